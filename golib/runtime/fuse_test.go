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
	powDims   []int64 // shape of Pow's exponent
	oneDims   []int64 // shape of Div's numerator
	anyShape  bool    // the input is declared without a shape (any rank)
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
		onnxtest.Floats("two", c.powDims, []float32{c.exponent}),
		onnxtest.Floats("eps", c.epsDims, eps),
		onnxtest.Floats("one", c.oneDims, []float32{c.numerator}),
	}
	inputs := []*onnxpb.ValueInfoProto{onnxtest.Info("in", 1, 2, 3, d)}
	if c.anyShape {
		inputs[0] = infoAnyShape("in", 1)
	}
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
	if c.anyShape {
		outputs[0] = infoAnyShape("y", 1)
	}
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

// infoAnyShape declares a tensor value of the given element type and no
// shape (any rank).
func infoAnyShape(name string, dtype int32) *onnxpb.ValueInfoProto {
	return &onnxpb.ValueInfoProto{Name: &name, Type: &onnxpb.TypeProto{Value: &onnxpb.TypeProto_TensorType{
		TensorType: &onnxpb.TypeProto_Tensor{ElemType: &dtype}}}}
}

// TestFuseRMSNormShapes: the fused SimplifiedLayerNormalization keeps x's
// shape, the chain broadcasts x with its constants and the weight; a run
// where they differ (constants of a higher rank than x, a weight longer
// than x's last dimension of 1) executes the chain and returns its shape,
// and the exporters' runs still take the fused kernel.
func TestFuseRMSNormShapes(t *testing.T) {
	const d = 8
	cases := []struct {
		name  string
		edit  func(*rmsChain)
		shape tensor.Shape // the fed input's
		want  tensor.Shape // the chain's output
		chain bool         // the run must take the chain
	}{
		{"rank-0 constants", func(*rmsChain) {}, tensor.Shape{2, d}, tensor.Shape{2, d}, false},
		{"rank-0 constants, 3D", func(*rmsChain) {}, tensor.Shape{1, 3, d}, tensor.Shape{1, 3, d}, false},
		{"eps of shape [1, 1, 1], x 2D", func(c *rmsChain) { c.epsDims = []int64{1, 1, 1} }, tensor.Shape{2, d}, tensor.Shape{1, 2, d}, true},
		{"eps of shape [1, 1, 1], x 3D", func(c *rmsChain) { c.epsDims = []int64{1, 1, 1} }, tensor.Shape{2, 3, d}, tensor.Shape{2, 3, d}, false},
		{"exponent of shape [1, 1, 1], x 2D", func(c *rmsChain) { c.powDims = []int64{1, 1, 1} }, tensor.Shape{2, d}, tensor.Shape{1, 2, d}, true},
		{"numerator of shape [1, 1, 1, 1], x 3D", func(c *rmsChain) { c.div, c.oneDims = true, []int64{1, 1, 1, 1} },
			tensor.Shape{2, 3, d}, tensor.Shape{1, 2, 3, d}, true},
		{"eps of shape [1], x 1D", func(c *rmsChain) { c.epsDims = []int64{1} }, tensor.Shape{d}, tensor.Shape{d}, false},
		{"weight broadcast over a last dimension of 1", func(*rmsChain) {}, tensor.Shape{2, 1}, tensor.Shape{2, d}, true},
	}
	rng := rand.New(rand.NewSource(5))
	for _, c := range cases {
		rc := defaultRMS()
		rc.anyShape = true
		c.edit(&rc)
		b := onnxtest.Bytes(rc.model())
		s, ref := fusedPair(t, c.name, b, "SimplifiedLayerNormalization", true, "Pow", "ReduceMean")
		x, _ := tensor.FromSlice(c.shape, randFloats(rng, c.shape.Size()))
		feeds := map[string]*tensor.Tensor{"in": x}
		got, _, err1 := s.Run(feeds, nil)
		want, _, err2 := ref.Run(feeds, nil)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v / %v", c.name, err1, err2)
		}
		if !want[0].Shape().Equal(c.want) || !got[0].Shape().Equal(c.want) {
			t.Fatalf("%s: shape %v, unfused %v, want %v", c.name, got[0].Shape(), want[0].Shape(), c.want)
		}
		g, w := got[0].Float32(), want[0].Float32()
		for i := range w {
			if math.Abs(float64(g[i]-w[i])) > 1e-6*math.Max(1, math.Abs(float64(w[i]))) {
				t.Fatalf("%s: [%d] = %v, unfused %v", c.name, i, g[i], w[i])
			}
		}
		found := false
		for _, n := range s.Plan().Nodes {
			if k, ok := n.Kernel.(*guardedKernel); ok {
				found = true
				if runs := k.chain.runs.Load(); (runs > 0) != c.chain {
					t.Errorf("%s: %d runs took the chain, want chain %v", c.name, runs, c.chain)
				}
			}
		}
		if !found {
			t.Errorf("%s: no guarded fused node in the plan", c.name)
		}
	}
}
