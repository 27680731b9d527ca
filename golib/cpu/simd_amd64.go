//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
	"unsafe"

	"github.com/klauspost/cpuid/v2"
)

// Every function of this package that runs 256- or 512-bit archsimd code calls
// archsimd.ClearAVXUpperBits (VZEROUPPER) when its vectors are done, before
// scalar float code and before returning (why, with the measurement: the same
// note in golib/cpu/gemm/simd_amd64.go).

// The inner loops address rows through unsafe pointers: slice expressions
// per vector cost more bounds checks and spills than the FMAs themselves.
// Every function checks its slices' lengths once on entry, so the raw
// accesses below stay inside them.

func ld16(p unsafe.Pointer, off int) archsimd.Float32x16 {
	return archsimd.LoadFloat32x16((*[16]float32)(unsafe.Add(p, off)))
}

func st16(v archsimd.Float32x16, p unsafe.Pointer, off int) {
	v.Store((*[16]float32)(unsafe.Add(p, off)))
}

func ld8(p unsafe.Pointer, off int) archsimd.Float32x8 {
	return archsimd.LoadFloat32x8((*[8]float32)(unsafe.Add(p, off)))
}

func st8(v archsimd.Float32x8, p unsafe.Pointer, off int) {
	v.Store((*[8]float32)(unsafe.Add(p, off)))
}

func f32p(s []float32) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(s)) }

// avx512Ops is the AVX-512 path: assembly inner loops (kern_avx512_amd64.s)
// and the simd/archsimd loops of this file (16-lane float32 vectors with
// FMA) for the shapes the assembly does not take. The 8-lane loops in the
// "AVX2" section below are avx2Ops' fallbacks (kern_avx2_amd64.go). Results
// equal the scalar codec (a signalling NaN may come back quieted).
var avx512Ops = kernelOps{
	name:    "avx512",
	dots:    dots16,
	maxOf:   maxAVX2,
	readSum: readSum16,
	expSub:  expSubx16,
	tanhCap: tanhCap16,
	scale:   scale16,
	axpy:    axpy16,
	dots4:   dots4x16,
	axpy4:   axpy4x16,
	axpy4k:  axpy4x16k,
	cvtF16:  cvtF16x16,
	cvtBF16: cvtBF16x16,
	half:    &half16Ops,
}

func registerSIMD() {
	x := archsimd.X86
	cpuT.Store(pickCPUTune(DetectFeatures()))
	// The AVX2 path widens fp16 with VCVTPH2PS: it needs F16C too
	// (archsimd does not report it; cpuid does).
	if x.AVX2() && x.FMA() && cpuid.CPU.Supports(cpuid.F16C) {
		kernelVariants = append(kernelVariants, &avx2Ops)
		cpuTuning = cpuT.Load().name
	}
	if x.AVX512() && x.FMA() {
		kernelVariants = append(kernelVariants, &avx512Ops)
	}
}

// ---- AVX-512 (16 lanes) ----

func sum4x16(a0, a1, a2, a3 archsimd.Float32x16) archsimd.Float32x4 {
	b0 := a0.GetLo().Add(a0.GetHi())
	b1 := a1.GetLo().Add(a1.GetHi())
	b2 := a2.GetLo().Add(a2.GetHi())
	b3 := a3.GetLo().Add(a3.GetHi())
	return sum4x8(b0, b1, b2, b3)
}

// sum4x8 returns the horizontal sums of four vectors as one 4-lane vector.
func sum4x8(b0, b1, b2, b3 archsimd.Float32x8) archsimd.Float32x4 {
	h := b0.AddPairsGrouped(b1).AddPairsGrouped(b2.AddPairsGrouped(b3))
	return h.GetLo().Add(h.GetHi())
}

func hsum8(b archsimd.Float32x8) float32 {
	x := b.GetLo().Add(b.GetHi())
	x = x.AddPairs(x)
	x = x.AddPairs(x)
	return x.GetElem(0)
}

