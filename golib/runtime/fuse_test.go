package runtime

import (
	"math"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// rmsChain describes one variant of the exporters' RMSNorm chain (the
// defaults are the dynamo export's form).
type rmsChain struct {
	opset     int64
	div       bool    // Div(1, s) instead of Reciprocal(s)
	cast      int64   // a Cast(to=cast) between the two Muls (0: none)
	swap      bool    // operands of both Muls and the Add in the other order
	axis      int64   // ReduceMean's axis
	keepdims  int64   // ReduceMean's keepdims
	exponent  float32 // Pow's exponent
	numerator float32 // Div's numerator
	epsDims   []int64 // shape of the eps constant
	weightIn  bool    // the weight is a graph input, not a constant
	weight2D  bool    // the weight has rank 2
	meanOut   bool    // the mean is also a graph output
	xScale    bool    // Mul(x', r) with x' != x (the Pow reads another value)
}

func defaultRMS() rmsChain {
	return rmsChain{opset: 18, axis: -1, keepdims: 1, exponent: 2, numerator: 1, epsDims: nil}
}

// model builds h = Relu(in) (so x is not a feed), then the chain on h, y =
// the chain's output.
func (c rmsChain) model() *onnxpb.ModelProto {
	const d = 8
	rng := rand.New(rand.NewSource(3))
	w := make([]float32, d)
	for i := range w {
		w[i] = 0.5 + rng.Float32()
	}
	pair := func(a, b string) []string {
		if c.swap {
			return []string{b, a}
		}
		return []string{a, b}
	}
	epsN := 1
	for _, e := range c.epsDims {
		epsN *= int(e)
	}
	eps := make([]float32, epsN)
	for i := range eps {
		eps[i] = 1e-6
	}
	inits := []*onnxpb.TensorProto{
		onnxtest.Floats("two", nil, []float32{c.exponent}),
		onnxtest.Floats("eps", c.epsDims, eps),
		onnxtest.Floats("one", nil, []float32{c.numerator}),
	}
	inputs := []*onnxpb.ValueInfoProto{onnxtest.Info("in", 1, 2, 3, d)}
	switch {
	case c.weightIn:
		inputs = append(inputs, onnxtest.Info("w", 1, d))
	case c.weight2D:
		inits = append(inits, onnxtest.Floats("w", []int64{1, d}, w))
	default:
		inits = append(inits, onnxtest.Floats("w", []int64{d}, w))
	}
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("Relu", []string{"in"}, []string{"x"}),
		onnxtest.Node("Neg", []string{"x"}, []string{"x2"}),
		onnxtest.Node("Pow", []string{"x", "two"}, []string{"q"}),
	}
	if c.opset >= 18 {
		inits = append(inits, onnxtest.Int64s("axes", []int64{1}, []int64{c.axis}))
		nodes = append(nodes, onnxtest.Node("ReduceMean", []string{"q", "axes"}, []string{"m"}, onnxtest.AttrInt("keepdims", c.keepdims)))
	} else {
		nodes = append(nodes, onnxtest.Node("ReduceMean", []string{"q"}, []string{"m"},
			onnxtest.AttrInts("axes", c.axis), onnxtest.AttrInt("keepdims", c.keepdims)))
	}
	nodes = append(nodes,
		onnxtest.Node("Add", pair("m", "eps"), []string{"a"}),
		onnxtest.Node("Sqrt", []string{"a"}, []string{"s"}))
	if c.div {
		nodes = append(nodes, onnxtest.Node("Div", []string{"one", "s"}, []string{"r"}))
	} else {
		nodes = append(nodes, onnxtest.Node("Reciprocal", []string{"s"}, []string{"r"}))
	}
	xs := "x"
	if c.xScale {
		xs = "x2"
	}
	nodes = append(nodes, onnxtest.Node("Mul", pair(xs, "r"), []string{"n"}))
	last := "n"
	if c.cast != 0 {
		nodes = append(nodes, onnxtest.Node("Cast", []string{"n"}, []string{"nc"}, onnxtest.AttrInt("to", c.cast)))
		last = "nc"
	}
	nodes = append(nodes, onnxtest.Node("Mul", pair("w", last), []string{"y"}))
	outputs := []*onnxpb.ValueInfoProto{onnxtest.Info("y", 1, 2, 3, d)}
	if c.meanOut {
		outputs = append(outputs, onnxtest.Info("m", 1, 2, 3, 1))
	}
	return onnxtest.Model(c.opset, onnxtest.Graph(nodes, inputs, outputs, inits...), nil)
}

