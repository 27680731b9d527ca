package runtime

import (
	"fmt"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// chainModel is y = Reshape(Cast(Relu(x)), t) where the Cast's input type
// is unknown when the plan is built (it passes through at run time) and
// the target t comes from Shape(x) through n Unsqueeze/Squeeze links, which
// the shape cache reuses: in a steady state only Relu and Reshape call
// their kernels.
func chainModel(n int) *onnxpb.ModelProto {
	nodes := []*onnxpb.NodeProto{onnxtest.Node("Relu", []string{"x"}, []string{"r"}),
		onnxtest.Node("Cast", []string{"r"}, []string{"c"}, onnxtest.AttrInt("to", 1)),
		onnxtest.Node("Shape", []string{"x"}, []string{"s0"})}
	for i := 1; i <= n; i++ {
		nodes = append(nodes,
			onnxtest.Node("Unsqueeze", []string{fmt.Sprintf("s%d", i-1), "zero"}, []string{fmt.Sprintf("u%d", i)}),
			onnxtest.Node("Squeeze", []string{fmt.Sprintf("u%d", i), "zero"}, []string{fmt.Sprintf("s%d", i)}))
	}
	nodes = append(nodes, onnxtest.Node("Reshape", []string{"c", fmt.Sprintf("s%d", n)}, []string{"y"}))
	g := onnxtest.Graph(nodes, []vi{onnxtest.Info("x", 1, -1, -1)}, []vi{onnxtest.Info("y", 1, -1, -1)},
		onnxtest.Int64s("zero", []int64{1}, []int64{0}))
	return onnxtest.Model(17, g, nil)
}

// TestExecutorAllocsPerNode: in a steady state the executor allocates
// nothing per node: a run with 96 links allocates what a run with 8 links
// does (the per-run allocations: outputs slice, stats, the two kernels'
// outputs).
func TestExecutorAllocsPerNode(t *testing.T) {
	x, _ := tensor.FromSlice(tensor.Shape{2, 3}, []float32{-1, 2, -3, 4, -5, 6})
	feeds := map[string]*tensor.Tensor{"x": x}
	allocs := map[int]float64{}
	for _, n := range []int{8, 96} {
		s := session(t, chainModel(n))
		s.profile = false
		if got := strings.Count(opTypes(s.Plan()), "queeze"); got != 2*n || !strings.Contains(opTypes(s.Plan()), "Cast") {
			t.Fatalf("plan %s: the links or the Cast were folded away", opTypes(s.Plan()))
		}
		run := func() {
			outs, _, err := s.Run(feeds, nil)
			if err != nil {
				t.Fatal(err)
			}
			if got := fmt.Sprint(outs[0].Float32()); got != "[0 2 0 4 0 6]" {
				t.Fatalf("y = %s", got)
			}
			s.DefaultState().Release(outs...)
		}
		run() // fills the shape cache
		allocs[n] = testing.AllocsPerRun(50, run)
	}
	t.Logf("allocations per run: %v (8 links), %v (96 links)", allocs[8], allocs[96])
	// One allocation per node would add 88; the race detector's runtime
	// adds one now and then.
	if allocs[96]-allocs[8] > 2 {
		t.Errorf("allocations per run: %v with 8 links, %v with 96: the executor allocates per node", allocs[8], allocs[96])
	}
}

// TestDecodeStepAllocs bounds the Go heap allocations of one growing decode
// step of an exported-style decoder (4 layers, 137 nodes after folding: shape arithmetic,
// mask building, decomposed attention), driven like generation (presents
// fed back as pasts, a new past length every step). Tensor headers are
// recycled per node, kernel temporaries come from per-node scratch and
// buffers from the state's pool; what remains is the geometry values the
// shape cache keeps (one allocation each: small tensors share the header's
// allocation) and the driver's own feeds (cpu/gemm's products come from a
// pool). Before the recycling this step made 775 allocations; then 205;
// now 103.
func TestDecodeStepAllocs(t *testing.T) {
	const bound = 140
	s := session(t, exportedDecoder(benchExported, 1))
	s.profile = false
	d, ok := newGrowingDriver(t, s)
	if !ok {
		t.Fatal("the exported decoder's inputs are not recognized by the driver")
	}
	d.run(t, 40) // the pool and the shape cache reach their steady state
	got := testing.AllocsPerRun(64, func() { d.run(t, 1) })
	t.Logf("allocations per decode step: %v (%d nodes)", got, len(s.Plan().Nodes))
	if got > bound {
		t.Errorf("a decode step made %v allocations, want at most %d", got, bound)
	}
}
