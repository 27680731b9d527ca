package runtime

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestDefaultInputFeeds: a feed replacing an initializer that is also a
// graph input is checked against the input's declaration like any other
// feed (element type, rank, fixed dimensions); a graph input declared
// twice is an invalid model.
func TestDefaultInputFeeds(t *testing.T) {
	g := onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Add", []string{"w", "x"}, []string{"y"})},
		[]vi{onnxtest.Info("x", 1, 4), onnxtest.Info("w", 1, 4)}, []vi{onnxtest.Info("y", 1, 4)},
		onnxtest.Floats("w", []int64{4}, []float32{1, 1, 1, 1}))
	s := session(t, onnxtest.Model(17, g, nil))
	x := f32(t, tensor.Shape{4}, 1, 2, 3, 4)
	w64, _ := tensor.FromSlice(tensor.Shape{4}, []float64{7, 7, 7, 7})
	cases := []struct {
		name  string
		feeds map[string]*tensor.Tensor
		want  string
		err   error
	}{
		{"default", map[string]*tensor.Tensor{"x": x}, "[2 3 4 5]", nil},
		{"default replaced", map[string]*tensor.Tensor{"x": x, "w": f32(t, tensor.Shape{4}, 7, 7, 7, 7)}, "[8 9 10 11]", nil},
		{"default replaced by a broadcast shape", map[string]*tensor.Tensor{"x": x, "w": f32(t, tensor.Shape{1}, 7)}, "", errs.ErrShape},
		{"default replaced by another rank", map[string]*tensor.Tensor{"x": x, "w": f32(t, tensor.Shape{1, 4}, 7, 7, 7, 7)}, "", errs.ErrShape},
		{"default replaced by another type", map[string]*tensor.Tensor{"x": x, "w": w64}, "", errs.ErrType},
	}
	for _, c := range cases {
		for _, prepared := range []bool{false, true} {
			var out []*tensor.Tensor
			var err error
			if prepared {
				names := []string{"x", "w"}[:len(c.feeds)]
				var sg *Signature
				if sg, err = s.Prepare(names, nil); err == nil {
					ts := make([]*tensor.Tensor, len(names))
					for i, n := range names {
						ts[i] = c.feeds[n]
					}
					out, _, err = s.RunSignature(s.DefaultState(), sg, ts)
				}
			} else {
				out, _, err = s.Run(c.feeds, nil)
			}
			if !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
				t.Errorf("%s (prepared %v): error %v, want %v", c.name, prepared, err, c.err)
				continue
			}
			if err == nil && sprintF32(out[0]) != c.want {
				t.Errorf("%s (prepared %v): y = %s, want %s", c.name, prepared, sprintF32(out[0]), c.want)
			}
		}
	}

	dup := onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Relu", []string{"x"}, []string{"y"})},
		[]vi{onnxtest.Info("x", 1, 4), onnxtest.Info("x", 7, 2)}, []vi{onnxtest.Info("y", 1, 4)})
	if _, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(17, dup, nil)), Options{}); !errors.Is(err, errs.ErrInvalidModel) {
		t.Errorf("graph input declared twice: %v", err)
	}
	bad := onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Add", []string{"w", "x"}, []string{"y"})},
		[]vi{onnxtest.Info("x", 1, 4), onnxtest.Info("w", 7, 4)}, []vi{onnxtest.Info("y", 1, 4)},
		onnxtest.Floats("w", []int64{4}, []float32{1, 1, 1, 1}))
	if _, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(17, bad, nil)), Options{}); !errors.Is(err, errs.ErrInvalidModel) {
		t.Errorf("default of another type than declared: %v", err)
	}
}

func sprintF32(t *tensor.Tensor) string {
	if t == nil || t.DType() != tensor.Float32 {
		return "<not float32>"
	}
	return fmt.Sprint(t.Float32())
}

