package runtime

import (
	"math"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// geluChain describes one variant of GPT-2's gelu_new as the exporters
// write it (defaults: the dynamo export's operand orders).
type geluChain struct {
	swap      bool    // every two-input node's operands in the other order
	exp       float32 // the Pow exponent (3)
	tanhOut   bool    // the Tanh's output is also a graph output
	otherHalf bool    // the 0.5 multiply reads another value than the Pow
	rank4     bool    // the constants have shape [1, 1, 1, 1] (broadcasting x's rank up)
	rank1     []bool  // per constant (e, c1, c2, one, half): of shape [1] instead of []
	anyShape  bool    // x is declared without a shape (any rank, a scalar included)
}

func (c geluChain) model() *onnxpb.ModelProto {
	pair := func(a, b string) []string {
		if c.swap {
			return []string{b, a}
		}
		return []string{a, b}
	}
	dims := []int64{}
	if c.rank4 {
		dims = []int64{1, 1, 1, 1}
	}
	cdims := func(k int) []int64 {
		if k < len(c.rank1) && c.rank1[k] {
			return []int64{1}
		}
		return dims
	}
	inits := []*onnxpb.TensorProto{
		onnxtest.Floats("e", cdims(0), []float32{c.exp}), onnxtest.Floats("c1", cdims(1), []float32{0.044715}),
		onnxtest.Floats("c2", cdims(2), []float32{0.7978845834732056}), onnxtest.Floats("one", cdims(3), []float32{1}),
		onnxtest.Floats("half", cdims(4), []float32{0.5}),
	}
	hx := "x"
	if c.otherHalf {
		hx = "z"
	}
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("Pow", []string{"x", "e"}, []string{"p"}),
		onnxtest.Node("Mul", pair("p", "c1"), []string{"m1"}),
		onnxtest.Node("Add", pair("x", "m1"), []string{"a"}),
		onnxtest.Node("Mul", pair("a", "c2"), []string{"m2"}),
		onnxtest.Node("Tanh", []string{"m2"}, []string{"t"}),
		onnxtest.Node("Add", pair("t", "one"), []string{"a2"}),
		onnxtest.Node("Mul", pair(hx, "half"), []string{"h"}),
		onnxtest.Node("Mul", pair("h", "a2"), []string{"y"}),
	}
	inputs := []*onnxpb.ValueInfoProto{onnxtest.Info("x", 1, -1, -1, 16), onnxtest.Info("z", 1, -1, -1, 16)}
	outputs := []*onnxpb.ValueInfoProto{onnxtest.Info("y", 1, -1, -1, -1)}
	if c.anyShape {
		inputs = []*onnxpb.ValueInfoProto{infoAnyShape("x", 1), infoAnyShape("z", 1)}
		outputs = []*onnxpb.ValueInfoProto{infoAnyShape("y", 1)}
	}
	if c.tanhOut {
		outputs = append(outputs, onnxtest.Info("t", 1, -1, -1, -1))
	}
	return onnxtest.Model(18, onnxtest.Graph(nodes, inputs, outputs, inits...), nil)
}