func dots16sim(s, q, k []float32, d int) {
	n := len(s)
	if n == 0 {
		return
	}
	_, _ = q[d-1], k[n*d-1]
	qp, kp := f32p(q), f32p(k)
	dv := (d &^ 15) * 4
	rb := d * 4
	t := 0
	for ; t+4 <= n; t += 4 {
		k0 := unsafe.Add(kp, t*rb)
		k1 := unsafe.Add(k0, rb)
		k2 := unsafe.Add(k1, rb)
		k3 := unsafe.Add(k2, rb)
		var a0, a1, a2, a3 archsimd.Float32x16
		for i := 0; i < dv; i += 64 {
			qv := ld16(qp, i)
			a0 = qv.MulAdd(ld16(k0, i), a0)
			a1 = qv.MulAdd(ld16(k1, i), a1)
			a2 = qv.MulAdd(ld16(k2, i), a2)
			a3 = qv.MulAdd(ld16(k3, i), a3)
		}
		sum4x16(a0, a1, a2, a3).StoreSlice(s[t:])
		archsimd.ClearAVXUpperBits()
		for i := dv / 4; i < d; i++ {
			qi := q[i]
			s[t] += qi * k[t*d+i]
			s[t+1] += qi * k[(t+1)*d+i]
			s[t+2] += qi * k[(t+2)*d+i]
			s[t+3] += qi * k[(t+3)*d+i]
		}
	}
	for ; t < n; t++ {
		k0 := unsafe.Add(kp, t*rb)
		var a archsimd.Float32x16
		for i := 0; i < dv; i += 64 {
			a = ld16(qp, i).MulAdd(ld16(k0, i), a)
		}
		sum := hsum8(a.GetLo().Add(a.GetHi()))
		archsimd.ClearAVXUpperBits()
		for i := dv / 4; i < d; i++ {
			sum += q[i] * k[t*d+i]
		}
		s[t] = sum
	}
}

func scale16(dst, src []float32, f float32) {
	n := len(src)
	dst = dst[:n]
	fv := archsimd.BroadcastFloat32x16(f)
	i := 0
	for ; i+16 <= n; i += 16 {
		archsimd.LoadFloat32x16Slice(src[i:]).Mul(fv).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	for ; i < n; i++ {
		dst[i] = src[i] * f
	}
}

func scale8(dst, src []float32, f float32) {
	n := len(src)
	dst = dst[:n]
	fv := archsimd.BroadcastFloat32x8(f)
	i := 0
	for ; i+8 <= n; i += 8 {
		archsimd.LoadFloat32x8Slice(src[i:]).Mul(fv).StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	for ; i < n; i++ {
		dst[i] = src[i] * f
	}
}

// maxTail folds the elements of s into the running maximum m with the
// contract of maxOf (NaN when one of them is not finite).
func maxTail(m float32, s []float32) float32 {
	var z float32
	for _, x := range s {
		m = max(m, x)
		z += x * 0
	}
	if z != 0 {
		return z
	}
	return m
}

// exp16 is the vector twin of expf (same algorithm and constants).
func exp16(x archsimd.Float32x16) archsimd.Float32x16 {
	x = x.Min(archsimd.BroadcastFloat32x16(expHi)).Max(archsimd.BroadcastFloat32x16(expLo))
	mag := archsimd.BroadcastFloat32x16(roundMag)
	t := x.MulAdd(archsimd.BroadcastFloat32x16(log2e), mag)
	n := t.Sub(mag)
	r := n.MulAdd(archsimd.BroadcastFloat32x16(-ln2Hi), x)
	r = n.MulAdd(archsimd.BroadcastFloat32x16(-ln2Lo), r)
	p := archsimd.BroadcastFloat32x16(expP0)
	p = p.MulAdd(r, archsimd.BroadcastFloat32x16(expP1))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x16(expP2))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x16(expP3))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x16(expP4))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x16(expP5))
	p = p.Mul(r.Mul(r)).Add(r).Add(archsimd.BroadcastFloat32x16(1))
	pow := t.AsInt32x16().ShiftAllLeft(23).Add(archsimd.BroadcastInt32x16(0x3f800000)).AsFloat32x16()
	return p.Mul(pow)
}

