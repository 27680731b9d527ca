package ops

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// BenchmarkSigmoidMLP is the SiLU gate of one decode step (intermediate
// size 2736).
func BenchmarkSigmoidMLP(b *testing.B) {
	x, _ := tensor.New(tensor.Float32, tensor.Shape{1, 1, 2736})
	for i := range x.Float32() {
		x.Float32()[i] = float32(i%200-100) / 17
	}
	f, _ := Lookup("", "Sigmoid", 13)
	k, _ := f(&Node{OpType: "Sigmoid", Opset: 13, Attrs: Attributes{}, NumInputs: 1, NumOutputs: 1})
	b.SetBytes(int64(2 * x.NumBytes()))
	for b.Loop() {
		ctx := NewContext([]*tensor.Tensor{x}, []bool{true}, 1, nil)
		if err := k.Compute(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRMSNormDecode is one RMSNormalization of a decode step (hidden
// 1024, one token).
func BenchmarkRMSNormDecode(b *testing.B) {
	x, _ := tensor.New(tensor.Float32, tensor.Shape{1, 1, 1024})
	scale, _ := tensor.New(tensor.Float32, tensor.Shape{1024})
	for i := range x.Float32() {
		x.Float32()[i] = float32(i%13) - 6
		scale.Float32()[i] = 1
	}
	f, _ := Lookup("", "RMSNormalization", 23)
	k, _ := f(&Node{OpType: "RMSNormalization", Opset: 23, Attrs: Attributes{}, NumInputs: 2, NumOutputs: 1})
	for b.Loop() {
		ctx := NewContext([]*tensor.Tensor{x, scale}, []bool{true}, 1, nil)
		if err := k.Compute(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
