//go:build goexperiment.simd && amd64

package gemm

import (
	"simd/archsimd"
	"unsafe"
)

// dequantAVX2 is dequantGo eight columns per vector: the nibbles split by
// a mask and a 16-bit shift (a multiply-high), each eight bytes zero-extended to int32
// (VPMOVZXBD; the upper eight by VPUNPCKHQDQ first), converted, minus the
// zeros, times the scales (bit-identical: the same two float32 steps).
func dequantAVX2(nibbles bool, dst []float32, src []byte, s, z *[packNR]float32) {
	rows := len(dst) / packNR
	if rows == 0 {
		return
	}
	var sv, zv [4]archsimd.Float32x8
	for i := range 4 {
		sv[i] = archsimd.LoadFloat32x8((*[8]float32)(s[8*i:]))
		zv[i] = archsimd.LoadFloat32x8((*[8]float32)(z[8*i:]))
	}
	pd := unsafe.Pointer(unsafe.SliceData(dst))
	put := func(r, i int, x archsimd.Uint8x16) {
		v := x.ExtendLo8ToUint32().AsInt32x8().ConvertToFloat32().Sub(zv[i]).Mul(sv[i])
		v.Store((*[8]float32)(unsafe.Add(pd, (r*packNR+8*i)*4)))
	}
	hi := func(x archsimd.Uint8x16) archsimd.Uint8x16 {
		q := x.AsUint64x2()
		return q.InterleaveHi(q).AsUint8x16()
	}
	if nibbles {
		src = src[:rows*packNR/2]
		// Constants from memory: BroadcastUint8x16 is emulated, and
		// ShiftAllRight(4) took its count through a legacy-SSE MOVQ that,
		// after 256-bit ops, cost 20x the loop here (Zen 3); the high half
		// of x * 2^12 is x >> 4 (VPMULHUW).
		m, sh := archsimd.LoadUint8x16(&lowNibbles), archsimd.LoadUint16x8(&shift4)
		for r := range rows {
			x := archsimd.LoadUint8x16((*[16]uint8)(src[r*16:]))
			lo := x.And(m)
			up := x.AsUint16x8().MulHigh(sh).AsUint8x16().And(m)
			put(r, 0, lo)
			put(r, 1, hi(lo))
			put(r, 2, up)
			put(r, 3, hi(up))
		}
		archsimd.ClearAVXUpperBits()
		return
	}
	src = src[:rows*packNR]
	for r := range rows {
		a := archsimd.LoadUint8x16((*[16]uint8)(src[r*32:]))
		b := archsimd.LoadUint8x16((*[16]uint8)(src[r*32+16:]))
		put(r, 0, a)
		put(r, 1, hi(a))
		put(r, 2, b)
		put(r, 3, hi(b))
	}
	archsimd.ClearAVXUpperBits()
}

// lowNibbles is the mask of a byte's low nibble in every byte.
var lowNibbles = [16]uint8{15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15}

// shift4 multiplies 16-bit lanes by 2^12: the high half is the lane >> 4.
var shift4 = [8]uint16{1 << 12, 1 << 12, 1 << 12, 1 << 12, 1 << 12, 1 << 12, 1 << 12, 1 << 12}

// panelQuantRowAVX2 is dequantAVX2 fused with panelRow for one row of A:
// out[c] += sum_r a[r] * W[r][c] over the len(a) rows of src (one group:
// scales s, zeros z), the dequantized values never leaving the registers.
// It makes two passes of 16 columns (panelQuantHalf): with all 32 columns'
// scales, zeros and sums live the compiler spilled 128-bit values with
// legacy-SSE MOVUPS, which after 256-bit ops ran the loop 20x slower here
// (Zen 3).
func panelQuantRowAVX2(nibbles bool, a []float32, src []byte, s, z *[packNR]float32, out *[packNR]float32) {
	rows := len(a)
	if rows == 0 {
		return
	}
	rb := packNR
	if nibbles {
		rb = packNR / 2
	}
	src = src[:rows*rb]
	panelQuantHalf(nibbles, false, a, src, rb, (*[16]float32)(s[0:]), (*[16]float32)(z[0:]), (*[16]float32)(out[0:]))
	panelQuantHalf(nibbles, true, a, src, rb, (*[16]float32)(s[16:]), (*[16]float32)(z[16:]), (*[16]float32)(out[16:]))
}

// panelQuantHalf is one pass of panelQuantRowAVX2 over columns 0-15 (upper
// false) or 16-31 (upper true): with nibbles the low or high nibbles of each
// row's 16 bytes, else the row's first or last 16 bytes; rb is the bytes of
// a row of src. The group's zero and scale are applied once, at the end:
// sum_r a_r*(v_r - z)*s = (sum_r a_r*v_r - z*sum_r a_r)*s, so a value
// costs a conversion and a multiply-add (the float32 rounding differs
// from dequantizing first by the usual reassociation).
func panelQuantHalf(nibbles, upper bool, a []float32, src []byte, rb int, s, z, out *[16]float32) {
	var c0, c1, sum archsimd.Float32x8
	m, sh := archsimd.LoadUint8x16(&lowNibbles), archsimd.LoadUint16x8(&shift4)
	off := 0
	if upper && !nibbles {
		off = 16
	}
	for r, av := range a {
		x := archsimd.LoadUint8x16((*[16]uint8)(src[r*rb+off:]))
		if nibbles {
			if upper {
				x = x.AsUint16x8().MulHigh(sh).AsUint8x16()
			}
			x = x.And(m)
		}
		q := x.AsUint64x2()
		x1 := q.InterleaveHi(q).AsUint8x16()
		b := archsimd.BroadcastFloat32x8(av)
		sum = sum.Add(b)
		c0 = x.ExtendLo8ToUint32().AsInt32x8().ConvertToFloat32().MulAdd(b, c0)
		c1 = x1.ExtendLo8ToUint32().AsInt32x8().ConvertToFloat32().MulAdd(b, c1)
	}
	z0, z1 := archsimd.LoadFloat32x8((*[8]float32)(z[0:])), archsimd.LoadFloat32x8((*[8]float32)(z[8:]))
	s0, s1 := archsimd.LoadFloat32x8((*[8]float32)(s[0:])), archsimd.LoadFloat32x8((*[8]float32)(s[8:]))
	o0, o1 := archsimd.LoadFloat32x8((*[8]float32)(out[0:])), archsimd.LoadFloat32x8((*[8]float32)(out[8:]))
	c0.Sub(z0.Mul(sum)).MulAdd(s0, o0).Store((*[8]float32)(out[0:]))
	c1.Sub(z1.Mul(sum)).MulAdd(s1, o1).Store((*[8]float32)(out[8:]))
	archsimd.ClearAVXUpperBits()
}

