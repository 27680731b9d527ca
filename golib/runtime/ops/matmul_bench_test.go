package ops

import (
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// BenchmarkMatMulDecode: one token through a 1024x4096 projection whose
// weight is an initializer (pre-converted once for 16-bit types).
func BenchmarkMatMulDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float16} {
		b.Run(dt.String(), func(b *testing.B) {
			x := randT(r, tensor.Shape{1, 1, 1024})
			w := randT(r, tensor.Shape{1024, 4096})
			if dt != tensor.Float32 {
				x, w = convertT(x, dt), convertT(w, dt)
			}
			f, err := Lookup("", "MatMul", 13)
			if err != nil {
				b.Fatal(err)
			}
			n := &Node{OpType: "MatMul", Opset: 13, NumInputs: 2, NumOutputs: 1, InputPresent: []bool{true, true},
				OutputPresent: []bool{true}, Constants: []*tensor.Tensor{nil, w}}
			k, err := f(n)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(4 * 1024 * 4096)
			for b.Loop() {
				if err := k.Compute(NewContext([]*tensor.Tensor{x, w}, n.OutputPresent, 2, nil)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMatMulSmall: one token through the projections of a small
// Llama-style export (hidden 256, weights hot in L1/L2), the op with its
// context reused as the runtime reuses it, so a call's fixed cost shows.
func BenchmarkMatMulSmall(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range [][2]int{{256, 64}, {256, 256}, {256, 512}, {512, 256}, {256, 1024}} {
		b.Run(tensor.Shape{s[0], s[1]}.String(), func(b *testing.B) {
			x := randT(r, tensor.Shape{1, 1, s[0]})
			w := randT(r, tensor.Shape{s[0], s[1]})
			f, err := Lookup("", "MatMul", 13)
			if err != nil {
				b.Fatal(err)
			}
			n := &Node{OpType: "MatMul", Opset: 13, NumInputs: 2, NumOutputs: 1, InputPresent: []bool{true, true},
				OutputPresent: []bool{true}, Constants: []*tensor.Tensor{nil, w}}
			k, err := f(n)
			if err != nil {
				b.Fatal(err)
			}
			in := []*tensor.Tensor{x, w}
			ctx := NewContext(in, n.OutputPresent, 1, nil)
			b.SetBytes(int64(4 * s[0] * s[1]))
			b.ReportAllocs()
			for b.Loop() {
				ctx.Reset(in, n.OutputPresent, 1, nil, nil)
				if err := k.Compute(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMatMulPrefillSmall: a 16-token prompt through the projections of
// the tiny fixture exports (hidden 64, float32 and float16 weights as
// initializers), one and two threads, the context reused.
func BenchmarkMatMulPrefillSmall(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float16} {
		for _, s := range [][2]int{{64, 64}, {64, 128}, {128, 64}, {64, 256}} {
			for _, threads := range []int{1, 2} {
				b.Run(dt.String()+"/"+tensor.Shape{16, s[0], s[1]}.String()+"/threads="+string(rune('0'+threads)), func(b *testing.B) {
					x := randT(r, tensor.Shape{1, 16, s[0]})
					w := randT(r, tensor.Shape{s[0], s[1]})
					if dt != tensor.Float32 {
						x, w = convertT(x, dt), convertT(w, dt)
					}
					f, err := Lookup("", "MatMul", 13)
					if err != nil {
						b.Fatal(err)
					}
					n := &Node{OpType: "MatMul", Opset: 13, NumInputs: 2, NumOutputs: 1, InputPresent: []bool{true, true},
						OutputPresent: []bool{true}, Constants: []*tensor.Tensor{nil, w}}
					k, err := f(n)
					if err != nil {
						b.Fatal(err)
					}
					in := []*tensor.Tensor{x, w}
					ctx := NewContext(in, n.OutputPresent, threads, nil)
					b.ReportAllocs()
					for b.Loop() {
						ctx.Reset(in, n.OutputPresent, threads, nil, nil)
						if err := k.Compute(ctx); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}
