package runtime

import (
	"fmt"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// dedupModel repeats shape arithmetic as the TorchScript exports do: two
// Shape(x) reads, Gathers of the same dimension through equal constants of
// different names, a Gather of another dimension (not a duplicate), a Cast
// to another type (not a duplicate), and a duplicate whose output is a graph
// output (kept).
func dedupModel() *onnxpb.ModelProto {
	nd := onnxtest.Node
	nodes := []*onnxpb.NodeProto{
		nd("Shape", []string{"x"}, []string{"s1"}),
		nd("Shape", []string{"x"}, []string{"s2"}),
		nd("Gather", []string{"s1", "i1a"}, []string{"d1"}, onnxtest.AttrInt("axis", 0)),
		nd("Gather", []string{"s2", "i1b"}, []string{"d1b"}, onnxtest.AttrInt("axis", 0)),
		nd("Gather", []string{"s2", "i0"}, []string{"d0"}, onnxtest.AttrInt("axis", 0)),
		nd("Unsqueeze", []string{"d1", "ax"}, []string{"u1"}),
		nd("Unsqueeze", []string{"d1b", "ax"}, []string{"u1b"}),
		nd("Unsqueeze", []string{"d0", "ax"}, []string{"u0"}),
		nd("Concat", []string{"u1", "u0"}, []string{"t1"}, onnxtest.AttrInt("axis", 0)),
		nd("Concat", []string{"u1b", "u0"}, []string{"t2"}, onnxtest.AttrInt("axis", 0)),
		nd("Cast", []string{"t2"}, []string{"tf"}, onnxtest.AttrInt("to", 1)),
		nd("Cast", []string{"t2"}, []string{"ti"}, onnxtest.AttrInt("to", 6)),
		nd("Reshape", []string{"x", "t1"}, []string{"y1"}),
		nd("Reshape", []string{"x", "t2"}, []string{"y2"}),
		nd("Add", []string{"y1", "y2"}, []string{"y"}),
		nd("Concat", []string{"u1", "u0"}, []string{"shape_out"}, onnxtest.AttrInt("axis", 0)),
	}
	g := onnxtest.Graph(nodes, []vi{onnxtest.Info("x", 1, -1, -1)},
		[]vi{onnxtest.Info("y", 1, -1, -1), onnxtest.Info("shape_out", 7, 2), onnxtest.Info("tf", 1, 2), onnxtest.Info("ti", 6, 2)},
		onnxtest.Int64s("i1a", nil, []int64{1}), onnxtest.Int64s("i1b", nil, []int64{1}), onnxtest.Int64s("i0", nil, []int64{0}),
		onnxtest.Int64s("ax", []int64{1}, []int64{0}))
	return onnxtest.Model(17, g, nil)
}

// TestDedupPlan: the duplicates go (one Shape, Gather, Unsqueeze, Concat
// and Reshape each), the rest stays, and the outputs are those of the plan
// without folding.
func TestDedupPlan(t *testing.T) {
	s := session(t, dedupModel())
	got := opTypes(s.Plan())
	for op, want := range map[string]int{"Shape": 1, "Gather": 2, "Unsqueeze": 2, "Concat": 2, "Cast": 2, "Reshape": 1, "Add": 1} {
		if n := countOp(got, op); n != want {
			t.Errorf("plan %s: %d %s nodes, want %d", got, n, op, want)
		}
	}
	ref, err := NewSessionFromBytes(onnxtest.Bytes(dedupModel()), Options{DisableFolding: true})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Close()
	for _, shape := range []tensor.Shape{{2, 3}, {3, 2}, {1, 5}, {2, 3}} {
		v := make([]float32, shape.Size())
		for i := range v {
			v[i] = float32(i) - 1.5
		}
		x, _ := tensor.FromSlice(shape, v)
		feeds := map[string]*tensor.Tensor{"x": x}
		outs, _, err := s.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _, err := ref.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := range outs {
			if !equalTensor(outs[k], want[k]) {
				t.Fatalf("x %v: output %d = %v, want %v", shape, k, fmt.Sprint(outs[k].Shape(), outs[k].Bytes()), fmt.Sprint(want[k].Shape(), want[k].Bytes()))
			}
		}
		s.DefaultState().Release(outs...)
	}
}

func countOp(plan, op string) int {
	n := 0
	for _, f := range strings.Fields(plan) {
		if f == op {
			n++
		}
	}
	return n
}
