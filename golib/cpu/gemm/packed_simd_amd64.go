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

// panelAVX2 is panelAVX512 with ymm vectors: one row keeps its 32 columns
// in four accumulators; more rows take the panel in two 16-column halves,
// four rows at a time (eight accumulators; amd64 Go code has 15 usable
// vector registers).
func panelAVX2(m, k int, a *[skinnyRows][]float32, p []float32, out *[skinnyRows][packNR]float32) {
	p = p[:k*packNR]
	pb := unsafe.Pointer(unsafe.SliceData(p))
	ld := func(off int) f8 {
		return archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(pb, off*4)))
	}
	if m == 1 {
		a0 := a[0][:k]
		var c0, c1, c2, c3 f8
		for l, av := range a0 {
			v := bcast8(av)
			o := l * packNR
			c0 = ld(o).MulAdd(v, c0)
			c1 = ld(o+8).MulAdd(v, c1)
			c2 = ld(o+16).MulAdd(v, c2)
			c3 = ld(o+24).MulAdd(v, c3)
		}
		o0 := (*[8]float32)(out[0][0:8])
		c0.Add(archsimd.LoadFloat32x8(o0)).Store(o0)
		o1 := (*[8]float32)(out[0][8:16])
		c1.Add(archsimd.LoadFloat32x8(o1)).Store(o1)
		o2 := (*[8]float32)(out[0][16:24])
		c2.Add(archsimd.LoadFloat32x8(o2)).Store(o2)
		o3 := (*[8]float32)(out[0][24:32])
		c3.Add(archsimd.LoadFloat32x8(o3)).Store(o3)
		return
	}
	var r [4][]float32
	for i := range 4 {
		r[i] = a[min(i, m-1)][:k]
	}
	r0, r1, r2, r3 := r[0], r[1], r[2], r[3]
	var tile [4][packNR]float32
	for h := 0; h < packNR; h += 16 {
		var c00, c01, c10, c11, c20, c21, c30, c31 f8
		for l := range k {
			o := l*packNR + h
			b0, b1 := ld(o), ld(o+8)
			v := bcast8(r0[l])
			c00 = b0.MulAdd(v, c00)
			c01 = b1.MulAdd(v, c01)
			v = bcast8(r1[l])
			c10 = b0.MulAdd(v, c10)
			c11 = b1.MulAdd(v, c11)
			v = bcast8(r2[l])
			c20 = b0.MulAdd(v, c20)
			c21 = b1.MulAdd(v, c21)
			v = bcast8(r3[l])
			c30 = b0.MulAdd(v, c30)
			c31 = b1.MulAdd(v, c31)
		}
		c00.Store((*[8]float32)(tile[0][h : h+8]))
		c01.Store((*[8]float32)(tile[0][h+8 : h+16]))
		c10.Store((*[8]float32)(tile[1][h : h+8]))
		c11.Store((*[8]float32)(tile[1][h+8 : h+16]))
		c20.Store((*[8]float32)(tile[2][h : h+8]))
		c21.Store((*[8]float32)(tile[2][h+8 : h+16]))
		c30.Store((*[8]float32)(tile[3][h : h+8]))
		c31.Store((*[8]float32)(tile[3][h+8 : h+16]))
	}
	for i := range m {
		for j := range packNR {
			out[i][j] += tile[i][j]
		}
	}
}
