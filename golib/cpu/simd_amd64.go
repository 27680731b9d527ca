//go:build goexperiment.simd && amd64

package cpu

import (
	"simd/archsimd"
)

// avx512Ops and avx2Ops are the simd/archsimd inner loops: 16- and 8-lane
// float32 vectors with FMA. Half and bfloat16 rows are widened with integer
// shifts (archsimd has no F16C or BF16 conversion intrinsics yet); the
// results are bit-identical to the scalar codec.
var avx512Ops = kernelOps{
	name:    "avx512",
	dots:    dots16,
	maxOf:   max16,
	expSub:  expSub16,
	tanhCap: tanhCap16,
	axpy:    axpy16,
	cvtF16:  cvtF16x16,
	cvtBF16: cvtBF16x16,
}

var avx2Ops = kernelOps{
	name:    "avx2",
	dots:    dots8,
	maxOf:   max8,
	expSub:  expSub8,
	tanhCap: tanhCap8,
	axpy:    axpy8,
	cvtF16:  cvtF16x8,
	cvtBF16: cvtBF16x8,
}

func registerSIMD() {
	x := archsimd.X86
	if x.AVX2() && x.FMA() {
		kernelVariants = append(kernelVariants, &avx2Ops)
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

func dots16(s, q, k []float32, d int) {
	n := len(s)
	dv := d &^ 15
	t := 0
	for ; t+4 <= n; t += 4 {
		k0 := k[t*d : t*d+d]
		k1 := k[t*d+d : t*d+2*d]
		k2 := k[t*d+2*d : t*d+3*d]
		k3 := k[t*d+3*d : t*d+4*d]
		var a0, a1, a2, a3 archsimd.Float32x16
		for i := 0; i < dv; i += 16 {
			qv := archsimd.LoadFloat32x16Slice(q[i:])
			a0 = qv.MulAdd(archsimd.LoadFloat32x16Slice(k0[i:]), a0)
			a1 = qv.MulAdd(archsimd.LoadFloat32x16Slice(k1[i:]), a1)
			a2 = qv.MulAdd(archsimd.LoadFloat32x16Slice(k2[i:]), a2)
			a3 = qv.MulAdd(archsimd.LoadFloat32x16Slice(k3[i:]), a3)
		}
		r := sum4x16(a0, a1, a2, a3)
		r.StoreSlice(s[t:])
		for i := dv; i < d; i++ {
			s[t] += q[i] * k0[i]
			s[t+1] += q[i] * k1[i]
			s[t+2] += q[i] * k2[i]
			s[t+3] += q[i] * k3[i]
		}
	}
	for ; t < n; t++ {
		kr := k[t*d : t*d+d]
		var a archsimd.Float32x16
		for i := 0; i < dv; i += 16 {
			a = archsimd.LoadFloat32x16Slice(q[i:]).MulAdd(archsimd.LoadFloat32x16Slice(kr[i:]), a)
		}
		sum := hsum8(a.GetLo().Add(a.GetHi()))
		for i := dv; i < d; i++ {
			sum += q[i] * kr[i]
		}
		s[t] = sum
	}
}

func max16(s []float32) float32 {
	n := len(s)
	i := 0
	m := s[0]
	if n >= 16 {
		mv := archsimd.LoadFloat32x16Slice(s)
		for i = 16; i+16 <= n; i += 16 {
			mv = mv.Max(archsimd.LoadFloat32x16Slice(s[i:]))
		}
		m8 := mv.GetLo().Max(mv.GetHi())
		m4 := m8.GetLo().Max(m8.GetHi())
		m = max(max(m4.GetElem(0), m4.GetElem(1)), max(m4.GetElem(2), m4.GetElem(3)))
	}
	for ; i < n; i++ {
		m = max(m, s[i])
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
	for ; i < n; i++ {
		e := expf(s[i] - m)
		s[i] = e
		sum += e
	}
	return sum
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
		th := one.Sub(two.Div(e.Add(one)))
		th.Mul(cv).StoreSlice(s[i:])
	}
	goTanhCap(s[i:], c)
}

func axpy16(acc, p, v []float32, alpha float32) {
	d := len(acc)
	n := len(p)
	av := archsimd.BroadcastFloat32x16(alpha)
	scale := alpha != 1
	i := 0
	for ; i+64 <= d; i += 64 {
		a0 := archsimd.LoadFloat32x16Slice(acc[i:])
		a1 := archsimd.LoadFloat32x16Slice(acc[i+16:])
		a2 := archsimd.LoadFloat32x16Slice(acc[i+32:])
		a3 := archsimd.LoadFloat32x16Slice(acc[i+48:])
		if scale {
			a0, a1, a2, a3 = a0.Mul(av), a1.Mul(av), a2.Mul(av), a3.Mul(av)
		}
		for t := 0; t < n; t++ {
			pb := archsimd.BroadcastFloat32x16(p[t])
			vr := v[t*d+i : t*d+i+64]
			a0 = pb.MulAdd(archsimd.LoadFloat32x16Slice(vr), a0)
			a1 = pb.MulAdd(archsimd.LoadFloat32x16Slice(vr[16:]), a1)
			a2 = pb.MulAdd(archsimd.LoadFloat32x16Slice(vr[32:]), a2)
			a3 = pb.MulAdd(archsimd.LoadFloat32x16Slice(vr[48:]), a3)
		}
		a0.StoreSlice(acc[i:])
		a1.StoreSlice(acc[i+16:])
		a2.StoreSlice(acc[i+32:])
		a3.StoreSlice(acc[i+48:])
	}
	for ; i+16 <= d; i += 16 {
		a0 := archsimd.LoadFloat32x16Slice(acc[i:])
		if scale {
			a0 = a0.Mul(av)
		}
		var a1 archsimd.Float32x16
		t := 0
		for ; t+2 <= n; t += 2 {
			a0 = archsimd.BroadcastFloat32x16(p[t]).MulAdd(archsimd.LoadFloat32x16Slice(v[t*d+i:]), a0)
			a1 = archsimd.BroadcastFloat32x16(p[t+1]).MulAdd(archsimd.LoadFloat32x16Slice(v[t*d+d+i:]), a1)
		}
		if t < n {
			a0 = archsimd.BroadcastFloat32x16(p[t]).MulAdd(archsimd.LoadFloat32x16Slice(v[t*d+i:]), a0)
		}
		a0.Add(a1).StoreSlice(acc[i:])
	}
	for ; i < d; i++ {
		x := acc[i] * alpha
		for t := 0; t < n; t++ {
			x += p[t] * v[t*d+i]
		}
		acc[i] = x
	}
}

func cvtBF16x16(dst []float32, src []uint16) {
	n := len(src)
	i := 0
	for ; i+16 <= n; i += 16 {
		archsimd.LoadUint16x16Slice(src[i:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x16().StoreSlice(dst[i:])
	}
	for ; i < n; i++ {
		dst[i] = bf16f(src[i])
	}
}

// cvtF16x16 widens IEEE halves exactly: the exponent/mantissa bits shifted
// into float32 position and multiplied by 2^112 rebias normals and
// normalize subnormals in one step; Inf/NaN get the all-ones exponent.
func cvtF16x16(dst []float32, src []uint16) {
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
	for ; i < n; i++ {
		dst[i] = goF16(src[i])
	}
}

// ---- AVX2 (8 lanes) ----

func dots8(s, q, k []float32, d int) {
	n := len(s)
	dv := d &^ 7
	t := 0
	for ; t+4 <= n; t += 4 {
		k0 := k[t*d : t*d+d]
		k1 := k[t*d+d : t*d+2*d]
		k2 := k[t*d+2*d : t*d+3*d]
		k3 := k[t*d+3*d : t*d+4*d]
		var a0, a1, a2, a3 archsimd.Float32x8
		for i := 0; i < dv; i += 8 {
			qv := archsimd.LoadFloat32x8Slice(q[i:])
			a0 = qv.MulAdd(archsimd.LoadFloat32x8Slice(k0[i:]), a0)
			a1 = qv.MulAdd(archsimd.LoadFloat32x8Slice(k1[i:]), a1)
			a2 = qv.MulAdd(archsimd.LoadFloat32x8Slice(k2[i:]), a2)
			a3 = qv.MulAdd(archsimd.LoadFloat32x8Slice(k3[i:]), a3)
		}
		sum4x8(a0, a1, a2, a3).StoreSlice(s[t:])
		for i := dv; i < d; i++ {
			s[t] += q[i] * k0[i]
			s[t+1] += q[i] * k1[i]
			s[t+2] += q[i] * k2[i]
			s[t+3] += q[i] * k3[i]
		}
	}
	for ; t < n; t++ {
		kr := k[t*d : t*d+d]
		var a archsimd.Float32x8
		for i := 0; i < dv; i += 8 {
			a = archsimd.LoadFloat32x8Slice(q[i:]).MulAdd(archsimd.LoadFloat32x8Slice(kr[i:]), a)
		}
		sum := hsum8(a)
		for i := dv; i < d; i++ {
			sum += q[i] * kr[i]
		}
		s[t] = sum
	}
}

func max8(s []float32) float32 {
	n := len(s)
	i := 0
	m := s[0]
	if n >= 8 {
		mv := archsimd.LoadFloat32x8Slice(s)
		for i = 8; i+8 <= n; i += 8 {
			mv = mv.Max(archsimd.LoadFloat32x8Slice(s[i:]))
		}
		m4 := mv.GetLo().Max(mv.GetHi())
		m = max(max(m4.GetElem(0), m4.GetElem(1)), max(m4.GetElem(2), m4.GetElem(3)))
	}
	for ; i < n; i++ {
		m = max(m, s[i])
	}
	return m
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

func expSub8(s []float32, m float32) float32 {
	n := len(s)
	mv := archsimd.BroadcastFloat32x8(m)
	var acc archsimd.Float32x8
	i := 0
	for ; i+8 <= n; i += 8 {
		e := exp8(archsimd.LoadFloat32x8Slice(s[i:]).Sub(mv))
		e.StoreSlice(s[i:])
		acc = acc.Add(e)
	}
	sum := hsum8(acc)
	for ; i < n; i++ {
		e := expf(s[i] - m)
		s[i] = e
		sum += e
	}
	return sum
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
		th := one.Sub(two.Div(e.Add(one)))
		th.Mul(cv).StoreSlice(s[i:])
	}
	goTanhCap(s[i:], c)
}

func axpy8(acc, p, v []float32, alpha float32) {
	d := len(acc)
	n := len(p)
	av := archsimd.BroadcastFloat32x8(alpha)
	scale := alpha != 1
	i := 0
	for ; i+32 <= d; i += 32 {
		a0 := archsimd.LoadFloat32x8Slice(acc[i:])
		a1 := archsimd.LoadFloat32x8Slice(acc[i+8:])
		a2 := archsimd.LoadFloat32x8Slice(acc[i+16:])
		a3 := archsimd.LoadFloat32x8Slice(acc[i+24:])
		if scale {
			a0, a1, a2, a3 = a0.Mul(av), a1.Mul(av), a2.Mul(av), a3.Mul(av)
		}
		for t := 0; t < n; t++ {
			pb := archsimd.BroadcastFloat32x8(p[t])
			vr := v[t*d+i : t*d+i+32]
			a0 = pb.MulAdd(archsimd.LoadFloat32x8Slice(vr), a0)
			a1 = pb.MulAdd(archsimd.LoadFloat32x8Slice(vr[8:]), a1)
			a2 = pb.MulAdd(archsimd.LoadFloat32x8Slice(vr[16:]), a2)
			a3 = pb.MulAdd(archsimd.LoadFloat32x8Slice(vr[24:]), a3)
		}
		a0.StoreSlice(acc[i:])
		a1.StoreSlice(acc[i+8:])
		a2.StoreSlice(acc[i+16:])
		a3.StoreSlice(acc[i+24:])
	}
	for ; i+8 <= d; i += 8 {
		a0 := archsimd.LoadFloat32x8Slice(acc[i:])
		if scale {
			a0 = a0.Mul(av)
		}
		var a1 archsimd.Float32x8
		t := 0
		for ; t+2 <= n; t += 2 {
			a0 = archsimd.BroadcastFloat32x8(p[t]).MulAdd(archsimd.LoadFloat32x8Slice(v[t*d+i:]), a0)
			a1 = archsimd.BroadcastFloat32x8(p[t+1]).MulAdd(archsimd.LoadFloat32x8Slice(v[t*d+d+i:]), a1)
		}
		if t < n {
			a0 = archsimd.BroadcastFloat32x8(p[t]).MulAdd(archsimd.LoadFloat32x8Slice(v[t*d+i:]), a0)
		}
		a0.Add(a1).StoreSlice(acc[i:])
	}
	for ; i < d; i++ {
		x := acc[i] * alpha
		for t := 0; t < n; t++ {
			x += p[t] * v[t*d+i]
		}
		acc[i] = x
	}
}

func cvtBF16x8(dst []float32, src []uint16) {
	n := len(src)
	i := 0
	for ; i+8 <= n; i += 8 {
		archsimd.LoadUint16x8Slice(src[i:]).ExtendToUint32().ShiftAllLeft(16).AsFloat32x8().StoreSlice(dst[i:])
	}
	for ; i < n; i++ {
		dst[i] = bf16f(src[i])
	}
}

func cvtF16x8(dst []float32, src []uint16) {
	n := len(src)
	em := archsimd.BroadcastUint32x8(0x7fff)
	sm := archsimd.BroadcastUint32x8(0x8000)
	infm := archsimd.BroadcastUint32x8(0x7c00)
	expAll := archsimd.BroadcastUint32x8(0x7f800000)
	magic := archsimd.BroadcastFloat32x8(0x1p112)
	i := 0
	for ; i+8 <= n; i += 8 {
		h := archsimd.LoadUint16x8Slice(src[i:]).ExtendToUint32()
		o := h.And(em).ShiftAllLeft(13)
		f := o.AsFloat32x8().Mul(magic).AsUint32x8()
		special := h.And(infm).Equal(infm)
		f = o.Or(expAll).Merge(f, special)
		f.Or(h.And(sm).ShiftAllLeft(16)).AsFloat32x8().StoreSlice(dst[i:])
	}
	for ; i < n; i++ {
		dst[i] = goF16(src[i])
	}
}
