//go:build goexperiment.simd && amd64

package mha

import (
	"math"
	"simd/archsimd"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// pickStream follows the gemm package's instruction-set choice, like pickExp.
func pickStream() *streamKernels {
	switch gemm.Path() {
	case "avx512":
		return &avx512StreamKernels
	case "avx2":
		return &avx2StreamKernels
	}
	return &goStreamKernels
}

var (
	avx512StreamKernels = streamKernels{dots: dotsAVX512, accum: accumAVX512, maxOf: maxOfAVX512, nonFinite: nonFiniteAVX512}
	avx2StreamKernels   = streamKernels{dots: dotsAVX2, accum: accumAVX2, maxOf: maxOfAVX2, nonFinite: nonFiniteAVX2}
)

// maxOfAVX512 is maxOfGo with sixteen lanes: the running maximum and
// sum(0*x) side by side.
func maxOfAVX512(s []float32) float32 {
	if len(s) < 16 {
		return maxOfGo(s)
	}
	zero := archsimd.BroadcastFloat32x16(0)
	m, z := load16(s), zero
	i := 0
	for ; i+16 <= len(s); i += 16 {
		x := load16(s[i:])
		m = m.Max(x)
		z = x.MulAdd(zero, z)
	}
	if z.NotEqual(zero).ToBits() != 0 {
		return float32(math.NaN())
	}
	var t [16]float32
	m.Store(&t)
	mx := t[0]
	for _, x := range t[1:] {
		mx = max(mx, x)
	}
	if i < len(s) {
		r := maxOfGo(s[i:])
		if r != r {
			return r
		}
		mx = max(mx, r)
	}
	return mx
}

// maxOfAVX2 is maxOfAVX512 with eight lanes.
func maxOfAVX2(s []float32) float32 {
	if len(s) < 8 {
		return maxOfGo(s)
	}
	zero := archsimd.BroadcastFloat32x8(0)
	m, z := load8(s), zero
	i := 0
	for ; i+8 <= len(s); i += 8 {
		x := load8(s[i:])
		m = m.Max(x)
		z = x.MulAdd(zero, z)
	}
	if z.NotEqual(zero).ToBits() != 0 {
		return float32(math.NaN())
	}
	var t [8]float32
	m.Store(&t)
	mx := t[0]
	for _, x := range t[1:] {
		mx = max(mx, x)
	}
	if i < len(s) {
		r := maxOfGo(s[i:])
		if r != r {
			return r
		}
		mx = max(mx, r)
	}
	return mx
}

// nonFiniteAVX512 is nonFiniteGo with sixteen lanes: sum(0*x), NaN exactly
// when one x is NaN or infinite.
func nonFiniteAVX512(s []float32) bool {
	if len(s) < 16 {
		return nonFiniteGo(s)
	}
	zero := archsimd.BroadcastFloat32x16(0)
	z0, z1 := zero, zero
	i := 0
	for ; i+32 <= len(s); i += 32 {
		z0 = load16(s[i:]).MulAdd(zero, z0)
		z1 = load16(s[i+16:]).MulAdd(zero, z1)
	}
	for ; i+16 <= len(s); i += 16 {
		z0 = load16(s[i:]).MulAdd(zero, z0)
	}
	return z0.Add(z1).NotEqual(zero).ToBits() != 0 || nonFiniteGo(s[i:])
}

// nonFiniteAVX2 is nonFiniteAVX512 with eight lanes.
func nonFiniteAVX2(s []float32) bool {
	if len(s) < 8 {
		return nonFiniteGo(s)
	}
	zero := archsimd.BroadcastFloat32x8(0)
	z0, z1 := zero, zero
	i := 0
	for ; i+16 <= len(s); i += 16 {
		z0 = load8(s[i:]).MulAdd(zero, z0)
		z1 = load8(s[i+8:]).MulAdd(zero, z1)
	}
	for ; i+8 <= len(s); i += 8 {
		z0 = load8(s[i:]).MulAdd(zero, z0)
	}
	return z0.Add(z1).NotEqual(zero).ToBits() != 0 || nonFiniteGo(s[i:])
}

// hsum4x8 returns the lane sums of a, b, c and d: two rounds of pairwise
// horizontal adds leave each sum split over the two 128-bit halves.
func hsum4x8(a, b, c, d archsimd.Float32x8) archsimd.Float32x4 {
	s := a.AddPairsGrouped(b).AddPairsGrouped(c.AddPairsGrouped(d))
	return s.GetLo().Add(s.GetHi())
}

// fold16 adds the two 256-bit halves of x.
func fold16(x archsimd.Float32x16) archsimd.Float32x8 { return x.GetLo().Add(x.GetHi()) }

// dotsAVX512 scores four keys at a time (four independent FMA chains, one
// horizontal reduction for the four); head dims that are not a multiple of
// 16 use the portable loop.
func dotsAVX512(dst, q, k []float32, n, dk int) {
	if dk%16 != 0 || n <= 0 {
		dotsGo(dst, q, k, n, dk)
		return
	}
	_, _, _ = dst[n-1], q[dk-1], k[n*dk-1]
	pq, pk := unsafe.Pointer(unsafe.SliceData(q)), unsafe.Pointer(unsafe.SliceData(k))
	ld := func(p unsafe.Pointer, i int) archsimd.Float32x16 {
		return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, uintptr(i)*4)))
	}
	t := 0
	for ; t+4 <= n; t += 4 {
		var a, b, c, d archsimd.Float32x16
		r := t * dk
		for j := 0; j < dk; j += 16 {
			qv := ld(pq, j)
			a = ld(pk, r+j).MulAdd(qv, a)
			b = ld(pk, r+dk+j).MulAdd(qv, b)
			c = ld(pk, r+2*dk+j).MulAdd(qv, c)
			d = ld(pk, r+3*dk+j).MulAdd(qv, d)
		}
		hsum4x8(fold16(a), fold16(b), fold16(c), fold16(d)).Store((*[4]float32)(dst[t : t+4]))
	}
	if t < n {
		dotsGo(dst[t:n], q, k[t*dk:], n-t, dk)
	}
}