// TestUnsupportedTypesAtCreation: a supported op with an element type its
// kernel does not compute fails at session creation with
// errs.ErrNotImplemented naming the op and the type, when the graph
// declares the type (graph inputs, initializers, value_info); a type known
// only at run time still fails the run with errs.ErrType.
func TestUnsupportedTypesAtCreation(t *testing.T) {
	two := func(op string, dt int32) *onnxpb.GraphProto {
		return onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node(op, []string{"a", "b"}, []string{"y"})},
			[]vi{onnxtest.Info("a", dt, 2, 2), onnxtest.Info("b", dt, 2, 2)}, []vi{onnxtest.Info("y", dt, 2, 2)})
	}
	one := func(op string, dt int32) *onnxpb.GraphProto {
		return onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node(op, []string{"a"}, []string{"y"})},
			[]vi{onnxtest.Info("a", dt, 2)}, []vi{onnxtest.Info("y", dt, 2)})
	}
	// Gemm's A declared float64 by value_info, B an initializer
	viGemm := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Relu", []string{"x"}, []string{"r"}),
		onnxtest.Node("Gemm", []string{"r", "w"}, []string{"y"}),
	}, []vi{infoAnyShape("x", 11)}, []vi{onnxtest.Info("y", 11, 2, 2)},
		&onnxpb.TensorProto{Name: strPtr("w"), DataType: i32Ptr(11), Dims: []int64{2, 2}, DoubleData: []float64{1, 0, 0, 1}})
	viGemm.ValueInfo = []vi{onnxtest.Info("r", 11, 2, 2)}
	// MatMul's B a uint32 initializer, A undeclared
	constB := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Relu", []string{"x"}, []string{"r"}),
		onnxtest.Node("MatMul", []string{"r", "w"}, []string{"y"}),
	}, []vi{onnxtest.Info("x", 12, 2, 2)}, []vi{onnxtest.Info("y", 12, 2, 2)},
		&onnxpb.TensorProto{Name: strPtr("w"), DataType: i32Ptr(12), Dims: []int64{2, 2}, Uint64Data: []uint64{1, 0, 0, 1}})
	cases := []struct {
		name string
		g    *onnxpb.GraphProto
		err  error
		text []string
	}{
		{"Gemm float64", two("Gemm", 11), errs.ErrNotImplemented, []string{"Gemm", "float64"}},
		{"Gemm int64", two("Gemm", 7), errs.ErrNotImplemented, []string{"Gemm", "int64"}},
		{"Gemm float64 by value_info", viGemm, errs.ErrNotImplemented, []string{"Gemm", "float64"}},
		{"MatMul uint32", two("MatMul", 12), errs.ErrNotImplemented, []string{"MatMul", "uint32"}},
		{"MatMul uint32 constant B", constB, errs.ErrNotImplemented, []string{"MatMul", "uint32"}},
		{"MatMul bool", two("MatMul", 9), errs.ErrNotImplemented, []string{"MatMul", "bool"}},
		{"Sqrt int64", one("Sqrt", 7), errs.ErrNotImplemented, []string{"Sqrt", "int64"}},
		{"Neg bool", one("Neg", 9), errs.ErrNotImplemented, []string{"Neg", "bool"}},
		{"Gelu int32", one("Gelu", 6), errs.ErrNotImplemented, []string{"Gelu", "int32"}},
		{"Gemm float32", two("Gemm", 1), nil, nil},
		{"Gemm float16", two("Gemm", 10), nil, nil},
		{"MatMul float64", two("MatMul", 11), nil, nil},
		{"MatMul int32", two("MatMul", 6), nil, nil},
		{"Neg int8", one("Neg", 3), nil, nil},
		{"Sqrt float64", one("Sqrt", 11), nil, nil},
	}
	for _, c := range cases {
		_, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(20, c.g, nil)), Options{})
		if !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("%s: error %v, want %v", c.name, err, c.err)
			continue
		}
		for _, s := range c.text {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: error %q does not name %q", c.name, err, s)
			}
		}
	}

	// the type of Gemm's input is not declared: the session is created and
	// the run fails
	undeclared := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Relu", []string{"x"}, []string{"r"}),
		onnxtest.Node("Gemm", []string{"r", "r"}, []string{"y"}),
	}, []vi{onnxtest.Info("x", 11, 2, 2)}, []vi{infoAnyShape("y", 11)})
	s, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(20, undeclared, nil)), Options{})
	if err != nil {
		t.Fatalf("Gemm of an undeclared type: %v", err)
	}
	x, _ := tensor.FromSlice(tensor.Shape{2, 2}, []float64{1, 2, 3, 4})
	if _, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil); !errors.Is(err, errs.ErrType) {
		t.Errorf("Gemm of an undeclared float64: run error %v, want %v", err, errs.ErrType)
	}
}

func strPtr(s string) *string { return &s }
func i32Ptr(v int32) *int32   { return &v }
