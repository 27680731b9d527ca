//go:build goexperiment.simd && amd64

package gemm

import (
	"simd/archsimd"
	"unsafe"
)

var avx2Kernels = kernels{
	name:  "avx2",
	mr:    6,
	nr:    32,
	micro: microAVX2,

	microRows:  microRowsAVX2,
	microFirst: microFirstAVX2,
	axpy4:      axpy4AVX2,
	axpy:       axpyAVX2,
	dot:        dotAVX2,
	cvt16:      cvt16AVX2,
	panel:      panelAVX2,
}

type f8 = archsimd.Float32x8

func load8(s []float32) f8 { return archsimd.LoadFloat32x8((*[8]float32)(s[:8])) }

func bcast8(v float32) f8 { return archsimd.BroadcastFloat32x8(v) }

//go:generate sh -c "python3 asmgen_tile.py > tile_avx2_amd64.s"

//go:noescape
func micro6x16asm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int)

//go:noescape
func micro5x16asm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int)

//go:noescape
func micro4x16asm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int)

//go:noescape
func micro3x16asm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int)

//go:noescape
func micro2x16asm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int)

//go:noescape
func micro1x16asm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int)

//go:noescape
func micro6x16pfasm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int, pf int)

//go:noescape
func micro5x16pfasm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int, pf int)

//go:noescape
func micro4x16pfasm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int, pf int)

//go:noescape
func micro3x16pfasm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int, pf int)

//go:noescape
func micro2x16pfasm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int, pf int)

//go:noescape
func micro1x16pfasm(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int, pf int)

// microByRows are the generated N x 16 kernels (tile_avx2_amd64.s), index
// N-1.
var microByRows = [6]func(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int){
	micro1x16asm, micro2x16asm, micro3x16asm, micro4x16asm, micro5x16asm, micro6x16asm,
}

// microFirstByRows are microByRows with prefetches (the pf kernels).
var microFirstByRows = [6]func(kc int, a *float32, b *float32, bstride int, alpha float32, c *float32, ldc int, pf int){
	micro1x16pfasm, micro2x16pfasm, micro3x16pfasm, micro4x16pfasm, micro5x16pfasm, micro6x16pfasm,
}

// firstPrefetch is how far ahead, in bytes of the sliver, microFirstAVX2
// prefetches: 64 sliver rows. Forced AVX2 on a loaded Zen 4 (one thread,
// the decode step's weights cold, best of six interleaved runs), 32, 64
// and 128 rows ahead ran 5-row products in 26.1 / 26.0 / 28.5 ms and
// 16-row ones in 61.1 / 59.8 / 65.0 ms, against 43.0 and 81.5 ms without
// prefetching (the AVX-512 path: 25.6 and 53.9 ms).
const firstPrefetch = 64 * 4 * packNR

// microFirstAVX2 is microRowsAVX2 for a B sliver read from memory for the
// first time. The pass over the left 16 columns touches every other cache
// line of the sliver (its rows are 128 bytes), a walk the hardware
// prefetcher does not follow well, so it prefetches both lines of the sliver
// row 64 rows ahead; the right half then finds its lines in cache.
func microFirstAVX2(rows, kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	if kc <= 0 || rows <= 0 {
		return
	}
	rows = min(rows, 6)
	_, _, _ = ap[6*kc-1], bp[32*kc-1], c[(rows-1)*ldc+31]
	a, b := unsafe.SliceData(ap), unsafe.SliceData(bp)
	microFirstByRows[rows-1](kc, a, b, 4*32, alpha, unsafe.SliceData(c), ldc, firstPrefetch)
	microByRows[rows-1](kc, a, &bp[16], 4*32, alpha, &c[16], ldc)
}

// microAVX2 is the 6 x 32 tile as two passes of the assembly 6 x 16 kernel
// (micro6x16asm: twelve ymm accumulators, the most 16 registers hold with
// two B vectors and the broadcasts) over the two 16-column halves of the
// B sliver, with the A panel in L1 for both. A sliver packNR wide lets the
// blocked algorithm read PackB's panels on this path too. The archsimd
// 4 x 16 tile it replaces broadcast A through registers and could not hold
// more accumulators (Go code has 15 usable vector registers).
func microAVX2(kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	if kc <= 0 {
		return
	}
	_, _, _ = ap[6*kc-1], bp[32*kc-1], c[5*ldc+31]
	a, b := unsafe.SliceData(ap), unsafe.SliceData(bp)
	micro6x16asm(kc, a, b, 4*32, alpha, unsafe.SliceData(c), ldc)
	micro6x16asm(kc, a, &bp[16], 4*32, alpha, &c[16], ldc)
}

// microRowsAVX2 is microAVX2 for the first rows rows of the tile (1 <=
// rows <= 6), with the N x 16 kernel of that height.
func microRowsAVX2(rows, kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	if kc <= 0 || rows <= 0 {
		return
	}
	rows = min(rows, 6)
	_, _, _ = ap[6*kc-1], bp[32*kc-1], c[(rows-1)*ldc+31]
	a, b := unsafe.SliceData(ap), unsafe.SliceData(bp)
	f := microByRows[rows-1]
	f(kc, a, b, 4*32, alpha, unsafe.SliceData(c), ldc)
	f(kc, a, &bp[16], 4*32, alpha, &c[16], ldc)
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