func expSub16(s []float32, m float32) float32 {
	n := len(s)
	mv := archsimd.BroadcastFloat32x16(m)
	var acc archsimd.Float32x16
	i := 0
	for ; i+16 <= n; i += 16 {
		e := exp16(archsimd.LoadFloat32x16Slice(s[i:]).Sub(mv))
		e.StoreSlice(s[i:])
		acc = acc.Add(e)
	}
	sum := hsum8(acc.GetLo().Add(acc.GetHi()))
	archsimd.ClearAVXUpperBits()
	for ; i < n; i++ {
		e := expf(s[i] - m)
		s[i] = e
		sum += e
	}
	return sum
}

// tanhSmallSq bounds x*x for the odd polynomial of tanhSmall16/8: below
// |x| = 0.25, 1 - 2/(e^2x + 1) loses up to 1e-7 absolutely (relative error
// 1e-3 at x = 1e-4, wrong scores with a large softcap); the polynomial's
// truncation error there is below 1e-8 relative.
const tanhSmallSq = 0.0625

// Taylor coefficients of tanh: x - x^3/3 + 2x^5/15 - 17x^7/315 + 62x^9/2835.
const (
	tanhC3 = -1.0 / 3
	tanhC5 = 2.0 / 15
	tanhC7 = -17.0 / 315
	tanhC9 = 62.0 / 2835
)

func tanhSmall16(x archsimd.Float32x16) archsimd.Float32x16 {
	x2 := x.Mul(x)
	p := archsimd.BroadcastFloat32x16(tanhC9)
	p = p.MulAdd(x2, archsimd.BroadcastFloat32x16(tanhC7))
	p = p.MulAdd(x2, archsimd.BroadcastFloat32x16(tanhC5))
	p = p.MulAdd(x2, archsimd.BroadcastFloat32x16(tanhC3))
	return p.Mul(x2).MulAdd(x, x)
}

func tanhSmall8(x archsimd.Float32x8) archsimd.Float32x8 {
	x2 := x.Mul(x)
	p := archsimd.BroadcastFloat32x8(tanhC9)
	p = p.MulAdd(x2, archsimd.BroadcastFloat32x8(tanhC7))
	p = p.MulAdd(x2, archsimd.BroadcastFloat32x8(tanhC5))
	p = p.MulAdd(x2, archsimd.BroadcastFloat32x8(tanhC3))
	return p.Mul(x2).MulAdd(x, x)
}

func tanhCap16(s []float32, c float32) {
	n := len(s)
	cv := archsimd.BroadcastFloat32x16(c)
	one := archsimd.BroadcastFloat32x16(1)
	two := archsimd.BroadcastFloat32x16(2)
	i := 0
	for ; i+16 <= n; i += 16 {
		x := archsimd.LoadFloat32x16Slice(s[i:])
		e := exp16(x.Add(x))
		th := tanhSmall16(x).Merge(one.Sub(two.Div(e.Add(one))), x.Mul(x).Less(archsimd.BroadcastFloat32x16(tanhSmallSq)))
		// + x*0: a NaN or infinite x gives NaN (exp's clamp would hide it)
		x.MulAdd(archsimd.BroadcastFloat32x16(0), th.Mul(cv)).StoreSlice(s[i:])
	}
	archsimd.ClearAVXUpperBits()
	goTanhCap(s[i:], c)
}

