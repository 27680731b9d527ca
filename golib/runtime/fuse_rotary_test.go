package runtime

import (
	"math"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// rotChain describes one variant of the exporters' rotate_half rotary
// embedding (the defaults are the TorchScript export's form: the split
// point computed from Shape(q), the slices on axis 3).
type rotChain struct {
	constSplit bool  // the split point is a constant (dynamo's form)
	div        int64 // the split is d/div (2: the halves)
	axis       int64 // the slices' axis (3 or -1)
	catAxis    int64 // the Concat's axis
	swap       bool  // Mul and Add operands in the other order
	negFirst   bool  // Neg on the first half instead (not rotate_half)
	cosRank3   bool  // cos/sin fed as [b, s, d] directly (broadcast over heads from the left: no)
	catOut     bool  // the concatenation is also a graph output
	step2      bool  // the first slice has step 2
	half       bool  // float16 q, cos and sin
}

func defaultRot() rotChain { return rotChain{div: 2, axis: 3, catAxis: -1} }

const rotD = 8

func (c rotChain) model() *onnxpb.ModelProto {
	pair := func(a, b string) []string {
		if c.swap {
			return []string{b, a}
		}
		return []string{a, b}
	}
	step := int64(1)
	if c.step2 {
		step = 2
	}
	inits := []*onnxpb.TensorProto{
		onnxtest.Int64s("axis", []int64{1}, []int64{c.axis}), onnxtest.Int64s("zero", []int64{1}, []int64{0}),
		onnxtest.Int64s("big", []int64{1}, []int64{math.MaxInt64}), onnxtest.Int64s("one", []int64{1}, []int64{1}),
		onnxtest.Int64s("step", []int64{1}, []int64{step}),
		onnxtest.Int64s("idx", nil, []int64{3}), onnxtest.Int64s("div", nil, []int64{c.div}),
		onnxtest.Int64s("u0", []int64{1}, []int64{0}), onnxtest.Int64s("u1", []int64{1}, []int64{1}),
	}
	var nodes []*onnxpb.NodeProto
	split := "h1"
	if c.constSplit {
		inits = append(inits, onnxtest.Int64s("h1", []int64{1}, []int64{rotD / c.div}))
	} else {
		nodes = append(nodes,
			onnxtest.Node("Shape", []string{"q"}, []string{"qs"}),
			onnxtest.Node("Gather", []string{"qs", "idx"}, []string{"d"}, onnxtest.AttrInt("axis", 0)),
			onnxtest.Node("Div", []string{"d", "div"}, []string{"h"}),
			onnxtest.Node("Unsqueeze", []string{"h", "u0"}, []string{split}))
	}
	first, second := "x1", "nx2"
	nodes = append(nodes,
		onnxtest.Node("Slice", []string{"q", "zero", split, "axis", "step"}, []string{"x1"}),
		onnxtest.Node("Slice", []string{"q", split, "big", "axis", "one"}, []string{"x2"}))
	if c.negFirst {
		nodes = append(nodes, onnxtest.Node("Neg", []string{"x1"}, []string{"nx1"}))
		first, second = "nx1", "x2"
	} else {
		nodes = append(nodes, onnxtest.Node("Neg", []string{"x2"}, []string{"nx2"}))
	}
	nodes = append(nodes, onnxtest.Node("Concat", []string{second, first}, []string{"rot"}, onnxtest.AttrInt("axis", c.catAxis)))
	cos, sin := "c4", "s4"
	if c.cosRank3 {
		cos, sin = "cos", "sin"
	} else {
		nodes = append(nodes,
			onnxtest.Node("Unsqueeze", []string{"cos", "u1"}, []string{"c4"}),
			onnxtest.Node("Unsqueeze", []string{"sin", "u1"}, []string{"s4"}))
	}
	nodes = append(nodes,
		onnxtest.Node("Mul", pair("q", cos), []string{"qc"}),
		onnxtest.Node("Mul", pair("rot", sin), []string{"rs"}),
		onnxtest.Node("Add", pair("qc", "rs"), []string{"y"}))
	dt := int32(1)
	if c.half {
		dt = 10
	}
	inputs := []*onnxpb.ValueInfoProto{onnxtest.Info("q", dt, -1, 4, -1, rotD), onnxtest.Info("cos", dt, -1, -1, rotD),
		onnxtest.Info("sin", dt, -1, -1, rotD)}
	outputs := []*onnxpb.ValueInfoProto{onnxtest.Info("y", dt, -1, -1, -1, -1)}
	if c.catOut {
		outputs = append(outputs, onnxtest.Info("rot", dt, -1, -1, -1, -1))
	}
	return onnxtest.Model(18, onnxtest.Graph(nodes, inputs, outputs, inits...), nil)
}

// TestFuseRotary: the rotate_half chain becomes one RotaryHalf node in the
// exporters' forms; the fused kernel takes its own path exactly when the
// run is the canonical rotate_half and the chain otherwise; either way the
// outputs are bit-identical to the unfused graph's.
func TestFuseRotary(t *testing.T) {
	cases := []struct {
		name     string
		edit     func(*rotChain)
		fused    bool
		fallback bool // the fused kernel must take the chain
	}{
		{"torchscript (split from the shape)", func(*rotChain) {}, true, false},
		{"dynamo (constant split, axis -1)", func(c *rotChain) { c.constSplit, c.axis = true, -1 }, true, false},
		{"float16", func(c *rotChain) { c.half = true }, true, false},
		{"float16, split at a quarter: the chain", func(c *rotChain) { c.half, c.div = true, 4 }, true, true},
		{"operands swapped", func(c *rotChain) { c.swap = true }, true, false},
		{"concat on axis 3", func(c *rotChain) { c.catAxis = 3 }, true, false},
		{"split at a quarter: the chain", func(c *rotChain) { c.div = 4 }, true, true},
		{"step 2 on the first half: the chain", func(c *rotChain) { c.step2 = true; c.div = 4 }, true, true},
		{"cos broadcasting unlike [b, 1, s, d]: the chain (and its errors)", func(c *rotChain) { c.cosRank3 = true }, true, true},
		{"Neg on the first half", func(c *rotChain) { c.negFirst = true }, false, false},
		{"concatenation is a graph output", func(c *rotChain) { c.catOut = true }, false, false},
	}
	rng := rand.New(rand.NewSource(11))
	for _, c := range cases {
		rc := defaultRot()
		c.edit(&rc)
		b := onnxtest.Bytes(rc.model())
		s, ref := fusedPair(t, c.name, b, "RotaryHalf", c.fused, "Neg", "Concat")
		for _, dims := range [][2]int{{1, 1}, {2, 3}, {1, 17}} {
			bsz, seq := dims[0], dims[1]
			cs := tensor.Shape{bsz, seq, rotD}
			if rc.cosRank3 {
				cs = tensor.Shape{seq, 1, rotD} // broadcasts over b and heads, not like [b, 1, s, d]
			}
			mk := func(shape tensor.Shape) *tensor.Tensor {
				v := randFloats(rng, shape.Size())
				if !rc.half {
					t, _ := tensor.FromSlice(shape, v)
					return t
				}
				t, _ := tensor.New(tensor.Float16, shape)
				_ = tensor.FromFloat32(t, v)
				return t
			}
			q, cos, sin := mk(tensor.Shape{bsz, 4, seq, rotD}), mk(cs), mk(cs)
			feeds := map[string]*tensor.Tensor{"q": q, "cos": cos, "sin": sin}
			got, _, err1 := s.Run(feeds, nil)
			want, _, err2 := ref.Run(feeds, nil)
			if (err1 != nil) != (err2 != nil) {
				t.Fatalf("%s %v: errors differ: %v / %v", c.name, dims, err1, err2)
			}
			if err1 != nil {
				continue
			}
			for k := range want {
				if !got[k].Shape().Equal(want[k].Shape()) {
					t.Fatalf("%s %v: shape %v, unfused %v", c.name, dims, got[k].Shape(), want[k].Shape())
				}
				g, _ := tensor.AsFloat32(got[k])
				w, _ := tensor.AsFloat32(want[k])
				for i := range w {
					if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
						t.Fatalf("%s %v: output %d [%d] = %v, unfused %v", c.name, dims, k, i, g[i], w[i])
					}
				}
			}
		}
		if !c.fused {
			continue
		}
		for _, n := range s.Plan().Nodes {
			if k, ok := n.Kernel.(*rotaryHalf); ok {
				if fb := k.chain.runs.Load(); (fb > 0) != c.fallback {
					t.Errorf("%s: %d runs took the chain, want fallback %v", c.name, fb, c.fallback)
				}
			}
		}
	}
}

