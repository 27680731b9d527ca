//go:build goexperiment.simd && amd64

package mha

import (
	"simd/archsimd"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

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

// expSubAVX512 is expSubGo sixteen lanes at a time (same formula as exp32).
func expSubAVX512(row []float32, mx float32) float64 {
	n := len(row)
	p := unsafe.Pointer(unsafe.SliceData(row))
	b := archsimd.BroadcastFloat32x16
	vmx, lo, l2e := b(mx), b(expLo), b(expLog2e)
	nhi, nlo := b(-expLn2hi), b(-expLn2lo)
	c0, c1, c2, c3, c4, c5, one := b(expP0), b(expP1), b(expP2), b(expP3), b(expP4), b(expP5), b(1)
	bias := archsimd.BroadcastInt32x16(127)
	var acc archsimd.Float32x16
	i := 0
	for ; i+16 <= n; i += 16 {
		ptr := (*[16]float32)(unsafe.Add(p, uintptr(i)*4))
		d := archsimd.LoadFloat32x16(ptr).Sub(vmx)
		keep := d.GreaterEqual(lo)
		x := d.Max(lo)
		k := x.Mul(l2e).RoundToEvenScaled(0)
		r := k.MulAdd(nhi, x)
		r = k.MulAdd(nlo, r)
		q := c0.MulAdd(r, c1)
		q = q.MulAdd(r, c2)
		q = q.MulAdd(r, c3)
		q = q.MulAdd(r, c4)
		q = q.MulAdd(r, c5)
		q = q.MulAdd(r.Mul(r), r.Add(one))
		scale := k.ConvertToInt32().Add(bias).ShiftAllLeft(23).AsFloat32x16()
		e := q.Mul(scale).Masked(keep)
		e.Store(ptr)
		acc = acc.Add(e)
	}
	var lanes [16]float32
	acc.Store(&lanes)
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
	b := archsimd.BroadcastFloat32x8
	vmx, lo, l2e := b(mx), b(expLo), b(expLog2e)
	nhi, nlo := b(-expLn2hi), b(-expLn2lo)
	c0, c1, c2, c3, c4, c5, one := b(expP0), b(expP1), b(expP2), b(expP3), b(expP4), b(expP5), b(1)
	bias := archsimd.BroadcastInt32x8(127)
	var acc archsimd.Float32x8
	i := 0
	for ; i+8 <= n; i += 8 {
		ptr := (*[8]float32)(unsafe.Add(p, uintptr(i)*4))
		d := archsimd.LoadFloat32x8(ptr).Sub(vmx)
		keep := d.GreaterEqual(lo)
		x := d.Max(lo)
		k := x.Mul(l2e).RoundToEven()
		r := k.MulAdd(nhi, x)
		r = k.MulAdd(nlo, r)
		q := c0.MulAdd(r, c1)
		q = q.MulAdd(r, c2)
		q = q.MulAdd(r, c3)
		q = q.MulAdd(r, c4)
		q = q.MulAdd(r, c5)
		q = q.MulAdd(r.Mul(r), r.Add(one))
		scale := k.ConvertToInt32().Add(bias).ShiftAllLeft(23).AsFloat32x8()
		e := q.Mul(scale).Masked(keep)
		e.Store(ptr)
		acc = acc.Add(e)
	}
	var lanes [8]float32
	acc.Store(&lanes)
	var sum float64
	for _, v := range lanes {
		sum += float64(v)
	}
	return sum + expSubGo(row[i:], mx)
}
