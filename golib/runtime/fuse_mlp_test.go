package runtime

import (
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// mlpChain describes one variant of a Llama MLP's gate (the defaults are
// the exporters' form): g = MatMul(h, wg), u = MatMul(h, wu),
// y = Mul(Mul(g, Sigmoid(g)), u), h = Relu(in) so h is not a feed; and
// optionally a biased projection o = Add(MatMul(h, wo), bo).
type mlpChain struct {
	swap       bool  // operands of the Muls and the Add in the other order
	noGate     bool  // y = Mul(g, Sigmoid(g)) only
	gateOther  bool  // u = MatMul(in, wu): another A than g's
	gateWide   bool  // wu has another shape than wg (u broadcasts)
	sigOut     bool  // Sigmoid(g) is also a graph output
	siluOut    bool  // Mul(g, s) is also a graph output (with the gate)
	sigOther   bool  // Sigmoid reads u instead of g
	weightIn   bool  // wg is a graph input, not a constant
	bias       bool  // add the biased projection
	biasDims   []int // bo's shape (default [N])
	biasIn     bool  // bo is a graph input
	productOut bool  // MatMul(h, wo) is also a graph output
}

const mlpD, mlpF = 8, 12

func randFloats(rng *rand.Rand, n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = rng.Float32()*2 - 1
	}
	return v
}

func (c mlpChain) model() *onnxpb.ModelProto {
	rng := rand.New(rand.NewSource(5))
	pair := func(a, b string) []string {
		if c.swap {
			return []string{b, a}
		}
		return []string{a, b}
	}
	inputs := []*onnxpb.ValueInfoProto{onnxtest.Info("in", 1, -1, -1, mlpD)}
	var inits []*onnxpb.TensorProto
	if c.weightIn {
		inputs = append(inputs, onnxtest.Info("wg", 1, mlpD, mlpF))
	} else {
		inits = append(inits, onnxtest.Floats("wg", []int64{mlpD, mlpF}, randFloats(rng, mlpD*mlpF)))
	}
	if c.gateWide {
		inits = append(inits, onnxtest.Floats("wu", []int64{mlpD, 1}, randFloats(rng, mlpD)))
	} else {
		inits = append(inits, onnxtest.Floats("wu", []int64{mlpD, mlpF}, randFloats(rng, mlpD*mlpF)))
	}
	ua, sx := "h", "g"
	if c.gateOther {
		ua = "in"
	}
	if c.sigOther {
		sx = "u"
	}
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("Relu", []string{"in"}, []string{"h"}),
		onnxtest.Node("MatMul", []string{"h", "wg"}, []string{"g"}),
		onnxtest.Node("MatMul", []string{ua, "wu"}, []string{"u"}),
		onnxtest.Node("Sigmoid", []string{sx}, []string{"s"}),
		onnxtest.Node("Mul", pair("g", "s"), []string{"m"}),
	}
	outputs := []*onnxpb.ValueInfoProto{onnxtest.Info("y", 1, -1, -1, -1)}
	if c.noGate {
		nodes[len(nodes)-1].Output[0] = "y"
		outputs = append(outputs, onnxtest.Info("u", 1, -1, -1, -1))
	} else {
		nodes = append(nodes, onnxtest.Node("Mul", pair("m", "u"), []string{"y"}))
	}
	if c.sigOut {
		outputs = append(outputs, onnxtest.Info("s", 1, -1, -1, -1))
	}
	if c.siluOut {
		outputs = append(outputs, onnxtest.Info("m", 1, -1, -1, -1))
	}
	if c.bias {
		dims := c.biasDims
		if dims == nil {
			dims = []int{mlpF}
		}
		n := 1
		d64 := make([]int64, len(dims))
		for i, d := range dims {
			n *= d
			d64[i] = int64(d)
		}
		inits = append(inits, onnxtest.Floats("wo", []int64{mlpD, mlpF}, randFloats(rng, mlpD*mlpF)))
		if c.biasIn {
			inputs = append(inputs, onnxtest.Info("bo", 1, d64...))
		} else {
			inits = append(inits, onnxtest.Floats("bo", d64, randFloats(rng, n)))
		}
		nodes = append(nodes, onnxtest.Node("MatMul", []string{"h", "wo"}, []string{"p"}),
			onnxtest.Node("Add", pair("p", "bo"), []string{"o"}))
		outputs = append(outputs, onnxtest.Info("o", 1, -1, -1, -1))
		if c.productOut {
			outputs = append(outputs, onnxtest.Info("p", 1, -1, -1, -1))
		}
	}
	return onnxtest.Model(18, onnxtest.Graph(nodes, inputs, outputs, inits...), nil)
}

