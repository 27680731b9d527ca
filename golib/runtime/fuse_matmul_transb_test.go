package runtime

import (
	"math"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestFuseMatMulTransB: MatMul(a, Transpose(b)) over b's last two axes
// becomes one MatMulTransB node that reads b in place, for float32 and
// float16 and broadcast batches; integer products take the chain; other
// permutations and a transposed value read elsewhere stay unfused. The
// outputs equal the unfused graph's within float32 rounding (exactly for
// the chain).
func TestFuseMatMulTransB(t *testing.T) {
	cases := []struct {
		name         string
		perm         []int64
		dt           int32
		aShape, bShp tensor.Shape // b as fed (before the Transpose)
		tOut         bool
		fused        bool
		fallback     bool
	}{
		{"q x k^T (decode)", []int64{0, 1, 3, 2}, 1, tensor.Shape{1, 4, 1, 32}, tensor.Shape{1, 4, 37, 32}, false, true, false},
		{"q x k^T (prompt, broadcast batch)", []int64{0, 1, 3, 2}, 1, tensor.Shape{2, 4, 5, 8}, tensor.Shape{1, 4, 9, 8}, false, true, false},
		{"2-D", []int64{1, 0}, 1, tensor.Shape{3, 6}, tensor.Shape{5, 6}, false, true, false},
		{"float16", []int64{0, 1, 3, 2}, 10, tensor.Shape{1, 2, 1, 16}, tensor.Shape{1, 2, 7, 16}, false, true, false},
		{"int64: the chain", []int64{0, 2, 1}, 7, tensor.Shape{2, 3, 4}, tensor.Shape{2, 5, 4}, false, true, true},
		{"other permutation", []int64{0, 2, 1, 3}, 1, tensor.Shape{1, 4, 1, 8}, tensor.Shape{1, 8, 4, 1}, false, false, false},
		{"transposed value is a graph output", []int64{0, 1, 3, 2}, 1, tensor.Shape{1, 4, 1, 32}, tensor.Shape{1, 4, 37, 32}, true, false, false},
	}
	rng := rand.New(rand.NewSource(9))
	for _, c := range cases {
		nodes := []*onnxpb.NodeProto{
			onnxtest.Node("Transpose", []string{"b"}, []string{"bt"}, onnxtest.AttrInts("perm", c.perm...)),
			onnxtest.Node("MatMul", []string{"a", "bt"}, []string{"y"}),
		}
		dims := func(s tensor.Shape) []int64 {
			d := make([]int64, len(s))
			for i := range d {
				d[i] = -1
			}
			return d
		}
		outputs := []*onnxpb.ValueInfoProto{onnxtest.Info("y", c.dt, dims(c.aShape)...)}
		if c.tOut {
			outputs = append(outputs, onnxtest.Info("bt", c.dt, dims(c.bShp)...))
		}
		g := onnxtest.Graph(nodes, []*onnxpb.ValueInfoProto{onnxtest.Info("a", c.dt, dims(c.aShape)...),
			onnxtest.Info("b", c.dt, dims(c.bShp)...)}, outputs)
		b := onnxtest.Bytes(onnxtest.Model(18, g, nil))
		s, ref := fusedPair(t, c.name, b, "MatMulTransB", c.fused)
		mk := func(shape tensor.Shape) *tensor.Tensor {
			v := randFloats(rng, shape.Size())
			var x *tensor.Tensor
			switch c.dt {
			case 7:
				iv := make([]int64, len(v))
				for i := range v {
					iv[i] = int64(v[i] * 10)
				}
				x, _ = tensor.FromSlice(shape, iv)
			case 10:
				x, _ = tensor.New(tensor.Float16, shape)
				_ = tensor.FromFloat32(x, v)
			default:
				x, _ = tensor.FromSlice(shape, v)
			}
			return x
		}
		feeds := map[string]*tensor.Tensor{"a": mk(c.aShape), "b": mk(c.bShp)}
		got, _, err1 := s.Run(feeds, nil)
		want, _, err2 := ref.Run(feeds, nil)
		if err1 != nil || err2 != nil {
			t.Fatalf("%s: %v / %v", c.name, err1, err2)
		}
		for k := range want {
			if !got[k].Shape().Equal(want[k].Shape()) {
				t.Fatalf("%s: shape %v, unfused %v", c.name, got[k].Shape(), want[k].Shape())
			}
			if c.dt == 7 {
				g, w := got[k].Int64(), want[k].Int64()
				for i := range w {
					if g[i] != w[i] {
						t.Fatalf("%s: [%d] = %v, unfused %v", c.name, i, g[i], w[i])
					}
				}
				continue
			}
			g, _ := tensor.AsFloat32(got[k])
			w, _ := tensor.AsFloat32(want[k])
			tol := 1e-5
			if c.dt == 10 {
				tol = 2e-3 // float16 results rounded from float32 sums of another order
			}
			for i := range w {
				if math.Abs(float64(g[i]-w[i])) > tol*(1+math.Abs(float64(w[i]))) {
					t.Fatalf("%s: [%d] = %v, unfused %v", c.name, i, g[i], w[i])
				}
			}
		}
		if !c.fused {
			continue
		}
		for _, n := range s.Plan().Nodes {
			if k, ok := n.Kernel.(*matmulTransB); ok {
				if fb := k.chain.runs.Load(); (fb > 0) != c.fallback {
					t.Errorf("%s: %d runs took the chain, want fallback %v", c.name, fb, c.fallback)
				}
			}
		}
	}
}
