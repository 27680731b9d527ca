//go:build goexperiment.simd && amd64

package gemm

import "unsafe"

// panelAVX512 runs the AVX-512 assembly panel kernels (panel_avx512_amd64.s):
// the m x 32 tile in zmm accumulators over the whole sliver, which is read
// once as one contiguous run, with the inner loop unrolled so that at
// least eight accumulators are in flight, and the tile added to out at the
// end (asmgen_panel512.py says why).
func panelAVX512(m, k int, a *[skinnyRows][]float32, p []float32, out *[skinnyRows][packNR]float32) {
	if k <= 0 || m <= 0 {
		return
	}
	pp := unsafe.SliceData(p[:k*packNR])
	row := func(i int) *float32 { return unsafe.SliceData(a[i][:k]) }
	switch m {
	case 1:
		panel1zasm(k, row(0), pp, &out[0][0])
	case 2:
		panel2zasm(k, row(0), row(1), pp, &out[0][0])
	case 3:
		panel3zasm(k, row(0), row(1), row(2), pp, &out[0][0])
	default:
		panel4zasm(k, row(0), row(1), row(2), row(3), pp, &out[0][0])
	}
}

// panelRowAVX512 is panelAVX512 for one row, adding into a single row.
func panelRowAVX512(k int, a []float32, p []float32, out *[packNR]float32) {
	if k <= 0 {
		return
	}
	panel1zasm(k, unsafe.SliceData(a[:k]), unsafe.SliceData(p[:k*packNR]), &out[0])
}

// panelRowAVX2 is panelAVX2 for one row, adding into a single row.
func panelRowAVX2(k int, a []float32, p []float32, out *[packNR]float32) {
	if k <= 0 {
		return
	}
	panel1asm(k, unsafe.SliceData(a[:k]), unsafe.SliceData(p[:k*packNR]), &out[0])
}

//go:generate sh -c "python3 asmgen_panel512.py > panel_avx512_amd64.s"

//go:noescape
func panel1zasm(k int, a0 *float32, p *float32, out *float32)

//go:noescape
func panel2zasm(k int, a0, a1 *float32, p *float32, out *float32)

//go:noescape
func panel3zasm(k int, a0, a1, a2 *float32, p *float32, out *float32)

//go:noescape
func panel4zasm(k int, a0, a1, a2, a3 *float32, p *float32, out *float32)

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
