package runtime

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// spareModel is shape arithmetic over x's length n whose values change from
// run to run: Gather/Unsqueeze/Squeeze/Concat chains (views of rewritten
// values), a Range that grows with n, a value whose shape alternates with
// n's parity while its bytes stay (h) and a view of it that has the same
// shape and bytes either way (hv: it must be replaced with h), a
// geometry value that is a graph output (never kept), and a product that
// consumes the geometry values.
func spareModel() *onnxpb.ModelProto {
	nd := onnxtest.Node
	nodes := []*onnxpb.NodeProto{
		nd("Shape", []string{"x"}, []string{"s"}),
		nd("Gather", []string{"s", "zero_s"}, []string{"n"}, onnxtest.AttrInt("axis", 0)),
		nd("Unsqueeze", []string{"n", "zero1"}, []string{"u"}),
		nd("Unsqueeze", []string{"u", "zero1"}, []string{"u2"}),
		nd("Squeeze", []string{"u2", "zero1"}, []string{"sq"}),
		nd("Concat", []string{"one1", "sq"}, []string{"c"}, onnxtest.AttrInt("axis", 0)),
		nd("Range", []string{"zero_s", "n", "one_s"}, []string{"r"}),
		nd("Unsqueeze", []string{"r", "zero1"}, []string{"rr"}),
		nd("Cast", []string{"rr"}, []string{"m"}, onnxtest.AttrInt("to", 1)),
		nd("Reshape", []string{"x", "c"}, []string{"xr"}),
		nd("Add", []string{"xr", "m"}, []string{"y"}),
		// parity: h is [] or [1] holding n / 2; hv = Reshape(h, [-1])
		nd("Mod", []string{"n", "two_s"}, []string{"p"}),
		nd("Unsqueeze", []string{"p", "zero1"}, []string{"pe"}),
		nd("Slice", []string{"one1", "zero1", "pe"}, []string{"shp"}),
		nd("Div", []string{"n", "two_s"}, []string{"half"}),
		nd("Reshape", []string{"half", "shp"}, []string{"h0"}),
		nd("Add", []string{"h0", "zero_s"}, []string{"h"}),
		nd("Reshape", []string{"h", "minus1"}, []string{"hv"}),
		nd("Mul", []string{"hv", "u"}, []string{"hu"}),
		nd("Cast", []string{"hu"}, []string{"huf"}, onnxtest.AttrInt("to", 1)),
		nd("Mul", []string{"y", "huf"}, []string{"z"}),
		nd("Concat", []string{"s", "one1"}, []string{"g"}, onnxtest.AttrInt("axis", 0)),
	}
	g := onnxtest.Graph(nodes, []vi{onnxtest.Info("x", 1, -1)},
		[]vi{onnxtest.Info("z", 1, 1, -1), onnxtest.Info("g", 7, 2)},
		onnxtest.Int64s("zero_s", nil, []int64{0}), onnxtest.Int64s("one_s", nil, []int64{1}),
		onnxtest.Int64s("two_s", nil, []int64{2}), onnxtest.Int64s("zero1", []int64{1}, []int64{0}),
		onnxtest.Int64s("one1", []int64{1}, []int64{1}), onnxtest.Int64s("minus1", []int64{1}, []int64{-1}))
	return onnxtest.Model(17, g, nil)
}

