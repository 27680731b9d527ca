package ops

import (
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// BenchmarkAttentionDecode: one decode step of one layer on the tensor path
// (16 query heads over 8 KV heads of 64, past of 1024), per element type.
func BenchmarkAttentionDecode(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	rnd := func(shape tensor.Shape, dt tensor.DType) *tensor.Tensor {
		v := make([]float32, shape.Size())
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		t, _ := tensor.New(dt, shape)
		_ = tensor.FromFloat32(t, v)
		return t
	}
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float16} {
		b.Run(dt.String(), func(b *testing.B) {
			in := []*tensor.Tensor{rnd(tensor.Shape{1, 16, 1, 64}, dt), rnd(tensor.Shape{1, 8, 1, 64}, dt),
				rnd(tensor.Shape{1, 8, 1, 64}, dt), nil, rnd(tensor.Shape{1, 8, 1024, 64}, dt), rnd(tensor.Shape{1, 8, 1024, 64}, dt)}
			f, err := Lookup("", "Attention", 23)
			if err != nil {
				b.Fatal(err)
			}
			n := &Node{OpType: "Attention", Opset: 23, Attrs: attrs(intA("is_causal", 1)), NumInputs: 6, NumOutputs: 3,
				InputPresent: []bool{true, true, true, false, true, true}, OutputPresent: []bool{true, true, true},
				Constants: make([]*tensor.Tensor, 6)}
			k, err := f(n)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if err := k.Compute(NewContext(in, n.OutputPresent, 2, nil)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkAttentionSmall: one decode step of one layer of a small export
// (four query heads over one KV head of 64, 48 keys with a boolean mask, no
// past inputs: the dynamo exporter's Attention after its KV Concat), the
// context reused as the runtime reuses it, so the call's fixed cost shows.
func BenchmarkAttentionSmall(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	mask, _ := tensor.New(tensor.Bool, tensor.Shape{1, 1, 1, 48})
	for i := range mask.Bool() {
		mask.Bool()[i] = true
	}
	in := []*tensor.Tensor{randT(r, tensor.Shape{1, 4, 1, 64}), randT(r, tensor.Shape{1, 1, 48, 64}),
		randT(r, tensor.Shape{1, 1, 48, 64}), mask}
	f, err := Lookup("", "Attention", 23)
	if err != nil {
		b.Fatal(err)
	}
	n := &Node{OpType: "Attention", Opset: 23, Attrs: attrs(fltA("scale", 0.125)), NumInputs: 4, NumOutputs: 1,
		InputPresent: []bool{true, true, true, true}, OutputPresent: []bool{true}, Constants: make([]*tensor.Tensor, 4)}
	k, err := f(n)
	if err != nil {
		b.Fatal(err)
	}
	ctx := NewContext(in, n.OutputPresent, 1, nil)
	b.ReportAllocs()
	for b.Loop() {
		ctx.Reset(in, n.OutputPresent, 1, nil, nil)
		if err := k.Compute(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAttentionSmallPrefill is BenchmarkAttentionSmall for a 16-token
// prompt: 16 query rows over 16 keys, the exporter's causal boolean mask
// [1, 1, 16, 16].
func BenchmarkAttentionSmallPrefill(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	const t = 16
	mask, _ := tensor.New(tensor.Bool, tensor.Shape{1, 1, t, t})
	for i := range t {
		for j := range t {
			mask.Bool()[i*t+j] = j <= i
		}
	}
	in := []*tensor.Tensor{randT(r, tensor.Shape{1, 4, t, 64}), randT(r, tensor.Shape{1, 1, t, 64}),
		randT(r, tensor.Shape{1, 1, t, 64}), mask}
	f, err := Lookup("", "Attention", 23)
	if err != nil {
		b.Fatal(err)
	}
	n := &Node{OpType: "Attention", Opset: 23, Attrs: attrs(fltA("scale", 0.125)), NumInputs: 4, NumOutputs: 1,
		InputPresent: []bool{true, true, true, true}, OutputPresent: []bool{true}, Constants: make([]*tensor.Tensor, 4)}
	k, err := f(n)
	if err != nil {
		b.Fatal(err)
	}
	ctx := NewContext(in, n.OutputPresent, 1, nil)
	b.ReportAllocs()
	for b.Loop() {
		ctx.Reset(in, n.OutputPresent, 1, nil, nil)
		if err := k.Compute(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
