//go:build goexperiment.simd && amd64

package gemm

import (
	"simd/archsimd"
	"unsafe"
)

// cvt16AVX512 widens sixteen 16-bit floats per step with integer lane
// arithmetic: normal halves get their exponent rebiased, subnormals (and
// zero) are converted as integers times 2^-24, Inf/NaN keep an all-ones
// exponent. The result is bit-identical to cvt16Go.
func cvt16AVX512(kind Half, dst []float32, src []uint16) {
	n := len(src)
	dst = dst[:n]
	ps, pd := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
	i := 0
	if kind == BFloat16 {
		for ; i+16 <= n; i += 16 {
			x := archsimd.LoadUint16x16((*[16]uint16)(unsafe.Add(ps, uintptr(i)*2))).ExtendToUint32()
			x.ShiftAllLeft(16).AsFloat32x16().Store((*[16]float32)(unsafe.Add(pd, uintptr(i)*4)))
		}
		archsimd.ClearAVXUpperBits()
		cvt16Go(kind, dst[i:], src[i:])
		return
	}
	bi := archsimd.BroadcastInt32x16
	low, signBit := bi(0x7fff), bi(0x8000)
	minNormal, infExp := bi(0x400), bi(0x7c00)
	rebias, allOnes := bi((127-15)<<23), bi(0x7f800000)
	tiny := archsimd.BroadcastFloat32x16(1.0 / (1 << 24))
	for ; i+16 <= n; i += 16 {
		x := archsimd.LoadUint16x16((*[16]uint16)(unsafe.Add(ps, uintptr(i)*2))).ExtendToUint32().AsInt32x16()
		em := x.And(low)
		sign := x.And(signBit).ShiftAllLeft(16)
		shifted := em.ShiftAllLeft(13)
		normal := shifted.Add(rebias)
		sub := em.ConvertToFloat32().Mul(tiny).AsInt32x16()
		r := normal.Merge(sub, em.GreaterEqual(minNormal))
		r = shifted.Or(allOnes).Merge(r, em.GreaterEqual(infExp))
		r.Or(sign).AsFloat32x16().Store((*[16]float32)(unsafe.Add(pd, uintptr(i)*4)))
	}
	archsimd.ClearAVXUpperBits()
	cvt16Go(kind, dst[i:], src[i:])
}

// cvt16AVX2 is cvt16AVX512 eight values per step.
func cvt16AVX2(kind Half, dst []float32, src []uint16) {
	n := len(src)
	dst = dst[:n]
	ps, pd := unsafe.Pointer(unsafe.SliceData(src)), unsafe.Pointer(unsafe.SliceData(dst))
	i := 0
	if kind == BFloat16 {
		for ; i+8 <= n; i += 8 {
			x := archsimd.LoadUint16x8((*[8]uint16)(unsafe.Add(ps, uintptr(i)*2))).ExtendToUint32()
			x.ShiftAllLeft(16).AsFloat32x8().Store((*[8]float32)(unsafe.Add(pd, uintptr(i)*4)))
		}
		archsimd.ClearAVXUpperBits()
		cvt16Go(kind, dst[i:], src[i:])
		return
	}
	bi := archsimd.BroadcastInt32x8
	low, signBit := bi(0x7fff), bi(0x8000)
	minNormal, infExp := bi(0x400), bi(0x7c00)
	rebias, allOnes := bi((127-15)<<23), bi(0x7f800000)
	tiny := archsimd.BroadcastFloat32x8(1.0 / (1 << 24))
	for ; i+8 <= n; i += 8 {
		x := archsimd.LoadUint16x8((*[8]uint16)(unsafe.Add(ps, uintptr(i)*2))).ExtendToUint32().AsInt32x8()
		em := x.And(low)
		sign := x.And(signBit).ShiftAllLeft(16)
		shifted := em.ShiftAllLeft(13)
		normal := shifted.Add(rebias)
		sub := em.ConvertToFloat32().Mul(tiny).AsInt32x8()
		r := normal.Merge(sub, em.GreaterEqual(minNormal))
		r = shifted.Or(allOnes).Merge(r, em.GreaterEqual(infExp))
		r.Or(sign).AsFloat32x8().Store((*[8]float32)(unsafe.Add(pd, uintptr(i)*4)))
	}
	archsimd.ClearAVXUpperBits()
	cvt16Go(kind, dst[i:], src[i:])
}