// TestShapeCacheSpares: geometry values rewritten in the buffers of replaced
// ones give, over a random sequence of lengths (repeats, growth, shrinking,
// parity changes), what a fresh session gives for each length, and
// steady-state runs make no allocation per changed geometry value.
func TestShapeCacheSpares(t *testing.T) {
	s := session(t, spareModel())
	s.profile = false
	spared := 0
	for _, nd := range s.Plan().Nodes {
		for _, ok := range nd.spareOut {
			if ok {
				spared++
			}
		}
	}
	if spared < 8 {
		t.Fatalf("%d geometry outputs may use spares, want at least 8 (plan %s)", spared, opTypes(s.Plan()))
	}
	feed := func(n int) map[string]*tensor.Tensor {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%7) - 2.5
		}
		x, _ := tensor.FromSlice(tensor.Shape{n}, v)
		return map[string]*tensor.Tensor{"x": x}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	ns := []int{3, 3, 4, 5, 5, 4, 3, 9, 2, 2, 8, 9, 10, 11, 12, 1, 6}
	for range 60 {
		ns = append(ns, 1+rng.IntN(12))
	}
	for step, n := range ns {
		outs, _, err := s.Run(feed(n), nil)
		if err != nil {
			t.Fatal(err)
		}
		fresh := session(t, spareModel())
		want, _, err := fresh.Run(feed(n), nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := range outs {
			if !equalTensor(outs[k], want[k]) {
				t.Fatalf("step %d (n=%d): output %d = %v %v, a fresh session gives %v %v", step, n, k,
					outs[k].Shape(), fmt.Sprint(outs[k].Float32(), outs[k].Int64()), want[k].Shape(), fmt.Sprint(want[k].Float32(), want[k].Int64()))
			}
		}
		s.DefaultState().Release(outs...)
		fresh.Close()
	}
	// Alternating lengths change most geometry values at every run; each is
	// rewritten in place, so such a run allocates what a run with a
	// repeated length (nothing changes) does: the feed, the outputs and
	// the run's own bookkeeping.
	steady := func(alternate bool) float64 {
		i := 0
		return testing.AllocsPerRun(50, func() {
			if alternate {
				i++
			}
			outs, _, err := s.Run(feed(4+i%2), nil)
			if err != nil {
				t.Fatal(err)
			}
			s.DefaultState().Release(outs...)
		})
	}
	same, alt := steady(false), steady(true)
	t.Logf("allocations per run: %v (same length), %v (alternating)", same, alt)
	if alt > same+1 {
		t.Errorf("a run alternating between two lengths made %v allocations, one with a repeated length %v: changed geometry values allocate", alt, same)
	}
}

// TestReuseAndNewCap: Reuse rewrites a tensor in its own buffer while the
// capacity holds the new size, refuses pinned tensors and larger sizes;
// NewCap leaves room to grow, small tensors included.
func TestReuseAndNewCap(t *testing.T) {
	cases := []struct {
		dt      tensor.DType
		shape   tensor.Shape
		capB    int
		grow    tensor.Shape
		reusing bool
	}{
		{tensor.Int64, tensor.Shape{2}, 64, tensor.Shape{8}, true},
		{tensor.Int64, tensor.Shape{2}, 64, tensor.Shape{9}, false},
		{tensor.Float32, tensor.Shape{1, 20}, 160, tensor.Shape{1, 40}, true},
		{tensor.Float32, tensor.Shape{1, 20}, 160, tensor.Shape{1, 41}, false},
		{tensor.Bool, tensor.Shape{3}, 6, tensor.Shape{2, 3}, true},
	}
	for _, c := range cases {
		a, err := tensor.NewCap(c.dt, c.shape, c.capB)
		if err != nil {
			t.Fatal(err)
		}
		if !a.Shape().Equal(c.shape) || cap(a.Bytes()) < c.capB {
			t.Fatalf("NewCap(%v, %v, %d): shape %v, capacity %d", c.dt, c.shape, c.capB, a.Shape(), cap(a.Bytes()))
		}
		nb, _ := tensor.ByteSize(c.dt, c.grow)
		b := tensor.Reuse(a, c.dt, c.grow, nb)
		if (b != nil) != c.reusing {
			t.Fatalf("Reuse(%v -> %v): %v, want reuse %v", c.shape, c.grow, b, c.reusing)
		}
		if b != nil && (b != a || !b.Shape().Equal(c.grow) || b.NumBytes() != nb) {
			t.Fatalf("Reuse(%v -> %v) = %v (%d bytes)", c.shape, c.grow, b, b.NumBytes())
		}
	}
	p, _ := tensor.NewCap(tensor.Int64, tensor.Shape{2}, 64)
	p.Pin()
	if tensor.Reuse(p, tensor.Int64, tensor.Shape{2}, 16) != nil {
		t.Fatal("Reuse rewrote a pinned tensor")
	}
}

