//go:build goexperiment.simd && amd64

package gemm

import (
	"simd/archsimd"
	"unsafe"
)

// panelAVX512 keeps the m x 32 tile in zmm accumulators over the whole
// panel, which it reads once as one contiguous run, and adds the tile to
// out at the end. One row uses four accumulators (two steps of the inner
// dimension in flight) so the FMA latency does not bound the stream; more
// rows run four at a time (a missing row repeats the last one and its
// result is ignored).
func panelAVX512(m, k int, a *[skinnyRows][]float32, p []float32, out *[skinnyRows][packNR]float32) {
	p = p[:k*packNR]
	pb := unsafe.Pointer(unsafe.SliceData(p))
	ld := func(off int) f16 {
		return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(pb, off*4)))
	}
	if m == 1 {
		a0 := a[0][:k]
		var c0, c1, d0, d1 f16
		l := 0
		for ; l+2 <= k; l += 2 {
			v0, v1 := bcast16(a0[l]), bcast16(a0[l+1])
			o := l * packNR
			c0 = ld(o).MulAdd(v0, c0)
			c1 = ld(o+16).MulAdd(v0, c1)
			d0 = ld(o+32).MulAdd(v1, d0)
			d1 = ld(o+48).MulAdd(v1, d1)
		}
		if l < k {
			v0 := bcast16(a0[l])
			c0 = ld(l*packNR).MulAdd(v0, c0)
			c1 = ld(l*packNR+16).MulAdd(v0, c1)
		}
		o0, o1 := (*[16]float32)(out[0][:16]), (*[16]float32)(out[0][16:])
		c0.Add(d0).Add(archsimd.LoadFloat32x16(o0)).Store(o0)
		c1.Add(d1).Add(archsimd.LoadFloat32x16(o1)).Store(o1)
		return
	}
	var r [4][]float32
	for i := range 4 {
		r[i] = a[min(i, m-1)][:k]
	}
	r0, r1, r2, r3 := r[0], r[1], r[2], r[3]
	var c00, c01, c10, c11, c20, c21, c30, c31 f16
	for l := range k {
		o := l * packNR
		b0, b1 := ld(o), ld(o+16)
		v := bcast16(r0[l])
		c00 = b0.MulAdd(v, c00)
		c01 = b1.MulAdd(v, c01)
		v = bcast16(r1[l])
		c10 = b0.MulAdd(v, c10)
		c11 = b1.MulAdd(v, c11)
		v = bcast16(r2[l])
		c20 = b0.MulAdd(v, c20)
		c21 = b1.MulAdd(v, c21)
		v = bcast16(r3[l])
		c30 = b0.MulAdd(v, c30)
		c31 = b1.MulAdd(v, c31)
	}
	add := func(i int, lo, hi f16) {
		o0, o1 := (*[16]float32)(out[i][:16]), (*[16]float32)(out[i][16:])
		lo.Add(archsimd.LoadFloat32x16(o0)).Store(o0)
		hi.Add(archsimd.LoadFloat32x16(o1)).Store(o1)
	}
	add(0, c00, c01)
	if m > 1 {
		add(1, c10, c11)
	}
	if m > 2 {
		add(2, c20, c21)
	}
	if m > 3 {
		add(3, c30, c31)
	}
}

//go:noescape
func panel1asm(k int, a *float32, p *float32, out *float32)

//go:noescape
func panel2asm(k int, a0, a1 *float32, p *float32, out *float32)

//go:generate sh -c "python3 asmgen_panel.py > panel_avx2_amd64.s"

//go:noescape
func panel3asm(k int, a0, a1, a2 *float32, p *float32, out *float32)

//go:noescape
func panel4asm(k int, a0, a1, a2, a3 *float32, p *float32, out *float32)

// panelAVX2 runs the assembly panel kernels: one row keeps its 32 columns
// in eight accumulators (two steps in flight), two rows share every load
// of the sliver, three rows hold 3 x 32 columns in twelve accumulators in
// one pass, and four rows run in one pass too, the fourth row's sums kept
// in out (panel_avx2_amd64.s; asmgen_panel.py says why).
func panelAVX2(m, k int, a *[skinnyRows][]float32, p []float32, out *[skinnyRows][packNR]float32) {
	if k <= 0 || m <= 0 {
		return
	}
	pp := unsafe.SliceData(p[:k*packNR])
	row := func(i int) *float32 { return unsafe.SliceData(a[i][:k]) }
	switch m {
	case 1:
		panel1asm(k, row(0), pp, &out[0][0])
	case 2:
		panel2asm(k, row(0), row(1), pp, &out[0][0])
	case 3:
		panel3asm(k, row(0), row(1), row(2), pp, &out[0][0])
	default:
		panel4asm(k, row(0), row(1), row(2), row(3), pp, &out[0][0])
	}
}

//go:noescape
func panel1f16asm(k int, a *float32, p *uint16, out *float32)

//go:noescape
func panel2f16asm(k int, a0, a1 *float32, p *uint16, out *float32)

//go:noescape
func panel1bf16asm(k int, a *float32, p *uint16, out *float32)

//go:noescape
func panel2bf16asm(k int, a0, a1 *float32, p *uint16, out *float32)

//go:noescape
func panel3f16asm(k int, a0, a1, a2 *float32, p *uint16, out *float32)

//go:noescape
func panel3bf16asm(k int, a0, a1, a2 *float32, p *uint16, out *float32)

//go:noescape
func panel4f16asm(k int, a0, a1, a2, a3 *float32, p *uint16, out *float32)

//go:noescape
func panel4bf16asm(k int, a0, a1, a2, a3 *float32, p *uint16, out *float32)

// halfPanels are the 16-bit panel kernels of one encoding, by row count.
type halfPanels struct {
	p1 func(k int, a *float32, p *uint16, out *float32)
	p2 func(k int, a0, a1 *float32, p *uint16, out *float32)
	p3 func(k int, a0, a1, a2 *float32, p *uint16, out *float32)
	p4 func(k int, a0, a1, a2, a3 *float32, p *uint16, out *float32)
}

var (
	f16Panels  = halfPanels{panel1f16asm, panel2f16asm, panel3f16asm, panel4f16asm}
	bf16Panels = halfPanels{panel1bf16asm, panel2bf16asm, panel3bf16asm, panel4bf16asm}
)

// panelHalfAVX2 is panelAVX2 over a 16-bit sliver, widened in registers
// (F16C for float16), rows grouped as there.
func panelHalfAVX2(kind Half, m, k int, a *[skinnyRows][]float32, p []uint16, out *[skinnyRows][packNR]float32) {
	if k <= 0 || m <= 0 {
		return
	}
	ks := &f16Panels
	if kind == BFloat16 {
		ks = &bf16Panels
	}
	pp := unsafe.SliceData(p[:k*packNR])
	row := func(i int) *float32 { return unsafe.SliceData(a[i][:k]) }
	switch m {
	case 1:
		ks.p1(k, row(0), pp, &out[0][0])
	case 2:
		ks.p2(k, row(0), row(1), pp, &out[0][0])
	case 3:
		ks.p3(k, row(0), row(1), row(2), pp, &out[0][0])
	default:
		ks.p4(k, row(0), row(1), row(2), row(3), pp, &out[0][0])
	}
}