// TestFuseRMSNorm: the chain is fused into SimplifiedLayerNormalization in
// each form the exporters write, and only then; fused or not, the session
// computes what the unfused graph does (DisableFolding runs it as written).
func TestFuseRMSNorm(t *testing.T) {
	cases := []struct {
		name  string
		edit  func(*rmsChain)
		fused bool
	}{
		{"dynamo (Reciprocal, axes input)", func(*rmsChain) {}, true},
		{"torchscript (Div, no-op Cast)", func(c *rmsChain) { c.div, c.cast = true, 1 }, true},
		{"operands swapped", func(c *rmsChain) { c.swap = true }, true},
		{"axes attribute (opset 17)", func(c *rmsChain) { c.opset = 17 }, true},
		{"other axis", func(c *rmsChain) { c.axis = 1 }, false},
		{"keepdims 0", func(c *rmsChain) { c.keepdims = 0 }, false},
		{"cube", func(c *rmsChain) { c.exponent = 3 }, false},
		{"Div(2, s)", func(c *rmsChain) { c.div, c.numerator = true, 2 }, false},
		{"eps not a scalar", func(c *rmsChain) { c.epsDims = []int64{2, 3, 1} }, false},
		{"weight fed", func(c *rmsChain) { c.weightIn = true }, false},
		{"weight of rank 2", func(c *rmsChain) { c.weight2D = true }, false},
		{"mean is a graph output", func(c *rmsChain) { c.meanOut = true }, false},
		{"Cast to float16", func(c *rmsChain) { c.cast = 10 }, false},
		{"scaled value differs from the squared one", func(c *rmsChain) { c.xScale = true }, false},
	}
	in := make([]float32, 2*3*8)
	for i := range in {
		in[i] = float32(math.Sin(float64(i))) * 3
	}
	x, _ := tensor.FromSlice(tensor.Shape{2, 3, 8}, in)
	w, _ := tensor.FromSlice(tensor.Shape{8}, []float32{1, 2, 3, 4, 5, 6, 7, 8})
	for _, c := range cases {
		rc := defaultRMS()
		c.edit(&rc)
		b := onnxtest.Bytes(rc.model())
		feeds := map[string]*tensor.Tensor{"in": x}
		if rc.weightIn {
			feeds["w"] = w
		}
		s, ref := fusedPair(t, c.name, b, "SimplifiedLayerNormalization", c.fused, "Pow", "ReduceMean", "Mul")
		got, _, err1 := s.Run(feeds, nil)
		want, _, err2 := ref.Run(feeds, nil)
		if (err1 != nil) != (err2 != nil) {
			t.Fatalf("%s: errors differ: %v vs %v", c.name, err1, err2)
		}
		if err1 != nil {
			continue // the unfused graph fails too (a Cast to float16 feeding a float32 Mul)
		}
		for k := range want {
			g, wv := got[k].Float32(), want[k].Float32()
			for i := range wv {
				if d := math.Abs(float64(g[i] - wv[i])); d > 1e-6*math.Max(1, math.Abs(float64(wv[i]))) {
					t.Errorf("%s: output %d [%d] = %v, unfused %v", c.name, k, i, g[i], wv[i])
					break
				}
			}
		}
	}
}