func axpy16sim(acc, p, v []float32, alpha float32) {
	d := len(acc)
	n := len(p)
	if n == 0 || d == 0 {
		return
	}
	_ = v[n*d-1]
	ap, vp := f32p(acc), f32p(v)
	rb := d * 4
	av := archsimd.BroadcastFloat32x16(alpha)
	scale := alpha != 1
	i := 0
	for ; i+64 <= d; i += 64 {
		o := i * 4
		a0, a1, a2, a3 := ld16(ap, o), ld16(ap, o+64), ld16(ap, o+128), ld16(ap, o+192)
		if scale {
			a0, a1, a2, a3 = a0.Mul(av), a1.Mul(av), a2.Mul(av), a3.Mul(av)
		}
		for t := 0; t < n; t++ {
			vr := unsafe.Add(vp, t*rb+o) // never past the end (checkptr)
			pb := archsimd.BroadcastFloat32x16(p[t])
			a0 = pb.MulAdd(ld16(vr, 0), a0)
			a1 = pb.MulAdd(ld16(vr, 64), a1)
			a2 = pb.MulAdd(ld16(vr, 128), a2)
			a3 = pb.MulAdd(ld16(vr, 192), a3)
		}
		st16(a0, ap, o)
		st16(a1, ap, o+64)
		st16(a2, ap, o+128)
		st16(a3, ap, o+192)
	}
	for ; i+16 <= d; i += 16 {
		o := i * 4
		a0 := ld16(ap, o)
		if scale {
			a0 = a0.Mul(av)
		}
		var a1 archsimd.Float32x16
		t := 0
		for ; t+2 <= n; t += 2 {
			vr := unsafe.Add(vp, t*rb+o)
			a0 = archsimd.BroadcastFloat32x16(p[t]).MulAdd(ld16(vr, 0), a0)
			a1 = archsimd.BroadcastFloat32x16(p[t+1]).MulAdd(ld16(vr, rb), a1)
		}
		if t < n {
			vr := unsafe.Add(vp, t*rb+o)
			a0 = archsimd.BroadcastFloat32x16(p[t]).MulAdd(ld16(vr, 0), a0)
		}
		st16(a0.Add(a1), ap, o)
	}
	archsimd.ClearAVXUpperBits()
	for ; i < d; i++ {
		x := acc[i] * alpha
		for t := 0; t < n; t++ {
			x += p[t] * v[t*d+i]
		}
		acc[i] = x
	}
}

