package mha

import (
	"math"
	"sync"
)

// Decode-shaped calls (a few query tokens against a past) are a bandwidth
// problem: each K/V byte serves only the query heads of its group. The
// general unit materializes a [rows, total] score block through two
// products; the streaming unit instead walks one (sequence, KV head) with
// all query rows of its group in blocks of streamBlock keys: the block's
// scores for every row, a vectorized exp, the running (max, sum) update and
// the weighted V rows accumulated at once (the online softmax of the decode
// kernel in package cpu), so nothing of the context's length is
// materialized and each K/V byte is read once per call. It runs on the gemm
// pool with the call's thread bound. (Handing these calls to cpu.Attention
// instead was measured slower inside a decode step from Python: its
// worker pool polls for 1 ms after each call and competes with the gemm
// pool's helpers for the cores.)

// unitDecode enables the streaming unit (tests and benchmarks turn it off to
// compare with the general unit).
var unitDecode = true

// streamBlock is the number of keys per block: a 64-dim block of K and one
// of V are 16 KiB each and stay in L1 while every row of the group uses
// them.
const streamBlock = 64

// copyBlock is the number of keys copied into the present buffers at once,
// a multiple of streamBlock: long copies stream faster, and a copied range
// of K and V (2 x 128 KiB at 64 dims) is still in L2 when it is read.
const copyBlock = 512

// streamKernels are the inner loops of the streaming unit; every variant
// computes the same values.
type streamKernels struct {
	// dots sets dst[t] = sum_j q[j]*k[t*dk+j] for t < n (len(q) == dk).
	dots func(dst, q, k []float32, n, dk int)
	// accum adds sum_t p[t]*v[t*dv:(t+1)*dv] to acc (len(acc) == dv).
	accum func(acc, p, v []float32, n, dv int)
	// maxOf returns the largest element of s (len(s) > 0), or NaN when s
	// holds a NaN or an infinity.
	maxOf func(s []float32) float32
	// nonFinite reports whether s holds a NaN or an infinity.
	nonFinite func(s []float32) bool
}

var goStreamKernels = streamKernels{dots: dotsGo, accum: accumGo, maxOf: maxOfGo, nonFinite: nonFiniteGo}

// maxOfGo is the portable streamKernels.maxOf.
func maxOfGo(s []float32) float32 {
	m := s[0]
	var z float32 // sum of x*0: NaN as soon as one x is NaN or infinite
	for _, x := range s {
		m = max(m, x)
		z += x * 0
	}
	if z != 0 {
		return z
	}
	return m
}

// streamMath reports whether the call is plain softmax attention with a
// causal rule (if any) aligned to the end of the keys: no mask, nonpad
// lengths, window, softcap, smooth softmax, qk_matmul_output or float64
// softmax, and either one query token without is_causal or as many new keys
// as query tokens (then query row i sees keys up to PastLen+i, the
// end-aligned rule).
//
// Under these conditions the last query row sees every position (causal
// rows need KVLen == QLen), so a streaming unit copies all of its head into
// the present outputs; the Attention op relies on it and does not zero them.
func (g *Geometry) streamMath(out Outputs) bool {
	return !g.HasMask && !g.HasNonpad && !g.SlidingWindow && !g.SmoothSoftmax && out.QK == nil &&
		g.Softcap == 0 && g.Scale > 0 && g.SoftmaxPrecision != PrecisionDouble &&
		g.QLen >= 1 && g.QLen <= g.TotalLen &&
		((g.QLen == 1 && !g.IsCausal) || (g.IsCausal && g.KVLen == g.QLen))
}

// streamState is one unit's scratch, pooled.
type streamState struct {
	qs, acc, sc []float32
	m, l        []float32
	lim         []int
}

var streamStates = sync.Pool{New: func() any { return new(streamState) }}

// grow returns b resized to n, reallocating only when it is too small.
func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}

