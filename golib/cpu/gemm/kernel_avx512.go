//go:build goexperiment.simd && amd64

package gemm

import (
	"simd/archsimd"
	"unsafe"
)

var avx512Kernels = kernels{
	name:  "avx512",
	mr:    8,
	nr:    32,
	micro: micro8AVX512,
	axpy4: axpy4AVX512,
	axpy:  axpyAVX512,
	dot:   dotAVX512,
	cvt16: cvt16AVX512,
	// the ymm dequantization (products of 2+ rows, widened a sliver at a
	// time, are not bound by it); the one-row product in zmm
	dequant:       dequantAVX2,
	panelQuantRow: panelQuantRowAVX512,

	axpy4Half: axpy4HalfAVX512,
	axpy8:     axpy8AVX512,
	axpy8m:    axpy8mAVX512,
	panel:     panelAVX512,
	panelRow:  panelRowAVX512,
}

type f16 = archsimd.Float32x16

func load16(s []float32) f16 { return archsimd.LoadFloat32x16((*[16]float32)(s[:16])) }

func bcast16(v float32) f16 { return archsimd.BroadcastFloat32x16(v) }

//go:noescape
func micro8asm(kc int, a *float32, b *float32, alpha float32, c *float32, ldc int)

// micro8AVX512 is the assembly 8 x 32 micro kernel (micro8asm). The
// archsimd 4 x 32 tile it replaces broadcast A through registers (the
// compiler's vector register budget spilled larger tiles) and ran a
// 64-token prefill of the demo decoder at about 57 GFLOP/s per core.
func micro8AVX512(kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	if kc <= 0 {
		return
	}
	_, _, _ = ap[8*kc-1], bp[32*kc-1], c[7*ldc+31]
	micro8asm(kc, unsafe.SliceData(ap), unsafe.SliceData(bp), alpha, unsafe.SliceData(c), ldc)
}

// axpy4AVX512 streams four rows of B into y. Pointer arithmetic replaces
// per-step slicing (bounds are checked once) so the loop is loads and FMAs.
func axpy4AVX512(a0, a1, a2, a3 float32, x0, x1, x2, x3, y []float32) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	v0, v1, v2, v3 := bcast16(a0), bcast16(a1), bcast16(a2), bcast16(a3)
	p0, p1 := unsafe.Pointer(unsafe.SliceData(x0)), unsafe.Pointer(unsafe.SliceData(x1))
	p2, p3 := unsafe.Pointer(unsafe.SliceData(x2)), unsafe.Pointer(unsafe.SliceData(x3))
	py := unsafe.Pointer(unsafe.SliceData(y))
	i := 0
	for ; i+16 <= n; i += 16 {
		off := uintptr(i) * 4
		acc := archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(py, off)))
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p0, off))).MulAdd(v0, acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p1, off))).MulAdd(v1, acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p2, off))).MulAdd(v2, acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p3, off))).MulAdd(v3, acc)
		acc.Store((*[16]float32)(unsafe.Add(py, off)))
	}
	archsimd.ClearAVXUpperBits()
	if i < n {
		axpy4Go(a0, a1, a2, a3, x0[i:], x1[i:], x2[i:], x3[i:], y[i:])
	}
}

func axpyAVX512(a float32, x, y []float32) {
	n := len(y)
	x = x[:n]
	v := bcast16(a)
	i := 0
	for ; i+16 <= n; i += 16 {
		load16(x[i:]).MulAdd(v, load16(y[i:])).Store((*[16]float32)(y[i : i+16]))
	}
	archsimd.ClearAVXUpperBits()
	if i < n {
		axpyGo(a, x[i:], y[i:])
	}
}

func dotAVX512(x, y []float32) float32 {
	n := len(x)
	y = y[:n]
	px, py := unsafe.Pointer(unsafe.SliceData(x)), unsafe.Pointer(unsafe.SliceData(y))
	ld := func(p unsafe.Pointer, i int) f16 {
		return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, uintptr(i)*4)))
	}
	var s0, s1, s2, s3 f16
	i := 0
	for ; i+64 <= n; i += 64 {
		s0 = ld(px, i).MulAdd(ld(py, i), s0)
		s1 = ld(px, i+16).MulAdd(ld(py, i+16), s1)
		s2 = ld(px, i+32).MulAdd(ld(py, i+32), s2)
		s3 = ld(px, i+48).MulAdd(ld(py, i+48), s3)
	}
	for ; i+16 <= n; i += 16 {
		s0 = ld(px, i).MulAdd(ld(py, i), s0)
	}
	var lanes [16]float32
	s0.Add(s1).Add(s2.Add(s3)).Store(&lanes)
	archsimd.ClearAVXUpperBits()
	var s float32
	for _, v := range lanes {
		s += v
	}
	if i < n {
		s += dotGo(x[i:], y[i:])
	}
	return s
}