func cvtBF16x16sim(dst []float32, src []uint16) {
	n := len(src)
	i := 0
	for ; i+16 <= n; i += 16 {
		archsimd.LoadUint16x16Slice(src[i:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x16().StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	for ; i < n; i++ {
		dst[i] = bf16f(src[i])
	}
}

// cvtF16x16sim widens IEEE halves exactly: the exponent/mantissa bits shifted
// into float32 position and multiplied by 2^112 rebias normals and
// normalize subnormals in one step; Inf/NaN get the all-ones exponent.
func cvtF16x16sim(dst []float32, src []uint16) {
	n := len(src)
	em := archsimd.BroadcastUint32x16(0x7fff)
	sm := archsimd.BroadcastUint32x16(0x8000)
	infm := archsimd.BroadcastUint32x16(0x7c00)
	expAll := archsimd.BroadcastUint32x16(0x7f800000)
	magic := archsimd.BroadcastFloat32x16(0x1p112)
	i := 0
	for ; i+16 <= n; i += 16 {
		h := archsimd.LoadUint16x16Slice(src[i:]).ExtendToUint32()
		o := h.And(em).ShiftAllLeft(13)
		f := o.AsFloat32x16().Mul(magic).AsUint32x16()
		special := h.And(infm).Equal(infm)
		f = o.Or(expAll).Merge(f, special)
		f.Or(h.And(sm).ShiftAllLeft(16)).AsFloat32x16().StoreSlice(dst[i:])
	}
	archsimd.ClearAVXUpperBits()
	for ; i < n; i++ {
		dst[i] = goF16(src[i])
	}
}

// ---- AVX2 (8 lanes) ----

func dots8(s, q, k []float32, d int) {
	n := len(s)
	if n == 0 {
		return
	}
	_, _ = q[d-1], k[n*d-1]
	qp, kp := f32p(q), f32p(k)
	dv := (d &^ 7) * 4
	rb := d * 4
	t := 0
	for ; t+4 <= n; t += 4 {
		k0 := unsafe.Add(kp, t*rb)
		k1 := unsafe.Add(k0, rb)
		k2 := unsafe.Add(k1, rb)
		k3 := unsafe.Add(k2, rb)
		var a0, a1, a2, a3 archsimd.Float32x8
		for i := 0; i < dv; i += 32 {
			qv := ld8(qp, i)
			a0 = qv.MulAdd(ld8(k0, i), a0)
			a1 = qv.MulAdd(ld8(k1, i), a1)
			a2 = qv.MulAdd(ld8(k2, i), a2)
			a3 = qv.MulAdd(ld8(k3, i), a3)
		}
		sum4x8(a0, a1, a2, a3).StoreSlice(s[t:])
		archsimd.ClearAVXUpperBits()
		for i := dv / 4; i < d; i++ {
			qi := q[i]
			s[t] += qi * k[t*d+i]
			s[t+1] += qi * k[(t+1)*d+i]
			s[t+2] += qi * k[(t+2)*d+i]
			s[t+3] += qi * k[(t+3)*d+i]
		}
	}
	for ; t < n; t++ {
		k0 := unsafe.Add(kp, t*rb)
		var a archsimd.Float32x8
		for i := 0; i < dv; i += 32 {
			a = ld8(qp, i).MulAdd(ld8(k0, i), a)
		}
		sum := hsum8(a)
		archsimd.ClearAVXUpperBits()
		for i := dv / 4; i < d; i++ {
			sum += q[i] * k[t*d+i]
		}
		s[t] = sum
	}
}

// exp8 is the 8-lane twin of exp16.
func exp8(x archsimd.Float32x8) archsimd.Float32x8 {
	x = x.Min(archsimd.BroadcastFloat32x8(expHi)).Max(archsimd.BroadcastFloat32x8(expLo))
	mag := archsimd.BroadcastFloat32x8(roundMag)
	t := x.MulAdd(archsimd.BroadcastFloat32x8(log2e), mag)
	n := t.Sub(mag)
	r := n.MulAdd(archsimd.BroadcastFloat32x8(-ln2Hi), x)
	r = n.MulAdd(archsimd.BroadcastFloat32x8(-ln2Lo), r)
	p := archsimd.BroadcastFloat32x8(expP0)
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP1))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP2))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP3))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP4))
	p = p.MulAdd(r, archsimd.BroadcastFloat32x8(expP5))
	p = p.Mul(r.Mul(r)).Add(r).Add(archsimd.BroadcastFloat32x8(1))
	pow := t.AsInt32x8().ShiftAllLeft(23).Add(archsimd.BroadcastInt32x8(0x3f800000)).AsFloat32x8()
	return p.Mul(pow)
}

func tanhCap8(s []float32, c float32) {
	n := len(s)
	cv := archsimd.BroadcastFloat32x8(c)
	one := archsimd.BroadcastFloat32x8(1)
	two := archsimd.BroadcastFloat32x8(2)
	i := 0
	for ; i+8 <= n; i += 8 {
		x := archsimd.LoadFloat32x8Slice(s[i:])
		e := exp8(x.Add(x))
		th := tanhSmall8(x).Merge(one.Sub(two.Div(e.Add(one))), x.Mul(x).Less(archsimd.BroadcastFloat32x8(tanhSmallSq)))
		// + x*0: a NaN or infinite x gives NaN (exp's clamp would hide it)
		x.MulAdd(archsimd.BroadcastFloat32x8(0), th.Mul(cv)).StoreSlice(s[i:])
	}
	archsimd.ClearAVXUpperBits()
	goTanhCap(s[i:], c)
}

