package mha

import (
	"math"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// A span is a set of query rows that share one KV head and sit at a
// constant stride in Q and Y, so one product scores them all and each K/V
// byte is read once for the whole span: all query heads of a GQA group when
// their rows are evenly spaced (4D inputs, or 3D with one query token),
// otherwise a single query head. Row r of a span is query position r % QLen
// of query head h0 + r / QLen.
type span struct {
	b, h0, kvh   int
	qOff, ldq    int
	yOff, ldy    int
	keys, values int // offsets of the KV head in the present buffers
}

// spanHeads is the number of query heads per span.
func (g *Geometry) spanHeads() int {
	if !g.Input3D || g.QLen == 1 {
		return g.QHeads / g.KVHeads
	}
	return 1
}

// span returns span number s (batch-major).
func (g *Geometry) span(s int) span {
	per := g.QHeads / g.spanHeads()
	sp := span{b: s / per, h0: (s % per) * g.spanHeads()}
	sp.kvh = sp.h0 / (g.QHeads / g.KVHeads) // GQA: consecutive query heads share a KV head
	dk, dv := g.HeadDimK, g.HeadDimV
	if g.Input3D {
		sp.ldq, sp.qOff = g.QHeads*dk, sp.b*g.QLen*g.QHeads*dk+sp.h0*dk
		sp.ldy, sp.yOff = g.QHeads*dv, sp.b*g.QLen*g.QHeads*dv+sp.h0*dv
		if g.QLen == 1 { // the group's heads are adjacent in the hidden axis
			sp.ldq, sp.ldy = dk, dv
		}
	} else {
		sp.ldq, sp.qOff = dk, (sp.b*g.QHeads+sp.h0)*g.QLen*dk
		sp.ldy, sp.yOff = dv, (sp.b*g.QHeads+sp.h0)*g.QLen*dv
	}
	bkv := sp.b*g.KVHeads + sp.kvh
	sp.keys, sp.values = bkv*g.TotalLen*dk, bkv*g.TotalLen*dv
	return sp
}

// unit computes rows [r0, r1) of a span: scores = scale * Q K^T, then
// softcap, masks and softmax per row, then Y = P V, capturing
// qk_matmul_output at the requested stage. threads bounds its products.
// Rows that meet a non-finite value are recomputed with exactRow: a raw
// score that is NaN or ±Inf, a non-finite output row, or a non-finite
// value in the V rows past the scored columns (which the definition weighs
// by 0); nonFinite is the check, pad (nil without nonpad lengths) remembers
// it for the V rows past each sequence's nonpad length.
func (g *Geometry) unit(in Inputs, out Outputs, keys, values []float32, sp span, r0, r1, threads int, ex expFunc, nonFinite func([]float32) bool, pad padCheck) error {
	rows := r1 - r0
	total, dk, dv := g.TotalLen, g.HeadDimK, g.HeadDimV
	kb := keys[sp.keys : sp.keys+total*dk]
	vb := values[sp.values : sp.values+total*dv]

	// offset aligns the causal frontier to the end of the valid keys.
	offset, valid := g.PastLen, total
	if g.HasNonpad {
		valid = int(in.NonpadKVSeqlen[sp.b])
		offset = valid - g.QLen
	}
	// Keys no row of the block may attend need no score unless
	// qk_matmul_output wants to see them.
	cols := total
	if out.QK == nil {
		last := g.QLen - 1 // the block's latest query position
		if r1-r0 < g.QLen && r0%g.QLen <= (r1-1)%g.QLen {
			last = (r1 - 1) % g.QLen
		}
		if g.IsCausal {
			cols = min(cols, max(0, last+offset+1))
		}
		if g.SlidingWindow && g.RightWindow >= 0 {
			cols = min(cols, max(0, last+offset+g.RightWindow+1))
		}
		cols = min(cols, valid)
	}
	excl, allMasked := float32(lowest), float32(lowest)
	if g.InfMasking {
		excl, allMasked = float32(math.Inf(-1)), float32(math.Inf(-1))
	}

	sp2 := scratch.Get().(*[]float32)
	defer scratch.Put(sp2)
	if cap(*sp2) < rows*total {
		*sp2 = make([]float32, rows*total)
	}
	s := (*sp2)[:rows*total]
	if cols > 0 {
		q := in.Q[sp.qOff+r0*sp.ldq:]
		if err := gemm.SgemmThreads(threads, false, true, rows, cols, dk, g.Scale, q, sp.ldq, kb, dk, 0, s, total); err != nil {
			return err
		}
	}
	// exact[r]: row r is recomputed by exactRow. With scale 0 the product
	// is not computed (0 scores), so NaN and ±Inf are looked for in Q and K.
	var exact [rowBlock]bool
	all := false
	if cols < total {
		hi := total
		if pad != nil && valid < total { // the padding: once per KV head
			hi = valid
			all = pad.nonFinite(sp.b*g.KVHeads+sp.kvh, vb[valid*dv:], nonFinite)
		}
		all = all || nonFinite(vb[cols*dv:hi*dv])
	}
	kBad := g.Scale == 0 && nonFinite(kb[:cols*dk])
	for r := range rows {
		h, i := sp.h0+(r0+r)/g.QLen, (r0+r)%g.QLen
		row := s[r*total : r*total+cols]
		var qk []float32
		if out.QK != nil {
			qk = out.QK[((sp.b*g.QHeads+h)*g.QLen+i)*total : ((sp.b*g.QHeads+h)*g.QLen+i+1)*total]
		}
		exact[r] = all || nonFinite(row) ||
			(g.Scale == 0 && (kBad || nonFinite(in.Q[sp.qOff+(r0+r)*sp.ldq:][:dk])))
		if exact[r] {
			clear(row)
			continue
		}
		if g.QKMode == 0 && qk != nil {
			copy(qk, row)
		}
		if g.Softcap > 0 {
			softcap(row, g.Softcap)
		}
		if g.QKMode == 1 && qk != nil {
			copy(qk, row)
		}
		lo, lim := 0, valid
		if g.IsCausal {
			lim = min(lim, max(0, i+offset+1))
		}
		if g.SlidingWindow {
			if g.RightWindow >= 0 {
				lim = min(lim, max(0, i+offset+g.RightWindow+1))
			}
			if g.LeftWindow >= 0 {
				lo = max(0, i+offset-g.LeftWindow)
			}
		}
		g.mask(row, in.Mask, sp.b, h, i, lo, lim, excl)
		if g.QKMode == 2 && qk != nil {
			copy(qk, row)
		}
		switch {
		case g.SmoothSoftmax:
			var sink float32
			if in.HeadSink != nil {
				sink = in.HeadSink[h]
			}
			softmaxSink(row, ex, sink, g.SoftmaxPrecision == PrecisionDouble)
		case g.SoftmaxPrecision == PrecisionDouble:
			softmax64(row, allMasked)
		default:
			softmax32(row, ex, allMasked)
		}
		if g.QKMode == 3 && qk != nil {
			copy(qk, row)
		}
	}
	y := out.Y[sp.yOff+r0*sp.ldy:]
	if err := gemm.SgemmThreads(threads, false, false, rows, dv, cols, 1, s, max(total, 1), vb, dv, 0, y, sp.ldy); err != nil {
		return err
	}
	for r := range rows {
		yr := y[r*sp.ldy : r*sp.ldy+dv]
		if !exact[r] && !nonFinite(yr) {
			continue
		}
		h, i := sp.h0+(r0+r)/g.QLen, (r0+r)%g.QLen
		var qk []float32
		if out.QK != nil {
			qk = out.QK[((sp.b*g.QHeads+h)*g.QLen+i)*total : ((sp.b*g.QHeads+h)*g.QLen+i+1)*total]
		}
		g.exactFallback(in, keys, values, sp.b, h, i, yr, qk)
	}
	return nil
}

// padCheck holds, per (sequence, KV head), whether the V rows past the
// nonpad length hold a NaN or an infinity: 0 not known yet, 1 no, 2 yes.
// The units of one head may compute it concurrently; they store the same
// value.
type padCheck []atomic.Int32

func (p padCheck) nonFinite(bh int, v []float32, check func([]float32) bool) bool {
	switch p[bh].Load() {
	case 1:
		return false
	case 2:
		return true
	}
	bad := check(v)
	if bad {
		p[bh].Store(2)
	} else {
		p[bh].Store(1)
	}
	return bad
}

// mask adds the float mask or applies the bool mask to one score row, then
// gives the score excl to the keys before lo (sliding window) and at or
// after lim (causal frontier, window, nonpad length).
func (g *Geometry) mask(row []float32, m Mask, b, h, i, lo, lim int, excl float32) {
	if g.HasMask {
		md, ms := g.maskDims, g.maskStrides
		base := b*ms[0] + h*ms[1] + i*ms[2]
		n := min(md[3], len(row))
		if m.Float != nil {
			for j, v := range m.Float[base : base+n] {
				row[j] += v
			}
			for j := n; j < len(row); j++ { // short mask: padded with -inf
				row[j] = float32(math.Inf(-1))
			}
		} else {
			for j, ok := range m.Bool[base : base+n] {
				if !ok {
					row[j] = excl
				}
			}
			for j := n; j < len(row); j++ {
				row[j] = excl
			}
		}
	}
	for j := range min(lo, len(row)) {
		row[j] = excl
	}
	for j := max(lim, 0); j < len(row); j++ {
		row[j] = excl
	}
}

func softcap(row []float32, c float32) {
	inv := 1 / float64(c)
	for j, v := range row {
		row[j] = c * float32(math.Tanh(float64(v)*inv))
	}
}

// softmax32 normalizes row in place with float32 exponentials (computed by
// ex) and a float64 sum. A row whose best score is at most allMasked has no
// attendable key and becomes zeros.
func softmax32(row []float32, ex expFunc, allMasked float32) {
	mx := float32(math.Inf(-1))
	nan := false
	for _, v := range row {
		if v > mx {
			mx = v
		}
		nan = nan || v != v
	}
	if nan {
		fillNaN(row)
		return
	}
	if mx <= allMasked {
		clear(row)
		return
	}
	inv := float32(1 / ex(row, mx))
	for j := range row {
		row[j] *= inv
	}
}

// softmaxSink is the smooth softmax (see Attrs.SmoothSoftmax): the row
// and one extra logit sink, which absorbs weight but is not part of the
// output. A row is never all-masked (the sink always takes part), so an
// excluded row gives zeros. wide computes the exponentials in float64.
func softmaxSink(row []float32, ex expFunc, sink float32, wide bool) {
	mx := sink
	nan := false
	for _, v := range row {
		if v > mx {
			mx = v
		}
		nan = nan || v != v
	}
	if nan {
		fillNaN(row)
		return
	}
	if wide {
		var sum float64
		e := make([]float64, len(row))
		for j, v := range row {
			e[j] = math.Exp(float64(v) - float64(mx))
			sum += e[j]
		}
		sum += math.Exp(float64(sink) - float64(mx))
		for j := range row {
			row[j] = float32(e[j] / sum)
		}
		return
	}
	sum := ex(row, mx) + float64(exp32(sink-mx))
	inv := float32(1 / sum)
	for j := range row {
		row[j] *= inv
	}
}

// fillNaN makes every probability of a row with a NaN score NaN: IEEE
// propagation through the softmax's max, as the float64 definition computes
// it (a NaN row is not an all-masked row, which becomes zeros).
func fillNaN(row []float32) {
	nan := float32(math.NaN())
	for j := range row {
		row[j] = nan
	}
}

// softmax64 is softmax32 computed in float64 (softmax_precision = double).
func softmax64(row []float32, allMasked float32) {
	mx := math.Inf(-1)
	for _, v := range row {
		mx = math.Max(mx, float64(v))
	}
	if mx != mx {
		fillNaN(row)
		return
	}
	if mx <= float64(allMasked) {
		clear(row)
		return
	}
	e := make([]float64, len(row))
	var sum float64
	for j, v := range row {
		e[j] = math.Exp(float64(v) - mx)
		sum += e[j]
	}
	for j := range row {
		row[j] = float32(e[j] / sum)
	}
}