// panelQuantRowAVX512 is panelQuantRowAVX2 with 16-lane vectors: one pass
// over the sliver's 32 columns, each row's 16 bytes (nibbles: low nibbles
// columns 0-15, high 16-31; else two loads of 16 bytes) widened by
// VPMOVZXBD to two zmm of int32, converted and multiply-added, half the
// instructions of the 8-lane loop; even and odd rows go to separate sums
// (added at the end) so that two multiply-add chains run at once. Against
// the AVX2 loop on the AVX-512 path, a decode step's int4 products
// (BenchmarkDecodeStepQuant m1, one thread, Zen 4): 1.5-1.6x (the same
// even/odd split in the AVX2 loop measured no faster there); the rows'
// sums are added in another order, so
// results differ from the AVX2 loop's by float32 rounding
// (TestPanelQuantRowKernels).
func panelQuantRowAVX512(nibbles bool, a []float32, src []byte, s, z *[packNR]float32, out *[packNR]float32) {
	rows := len(a)
	if rows == 0 {
		return
	}
	var c0, c1, d0, d1 archsimd.Float32x16
	var sum, sum2 float32
	if nibbles {
		src = src[:rows*packNR/2]
		m, sh := archsimd.LoadUint8x16(&lowNibbles), archsimd.LoadUint16x8(&shift4)
		r := 0
		for ; r+2 <= rows; r += 2 {
			x := archsimd.LoadUint8x16((*[16]uint8)(src[r*packNR/2:]))
			y := archsimd.LoadUint8x16((*[16]uint8)(src[(r+1)*packNR/2:]))
			xh := x.AsUint16x8().MulHigh(sh).AsUint8x16().And(m)
			yh := y.AsUint16x8().MulHigh(sh).AsUint8x16().And(m)
			b, e := archsimd.BroadcastFloat32x16(a[r]), archsimd.BroadcastFloat32x16(a[r+1])
			sum += a[r]
			sum2 += a[r+1]
			c0 = x.And(m).ExtendToUint32().AsInt32x16().ConvertToFloat32().MulAdd(b, c0)
			c1 = xh.ExtendToUint32().AsInt32x16().ConvertToFloat32().MulAdd(b, c1)
			d0 = y.And(m).ExtendToUint32().AsInt32x16().ConvertToFloat32().MulAdd(e, d0)
			d1 = yh.ExtendToUint32().AsInt32x16().ConvertToFloat32().MulAdd(e, d1)
		}
		if r < rows {
			x := archsimd.LoadUint8x16((*[16]uint8)(src[r*packNR/2:]))
			xh := x.AsUint16x8().MulHigh(sh).AsUint8x16().And(m)
			b := archsimd.BroadcastFloat32x16(a[r])
			sum += a[r]
			c0 = x.And(m).ExtendToUint32().AsInt32x16().ConvertToFloat32().MulAdd(b, c0)
			c1 = xh.ExtendToUint32().AsInt32x16().ConvertToFloat32().MulAdd(b, c1)
		}
	} else {
		src = src[:rows*packNR]
		for r, av := range a {
			x0 := archsimd.LoadUint8x16((*[16]uint8)(src[r*packNR:]))
			x1 := archsimd.LoadUint8x16((*[16]uint8)(src[r*packNR+16:]))
			b := archsimd.BroadcastFloat32x16(av)
			sum += av
			c0 = x0.ExtendToUint32().AsInt32x16().ConvertToFloat32().MulAdd(b, c0)
			c1 = x1.ExtendToUint32().AsInt32x16().ConvertToFloat32().MulAdd(b, c1)
		}
	}
	c0, c1 = c0.Add(d0), c1.Add(d1)
	sv := archsimd.BroadcastFloat32x16(sum + sum2)
	z0, z1 := archsimd.LoadFloat32x16((*[16]float32)(z[0:])), archsimd.LoadFloat32x16((*[16]float32)(z[16:]))
	s0, s1 := archsimd.LoadFloat32x16((*[16]float32)(s[0:])), archsimd.LoadFloat32x16((*[16]float32)(s[16:]))
	o0, o1 := archsimd.LoadFloat32x16((*[16]float32)(out[0:])), archsimd.LoadFloat32x16((*[16]float32)(out[16:]))
	c0.Sub(z0.Mul(sv)).MulAdd(s0, o0).Store((*[16]float32)(out[0:]))
	c1.Sub(z1.Mul(sv)).MulAdd(s1, o1).Store((*[16]float32)(out[16:]))
	archsimd.ClearAVXUpperBits()
}
