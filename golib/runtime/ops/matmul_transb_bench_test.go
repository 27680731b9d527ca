package ops

import (
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// BenchmarkMatMulTransB times a decode step's q x k^T of the tiny fixture
// decoders (4 heads of 32, 40 keys, float32) as one transposed product
// against Transpose then MatMul.
func BenchmarkMatMulTransB(b *testing.B) {
	rng := rand.New(rand.NewSource(1))
	mk := func(s tensor.Shape) *tensor.Tensor {
		v := make([]float32, s.Size())
		for i := range v {
			v[i] = rng.Float32()
		}
		t, _ := tensor.FromSlice(s, v)
		return t
	}
	q, k := mk(tensor.Shape{1, 4, 1, 32}), mk(tensor.Shape{1, 4, 40, 32})
	b.Run("fused", func(b *testing.B) {
		ctx := NewContext([]*tensor.Tensor{q, k}, []bool{true}, 1, nil)
		for b.Loop() {
			ctx.Reset([]*tensor.Tensor{q, k}, []bool{true}, 1, nil, nil)
			if _, err := MatMulTransB(ctx, q, k); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("transpose+matmul", func(b *testing.B) {
		tf, _ := Lookup("", "Transpose", 13)
		tk, _ := tf(&Node{OpType: "Transpose", Opset: 13, Attrs: Attributes{"perm": {Type: AttrInts, Ints: []int64{0, 1, 3, 2}}},
			NumInputs: 1, NumOutputs: 1, InputPresent: []bool{true}, OutputPresent: []bool{true}, Constants: make([]*tensor.Tensor, 1)})
		tctx := NewContext([]*tensor.Tensor{k}, []bool{true}, 1, nil)
		ctx := NewContext(nil, []bool{true}, 1, nil)
		for b.Loop() {
			tctx.Reset([]*tensor.Tensor{k}, []bool{true}, 1, nil, nil)
			if err := tk.Compute(tctx); err != nil {
				b.Fatal(err)
			}
			ctx.Reset([]*tensor.Tensor{q, tctx.Output(0)}, []bool{true}, 1, nil, nil)
			if _, err := matmulCompute(ctx, nil); err != nil {
				b.Fatal(err)
			}
		}
	})
}