// half16 holds the broadcast constants of the float16 widening.
type half16 struct {
	infBits, allOnes archsimd.Int32x16
	scale            archsimd.Float32x16
}

// init sets the constants in place: a constructor returning the struct was
// copied with legacy-SSE moves after 256-bit ops (see the ClearAVXUpperBits note
// in simd_amd64.go).
func (c *half16) init() {
	b := archsimd.BroadcastInt32x16
	c.infBits = b(0x0f800000)
	c.allOnes = b(0x7f800000)
	c.scale = archsimd.BroadcastFloat32x16(0x1p112)
}

// load loads sixteen 16-bit floats at p and widens them. For float16 the
// exponent and mantissa shifted into float32 position, read as a float and
// multiplied by 2^112, is the exact value of normal and subnormal halves
// alike (a power-of-two scaling); infinities and NaN get an all-ones
// exponent instead. Shifts rather than masks isolate the fields (fewer
// constants to keep in registers). Bit-identical to cvt16Go.
func (h *half16) load(kind Half, p unsafe.Pointer) archsimd.Float32x16 {
	x := archsimd.LoadUint16x16((*[16]uint16)(p)).ExtendToUint32()
	if kind == BFloat16 {
		return x.ShiftAllLeft(16).AsFloat32x16()
	}
	mag := x.ShiftAllLeft(17).ShiftAllRight(4).AsInt32x16() // exponent and mantissa at float32 positions
	sign := x.ShiftAllRight(15).ShiftAllLeft(31).AsInt32x16()
	f := mag.AsFloat32x16().Mul(h.scale).AsInt32x16()
	f = mag.Or(h.allOnes).Merge(f, mag.GreaterEqual(h.infBits))
	return f.Or(sign).AsFloat32x16()
}

// axpy4HalfAVX512 is axpy4 with the four B rows stored as 16-bit floats,
// widened in registers (no float32 copy of the weights is written).
func axpy4HalfAVX512(kind Half, a0, a1, a2, a3 float32, x0, x1, x2, x3 []uint16, y []float32) {
	n := len(y)
	x0, x1, x2, x3 = x0[:n], x1[:n], x2[:n], x3[:n]
	var h half16
	h.init()
	v0, v1, v2, v3 := bcast16(a0), bcast16(a1), bcast16(a2), bcast16(a3)
	p0, p1 := unsafe.Pointer(unsafe.SliceData(x0)), unsafe.Pointer(unsafe.SliceData(x1))
	p2, p3 := unsafe.Pointer(unsafe.SliceData(x2)), unsafe.Pointer(unsafe.SliceData(x3))
	py := unsafe.Pointer(unsafe.SliceData(y))
	i := 0
	for ; i+16 <= n; i += 16 {
		off, yo := uintptr(i)*2, uintptr(i)*4
		acc := archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(py, yo)))
		acc = h.load(kind, unsafe.Add(p0, off)).MulAdd(v0, acc)
		acc = h.load(kind, unsafe.Add(p1, off)).MulAdd(v1, acc)
		acc = h.load(kind, unsafe.Add(p2, off)).MulAdd(v2, acc)
		acc = h.load(kind, unsafe.Add(p3, off)).MulAdd(v3, acc)
		acc.Store((*[16]float32)(unsafe.Add(py, yo)))
	}
	archsimd.ClearAVXUpperBits()
	if i < n {
		var t [4][16]float32
		r := n - i
		cvt16Go(kind, t[0][:r], x0[i:])
		cvt16Go(kind, t[1][:r], x1[i:])
		cvt16Go(kind, t[2][:r], x2[i:])
		cvt16Go(kind, t[3][:r], x3[i:])
		axpy4Go(a0, a1, a2, a3, t[0][:r], t[1][:r], t[2][:r], t[3][:r], y[i:])
	}
}