// TestFuseSiLUAndMatMulBias: the MLP gate is fused into SiLU (with or
// without the gate multiply) and the biased projection into MatMulBias in
// the forms the exporters write, and only where the match is proven; fused
// or not, the outputs are bit-identical to the unfused graph's
// (DisableFolding runs it as written), over several row counts.
func TestFuseSiLUAndMatMulBias(t *testing.T) {
	cases := []struct {
		name      string
		c         mlpChain
		silu      int // SiLU nodes expected
		gated     bool
		matmulAdd bool
	}{
		{"gated SiLU", mlpChain{}, 1, true, false},
		{"gated SiLU, operands swapped", mlpChain{swap: true}, 1, true, false},
		{"SiLU without a gate", mlpChain{noGate: true}, 1, false, false},
		{"gate from another A: SiLU alone", mlpChain{gateOther: true}, 1, false, false},
		{"gate broadcasts: SiLU alone", mlpChain{gateWide: true}, 1, false, false},
		{"SiLU output is a graph output: SiLU alone", mlpChain{siluOut: true}, 1, false, false},
		{"sigmoid is a graph output", mlpChain{sigOut: true}, 0, false, false},
		{"sigmoid of another value", mlpChain{sigOther: true}, 0, false, false},
		{"weight fed (type not proven)", mlpChain{weightIn: true}, 0, false, false},
		{"biased projection", mlpChain{bias: true}, 1, true, true},
		{"biased projection, Add swapped", mlpChain{bias: true, swap: true}, 1, true, true},
		{"bias of rank 2", mlpChain{bias: true, biasDims: []int{1, mlpF}}, 1, true, false},
		{"bias of another length", mlpChain{bias: true, biasDims: []int{1}}, 1, true, false},
		{"bias fed", mlpChain{bias: true, biasIn: true}, 1, true, false},
		{"product is a graph output", mlpChain{bias: true, productOut: true}, 1, true, false},
	}
	rng := rand.New(rand.NewSource(9))
	for _, c := range cases {
		b := onnxtest.Bytes(c.c.model())
		s, err := NewSessionFromBytes(b, Options{Threads: 1})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		plan := opTypes(s.Plan())
		t.Logf("%s: %s", c.name, plan)
		if got := strings.Count(plan, "SiLU"); got != c.silu {
			t.Errorf("%s: %d SiLU nodes, want %d (plan %s)", c.name, got, c.silu, plan)
		}
		if c.silu > 0 && strings.Contains(plan, "Sigmoid") {
			t.Errorf("%s: Sigmoid left next to SiLU: %s", c.name, plan)
		}
		muls := 0
		for _, op := range strings.Fields(plan) {
			if op == "Mul" {
				muls++
			}
		}
		if c.gated && muls != 0 {
			t.Errorf("%s: Mul left in a gated plan: %s", c.name, plan)
		}
		if got := strings.Contains(plan, "MatMulBias"); got != c.matmulAdd {
			t.Errorf("%s: MatMulBias = %v, want %v (plan %s)", c.name, got, c.matmulAdd, plan)
		}
		ref, err := NewSessionFromBytes(b, Options{Threads: 1, DisableFolding: true})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, shape := range []tensor.Shape{{1, 1, mlpD}, {2, 5, mlpD}, {1, 33, mlpD}, {1, 0, mlpD}} {
			in := make([]float32, shape.Size())
			for i := range in {
				in[i] = float32(rng.NormFloat64() * 4)
			}
			if len(in) >= 2 {
				in[0], in[1] = 90, -90 // the sigmoid's saturated ends
			}
			x, _ := tensor.FromSlice(shape, in)
			feeds := map[string]*tensor.Tensor{"in": x}
			if c.c.weightIn {
				feeds["wg"], _ = tensor.FromSlice(tensor.Shape{mlpD, mlpF}, randFloats(rng, mlpD*mlpF))
			}
			if c.c.biasIn {
				feeds["bo"], _ = tensor.FromSlice(tensor.Shape{mlpF}, randFloats(rng, mlpF))
			}
			got, _, err1 := s.Run(feeds, nil)
			want, _, err2 := ref.Run(feeds, nil)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s %v: %v / %v", c.name, shape, err1, err2)
			}
			for k := range want {
				g, w := got[k].Float32(), want[k].Float32()
				if !got[k].Shape().Equal(want[k].Shape()) {
					t.Fatalf("%s %v: output %d shape %v, unfused %v", c.name, shape, k, got[k].Shape(), want[k].Shape())
				}
				for i := range w {
					if math.Float32bits(g[i]) != math.Float32bits(w[i]) {
						t.Errorf("%s %v: output %d [%d] = %v, unfused %v", c.name, shape, k, i, g[i], w[i])
						break
					}
				}
			}
		}
	}
}