// accumAVX512 keeps 64 columns of acc in four registers over all n value
// rows; head dims that are not a multiple of 16 use the portable loop.
func accumAVX512(acc, p, v []float32, n, dv int) {
	if dv%16 != 0 || n <= 0 {
		accumGo(acc, p, v, n, dv)
		return
	}
	_, _, _ = acc[dv-1], p[n-1], v[n*dv-1]
	pv := unsafe.Pointer(unsafe.SliceData(v))
	ld := func(i int) archsimd.Float32x16 {
		return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(pv, uintptr(i)*4)))
	}
	j := 0
	for ; j+64 <= dv; j += 64 {
		a0, a1 := load16(acc[j:]), load16(acc[j+16:])
		a2, a3 := load16(acc[j+32:]), load16(acc[j+48:])
		for t := range n {
			w := archsimd.BroadcastFloat32x16(p[t])
			r := t*dv + j
			a0 = ld(r).MulAdd(w, a0)
			a1 = ld(r+16).MulAdd(w, a1)
			a2 = ld(r+32).MulAdd(w, a2)
			a3 = ld(r+48).MulAdd(w, a3)
		}
		a0.Store((*[16]float32)(acc[j : j+16]))
		a1.Store((*[16]float32)(acc[j+16 : j+32]))
		a2.Store((*[16]float32)(acc[j+32 : j+48]))
		a3.Store((*[16]float32)(acc[j+48 : j+64]))
	}
	for ; j < dv; j += 16 {
		a := load16(acc[j:])
		for t := range n {
			a = ld(t*dv+j).MulAdd(archsimd.BroadcastFloat32x16(p[t]), a)
		}
		a.Store((*[16]float32)(acc[j : j+16]))
	}
}

// load16 loads s[0:16].
func load16(s []float32) archsimd.Float32x16 {
	return archsimd.LoadFloat32x16((*[16]float32)(s[:16]))
}

// load8 loads s[0:8].
func load8(s []float32) archsimd.Float32x8 {
	return archsimd.LoadFloat32x8((*[8]float32)(s[:8]))
}

// dotsAVX2 is dotsAVX512 with 8-lane vectors.
func dotsAVX2(dst, q, k []float32, n, dk int) {
	if dk%8 != 0 || n <= 0 {
		dotsGo(dst, q, k, n, dk)
		return
	}
	_, _, _ = dst[n-1], q[dk-1], k[n*dk-1]
	pq, pk := unsafe.Pointer(unsafe.SliceData(q)), unsafe.Pointer(unsafe.SliceData(k))
	ld := func(p unsafe.Pointer, i int) archsimd.Float32x8 {
		return archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p, uintptr(i)*4)))
	}
	t := 0
	for ; t+4 <= n; t += 4 {
		var a, b, c, d archsimd.Float32x8
		r := t * dk
		for j := 0; j < dk; j += 8 {
			qv := ld(pq, j)
			a = ld(pk, r+j).MulAdd(qv, a)
			b = ld(pk, r+dk+j).MulAdd(qv, b)
			c = ld(pk, r+2*dk+j).MulAdd(qv, c)
			d = ld(pk, r+3*dk+j).MulAdd(qv, d)
		}
		hsum4x8(a, b, c, d).Store((*[4]float32)(dst[t : t+4]))
	}
	if t < n {
		dotsGo(dst[t:n], q, k[t*dk:], n-t, dk)
	}
}

// accumAVX2 is accumAVX512 with 8-lane vectors (32 columns in registers).
func accumAVX2(acc, p, v []float32, n, dv int) {
	if dv%8 != 0 || n <= 0 {
		accumGo(acc, p, v, n, dv)
		return
	}
	_, _, _ = acc[dv-1], p[n-1], v[n*dv-1]
	pv := unsafe.Pointer(unsafe.SliceData(v))
	ld := func(i int) archsimd.Float32x8 {
		return archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(pv, uintptr(i)*4)))
	}
	j := 0
	for ; j+32 <= dv; j += 32 {
		a0, a1 := load8(acc[j:]), load8(acc[j+8:])
		a2, a3 := load8(acc[j+16:]), load8(acc[j+24:])
		for t := range n {
			w := archsimd.BroadcastFloat32x8(p[t])
			r := t*dv + j
			a0 = ld(r).MulAdd(w, a0)
			a1 = ld(r+8).MulAdd(w, a1)
			a2 = ld(r+16).MulAdd(w, a2)
			a3 = ld(r+24).MulAdd(w, a3)
		}
		a0.Store((*[8]float32)(acc[j : j+8]))
		a1.Store((*[8]float32)(acc[j+8 : j+16]))
		a2.Store((*[8]float32)(acc[j+16 : j+24]))
		a3.Store((*[8]float32)(acc[j+24 : j+32]))
	}
	for ; j < dv; j += 8 {
		a := load8(acc[j:])
		for t := range n {
			a = ld(t*dv+j).MulAdd(archsimd.BroadcastFloat32x8(p[t]), a)
		}
		a.Store((*[8]float32)(acc[j : j+8]))
	}
}
