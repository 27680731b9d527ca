package model

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
)

// TestGraphDeclarations: duplicate graph input names (in any graph) and
// duplicate output names of the main graph are invalid, and an
// initializer that is also a graph input must agree with the input's
// declared element type, rank and fixed dimensions.
func TestGraphDeclarations(t *testing.T) {
	relu := []*onnxpb.NodeProto{onnxtest.Node("Relu", []string{"x"}, []string{"y"})}
	add := []*onnxpb.NodeProto{onnxtest.Node("Add", []string{"w", "x"}, []string{"y"})}
	w3 := onnxtest.Floats("w", []int64{3}, []float32{1, 2, 3})
	vis := func(v ...*onnxpb.ValueInfoProto) []*onnxpb.ValueInfoProto { return v }
	y := vis(onnxtest.Info("y", 1, 3))
	cases := []struct {
		name  string
		nodes []*onnxpb.NodeProto
		ins   []*onnxpb.ValueInfoProto
		outs  []*onnxpb.ValueInfoProto
		inits []*onnxpb.TensorProto
		err   error
	}{
		{"distinct inputs", add, vis(onnxtest.Info("x", 1, 3), onnxtest.Info("w", 1, 3)), y, nil, nil},
		{"input declared twice", relu, vis(onnxtest.Info("x", 1, 4), onnxtest.Info("x", 7, 2)), y, nil, errs.ErrInvalidModel},
		{"input declared twice alike", relu, vis(onnxtest.Info("x", 1, 4), onnxtest.Info("x", 1, 4)), y, nil, errs.ErrInvalidModel},
		{"output declared twice", relu, vis(onnxtest.Info("x", 1, 3)), vis(onnxtest.Info("y", 1, 3), onnxtest.Info("y", 1, 3)), nil, errs.ErrInvalidModel},
		{"default agrees", add, vis(onnxtest.Info("x", 1, 3), onnxtest.Info("w", 1, 3)), y, []*onnxpb.TensorProto{w3}, nil},
		{"default of a symbolic dimension", add, vis(onnxtest.Info("x", 1, 3), onnxtest.Info("w", 1, -1)), y, []*onnxpb.TensorProto{w3}, nil},
		{"default of an undeclared shape", add, vis(onnxtest.Info("x", 1, 3), infoNoShape("w", 1)), y, []*onnxpb.TensorProto{w3}, nil},
		{"default not declared an input", add, vis(onnxtest.Info("x", 1, 3)), y, []*onnxpb.TensorProto{w3}, nil},
		{"default of another type", add, vis(onnxtest.Info("x", 1, 3), onnxtest.Info("w", 7, 3)), y, []*onnxpb.TensorProto{w3}, errs.ErrInvalidModel},
		{"default of another dimension", add, vis(onnxtest.Info("x", 1, 3), onnxtest.Info("w", 1, 4)), y, []*onnxpb.TensorProto{w3}, errs.ErrInvalidModel},
		{"default of another rank", add, vis(onnxtest.Info("x", 1, 3), onnxtest.Info("w", 1, 1, 3)), y, []*onnxpb.TensorProto{w3}, errs.ErrInvalidModel},
	}
	for _, c := range cases {
		b := onnxtest.Bytes(onnxtest.Model(17, onnxtest.Graph(c.nodes, c.ins, c.outs, c.inits...), nil))
		_, err := LoadBytes(b, Options{})
		if !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
		}
	}

	// a subgraph (an If branch, a Loop body) may list one value twice as
	// an output, not as an input
	m, err := LoadBytes(onnxtest.Bytes(onnxtest.Model(17, onnxtest.Graph(relu, vis(onnxtest.Info("x", 1, 3)), y), nil)), Options{})
	if err != nil {
		t.Fatal(err)
	}
	body := onnxtest.Graph(relu, vis(onnxtest.Info("x", 1, 3)), vis(onnxtest.Info("y", 1, 3), onnxtest.Info("y", 1, 3)))
	if _, err := m.Graph.Subgraph(body); err != nil {
		t.Errorf("subgraph with an output listed twice: %v", err)
	}
	body = onnxtest.Graph(relu, vis(onnxtest.Info("x", 1, 3), onnxtest.Info("x", 1, 3)), y)
	if _, err := m.Graph.Subgraph(body); !errors.Is(err, errs.ErrInvalidModel) {
		t.Errorf("subgraph with an input declared twice: %v", err)
	}
}

// infoNoShape declares a tensor value without a shape.
func infoNoShape(name string, dtype int32) *onnxpb.ValueInfoProto {
	return &onnxpb.ValueInfoProto{Name: &name, Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
		TensorType: &onnxpb.TypeProto_Tensor{ElemType: &dtype}}}}
}
