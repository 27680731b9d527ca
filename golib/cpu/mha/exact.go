package mha

import (
	"math"
	"sync/atomic"
)

// exactRows counts the rows the float32 units recomputed with exactRow.
var exactRows atomic.Int64

// exactRow computes query row i of query head h of sequence b in float64,
// reading Q from in and the keys and values from the present buffers
// ([batch, kv_heads, total, dim], as Run assembles them). It returns the
// output row (head_dim_v values) and the row of qk_matmul_output at the
// stage QKMode selects (total values). It allocates; the reference used by
// the tests is this function applied to every row.
func (g *Geometry) exactRow(in Inputs, keys, values []float32, b, h, i int) (y, qk []float64) {
	Hq, Hkv, S, T := g.QHeads, g.KVHeads, g.QLen, g.TotalLen
	dk, dv, P := g.HeadDimK, g.HeadDimV, g.PastLen
	kh := h * Hkv / Hq
	var q []float32
	if g.Input3D {
		q = in.Q[(b*S+i)*Hq*dk+h*dk:][:dk]
	} else {
		q = in.Q[((b*Hq+h)*S+i)*dk:][:dk]
	}
	kb := keys[(b*Hkv+kh)*T*dk:][:T*dk]
	vb := values[(b*Hkv+kh)*T*dv:][:T*dv]
	low := -math.MaxFloat32
	if g.InfMasking {
		low = math.Inf(-1)
	}
	sc := make([]float64, T)
	qk = make([]float64, T)
	for j := range T {
		var dot float64
		for d, x := range q {
			dot += float64(x) * float64(kb[j*dk+d])
		}
		s := dot * float64(g.Scale)
		if g.QKMode == 0 {
			qk[j] = s
		}
		if g.Softcap > 0 {
			s = float64(g.Softcap) * math.Tanh(s/float64(g.Softcap))
		}
		if g.QKMode == 1 {
			qk[j] = s
		}
		allowed := true
		if g.HasMask {
			md := g.maskDims
			mb, mh, mi := b%md[0], h%md[1], i%md[2]
			if j >= md[3] {
				if in.Mask.Float != nil {
					s = math.Inf(-1)
				} else {
					allowed = false
				}
			} else {
				idx := ((mb*md[1]+mh)*md[2]+mi)*md[3] + j
				if in.Mask.Float != nil {
					s += float64(in.Mask.Float[idx])
				} else if !in.Mask.Bool[idx] {
					allowed = false
				}
			}
		}
		offset := P
		if g.HasNonpad {
			n := int(in.NonpadKVSeqlen[b])
			offset = n - S
			if j >= n {
				allowed = false
			}
		}
		if g.IsCausal && j > i+offset {
			allowed = false
		}
		if g.SlidingWindow {
			p := i + offset
			if (g.LeftWindow >= 0 && j < p-g.LeftWindow) || (g.RightWindow >= 0 && j > p+g.RightWindow) {
				allowed = false
			}
		}
		if !allowed {
			s = low
		}
		sc[j] = s
		if g.QKMode == 2 {
			qk[j] = s
		}
	}
	mx := math.Inf(-1)
	for _, s := range sc {
		mx = math.Max(mx, s)
	}
	var sum, sink float64
	if g.SmoothSoftmax { // one more logit that takes weight only
		if in.HeadSink != nil {
			sink = float64(in.HeadSink[h])
		}
		mx = math.Max(mx, sink)
		sum = math.Exp(sink - mx)
	}
	for j, s := range sc {
		if mx <= low && !g.SmoothSoftmax {
			sc[j] = 0
			continue
		}
		sc[j] = math.Exp(s - mx)
		sum += sc[j]
	}
	for j := range sc {
		if sum > 0 {
			sc[j] /= sum
		}
		if g.QKMode == 3 {
			qk[j] = sc[j]
		}
	}
	y = make([]float64, dv)
	for d := range dv {
		var acc float64
		for j := range T {
			acc += sc[j] * float64(vb[j*dv+d])
		}
		y[d] = acc
	}
	return y, qk
}

// exactFallback recomputes query row (b, h, i) with exactRow into y (its
// head_dim_v outputs) and qk (its qk_matmul_output row, or nil).
func (g *Geometry) exactFallback(in Inputs, keys, values []float32, b, h, i int, y, qk []float32) {
	exactRows.Add(1)
	y64, qk64 := g.exactRow(in, keys, values, b, h, i)
	for d, v := range y64 {
		y[d] = float32(v)
	}
	for j := range qk {
		qk[j] = float32(qk64[j])
	}
}

// nonFiniteGo reports whether s holds a NaN or an infinity: sum(0*x) is
// NaN exactly then (four independent sums).
func nonFiniteGo(s []float32) bool {
	var z0, z1, z2, z3 float32
	j := 0
	for ; j+4 <= len(s); j += 4 {
		z0 += s[j] * 0
		z1 += s[j+1] * 0
		z2 += s[j+2] * 0
		z3 += s[j+3] * 0
	}
	for ; j < len(s); j++ {
		z0 += s[j] * 0
	}
	return (z0+z1)+(z2+z3) != 0
}
