package runtime

import (
	"encoding/binary"
	"math"
	"math/rand"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// halfRMSModel is the float16 TorchScript export's RMSNorm: x (of element
// type xType) cast to float32, the statistics, a Cast to float16, the
// float16 weight (d values). extraRead makes the float32 x a graph output
// too.
func halfRMSModel(xType int32, d int, extraRead bool) *onnxpb.ModelProto {
	return halfRMSModelEps(xType, d, extraRead, nil)
}

// halfRMSModelEps is halfRMSModel with an eps constant of shape epsDims.
func halfRMSModelEps(xType int32, d int, extraRead bool, epsDims []int64) *onnxpb.ModelProto {
	rng := rand.New(rand.NewSource(2))
	w := make([]float32, d)
	for i := range w {
		w[i] = 0.5 + rng.Float32()
	}
	bits := make([]uint16, d)
	codec.EncodeF16(bits, w)
	raw := make([]byte, 2*d)
	for i, b := range bits {
		binary.LittleEndian.PutUint16(raw[2*i:], b)
	}
	inits := []*onnxpb.TensorProto{
		onnxtest.Floats("two", nil, []float32{2}), onnxtest.Floats("eps", epsDims, []float32{1e-6}),
		onnxtest.Floats("one", nil, []float32{1}), onnxtest.Int64s("axes", []int64{1}, []int64{-1}),
		onnxtest.Raw("w", 10, []int64{int64(d)}, raw),
	}
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("Cast", []string{"x"}, []string{"x32"}, onnxtest.AttrInt("to", 1)),
		onnxtest.Node("Pow", []string{"x32", "two"}, []string{"q"}),
		onnxtest.Node("ReduceMean", []string{"q", "axes"}, []string{"m"}, onnxtest.AttrInt("keepdims", 1)),
		onnxtest.Node("Add", []string{"m", "eps"}, []string{"a"}),
		onnxtest.Node("Sqrt", []string{"a"}, []string{"s"}),
		onnxtest.Node("Div", []string{"one", "s"}, []string{"r"}),
		onnxtest.Node("Mul", []string{"x32", "r"}, []string{"n"}),
		onnxtest.Node("Cast", []string{"n"}, []string{"n16"}, onnxtest.AttrInt("to", 10)),
		onnxtest.Node("Mul", []string{"w", "n16"}, []string{"y"}),
	}
	outputs := []*onnxpb.ValueInfoProto{onnxtest.Info("y", 10, -1, -1, -1)}
	if extraRead {
		outputs = append(outputs, onnxtest.Info("x32", 1, -1, -1, -1))
	}
	return onnxtest.Model(18, onnxtest.Graph(nodes, []*onnxpb.ValueInfoProto{onnxtest.Info("x", xType, -1, -1, -1)},
		outputs, inits...), nil)
}

// TestFuseRMSNormHalf: the float16 chain becomes RMSNormHalf, whose own
// path serves float16 inputs covered by the weight (within one float16
// ulp of the chain) and the chain every other run (bit-identical).
func TestFuseRMSNormHalf(t *testing.T) {
	const d = 16
	cases := []struct {
		name   string
		xType  int32
		cols   int
		extra  bool
		fused  bool
		chain  bool // the fused kernel must take the chain
		approx bool // own path: within an ulp, not bit-identical
	}{
		{"float16 x", 10, d, false, true, false, true},
		{"float32 x (its no-op Cast is dropped): unfused", 1, d, false, false, false, false},
		{"bfloat16 x", 16, d, false, true, false, true},
		{"last axis of 1 broadcast by the weight: the chain", 10, 1, false, true, true, false},
		{"float32 x read elsewhere", 10, d, true, false, false, false},
	}
	rng := rand.New(rand.NewSource(4))
	for _, c := range cases {
		b := onnxtest.Bytes(halfRMSModel(c.xType, d, c.extra))
		s, err := NewSessionFromBytes(b, Options{Threads: 1})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		plan := opTypes(s.Plan())
		if got := strings.Contains(plan, "RMSNormHalf"); got != c.fused {
			t.Fatalf("%s: fused = %v, want %v (plan %s)", c.name, got, c.fused, plan)
		}
		if c.fused && plan != "RMSNormHalf" {
			t.Errorf("%s: plan %s", c.name, plan)
		}
		ref, err := NewSessionFromBytes(b, Options{Threads: 1, DisableFolding: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, rows := range []int{1, 3, 40} {
			v := make([]float32, rows*c.cols)
			for i := range v {
				v[i] = float32(rng.NormFloat64() * 3)
			}
			shape := tensor.Shape{1, rows, c.cols}
			x, _ := tensor.New(tensor.DType(c.xType), shape)
			if err := tensor.FromFloat32(x, v); err != nil {
				t.Fatal(err)
			}
			got, _, err1 := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
			want, _, err2 := ref.Run(map[string]*tensor.Tensor{"x": x}, nil)
			if err1 != nil || err2 != nil {
				t.Fatalf("%s: %v / %v", c.name, err1, err2)
			}
			g, _ := tensor.AsFloat32(got[0])
			w, _ := tensor.AsFloat32(want[0])
			if !got[0].Shape().Equal(want[0].Shape()) || got[0].DType() != want[0].DType() {
				t.Fatalf("%s: %v %v, unfused %v %v", c.name, got[0].DType(), got[0].Shape(), want[0].DType(), want[0].Shape())
			}
			for i := range w {
				tol := 0.0
				if c.approx {
					tol = math.Abs(float64(w[i])) * (1.0 / 1024) // one float16 ulp
				}
				if math.Abs(float64(g[i]-w[i])) > tol {
					t.Fatalf("%s rows %d: [%d] = %v, unfused %v", c.name, rows, i, g[i], w[i])
				}
			}
		}
		for _, n := range s.Plan().Nodes {
			if k, ok := n.Kernel.(*rmsNormHalf); ok {
				if runs := k.chain.runs.Load(); (runs > 0) != c.chain {
					t.Errorf("%s: %d runs took the chain, want chain %v", c.name, runs, c.chain)
				}
			}
		}
	}
}

// TestFuseRMSNormHalfRank: an eps of a higher rank than x broadcasts the
// chain's output up to its rank; the fused kernel takes the chain for such
// an x and returns its shape.
func TestFuseRMSNormHalfRank(t *testing.T) {
	const d = 16
	b := onnxtest.Bytes(halfRMSModelEps(10, d, false, []int64{1, 1, 1, 1}))
	s, ref := fusedPair(t, "eps of rank 4", b, "RMSNormHalf", true, "Pow")
	x, _ := tensor.New(tensor.Float16, tensor.Shape{1, 3, d})
	if err := tensor.FromFloat32(x, randFloats(rand.New(rand.NewSource(6)), 3*d)); err != nil {
		t.Fatal(err)
	}
	got, _, err1 := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
	want, _, err2 := ref.Run(map[string]*tensor.Tensor{"x": x}, nil)
	if err1 != nil || err2 != nil {
		t.Fatalf("%v / %v", err1, err2)
	}
	if sh := (tensor.Shape{1, 1, 3, d}); !want[0].Shape().Equal(sh) || !got[0].Shape().Equal(sh) {
		t.Fatalf("shape %v, unfused %v, want %v", got[0].Shape(), want[0].Shape(), sh)
	}
	g, _ := tensor.AsFloat32(got[0])
	w, _ := tensor.AsFloat32(want[0])
	for i := range w {
		if g[i] != w[i] {
			t.Fatalf("[%d] = %v, unfused %v", i, g[i], w[i])
		}
	}
}
