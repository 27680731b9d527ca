package runtime

import (
	"math"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// rkvChain describes one variant of the repeat_kv expansion in front of a
// standard Attention (the default is the dynamo export's form: the Expand
// and Reshape shapes computed from Shape(k) at run time).
type rkvChain struct {
	constShapes bool  // Expand to [1, 1, rep, 1, 1], Reshape to [0, h*rep, -1, d] (constants)
	axis        int64 // the Unsqueeze axis (2 or -3: repeat_kv; 1: a tile, not repeat_kv)
	qMul        int   // q heads = qMul * kv heads * rep (1: repeat_kv's grouping)
	expOut      bool  // the expanded K is also a graph output
	mask        bool  // a float attention mask input
}

const (
	rkvHeads, rkvRep, rkvD = 2, 3, 8
)

func (c rkvChain) model() *onnxpb.ModelProto {
	inits := []*onnxpb.TensorProto{
		onnxtest.Int64s("ax", []int64{1}, []int64{c.axis}), onnxtest.Int64s("rep", []int64{1}, []int64{rkvRep}),
		onnxtest.Int64s("s0", []int64{1}, []int64{0}), onnxtest.Int64s("s1", []int64{1}, []int64{1}),
		onnxtest.Int64s("s2", []int64{1}, []int64{2}), onnxtest.Int64s("s4", []int64{1}, []int64{4}),
		onnxtest.Int64s("cexp", []int64{5}, []int64{1, 1, rkvRep, 1, 1}),
		onnxtest.Int64s("cres", []int64{4}, []int64{0, rkvHeads * rkvRep, -1, rkvD}),
	}
	var nodes []*onnxpb.NodeProto
	for _, x := range []string{"k", "v"} {
		exp, res := "cexp", "cres"
		if !c.constShapes {
			exp, res = x+"_exp", x+"_res"
			nodes = append(nodes,
				onnxtest.Node("Shape", []string{x}, []string{x + "_s"}),
				onnxtest.Node("Slice", []string{x + "_s", "s0", "s2"}, []string{x + "_bh"}),
				onnxtest.Node("Slice", []string{x + "_s", "s2", "s4"}, []string{x + "_td"}),
				onnxtest.Node("Slice", []string{x + "_s", "s0", "s1"}, []string{x + "_b"}),
				onnxtest.Node("Slice", []string{x + "_s", "s1", "s2"}, []string{x + "_h"}),
				onnxtest.Node("Mul", []string{x + "_h", "rep"}, []string{x + "_hr"}),
				onnxtest.Node("Concat", []string{x + "_bh", "rep", x + "_td"}, []string{exp}, onnxtest.AttrInt("axis", 0)),
				onnxtest.Node("Concat", []string{x + "_b", x + "_hr", x + "_td"}, []string{res}, onnxtest.AttrInt("axis", 0)))
			if c.axis == 1 { // the tile's shapes: [b, rep, h, t, d]
				nodes[len(nodes)-2] = onnxtest.Node("Concat", []string{x + "_b", "rep", x + "_h", x + "_td"}, []string{exp}, onnxtest.AttrInt("axis", 0))
			}
		}
		nodes = append(nodes,
			onnxtest.Node("Unsqueeze", []string{x, "ax"}, []string{x + "_u"}),
			onnxtest.Node("Expand", []string{x + "_u", exp}, []string{x + "_e"}),
			onnxtest.Node("Reshape", []string{x + "_e", res}, []string{x + "_r"}))
	}
	in := []string{"q", "k_r", "v_r"}
	if c.mask {
		in = append(in, "mask")
	}
	nodes = append(nodes, onnxtest.Node("Attention", in, []string{"y"}))
	inputs := []*onnxpb.ValueInfoProto{onnxtest.Info("q", 1, -1, -1, -1, rkvD), onnxtest.Info("k", 1, -1, rkvHeads, -1, rkvD),
		onnxtest.Info("v", 1, -1, rkvHeads, -1, rkvD)}
	if c.mask {
		inputs = append(inputs, onnxtest.Info("mask", 1, -1, -1))
	}
	outputs := []*onnxpb.ValueInfoProto{onnxtest.Info("y", 1, -1, -1, -1, -1)}
	if c.expOut {
		outputs = append(outputs, onnxtest.Info("k_r", 1, -1, -1, -1, -1))
	}
	return onnxtest.Model(23, onnxtest.Graph(nodes, inputs, outputs, inits...), nil)
}

// TestFuseAttentionRepeatKV: the repeat_kv chains of K and V and their
// Attention become one AttentionRepeatKV node; it reads the unexpanded K/V
// exactly when the run's shapes are a repeat_kv with q's heads, and runs
// the chain otherwise; either way the outputs are the unfused graph's
// (within float32 rounding: the grouped and the expanded kernel may sum in
// another order).
func TestFuseAttentionRepeatKV(t *testing.T) {
	cases := []struct {
		name     string
		edit     func(*rkvChain)
		fused    bool
		fallback bool
	}{
		{"dynamo (shapes from Shape(k))", func(*rkvChain) {}, true, false},
		{"axis -3, with a mask", func(c *rkvChain) { c.axis, c.mask = -3, true }, true, false},
		{"constant broadcast shapes", func(c *rkvChain) { c.constShapes = true }, true, false},
		{"q with twice the expanded heads: the chain", func(c *rkvChain) { c.qMul = 2 }, true, true},
		{"Unsqueeze at axis 1 (a tile): the chain", func(c *rkvChain) { c.axis = 1 }, true, true},
		{"expanded K is a graph output", func(c *rkvChain) { c.expOut = true }, false, false},
	}
	rng := rand.New(rand.NewSource(5))
	for _, c := range cases {
		rc := rkvChain{axis: 2, qMul: 1}
		c.edit(&rc)
		b := onnxtest.Bytes(rc.model())
		s, ref := fusedPair(t, c.name, b, "AttentionRepeatKV", c.fused, "Expand", "Unsqueeze")
		for _, dims := range [][3]int{{1, 1, 1}, {1, 1, 17}, {2, 4, 9}} {
			bsz, sq, kv := dims[0], dims[1], dims[2]
			mk := func(shape tensor.Shape) *tensor.Tensor {
				t, _ := tensor.FromSlice(shape, randFloats(rng, shape.Size()))
				return t
			}
			feeds := map[string]*tensor.Tensor{"q": mk(tensor.Shape{bsz, rc.qMul * rkvHeads * rkvRep, sq, rkvD}),
				"k": mk(tensor.Shape{bsz, rkvHeads, kv, rkvD}), "v": mk(tensor.Shape{bsz, rkvHeads, kv, rkvD})}
			if rc.mask {
				feeds["mask"] = mk(tensor.Shape{sq, kv})
			}
			for range 2 { // the second run reuses the node's context
				got, _, err1 := s.Run(feeds, nil)
				want, _, err2 := ref.Run(feeds, nil)
				if err1 != nil || err2 != nil {
					t.Fatalf("%s %v: %v / %v", c.name, dims, err1, err2)
				}
				for k := range want {
					if !got[k].Shape().Equal(want[k].Shape()) {
						t.Fatalf("%s %v: shape %v, unfused %v", c.name, dims, got[k].Shape(), want[k].Shape())
					}
					g, w := got[k].Float32(), want[k].Float32()
					for i := range w {
						if math.Abs(float64(g[i]-w[i])) > 1e-6*(1+math.Abs(float64(w[i]))) {
							t.Fatalf("%s %v: output %d [%d] = %v, unfused %v", c.name, dims, k, i, g[i], w[i])
						}
					}
				}
			}
		}
		if !c.fused {
			continue
		}
		for _, n := range s.Plan().Nodes {
			if k, ok := n.Kernel.(*attentionRepeatKV); ok {
				if fb := k.chain.runs.Load(); (fb > 0) != c.fallback {
					t.Errorf("%s: %d runs took the chain, want fallback %v", c.name, fb, c.fallback)
				}
			}
		}
	}
}