// TestFuseGeluTanh: GPT-2's gelu_new chain becomes one GeluTanhChain node
// in the exporters' operand orders and for any constant values; the
// outputs are bit-identical to the unfused graph's, NaN and infinities
// included; chains it cannot prove stay unfused.
func TestFuseGeluTanh(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(*geluChain)
		fused bool
	}{
		{"dynamo order", func(*geluChain) {}, true},
		{"operands swapped", func(c *geluChain) { c.swap = true }, true},
		{"exponent 2 (its constant used as given)", func(c *geluChain) { c.exp = 2 }, true},
		{"Tanh output is a graph output", func(c *geluChain) { c.tanhOut = true }, false},
		{"0.5 multiply of another value", func(c *geluChain) { c.otherHalf = true }, false},
		{"rank-4 constants", func(c *geluChain) { c.rank4 = true }, false},
	}
	rng := rand.New(rand.NewSource(3))
	for _, c := range cases {
		gc := geluChain{exp: 3}
		c.edit(&gc)
		b := onnxtest.Bytes(gc.model())
		s, ref := fusedPair(t, c.name, b, "GeluTanhChain", c.fused, "Tanh ", "Pow")
		for _, shape := range []tensor.Shape{{1, 1, 16}, {2, 5, 16}, {1, 0, 16}, {1, 3, 16}, {3, 7, 16}} {
			v := randFloats(rng, shape.Size())
			for j := range v {
				v[j] *= 8
			}
			if len(v) > 4 {
				v[0], v[1], v[2], v[3] = float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), 40
			}
			x, _ := tensor.FromSlice(shape, v)
			z, _ := tensor.FromSlice(shape, randFloats(rng, shape.Size()))
			feeds := map[string]*tensor.Tensor{"x": x, "z": z}
			got, _, err1 := s.Run(feeds, nil)
			want, _, err2 := ref.Run(feeds, nil)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s %v: %v / %v", c.name, shape, err1, err2)
			}
			for k := range want {
				if !got[k].Shape().Equal(want[k].Shape()) {
					t.Fatalf("%s %v: shape %v, unfused %v", c.name, shape, got[k].Shape(), want[k].Shape())
				}
				g, w := got[k].Float32(), want[k].Float32()
				for i := range w {
					if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
						t.Fatalf("%s %v: output %d [%d] = %v, unfused %v", c.name, shape, k, i, g[i], w[i])
					}
				}
			}
		}
	}
}

// TestFuseGeluTanhRank: a constant of shape [1] broadcasts a scalar x to
// [1]; the fused kernel, which keeps x's shape, runs the chain for such an
// x and its own path for the others (GPT-2's dynamo export writes some of
// the constants with shape [1]).
func TestFuseGeluTanhRank(t *testing.T) {
	cases := []struct {
		name  string
		rank1 []bool
	}{
		{"all constants of shape [1]", []bool{true, true, true, true, true}},
		{"the exponent", []bool{true}},
		{"c1", []bool{false, true}},
		{"c2", []bool{false, false, true}},
		{"the 1", []bool{false, false, false, true}},
		{"the 0.5", []bool{false, false, false, false, true}},
	}
	for _, c := range cases {
		b := onnxtest.Bytes(geluChain{exp: 3, rank1: c.rank1, anyShape: true}.model())
		s, ref := fusedPair(t, c.name, b, "GeluTanhChain", true, "Tanh ", "Pow")
		for _, sh := range []struct {
			x     tensor.Shape
			chain bool
		}{{tensor.Shape{}, true}, {tensor.Shape{3}, false}, {tensor.Shape{2, 3}, false}} {
			x, _ := tensor.FromSlice(sh.x, randFloats(rand.New(rand.NewSource(1)), sh.x.Size()))
			feeds := map[string]*tensor.Tensor{"x": x, "z": x}
			var before int64
			for _, n := range s.Plan().Nodes {
				if k, ok := n.Kernel.(*geluTanhChain); ok {
					before = k.chain.runs.Load()
				}
			}
			got, _, err1 := s.Run(feeds, nil)
			want, _, err2 := ref.Run(feeds, nil)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s %v: %v / %v", c.name, sh.x, err1, err2)
			}
			if !got[0].Shape().Equal(want[0].Shape()) {
				t.Fatalf("%s %v: shape %v, unfused %v", c.name, sh.x, got[0].Shape(), want[0].Shape())
			}
			if len(sh.x) == 0 && !want[0].Shape().Equal(tensor.Shape{1}) {
				t.Fatalf("%s: the unfused chain gives %v for a scalar", c.name, want[0].Shape())
			}
			g, w := got[0].Float32(), want[0].Float32()
			for i := range w {
				if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
					t.Fatalf("%s %v: [%d] = %v, unfused %v", c.name, sh.x, i, g[i], w[i])
				}
			}
			for _, n := range s.Plan().Nodes {
				if k, ok := n.Kernel.(*geluTanhChain); ok {
					if took := k.chain.runs.Load() > before; took != sh.chain {
						t.Errorf("%s %v: took the chain %v, want %v", c.name, sh.x, took, sh.chain)
					}
				}
			}
		}
	}
}