func axpy8(acc, p, v []float32, alpha float32) {
	d := len(acc)
	n := len(p)
	if n == 0 || d == 0 {
		return
	}
	_ = v[n*d-1]
	ap, vp := f32p(acc), f32p(v)
	rb := d * 4
	av := archsimd.BroadcastFloat32x8(alpha)
	scale := alpha != 1
	i := 0
	for ; i+32 <= d; i += 32 {
		o := i * 4
		a0, a1, a2, a3 := ld8(ap, o), ld8(ap, o+32), ld8(ap, o+64), ld8(ap, o+96)
		if scale {
			a0, a1, a2, a3 = a0.Mul(av), a1.Mul(av), a2.Mul(av), a3.Mul(av)
		}
		for t := 0; t < n; t++ {
			vr := unsafe.Add(vp, t*rb+o) // never past the end (checkptr)
			pb := archsimd.BroadcastFloat32x8(p[t])
			a0 = pb.MulAdd(ld8(vr, 0), a0)
			a1 = pb.MulAdd(ld8(vr, 32), a1)
			a2 = pb.MulAdd(ld8(vr, 64), a2)
			a3 = pb.MulAdd(ld8(vr, 96), a3)
		}
		st8(a0, ap, o)
		st8(a1, ap, o+32)
		st8(a2, ap, o+64)
		st8(a3, ap, o+96)
	}
	for ; i+8 <= d; i += 8 {
		o := i * 4
		a0 := ld8(ap, o)
		if scale {
			a0 = a0.Mul(av)
		}
		var a1 archsimd.Float32x8
		t := 0
		for ; t+2 <= n; t += 2 {
			vr := unsafe.Add(vp, t*rb+o)
			a0 = archsimd.BroadcastFloat32x8(p[t]).MulAdd(ld8(vr, 0), a0)
			a1 = archsimd.BroadcastFloat32x8(p[t+1]).MulAdd(ld8(vr, rb), a1)
		}
		if t < n {
			vr := unsafe.Add(vp, t*rb+o)
			a0 = archsimd.BroadcastFloat32x8(p[t]).MulAdd(ld8(vr, 0), a0)
		}
		st8(a0.Add(a1), ap, o)
	}
	archsimd.ClearAVXUpperBits()
	for ; i < d; i++ {
		x := acc[i] * alpha
		for t := 0; t < n; t++ {
			x += p[t] * v[t*d+i]
		}
		acc[i] = x
	}
}

// ---- four-row kernels ----

// dots4x16sim runs two rows x four tokens at a time: 8 accumulators, the most
// the compiler keeps in registers without spilling (it allocates 15 vector
// registers), so each K vector feeds two FMAs.
func dots4x16sim(s, q, k []float32, d int) {
	n := len(s) / 4
	if n == 0 {
		return
	}
	_, _, _ = s[4*n-1], q[4*d-1], k[n*d-1]
	if d&15 != 0 {
		goDots4(s, q, k, d)
		return
	}
	kp := f32p(k)
	rb := d * 4
	for r := 0; r < 4; r += 2 {
		qa := unsafe.Add(f32p(q), r*rb)
		qb := unsafe.Add(qa, rb)
		t := 0
		for ; t+4 <= n; t += 4 {
			k0 := unsafe.Add(kp, t*rb)
			k1 := unsafe.Add(k0, rb)
			k2 := unsafe.Add(k1, rb)
			k3 := unsafe.Add(k2, rb)
			var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x16
			for i := 0; i < rb; i += 64 {
				x0, x1, x2, x3 := ld16(k0, i), ld16(k1, i), ld16(k2, i), ld16(k3, i)
				qv := ld16(qa, i)
				a0, a1, a2, a3 = qv.MulAdd(x0, a0), qv.MulAdd(x1, a1), qv.MulAdd(x2, a2), qv.MulAdd(x3, a3)
				qv = ld16(qb, i)
				b0, b1, b2, b3 = qv.MulAdd(x0, b0), qv.MulAdd(x1, b1), qv.MulAdd(x2, b2), qv.MulAdd(x3, b3)
			}
			sum4x16(a0, a1, a2, a3).StoreSlice(s[r*n+t:])
			sum4x16(b0, b1, b2, b3).StoreSlice(s[(r+1)*n+t:])
		}
		if t < n {
			dots16sim(s[r*n+t:(r+1)*n], q[r*d:(r+1)*d], k[t*d:], d)
			dots16sim(s[(r+1)*n+t:(r+2)*n], q[(r+1)*d:(r+2)*d], k[t*d:], d)
		}
	}
	archsimd.ClearAVXUpperBits()
}

