//go:build goexperiment.simd && amd64

package gemm

import (
	"simd/archsimd"
	"unsafe"
)

var avx2Kernels = kernels{
	name:          "avx2",
	mr:            3,
	nr:            32,
	micro:         microAVX2,
	axpy4:         axpy4AVX2,
	axpy:          axpyAVX2,
	dot:           dotAVX2,
	cvt16:         cvt16AVX2,
	dequant:       dequantAVX2,
	panelQuantRow: panelQuantRowAVX2,
	panel:         panelAVX2,
	panelRow:      panelRowAVX2,

	sliverMajor:   true,
	microNext:     microNextAVX2,
	microHalfNext: microHalfNextAVX2,
	microRows:     microRowsAVX2,
	microHalf:     microHalfAVX2,
}

type f8 = archsimd.Float32x8

func load8(s []float32) f8 { return archsimd.LoadFloat32x8((*[8]float32)(s[:8])) }

func bcast8(v float32) f8 { return archsimd.BroadcastFloat32x8(v) }

//go:generate sh -c "python3 asmgen_tile.py > tile_avx2_amd64.s"

//go:noescape
func micro3x32asm(kc int, a *float32, b *float32, alpha float32, c *float32, ldc int)

//go:noescape
func micro2x32asm(kc int, a *float32, b *float32, alpha float32, c *float32, ldc int)

//go:noescape
func micro1x32asm(kc int, a *float32, b *float32, alpha float32, c *float32, ldc int)

// microAVX2 is the assembly 3 x 32 tile (micro3x32asm: twelve ymm
// accumulators, each 128-byte row of the B sliver read whole;
// asmgen_tile.py says why not 6 x 16). A sliver packNR wide lets the
// blocked algorithm read PackB's panels on this path too.
func microAVX2(kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	if kc <= 0 {
		return
	}
	_, _, _ = ap[3*kc-1], bp[32*kc-1], c[2*ldc+31]
	micro3x32asm(kc, unsafe.SliceData(ap), unsafe.SliceData(bp), alpha, unsafe.SliceData(c), ldc)
}

// microRowsAVX2 is microAVX2 for the first rows rows of the tile (1 <=
// rows <= 2), with the N x 32 kernel of that height.
func microRowsAVX2(rows, kc int, ap, bp []float32, alpha float32, c []float32, ldc int) {
	if kc <= 0 || rows <= 0 {
		return
	}
	_, _, _ = ap[3*kc-1], bp[32*kc-1], c[(min(rows, 3)-1)*ldc+31]
	a, b := unsafe.SliceData(ap), unsafe.SliceData(bp)
	switch rows {
	case 1:
		micro1x32asm(kc, a, b, alpha, unsafe.SliceData(c), ldc)
	case 2:
		micro2x32asm(kc, a, b, alpha, unsafe.SliceData(c), ldc)
	default:
		micro3x32asm(kc, a, b, alpha, unsafe.SliceData(c), ldc)
	}
}

//go:noescape
func micro3x32pfasm(kc int, a *float32, b *float32, alpha float32, c *float32, ldc int, next *float32, pfn int)

//go:noescape
func micro3x32f16pfasm(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int, next *uint16, pfn int)

//go:noescape
func micro3x32bf16pfasm(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int, next *uint16, pfn int)

// microNextAVX2 is microAVX2 prefetching next, len(next)/32 <= kc rows of
// the next sliver (micro3x32pfasm: the same loop with one row of next
// prefetched into L2 in each of its first steps), so a B streamed from
// memory arrives while the current sliver's panels run.
func microNextAVX2(kc int, ap, bp []float32, alpha float32, c []float32, ldc int, next []float32) {
	pfn := min(len(next)/32, kc)
	if kc <= 0 {
		return
	}
	_, _, _ = ap[3*kc-1], bp[32*kc-1], c[2*ldc+31]
	micro3x32pfasm(kc, unsafe.SliceData(ap), unsafe.SliceData(bp), alpha, unsafe.SliceData(c), ldc, unsafe.SliceData(next), pfn)
}

// microHalfNextAVX2 is microNextAVX2 over 16-bit slivers of encoding kind.
func microHalfNextAVX2(kind Half, kc int, ap []float32, bp []uint16, alpha float32, c []float32, ldc int, next []uint16) {
	if kc <= 0 {
		return
	}
	pfn := min(len(next)/32, kc)
	_, _, _ = ap[3*kc-1], bp[32*kc-1], c[2*ldc+31]
	f := micro3x32f16pfasm
	if kind == BFloat16 {
		f = micro3x32bf16pfasm
	}
	f(kc, unsafe.SliceData(ap), unsafe.SliceData(bp), alpha, unsafe.SliceData(c), ldc, unsafe.SliceData(next), pfn)
}

//go:noescape
func micro3x32f16asm(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int)

//go:noescape
func micro2x32f16asm(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int)

//go:noescape
func micro1x32f16asm(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int)

//go:noescape
func micro3x32bf16asm(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int)

//go:noescape
func micro2x32bf16asm(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int)

//go:noescape
func micro1x32bf16asm(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int)

// halfTiles are the 16-bit micro kernels of each encoding, index rows-1.
var halfTiles = [2][3]func(kc int, a *float32, b *uint16, alpha float32, c *float32, ldc int){
	{micro1x32f16asm, micro2x32f16asm, micro3x32f16asm},
	{micro1x32bf16asm, micro2x32bf16asm, micro3x32bf16asm},
}

// microHalfAVX2 is microRowsAVX2 over a 16-bit sliver (PackBHalf) of
// encoding kind, widened in registers.
func microHalfAVX2(kind Half, rows, kc int, ap []float32, bp []uint16, alpha float32, c []float32, ldc int) {
	if kc <= 0 || rows <= 0 {
		return
	}
	rows = min(rows, 3)
	_, _, _ = ap[3*kc-1], bp[32*kc-1], c[(rows-1)*ldc+31]
	e := 0
	if kind == BFloat16 {
		e = 1
	}
	halfTiles[e][rows-1](kc, unsafe.SliceData(ap), unsafe.SliceData(bp), alpha, unsafe.SliceData(c), ldc)
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
	archsimd.ClearAVXUpperBits()
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
	archsimd.ClearAVXUpperBits()
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