// dimModel gathers the batch (dimension 0, a scalar index) and the
// length (dimension -1, a 1-D index) of x's shape and builds
// y = Reshape(x, [b*n]) + b and z = w * the shape [b, n] as floats.
func dimModel() *onnxpb.ModelProto {
	nd := onnxtest.Node
	nodes := []*onnxpb.NodeProto{
		nd("Shape", []string{"x"}, []string{"s"}),
		nd("Gather", []string{"s", "zero_s"}, []string{"b"}, onnxtest.AttrInt("axis", 0)),
		nd("Gather", []string{"s", "last1"}, []string{"n1"}, onnxtest.AttrInt("axis", 0)),
		nd("Unsqueeze", []string{"b", "zero1"}, []string{"b1"}),
		nd("Mul", []string{"b1", "n1"}, []string{"bn"}),
		nd("Reshape", []string{"x", "bn"}, []string{"xr"}),
		nd("Cast", []string{"b"}, []string{"bf"}, onnxtest.AttrInt("to", 1)),
		nd("Add", []string{"xr", "bf"}, []string{"y"}),
		nd("Concat", []string{"b1", "n1"}, []string{"bnc"}, onnxtest.AttrInt("axis", 0)),
		nd("Cast", []string{"bnc"}, []string{"bncf"}, onnxtest.AttrInt("to", 1)),
		nd("Mul", []string{"bncf", "w"}, []string{"z"}),
	}
	g := onnxtest.Graph(nodes, []vi{onnxtest.Info("x", 1, -1, -1), onnxtest.Info("w", 1, 1)},
		[]vi{onnxtest.Info("y", 1, -1), onnxtest.Info("z", 1, 2)},
		onnxtest.Int64s("zero_s", nil, []int64{0}), onnxtest.Int64s("last1", []int64{1}, []int64{-1}),
		onnxtest.Int64s("zero1", []int64{1}, []int64{0}))
	return onnxtest.Model(17, g, nil)
}

// TestDimReads: a Gather of a shape dimension keeps its output while that
// dimension does (no kernel call when only the other one changes), and
// every run gives what a fresh session gives.
func TestDimReads(t *testing.T) {
	s := session(t, dimModel())
	dimReads := 0
	for _, nd := range s.Plan().Nodes {
		if nd.dimRead >= 0 {
			dimReads++
		}
	}
	if dimReads != 2 {
		t.Fatalf("%d dimension reads, want 2 (plan %s)", dimReads, opTypes(s.Plan()))
	}
	shapes := []tensor.Shape{{2, 3}, {2, 4}, {2, 5}, {3, 5}, {3, 6}, {1, 6}, {1, 7}, {2, 3}, {2, 3}, {4, 1}}
	for step, shape := range shapes {
		v := make([]float32, shape.Size())
		for i := range v {
			v[i] = float32(i)
		}
		x, _ := tensor.FromSlice(shape, v)
		w, _ := tensor.FromSlice(tensor.Shape{1}, []float32{0.5})
		feeds := map[string]*tensor.Tensor{"x": x, "w": w}
		outs, stats, err := s.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		fresh := session(t, dimModel())
		want, _, err := fresh.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := range outs {
			if !equalTensor(outs[k], want[k]) {
				t.Fatalf("step %d (x %v): output %d = %v, want %v", step, shape, k, outs[k].Float32(), want[k].Float32())
			}
		}
		gathers := 0
		for _, e := range stats.Events {
			if e.OpType == "Gather" {
				gathers++
			}
		}
		if step > 0 {
			prev := shapes[step-1]
			want := 0
			if prev[0] != shape[0] {
				want++
			}
			if prev[1] != shape[1] {
				want++
			}
			if gathers != want {
				t.Errorf("step %d (x %v after %v): %d Gather calls, want %d", step, shape, prev, gathers, want)
			}
		}
		s.DefaultState().Release(outs...)
		fresh.Close()
	}
}
