//go:build goexperiment.simd && amd64

package mha

import (
	"simd/archsimd"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// Every function of this package that runs 256- or 512-bit archsimd code calls
// archsimd.ClearAVXUpperBits (VZEROUPPER) when its vectors are done, before
// scalar float code and before returning (why, with the measurement: the same
// note in golib/cpu/gemm/simd_amd64.go).

// pickExp follows the gemm package's instruction-set choice, so OLKV_GEMM
// and gemm.SetPath switch the softmax too.
func pickExp() expFunc {
	switch gemm.Path() {
	case "avx512":
		return expSubAVX512
	case "avx2":
		return expSubAVX2
	}
	return expSubGo
}

// Polynomial and range-reduction constants shared with exp32.
const (
	expLog2e = 1.44269504088896341
	expLn2hi = 0.693359375
	expLn2lo = -2.12194440e-4
	expLo    = -87.33654
	expP0    = 1.9875691500e-4
	expP1    = 1.3981999507e-3
	expP2    = 8.3334519073e-3
	expP3    = 4.1665795894e-2
	expP4    = 1.6666665459e-1
	expP5    = 5.0000001201e-1
)

// exp16 holds the constants of exp32 in sixteen lanes; exp16.of is exp32
// lane by lane (e^d, 0 below expLo).
type exp16 struct {
	lo, l2e, nhi, nlo, c0, c1, c2, c3, c4, c5, one archsimd.Float32x16
	bias                                           archsimd.Int32x16
}

// init sets the constants in place: a constructor returning the struct was
// copied with legacy-SSE moves after 256-bit ops (see the ClearAVXUpperBits note
// in exp_simd_amd64.go).
func (c *exp16) init() {
	b := archsimd.BroadcastFloat32x16
	c.lo = b(expLo)
	c.l2e = b(expLog2e)
	c.nhi = b(-expLn2hi)
	c.nlo = b(-expLn2lo)
	c.c0 = b(expP0)
	c.c1 = b(expP1)
	c.c2 = b(expP2)
	c.c3 = b(expP3)
	c.c4 = b(expP4)
	c.c5 = b(expP5)
	c.one = b(1)
	c.bias = archsimd.BroadcastInt32x16(127)
}

func (c *exp16) of(d archsimd.Float32x16) archsimd.Float32x16 {
	keep := d.GreaterEqual(c.lo)
	x := d.Max(c.lo)
	k := x.Mul(c.l2e).RoundToEvenScaled(0)
	r := k.MulAdd(c.nhi, x)
	r = k.MulAdd(c.nlo, r)
	q := c.c0.MulAdd(r, c.c1)
	q = q.MulAdd(r, c.c2)
	q = q.MulAdd(r, c.c3)
	q = q.MulAdd(r, c.c4)
	q = q.MulAdd(r, c.c5)
	q = q.MulAdd(r.Mul(r), r.Add(c.one))
	scale := k.ConvertToInt32().Add(c.bias).ShiftAllLeft(23).AsFloat32x16()
	return q.Mul(scale).Masked(keep)
}

// exp8 is exp16 in eight lanes (AVX2).
type exp8 struct {
	lo, l2e, nhi, nlo, c0, c1, c2, c3, c4, c5, one archsimd.Float32x8
	bias                                           archsimd.Int32x8
}

// init sets the constants in place: a constructor returning the struct was
// copied with legacy-SSE moves after 256-bit ops (see the ClearAVXUpperBits note
// in exp_simd_amd64.go).
func (c *exp8) init() {
	b := archsimd.BroadcastFloat32x8
	c.lo = b(expLo)
	c.l2e = b(expLog2e)
	c.nhi = b(-expLn2hi)
	c.nlo = b(-expLn2lo)
	c.c0 = b(expP0)
	c.c1 = b(expP1)
	c.c2 = b(expP2)
	c.c3 = b(expP3)
	c.c4 = b(expP4)
	c.c5 = b(expP5)
	c.one = b(1)
	c.bias = archsimd.BroadcastInt32x8(127)
}

func (c *exp8) of(d archsimd.Float32x8) archsimd.Float32x8 {
	keep := d.GreaterEqual(c.lo)
	x := d.Max(c.lo)
	k := x.Mul(c.l2e).RoundToEven()
	r := k.MulAdd(c.nhi, x)
	r = k.MulAdd(c.nlo, r)
	q := c.c0.MulAdd(r, c.c1)
	q = q.MulAdd(r, c.c2)
	q = q.MulAdd(r, c.c3)
	q = q.MulAdd(r, c.c4)
	q = q.MulAdd(r, c.c5)
	q = q.MulAdd(r.Mul(r), r.Add(c.one))
	scale := k.ConvertToInt32().Add(c.bias).ShiftAllLeft(23).AsFloat32x8()
	return q.Mul(scale).Masked(keep)
}

// expSubAVX512 is expSubGo sixteen lanes at a time (same formula as exp32).
func expSubAVX512(row []float32, mx float32) float64 {
	n := len(row)
	p := unsafe.Pointer(unsafe.SliceData(row))
	var c exp16
	c.init()
	vmx := archsimd.BroadcastFloat32x16(mx)
	var acc archsimd.Float32x16
	i := 0
	for ; i+16 <= n; i += 16 {
		ptr := (*[16]float32)(unsafe.Add(p, uintptr(i)*4))
		e := c.of(archsimd.LoadFloat32x16(ptr).Sub(vmx))
		e.Store(ptr)
		acc = acc.Add(e)
	}
	var lanes [16]float32
	acc.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	var sum float64
	for _, v := range lanes {
		sum += float64(v)
	}
	return sum + expSubGo(row[i:], mx)
}

// expSubAVX2 is expSubAVX512 eight lanes at a time.
func expSubAVX2(row []float32, mx float32) float64 {
	n := len(row)
	p := unsafe.Pointer(unsafe.SliceData(row))
	var c exp8
	c.init()
	vmx := archsimd.BroadcastFloat32x8(mx)
	var acc archsimd.Float32x8
	i := 0
	for ; i+8 <= n; i += 8 {
		ptr := (*[8]float32)(unsafe.Add(p, uintptr(i)*4))
		e := c.of(archsimd.LoadFloat32x8(ptr).Sub(vmx))
		e.Store(ptr)
		acc = acc.Add(e)
	}
	var lanes [8]float32
	acc.Store(&lanes)
	archsimd.ClearAVXUpperBits()
	var sum float64
	for _, v := range lanes {
		sum += float64(v)
	}
	return sum + expSubGo(row[i:], mx)
}

// Sigmoid sets dst[i] = 1/(1+e^-src[i]) for i < len(src) (len(dst) >=
// len(src)) with the vector exponential of the softmax: e = e^-|x|, then
// 1/(1+e) for x >= 0 and e/(1+e) below, without branches. NaN stays NaN;
// below about -87.3 the result is 0. It follows gemm.Path like the softmax;
// sigmoidGo is the portable twin.
func Sigmoid(dst, src []float32) {
	switch gemm.Path() {
	case "avx512":
		sigmoidAVX512(dst, src)
	case "avx2":
		sigmoidAVX2(dst, src)
	default:
		sigmoidGo(dst, src)
	}
}

func sigmoidAVX512(dst, src []float32) {
	n := len(src)
	dst = dst[:n]
	ps, pd := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
	var c exp16
	c.init()
	zero := archsimd.BroadcastFloat32x16(0)
	i := 0
	for ; i+16 <= n; i += 16 {
		x := archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(ps, uintptr(i)*4)))
		e := c.of(x.Min(zero.Sub(x)))
		s := c.one.Div(c.one.Add(e))
		r := s.Merge(e.Mul(s), x.GreaterEqual(zero)).Merge(x, x.Equal(x))
		r.Store((*[16]float32)(unsafe.Add(pd, uintptr(i)*4)))
	}
	archsimd.ClearAVXUpperBits()
	sigmoidGo(dst[i:], src[i:])
}

func sigmoidAVX2(dst, src []float32) {
	n := len(src)
	dst = dst[:n]
	ps, pd := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
	var c exp8
	c.init()
	zero := archsimd.BroadcastFloat32x8(0)
	i := 0
	for ; i+8 <= n; i += 8 {
		x := archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(ps, uintptr(i)*4)))
		e := c.of(x.Min(zero.Sub(x)))
		s := c.one.Div(c.one.Add(e))
		r := s.Merge(e.Mul(s), x.GreaterEqual(zero)).Merge(x, x.Equal(x))
		r.Store((*[8]float32)(unsafe.Add(pd, uintptr(i)*4)))
	}
	archsimd.ClearAVXUpperBits()
	sigmoidGo(dst[i:], src[i:])
}
