package ops

import (
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func randT(r *rand.Rand, shape tensor.Shape) *tensor.Tensor {
	v := make([]float32, shape.Size())
	for i := range v {
		v[i] = float32(r.IntN(7) - 3) // small integers: exact in every path
	}
	return ft(shape, v...)
}

// naiveMatMul is numpy matmul written out with explicit broadcasting.
func naiveMatMul(t *testing.T, a, b *tensor.Tensor) []float32 {
	t.Helper()
	g, err := planMatMul(a.Shape(), b.Shape())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float64, g.out.Size())
	af, _ := tensor.AsFloat32(a)
	bf, _ := tensor.AsFloat32(b)
	matmulLoop(g, toF64(af), toF64(bf), out)
	res := make([]float32, len(out))
	for i, v := range out {
		res[i] = float32(v)
	}
	return res
}

func toF64(x []float32) []float64 {
	y := make([]float64, len(x))
	for i, v := range x {
		y[i] = float64(v)
	}
	return y
}

func TestMatMulBroadcast(t *testing.T) {
	cases := []struct {
		a, b, out tensor.Shape
	}{
		{tensor.Shape{3, 4}, tensor.Shape{4, 5}, tensor.Shape{3, 5}},
		{tensor.Shape{4}, tensor.Shape{4, 5}, tensor.Shape{5}},
		{tensor.Shape{3, 4}, tensor.Shape{4}, tensor.Shape{3}},
		{tensor.Shape{4}, tensor.Shape{4}, tensor.Shape{}},
		{tensor.Shape{2, 1, 3, 4}, tensor.Shape{4, 5}, tensor.Shape{2, 1, 3, 5}}, // folded
		{tensor.Shape{1, 1, 1024}, tensor.Shape{1024, 7}, tensor.Shape{1, 1, 7}}, // decode projection
		{tensor.Shape{2, 3, 4}, tensor.Shape{2, 4, 5}, tensor.Shape{2, 3, 5}},
		{tensor.Shape{2, 1, 3, 4}, tensor.Shape{3, 4, 6}, tensor.Shape{2, 3, 3, 6}},
		{tensor.Shape{3, 4}, tensor.Shape{2, 2, 4, 5}, tensor.Shape{2, 2, 3, 5}},
		{tensor.Shape{8, 1, 9}, tensor.Shape{8, 9, 17}, tensor.Shape{8, 1, 17}}, // batch-parallel path
		{tensor.Shape{2, 0, 4}, tensor.Shape{4, 5}, tensor.Shape{2, 0, 5}},
		{tensor.Shape{2, 3, 0}, tensor.Shape{0, 5}, tensor.Shape{2, 3, 5}},
	}
	r := rand.New(rand.NewPCG(1, 1))
	for _, c := range cases {
		a, b := randT(r, c.a), randT(r, c.b)
		want := naiveMatMul(t, a, b)
		for _, dt := range []tensor.DType{tensor.Float32, tensor.Float16, tensor.BFloat16} {
			ai, bi := a, b
			if dt != tensor.Float32 {
				ai, bi = convertT(a, dt), convertT(b, dt)
			}
			outs, err := call("MatMul", 13, nil, 1, ai, bi)
			if err != nil {
				t.Fatalf("%v x %v %v: %v", c.a, c.b, dt, err)
			}
			got := outs[0]
			if !got.Shape().Equal(c.out) || got.DType() != dt {
				t.Fatalf("%v x %v %v: shape %v dtype %v, want %v", c.a, c.b, dt, got.Shape(), got.DType(), c.out)
			}
			gf, _ := tensor.AsFloat32(got)
			for i := range want {
				if gf[i] != want[i] && dt == tensor.Float32 {
					t.Fatalf("%v x %v: [%d] = %v, want %v", c.a, c.b, i, gf[i], want[i])
				}
			}
		}
	}
}

func convertT(x *tensor.Tensor, dt tensor.DType) *tensor.Tensor {
	out, _ := tensor.New(dt, x.Shape())
	_ = tensor.FromFloat32(out, x.Float32())
	return out
}

func TestMatMulIntegerAndDouble(t *testing.T) {
	a, _ := tensor.FromSlice(tensor.Shape{2, 2}, []int64{1, 2, 3, 4})
	b, _ := tensor.FromSlice(tensor.Shape{2}, []int64{5, 6})
	outs, err := call("MatMul", 13, nil, 1, a, b)
	if err != nil || values(outs[0]) != "[17 39]" {
		t.Fatalf("int64: %v %v", err, values(outs[0]))
	}
	d, _ := tensor.FromSlice(tensor.Shape{1, 2}, []float64{0.5, 2})
	e, _ := tensor.FromSlice(tensor.Shape{2, 1}, []float64{4, 1})
	outs, err = call("MatMul", 13, nil, 1, d, e)
	if err != nil || values(outs[0]) != "[4]" {
		t.Fatalf("float64: %v %v", err, values(outs[0]))
	}
}

func TestMatMulErrors(t *testing.T) {
	cases := []struct {
		name string
		a, b *tensor.Tensor
		want error
	}{
		{"inner mismatch", ft(tensor.Shape{2, 3}, make([]float32, 6)...), ft(tensor.Shape{2, 3}, make([]float32, 6)...), errs.ErrShape},
		{"batch mismatch", ft(tensor.Shape{2, 1, 1}, 0, 0), ft(tensor.Shape{3, 1, 1}, 0, 0, 0), errs.ErrShape},
		{"scalar", ft(tensor.Shape{}, 1), ft(tensor.Shape{1}, 1), errs.ErrShape},
		{"type mismatch", ft(tensor.Shape{1}, 1), it(tensor.Shape{1}, 1), errs.ErrType},
		{"bool", bt(tensor.Shape{1}, true), bt(tensor.Shape{1}, true), errs.ErrType},
	}
	for _, c := range cases {
		if _, err := call("MatMul", 13, nil, 1, c.a, c.b); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}

// TestAttentionThreads: attention calls and batched products of a small
// model's decode step stay on one thread; calls with enough work for a
// second thread keep the caller's count.
func TestAttentionThreads(t *testing.T) {
	for _, c := range []struct {
		threads, rows, keys, dims, want int
	}{
		{2, 4, 33, 32, 1},     // tiny export: 4 heads, 33 positions, head_dim 16
		{2, 32, 4096, 256, 2}, // 32 heads over 4k positions
		{8, 1, 1 << 18, 1, 1}, // 2^18 multiply-adds: under 2*minSplitWork
		{8, 1, 1 << 18, 2, 8}, // exactly 2*minSplitWork
		{1, 32, 4096, 256, 1}, // one thread asked
		{2, 0, 4096, 256, 1},  // no rows
	} {
		if got := attentionThreads(c.threads, c.rows, c.keys, c.dims); got != c.want {
			t.Errorf("attentionThreads(%d, %d, %d, %d) = %d, want %d", c.threads, c.rows, c.keys, c.dims, got, c.want)
		}
	}
}
