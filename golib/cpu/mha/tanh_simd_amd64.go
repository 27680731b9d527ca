//go:build goexperiment.simd && amd64

package mha

import (
	"simd/archsimd"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// Tanh sets dst[i] = tanh(src[i]) for i < len(src) (len(dst) >= len(src);
// dst may be src); see tanh.go for the formula and its error. It follows
// gemm.Path like the softmax; tanhGo is the portable twin.
func Tanh(dst, src []float32) {
	switch gemm.Path() {
	case "avx512":
		tanhAVX512(dst, src)
	case "avx2":
		tanhAVX2(dst, src)
	default:
		tanhGo(dst, src)
	}
}

func tanhAVX512(dst, src []float32) {
	n := len(src)
	dst = dst[:n]
	ps, pd := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
	var c exp16
	c.init()
	b := archsimd.BroadcastFloat32x16
	zero, split, m2 := b(0), b(tanhSplit), b(-2)
	k := [9]archsimd.Float32x16{b(tanhC19), b(tanhC17), b(tanhC15), b(tanhC13), b(tanhC11), b(tanhC9),
		b(tanhC7), b(tanhC5), b(tanhC3)}
	i := 0
	for ; i+16 <= n; i += 16 {
		x := archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(ps, uintptr(i)*4)))
		a := x.Max(zero.Sub(x))
		s := x.Mul(x)
		p := k[0]
		for _, q := range k[1:] {
			p = p.MulAdd(s, q)
		}
		small := s.Mul(p).MulAdd(x, x)
		e := c.of(a.Mul(m2))
		y := c.one.Sub(e).Div(c.one.Add(e))
		big := y.Merge(zero.Sub(y), x.GreaterEqual(zero))
		r := x.Merge(big.Merge(small, a.GreaterEqual(split)), x.Equal(zero))
		r.Store((*[16]float32)(unsafe.Add(pd, uintptr(i)*4)))
	}
	archsimd.ClearAVXUpperBits()
	tanhGo(dst[i:], src[i:])
}

func tanhAVX2(dst, src []float32) {
	n := len(src)
	dst = dst[:n]
	ps, pd := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
	var c exp8
	c.init()
	b := archsimd.BroadcastFloat32x8
	zero, split, m2 := b(0), b(tanhSplit), b(-2)
	k := [9]archsimd.Float32x8{b(tanhC19), b(tanhC17), b(tanhC15), b(tanhC13), b(tanhC11), b(tanhC9),
		b(tanhC7), b(tanhC5), b(tanhC3)}
	i := 0
	for ; i+8 <= n; i += 8 {
		x := archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(ps, uintptr(i)*4)))
		a := x.Max(zero.Sub(x))
		s := x.Mul(x)
		p := k[0]
		for _, q := range k[1:] {
			p = p.MulAdd(s, q)
		}
		small := s.Mul(p).MulAdd(x, x)
		e := c.of(a.Mul(m2))
		y := c.one.Sub(e).Div(c.one.Add(e))
		big := y.Merge(zero.Sub(y), x.GreaterEqual(zero))
		r := x.Merge(big.Merge(small, a.GreaterEqual(split)), x.Equal(zero))
		r.Store((*[8]float32)(unsafe.Add(pd, uintptr(i)*4)))
	}
	archsimd.ClearAVXUpperBits()
	tanhGo(dst[i:], src[i:])
}