// streamUnit computes rows [0, rows) of span sp (all of them: one unit per
// KV head), assembling its head of keys and values as it goes.
func (g *Geometry) streamUnit(in Inputs, out Outputs, keys, values []float32, sp span, rows int, ex expFunc, ks *streamKernels) {
	total, dk, dv := g.TotalLen, g.HeadDimK, g.HeadDimV
	kb := keys[sp.keys : sp.keys+total*dk]
	vb := values[sp.values : sp.values+total*dv]
	st := streamStates.Get().(*streamState)
	defer streamStates.Put(st)
	st.qs, st.acc, st.sc = grow(st.qs, rows*dk), grow(st.acc, rows*dv), grow(st.sc, streamBlock)
	st.m, st.l = grow(st.m, rows), grow(st.l, rows)
	if cap(st.lim) < rows {
		st.lim = make([]int, rows)
	}
	st.lim = st.lim[:rows]
	end := 0
	for r := range rows {
		q := in.Q[sp.qOff+r*sp.ldq : sp.qOff+r*sp.ldq+dk]
		for j, x := range q {
			st.qs[r*dk+j] = x * g.Scale
		}
		st.lim[r] = total
		if g.IsCausal {
			st.lim[r] = min(total, r%g.QLen+g.PastLen+1)
		}
		end = max(end, st.lim[r])
		st.m[r], st.l[r] = float32(math.Inf(-1)), 0
	}
	clear(st.acc)
	// keys and values are the present buffers, filled block by block just
	// before the block is read (in place when they are the inputs).
	copyK, copyV := !sameSlice(keys, in.K), !sameSlice(values, in.V)
	for t0 := 0; t0 < end; t0 += streamBlock {
		if t0%copyBlock == 0 {
			t1 := min(t0+copyBlock, end)
			if copyK {
				g.copyRange(in.PastKey, in.K, keys, dk, sp.b, sp.kvh, t0, t1)
			}
			if copyV {
				g.copyRange(in.PastValue, in.V, values, dv, sp.b, sp.kvh, t0, t1)
			}
		}
		for r := range rows {
			n := min(t0+streamBlock, st.lim[r]) - t0
			if n <= 0 {
				continue
			}
			if st.m[r] != st.m[r] {
				continue // met a non-finite score: recomputed at the end
			}
			s := st.sc[:n]
			ks.dots(s, st.qs[r*dk:(r+1)*dk], kb[t0*dk:], n, dk)
			bm := ks.maxOf(s)
			if bm != bm { // a NaN or an infinite score
				st.m[r] = bm
				continue
			}
			mx := max(st.m[r], bm)
			acc := st.acc[r*dv : (r+1)*dv]
			if mx > st.m[r] && st.l[r] > 0 {
				alpha := exp32(st.m[r] - mx)
				st.l[r] *= alpha
				for j := range acc {
					acc[j] *= alpha
				}
			}
			st.m[r] = mx
			st.l[r] += float32(ex(s, mx))
			ks.accum(acc, s, vb[t0*dv:], n, dv)
		}
	}
	// A row whose state or accumulator is not finite met a non-finite
	// score or V value (sum(0*acc) is NaN exactly when acc holds a NaN or
	// an infinity): it is recomputed exactly. Rows that stop before the end
	// (causal) did not read the later V rows, which the definition weighs
	// by 0: when V holds a non-finite value, every row is recomputed.
	bad, partial := false, false
	for r := range rows {
		acc := st.acc[r*dv : (r+1)*dv]
		if !finiteState(st.m[r], st.l[r]) || ks.nonFinite(acc) {
			st.m[r], bad = float32(math.NaN()), true
			continue
		}
		partial = partial || st.lim[r] < total
		y := out.Y[sp.yOff+r*sp.ldy : sp.yOff+r*sp.ldy+dv]
		inv := 1 / st.l[r]
		for j, v := range acc {
			y[j] = v * inv
		}
	}
	if !bad {
		return
	}
	all := partial && ks.nonFinite(vb)
	for r := range rows {
		if st.m[r] == st.m[r] && !all {
			continue
		}
		y := out.Y[sp.yOff+r*sp.ldy : sp.yOff+r*sp.ldy+dv]
		g.exactFallback(in, keys, values, sp.b, sp.h0+r/g.QLen, r%g.QLen, y, nil)
	}
}

// finiteState reports whether a row's online-softmax state (max score m,
// sum of weights l) stayed finite: m is NaN once a score was not finite,
// and l >= 1 whenever m is finite.
func finiteState(m, l float32) bool { return m-m == 0 && l-l == 0 && l > 0 }

// dotsGo is the portable streamKernels.dots: four partial sums per key.
func dotsGo(dst, q, k []float32, n, dk int) {
	q = q[:dk]
	for t := range n {
		row := k[t*dk : (t+1)*dk]
		var s0, s1, s2, s3 float32
		j := 0
		for ; j+4 <= dk; j += 4 {
			s0 += q[j] * row[j]
			s1 += q[j+1] * row[j+1]
			s2 += q[j+2] * row[j+2]
			s3 += q[j+3] * row[j+3]
		}
		for ; j < dk; j++ {
			s0 += q[j] * row[j]
		}
		dst[t] = (s0 + s1) + (s2 + s3)
	}
}

// accumGo is the portable streamKernels.accum.
func accumGo(acc, p, v []float32, n, dv int) {
	acc = acc[:dv]
	for t := range n {
		pt := p[t]
		for j, x := range v[t*dv : (t+1)*dv] {
			acc[j] += pt * x
		}
	}
}
