//go:build goexperiment.simd && amd64

package gemm

import (
	"simd/archsimd"
	"unsafe"
)

var avx2Kernels = kernels{
	name:  "avx2",
	mr:    4,
	nr:    16,
	micro: microAVX2,
	axpy4: axpy4AVX2,
	axpy:  axpyAVX2,
	dot:   dotAVX2,
	cvt16: cvt16AVX2,
	panel: panelAVX2,
}

type f8 = archsimd.Float32x8

func load8(s []float32) f8 { return archsimd.LoadFloat32x8((*[8]float32)(s[:8])) }

func bcast8(v float32) f8 { return archsimd.BroadcastFloat32x8(v) }

// microAVX2 keeps a 4x16 tile in 8 ymm accumulators (amd64 Go code has 15
// usable vector registers: X15 is reserved as zero). Loads use pointer
// arithmetic after one bounds check.
func microAVX2(kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	if kc <= 0 {
		return
	}
	_, _ = ap[4*kc-1], bp[16*kc-1]
	pa, pb := unsafe.Pointer(unsafe.SliceData(ap)), unsafe.Pointer(unsafe.SliceData(bp))
	var c00, c01, c10, c11, c20, c21, c30, c31 f8
	for l := range kc {
		b := unsafe.Add(pb, l*64)
		b0 := archsimd.LoadFloat32x8((*[8]float32)(b))
		b1 := archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(b, 32)))
		a := (*[4]float32)(unsafe.Add(pa, l*16))
		a0 := bcast8(a[0])
		c00 = b0.MulAdd(a0, c00)
		c01 = b1.MulAdd(a0, c01)
		a1 := bcast8(a[1])
		c10 = b0.MulAdd(a1, c10)
		c11 = b1.MulAdd(a1, c11)
		a2 := bcast8(a[2])
		c20 = b0.MulAdd(a2, c20)
		c21 = b1.MulAdd(a2, c21)
		a3 := bcast8(a[3])
		c30 = b0.MulAdd(a3, c30)
		c31 = b1.MulAdd(a3, c31)
	}
	al := bcast8(alpha)
	store8x2(c[0*ldc:], al, c00, c01)
	store8x2(c[1*ldc:], al, c10, c11)
	store8x2(c[2*ldc:], al, c20, c21)
	store8x2(c[3*ldc:], al, c30, c31)
}

// store8x2 does c[0:16] += alpha * (v0, v1).
func store8x2(c []float32, al, v0, v1 f8) {
	c = c[:16]
	v0.MulAdd(al, load8(c[:8])).Store((*[8]float32)(c[:8]))
	v1.MulAdd(al, load8(c[8:])).Store((*[8]float32)(c[8:]))
}

func axpy4AVX2(a0, a1, a2, a3 float32, x0, x1, x2, x3, y []float32) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	v0, v1, v2, v3 := bcast8(a0), bcast8(a1), bcast8(a2), bcast8(a3)
	p0, p1 := unsafe.Pointer(unsafe.SliceData(x0)), unsafe.Pointer(unsafe.SliceData(x1))
	p2, p3 := unsafe.Pointer(unsafe.SliceData(x2)), unsafe.Pointer(unsafe.SliceData(x3))
	py := unsafe.Pointer(unsafe.SliceData(y))
	i := 0
	for ; i+8 <= n; i += 8 {
		off := uintptr(i) * 4
		acc := archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(py, off)))
		acc = archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p0, off))).MulAdd(v0, acc)
		acc = archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p1, off))).MulAdd(v1, acc)
		acc = archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p2, off))).MulAdd(v2, acc)
		acc = archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p3, off))).MulAdd(v3, acc)
		acc.Store((*[8]float32)(unsafe.Add(py, off)))
	}
	if i < n {
		axpy4Go(a0, a1, a2, a3, x0[i:], x1[i:], x2[i:], x3[i:], y[i:])
	}
}

func axpyAVX2(a float32, x, y []float32) {
	n := len(y)
	x = x[:n]
	v := bcast8(a)
	i := 0
	for ; i+8 <= n; i += 8 {
		load8(x[i:]).MulAdd(v, load8(y[i:])).Store((*[8]float32)(y[i : i+8]))
	}
	if i < n {
		axpyGo(a, x[i:], y[i:])
	}
}

func dotAVX2(x, y []float32) float32 {
	n := len(x)
	y = y[:n]
	px, py := unsafe.Pointer(unsafe.SliceData(x)), unsafe.Pointer(unsafe.SliceData(y))
	ld := func(p unsafe.Pointer, i int) f8 {
		return archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p, uintptr(i)*4)))
	}
	var s0, s1, s2, s3 f8
	i := 0
	for ; i+32 <= n; i += 32 {
		s0 = ld(px, i).MulAdd(ld(py, i), s0)
		s1 = ld(px, i+8).MulAdd(ld(py, i+8), s1)
		s2 = ld(px, i+16).MulAdd(ld(py, i+16), s2)
		s3 = ld(px, i+24).MulAdd(ld(py, i+24), s3)
	}
	for ; i+8 <= n; i += 8 {
		s0 = ld(px, i).MulAdd(ld(py, i), s0)
	}
	var lanes [8]float32
	s0.Add(s1).Add(s2.Add(s3)).Store(&lanes)
	var s float32
	for _, v := range lanes {
		s += v
	}
	if i < n {
		s += dotGo(x[i:], y[i:])
	}
	return s
}