// axpy4x16sim accumulates 4 rows x 32 dims per pass (8 accumulators).
func axpy4x16sim(acc, p, v []float32, alpha *[4]float32) {
	d, n := len(acc)/4, len(p)/4
	if n == 0 || d == 0 {
		return
	}
	_, _ = p[4*n-1], v[n*d-1]
	if d&31 != 0 {
		goAxpy4x(acc, p, v, alpha, axpy16sim)
		return
	}
	rb := d * 4
	ap, vp := f32p(acc), f32p(v)
	p0 := p[:n]
	p1 := p[n : 2*n]
	p2 := p[2*n : 3*n]
	p3 := p[3*n : 4*n]
	al0, al1 := archsimd.BroadcastFloat32x16(alpha[0]), archsimd.BroadcastFloat32x16(alpha[1])
	al2, al3 := archsimd.BroadcastFloat32x16(alpha[2]), archsimd.BroadcastFloat32x16(alpha[3])
	for o := 0; o < rb; o += 128 {
		r0, r1, r2, r3 := unsafe.Add(ap, o), unsafe.Add(ap, rb+o), unsafe.Add(ap, 2*rb+o), unsafe.Add(ap, 3*rb+o)
		a00, a01 := ld16(r0, 0).Mul(al0), ld16(r0, 64).Mul(al0)
		a10, a11 := ld16(r1, 0).Mul(al1), ld16(r1, 64).Mul(al1)
		a20, a21 := ld16(r2, 0).Mul(al2), ld16(r2, 64).Mul(al2)
		a30, a31 := ld16(r3, 0).Mul(al3), ld16(r3, 64).Mul(al3)
		for t := 0; t < n; t++ {
			vr := unsafe.Add(vp, t*rb+o)
			x0, x1 := ld16(vr, 0), ld16(vr, 64)
			b := archsimd.BroadcastFloat32x16(p0[t])
			a00, a01 = b.MulAdd(x0, a00), b.MulAdd(x1, a01)
			b = archsimd.BroadcastFloat32x16(p1[t])
			a10, a11 = b.MulAdd(x0, a10), b.MulAdd(x1, a11)
			b = archsimd.BroadcastFloat32x16(p2[t])
			a20, a21 = b.MulAdd(x0, a20), b.MulAdd(x1, a21)
			b = archsimd.BroadcastFloat32x16(p3[t])
			a30, a31 = b.MulAdd(x0, a30), b.MulAdd(x1, a31)
		}
		st16(a00, r0, 0)
		st16(a01, r0, 64)
		st16(a10, r1, 0)
		st16(a11, r1, 64)
		st16(a20, r2, 0)
		st16(a21, r2, 64)
		st16(a30, r3, 0)
		st16(a31, r3, 64)
	}
	archsimd.ClearAVXUpperBits()
}

// goAxpy4x runs a single-row axpy on each of the four rows.
func goAxpy4x(acc, p, v []float32, alpha *[4]float32, axpy func(acc, p, v []float32, alpha float32)) {
	d, n := len(acc)/4, len(p)/4
	for r := 0; r < 4; r++ {
		axpy(acc[r*d:(r+1)*d], p[r*n:(r+1)*n], v, alpha[r])
	}
}

