//go:build goexperiment.simd && amd64

package mha

import (
	"simd/archsimd"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// Gelu sets dst[i] = 0.5*src[i]*(erf(src[i]/sqrt 2) + 1) for i < len(src)
// (len(dst) >= len(src)); see gelu.go for the formula and its error. It
// follows gemm.Path like the softmax; geluGo is the portable twin.
func Gelu(dst, src []float32) {
	switch gemm.Path() {
	case "avx512":
		geluAVX512(dst, src, false)
	case "avx2":
		geluAVX2(dst, src, false)
	default:
		geluGo(dst, src)
	}
}

// GeluTanh sets dst[i] to the tanh approximation of GELU of src[i] (see
// gelu.go); geluTanhGo is the portable twin.
func GeluTanh(dst, src []float32) {
	switch gemm.Path() {
	case "avx512":
		geluAVX512(dst, src, true)
	case "avx2":
		geluAVX2(dst, src, true)
	default:
		geluTanhGo(dst, src)
	}
}

// erf16 holds erf32's constants in sixteen lanes.
type erf16 struct {
	split, b0, b1, b2, b3, b4, b5, b6, s0, s1, s2, s3, s4, s5, zero, half, r2, k, c archsimd.Float32x16
}

// init sets the constants in place: a constructor returning the struct was
// copied with legacy-SSE moves after 256-bit ops (see the ClearAVXUpperBits note
// in exp_simd_amd64.go).
func (c *erf16) init() {
	b := archsimd.BroadcastFloat32x16
	c.split = b(erfSplit)
	c.b0 = b(erfB0)
	c.b1 = b(erfB1)
	c.b2 = b(erfB2)
	c.b3 = b(erfB3)
	c.b4 = b(erfB4)
	c.b5 = b(erfB5)
	c.b6 = b(erfB6)
	c.s0 = b(erfS0)
	c.s1 = b(erfS1)
	c.s2 = b(erfS2)
	c.s3 = b(erfS3)
	c.s4 = b(erfS4)
	c.s5 = b(erfS5)
	c.zero = b(0)
	c.half = b(0.5)
	c.r2 = b(sqrt1_2)
	c.k = b(geluTanhK)
	c.c = b(geluTanhC)
}

// of is erf32 lane by lane.
func (e *erf16) of(c *exp16, a archsimd.Float32x16) archsimd.Float32x16 {
	t := a.Max(e.zero.Sub(a))
	s := a.Mul(a)
	r := e.b0.MulAdd(t, e.b1)
	u := e.b2.MulAdd(t, e.b3)
	r = r.MulAdd(s, u)
	r = r.MulAdd(t, e.b4)
	r = r.MulAdd(t, e.b5)
	r = r.MulAdd(t, e.b6)
	r = r.MulAdd(t, e.zero.Sub(t))
	big := c.one.Sub(c.of(r))
	big = big.Merge(e.zero.Sub(big), a.GreaterEqual(e.zero))
	p := e.s0.MulAdd(s, e.s1)
	p = p.MulAdd(s, e.s2)
	p = p.MulAdd(s, e.s3)
	p = p.MulAdd(s, e.s4)
	p = p.MulAdd(s, e.s5)
	return big.Merge(p.MulAdd(a, a), t.Greater(e.split))
}

func geluAVX512(dst, src []float32, tanh bool) {
	n := len(src)
	dst = dst[:n]
	ps, pd := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
	var c exp16
	var e erf16
	c.init()
	e.init()
	i := 0
	for ; i+16 <= n; i += 16 {
		x := archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(ps, uintptr(i)*4)))
		var y archsimd.Float32x16
		if tanh {
			u := e.k.Mul(e.c.Mul(x).Mul(x).MulAdd(x, x))
			q := c.of(u.Min(e.zero.Sub(u)))
			s := c.one.Div(c.one.Add(q))
			y = x.Mul(s.Merge(q.Mul(s), u.GreaterEqual(e.zero)))
		} else {
			y = e.half.Mul(x).Mul(e.of(&c, x.Mul(e.r2)).Add(c.one))
		}
		y.Store((*[16]float32)(unsafe.Add(pd, uintptr(i)*4)))
	}
	archsimd.ClearAVXUpperBits()
	if tanh {
		geluTanhGo(dst[i:], src[i:])
	} else {
		geluGo(dst[i:], src[i:])
	}
}

// erf8 is erf16 in eight lanes (AVX2).
type erf8 struct {
	split, b0, b1, b2, b3, b4, b5, b6, s0, s1, s2, s3, s4, s5, zero, half, r2, k, c archsimd.Float32x8
}

// init sets the constants in place: a constructor returning the struct was
// copied with legacy-SSE moves after 256-bit ops (see the ClearAVXUpperBits note
// in exp_simd_amd64.go).
func (c *erf8) init() {
	b := archsimd.BroadcastFloat32x8
	c.split = b(erfSplit)
	c.b0 = b(erfB0)
	c.b1 = b(erfB1)
	c.b2 = b(erfB2)
	c.b3 = b(erfB3)
	c.b4 = b(erfB4)
	c.b5 = b(erfB5)
	c.b6 = b(erfB6)
	c.s0 = b(erfS0)
	c.s1 = b(erfS1)
	c.s2 = b(erfS2)
	c.s3 = b(erfS3)
	c.s4 = b(erfS4)
	c.s5 = b(erfS5)
	c.zero = b(0)
	c.half = b(0.5)
	c.r2 = b(sqrt1_2)
	c.k = b(geluTanhK)
	c.c = b(geluTanhC)
}

func (e *erf8) of(c *exp8, a archsimd.Float32x8) archsimd.Float32x8 {
	t := a.Max(e.zero.Sub(a))
	s := a.Mul(a)
	r := e.b0.MulAdd(t, e.b1)
	u := e.b2.MulAdd(t, e.b3)
	r = r.MulAdd(s, u)
	r = r.MulAdd(t, e.b4)
	r = r.MulAdd(t, e.b5)
	r = r.MulAdd(t, e.b6)
	r = r.MulAdd(t, e.zero.Sub(t))
	big := c.one.Sub(c.of(r))
	big = big.Merge(e.zero.Sub(big), a.GreaterEqual(e.zero))
	p := e.s0.MulAdd(s, e.s1)
	p = p.MulAdd(s, e.s2)
	p = p.MulAdd(s, e.s3)
	p = p.MulAdd(s, e.s4)
	p = p.MulAdd(s, e.s5)
	return big.Merge(p.MulAdd(a, a), t.Greater(e.split))
}

func geluAVX2(dst, src []float32, tanh bool) {
	n := len(src)
	dst = dst[:n]
	ps, pd := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
	var c exp8
	var e erf8
	c.init()
	e.init()
	i := 0
	for ; i+8 <= n; i += 8 {
		x := archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(ps, uintptr(i)*4)))
		var y archsimd.Float32x8
		if tanh {
			u := e.k.Mul(e.c.Mul(x).Mul(x).MulAdd(x, x))
			q := c.of(u.Min(e.zero.Sub(u)))
			s := c.one.Div(c.one.Add(q))
			y = x.Mul(s.Merge(q.Mul(s), u.GreaterEqual(e.zero)))
		} else {
			y = e.half.Mul(x).Mul(e.of(&c, x.Mul(e.r2)).Add(c.one))
		}
		y.Store((*[8]float32)(unsafe.Add(pd, uintptr(i)*4)))
	}
	archsimd.ClearAVXUpperBits()
	if tanh {
		geluTanhGo(dst[i:], src[i:])
	} else {
		geluGo(dst[i:], src[i:])
	}
}