// TestRotateHalfF16Blocked checks the blocked float16 rotation against its
// value-by-value form, bit for bit, over head sizes (a row per block up to
// many, and rows past the block), cos/sin broadcasts and special values
// (NaN, infinities, subnormals, products that overflow float16).
func TestRotateHalfF16Blocked(t *testing.T) {
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.NaN()), float32(math.Inf(1)),
		float32(math.Inf(-1)), 6e-8, -3e-5, 65504, -60000, 1e-4}
	cases := []struct {
		name   string
		x, cos tensor.Shape
	}{
		{"d2", tensor.Shape{1, 3, 5, 2}, tensor.Shape{1, 1, 5, 2}},
		{"d16", tensor.Shape{1, 4, 16, 16}, tensor.Shape{1, 1, 16, 16}},
		{"d16-batch", tensor.Shape{3, 2, 7, 16}, tensor.Shape{3, 1, 7, 16}},
		{"d24-rank3", tensor.Shape{2, 11, 24}, tensor.Shape{11, 24}},
		{"d64", tensor.Shape{1, 2, 9, 64}, tensor.Shape{1, 1, 9, 64}},
		{"d128-full", tensor.Shape{1, 3, 5, 128}, tensor.Shape{1, 3, 5, 128}},
		{"d512", tensor.Shape{1, 2, 3, 512}, tensor.Shape{1, 1, 3, 512}},
		{"d640-scalar", tensor.Shape{1, 2, 3, 640}, tensor.Shape{1, 1, 3, 640}},
		{"one-row", tensor.Shape{1, 1, 1, 8}, tensor.Shape{1, 1, 1, 8}},
		{"empty", tensor.Shape{1, 2, 0, 16}, tensor.Shape{1, 1, 0, 16}},
	}
	rng := rand.New(rand.NewSource(7))
	fill := func(s tensor.Shape, scale float32) *tensor.Tensor {
		n, _ := s.NumElements()
		v := make([]float32, n)
		for i := range v {
			v[i] = (rng.Float32()*2 - 1) * scale
			if rng.Intn(17) == 0 {
				v[i] = special[rng.Intn(len(special))]
			}
		}
		tt, err := tensor.New(tensor.Float16, s)
		if err != nil {
			t.Fatal(err)
		}
		if err := tensor.FromFloat32(tt, v); err != nil {
			t.Fatal(err)
		}
		return tt
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			for _, scale := range []float32{1, 300} {
				x, cos, sin := fill(c.x, scale), fill(c.cos, 1), fill(c.cos, 1)
				h := c.x[len(c.x)-1] / 2
				got := make([]tensor.Float16Bits, x.Len())
				want := make([]tensor.Float16Bits, x.Len())
				rotateHalfF16(got, x, cos, sin, h)
				rotateHalfF16Scalar(want, x, cos, sin, h)
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("scale %v: value %d: got %#04x, want %#04x", scale, i, got[i], want[i])
					}
				}
			}
		})
	}
}