// dots4x8 (AVX2, 16 registers) runs two rows x four tokens at a time.
func dots4x8(s, q, k []float32, d int) {
	n := len(s) / 4
	if n == 0 {
		return
	}
	_, _, _ = s[4*n-1], q[4*d-1], k[n*d-1]
	if d&7 != 0 {
		goDots4(s, q, k, d)
		return
	}
	kp := f32p(k)
	rb := d * 4
	for r := 0; r < 4; r += 2 {
		qa := unsafe.Add(f32p(q), r*rb)
		qb := unsafe.Add(qa, rb)
		t := 0
		for ; t+4 <= n; t += 4 {
			k0 := unsafe.Add(kp, t*rb)
			k1 := unsafe.Add(k0, rb)
			k2 := unsafe.Add(k1, rb)
			k3 := unsafe.Add(k2, rb)
			var a0, a1, a2, a3, b0, b1, b2, b3 archsimd.Float32x8
			for i := 0; i < rb; i += 32 {
				x0, x1, x2, x3 := ld8(k0, i), ld8(k1, i), ld8(k2, i), ld8(k3, i)
				qv := ld8(qa, i)
				a0, a1, a2, a3 = qv.MulAdd(x0, a0), qv.MulAdd(x1, a1), qv.MulAdd(x2, a2), qv.MulAdd(x3, a3)
				qv = ld8(qb, i)
				b0, b1, b2, b3 = qv.MulAdd(x0, b0), qv.MulAdd(x1, b1), qv.MulAdd(x2, b2), qv.MulAdd(x3, b3)
			}
			sum4x8(a0, a1, a2, a3).StoreSlice(s[r*n+t:])
			sum4x8(b0, b1, b2, b3).StoreSlice(s[(r+1)*n+t:])
		}
		if t < n {
			dots8(s[r*n+t:(r+1)*n], q[r*d:(r+1)*d], k[t*d:], d)
			dots8(s[(r+1)*n+t:(r+2)*n], q[(r+1)*d:(r+2)*d], k[t*d:], d)
		}
	}
	archsimd.ClearAVXUpperBits()
}

// axpy4x8 (AVX2) accumulates 4 rows x 16 dims per pass (8 accumulators).
func axpy4x8(acc, p, v []float32, alpha *[4]float32) {
	d, n := len(acc)/4, len(p)/4
	if n == 0 || d == 0 {
		return
	}
	_, _ = p[4*n-1], v[n*d-1]
	if d&15 != 0 {
		goAxpy4x(acc, p, v, alpha, axpy8)
		return
	}
	rb := d * 4
	ap, vp := f32p(acc), f32p(v)
	p0 := p[:n]
	p1 := p[n : 2*n]
	p2 := p[2*n : 3*n]
	p3 := p[3*n : 4*n]
	al0, al1 := archsimd.BroadcastFloat32x8(alpha[0]), archsimd.BroadcastFloat32x8(alpha[1])
	al2, al3 := archsimd.BroadcastFloat32x8(alpha[2]), archsimd.BroadcastFloat32x8(alpha[3])
	for o := 0; o < rb; o += 64 {
		r0, r1, r2, r3 := unsafe.Add(ap, o), unsafe.Add(ap, rb+o), unsafe.Add(ap, 2*rb+o), unsafe.Add(ap, 3*rb+o)
		a00, a01 := ld8(r0, 0).Mul(al0), ld8(r0, 32).Mul(al0)
		a10, a11 := ld8(r1, 0).Mul(al1), ld8(r1, 32).Mul(al1)
		a20, a21 := ld8(r2, 0).Mul(al2), ld8(r2, 32).Mul(al2)
		a30, a31 := ld8(r3, 0).Mul(al3), ld8(r3, 32).Mul(al3)
		for t := 0; t < n; t++ {
			vr := unsafe.Add(vp, t*rb+o)
			x0, x1 := ld8(vr, 0), ld8(vr, 32)
			b := archsimd.BroadcastFloat32x8(p0[t])
			a00, a01 = b.MulAdd(x0, a00), b.MulAdd(x1, a01)
			b = archsimd.BroadcastFloat32x8(p1[t])
			a10, a11 = b.MulAdd(x0, a10), b.MulAdd(x1, a11)
			b = archsimd.BroadcastFloat32x8(p2[t])
			a20, a21 = b.MulAdd(x0, a20), b.MulAdd(x1, a21)
			b = archsimd.BroadcastFloat32x8(p3[t])
			a30, a31 = b.MulAdd(x0, a30), b.MulAdd(x1, a31)
		}
		st8(a00, r0, 0)
		st8(a01, r0, 32)
		st8(a10, r1, 0)
		st8(a11, r1, 32)
		st8(a20, r2, 0)
		st8(a21, r2, 32)
		st8(a30, r3, 0)
		st8(a31, r3, 32)
	}
	archsimd.ClearAVXUpperBits()
}