// axpy8AVX512 adds sum_r a[r]*x[r] to y for eight rows of B: one load and
// store of y per eight rows, eight concurrent read streams.
func axpy8AVX512(a *[8]float32, x *[8][]float32, y []float32) {
	n := len(y)
	var p [8]unsafe.Pointer
	var v [8]f16
	for r := range 8 {
		p[r] = unsafe.Pointer(unsafe.SliceData(x[r][:n]))
		v[r] = bcast16(a[r])
	}
	py := unsafe.Pointer(unsafe.SliceData(y))
	i := 0
	for ; i+16 <= n; i += 16 {
		off := uintptr(i) * 4
		acc := archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(py, off)))
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p[0], off))).MulAdd(v[0], acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p[1], off))).MulAdd(v[1], acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p[2], off))).MulAdd(v[2], acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p[3], off))).MulAdd(v[3], acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p[4], off))).MulAdd(v[4], acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p[5], off))).MulAdd(v[5], acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p[6], off))).MulAdd(v[6], acc)
		acc = archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p[7], off))).MulAdd(v[7], acc)
		acc.Store((*[16]float32)(unsafe.Add(py, off)))
	}
	archsimd.ClearAVXUpperBits()
	if i < n {
		axpy4Go(a[0], a[1], a[2], a[3], x[0][i:n], x[1][i:n], x[2][i:n], x[3][i:n], y[i:])
		axpy4Go(a[4], a[5], a[6], a[7], x[4][i:n], x[5][i:n], x[6][i:n], x[7][i:n], y[i:])
	}
}

// axpy8mAVX512 is axpy8AVX512 for m rows of C: the eight B vectors of a
// column step are loaded once and feed every row (m passes of axpy8 read B
// m times from L2, which capped four-row products at about half the
// streaming bandwidth). The m*8 broadcast factors live in a stack array:
// there are not enough vector registers for them and the eight B vectors.
func axpy8mAVX512(m int, a *[skinnyRows][8]float32, x *[8][]float32, y *[skinnyRows][]float32) {
	m = min(m, skinnyRows)
	n := len(y[0])
	var p [8]unsafe.Pointer
	for r := range 8 {
		p[r] = unsafe.Pointer(unsafe.SliceData(x[r][:n]))
	}
	var v [skinnyRows][8]f16
	var py [skinnyRows]unsafe.Pointer
	for i := range m {
		py[i] = unsafe.Pointer(unsafe.SliceData(y[i][:n]))
		for r := range 8 {
			v[i][r] = bcast16(a[i][r])
		}
	}
	ld := func(q unsafe.Pointer, off uintptr) f16 {
		return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(q, off)))
	}
	i := 0
	for ; i+16 <= n; i += 16 {
		off := uintptr(i) * 4
		b0, b1, b2, b3 := ld(p[0], off), ld(p[1], off), ld(p[2], off), ld(p[3], off)
		b4, b5, b6, b7 := ld(p[4], off), ld(p[5], off), ld(p[6], off), ld(p[7], off)
		for r := range m {
			w := &v[r]
			acc := ld(py[r], off)
			acc = b0.MulAdd(w[0], acc)
			acc = b1.MulAdd(w[1], acc)
			acc = b2.MulAdd(w[2], acc)
			acc = b3.MulAdd(w[3], acc)
			acc = b4.MulAdd(w[4], acc)
			acc = b5.MulAdd(w[5], acc)
			acc = b6.MulAdd(w[6], acc)
			acc = b7.MulAdd(w[7], acc)
			acc.Store((*[16]float32)(unsafe.Add(py[r], off)))
		}
	}
	archsimd.ClearAVXUpperBits()
	if i < n {
		for r := range m {
			ar := &a[r]
			axpy4Go(ar[0], ar[1], ar[2], ar[3], x[0][i:n], x[1][i:n], x[2][i:n], x[3][i:n], y[r][i:n])
			axpy4Go(ar[4], ar[5], ar[6], ar[7], x[4][i:n], x[5][i:n], x[6][i:n], x[7][i:n], y[r][i:n])
		}
	}
}
