package cpu

import (
	"fmt"
	"math"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// Quantized segments (cache.QuantSegment): the fused decode path.
//
// A sealed segment's rows are integers with float32 scales (and zeros for
// int4); the kernel never widens them into a scratch block. The score and
// accumulation loops dequantize in registers, x = s*q (+ z), and the online
// softmax around them is the native path's (unitState.block):
//
//   - K per channel: one scale (and zero) per channel covers every row of
//     the segment, so it is folded into the scaled query once per segment,
//     q'_d = q_d*s_d, plus the constant c = sum_d q_d*z_d (int4): the loops
//     then dot q' with the raw integers.
//   - K per token and V (always per token): every row carries one scale (and
//     zero) per group of elements, applied in registers as the row is
//     loaded; a dequantized vector feeds every query row of the group.
//
// The result is that of dequantizing (cache.DequantizeSegment, the one
// definition of the formats) and running the native path, up to float32
// rounding (and, with the integer score loop, SetQuantIntDots, up to the
// query's rounding to int8). Non-finite scales, zeros or products reach maxOf or the
// accumulator check and send the row to exactRow, which dequantizes with
// cache.DequantizeSegment (loadRows).

// qmat is a run of quantized rows: n rows of rb bytes in b and, for per-token
// scaling, ng scales (and zeros, int4) per row in s and z, g elements per
// group. s == nil means raw integers (per-channel K, folded into q).
type qmat struct {
	b    []byte
	f    cache.QuantFormat
	rb   int // bytes per row
	s, z []float32
	ng   int // groups per row
	g    int // elements per group
}

// rows returns rows [a, e) of m.
func (m qmat) rows(a, e int) qmat {
	r := m
	r.b = m.b[a*m.rb : e*m.rb]
	if m.s != nil {
		r.s = m.s[a*m.ng : e*m.ng]
		if m.f == cache.QuantInt4 {
			r.z = m.z[a*m.ng : e*m.ng]
		}
	}
	return r
}

// quantOps are the score and accumulation loops over quantized rows for one
// instruction set, contracts as kernelOps' float32 ones with K/V rows given
// as a qmat of len(s) (dots), n (dots4), len(p) (axpy) or n (axpy4) rows;
// the four-row loops take their score rows ld elements apart (the rows of
// a super-block's score buffer). pf is how many rows ahead the loops may
// prefetch.
type quantOps struct {
	dots  func(s, q []float32, k qmat, d, pf int)
	dots4 func(s []float32, ld, n int, q []float32, k qmat, d, pf int)
	axpy  func(acc, p []float32, v qmat, alpha *[4]float32, pf int) // alpha[0] scales the row
	axpy4 func(acc, p []float32, ld, n int, v qmat, alpha *[4]float32, pf int)
	// mul sets dst[i] = a[i]*b[i] (folding per-channel K scales into q).
	mul func(dst, a, b []float32)
	// prefetch, when set, hints the cache lines of a segment's scales and
	// zeros into L2: the scales of the chunks of the next super-block, which
	// lie apart from the rows (per-channel ones a chunk's stride apart), are
	// requested while this one is computed.
	prefetch func(q *cache.QuantSegment)
	// intPrep and intDots4, when set (AVX-512 VNNI, AVX2), are the integer score
	// loop for int8 and int4 K per channel: intPrep quantizes len(sc) query
	// rows (len(ks) elements each) times the channel scales ks to int16 per
	// row (dst; for int4 K in qi16Order), setting each row's scale sc[r] and
	// the sum of its integers sum[r] (false: a product is not finite, a
	// row's scale is out of range, or the head dim is not one the loop
	// takes); intDots4 computes four rows' scores (rows ld apart) over n
	// tokens from such rows, s = acc*aff-scale + aff-offset (layout in
	// kern_quant_amd64.s).
	intPrep func(dst []int16, q, ks []float32, f cache.QuantFormat, sc, sum []float32) bool
	// intPrepAff, when set (AVX-512 VNNI), is intPrep for rows a multiple
	// of four that also sets the rows' score offsets in off (int8: 0; int4
	// at head dim 128: the query row (float) dotted with
	// the channel zeros kz, in the order of the AVX-512 ops.dots) and
	// intDots4's argument blocks in aff (quantPart.aff) in the same call.
	intPrepAff func(dst []int16, q, ks, kz []float32, f cache.QuantFormat, sc, off, aff []float32) bool
	intDots4   func(s []float32, ld, n int, qi []int16, k qmat, d int, aff *[24]float32, pf int)
	// intDots1 is intDots4 for one row (s = acc*aff[0] + aff[1]): a KV
	// head's only query row (MHA decode) and the rows left after the
	// groups of four.
	intDots1 func(s []float32, n int, qi []int16, k qmat, d int, aff *[2]float32, pf int)
	// vaxpy4, when set (AVX-512 VNNI, AVX2), is axpy4 by integer dots: the
	// weights p_rt times the rows' V scales are quantized to int16 per row
	// (steps of max_t,g p_rt*s_tg / 16383 over the n tokens), V rows widened
	// to int16 and dotted by token pairs (VPDPWSSD); int4's zeros add
	// sum_t p_rt*z_tg in float32. It returns false, doing nothing, when the
	// shape is not one it takes (two or four V scale groups per row, head
	// dim a multiple of 128); ws is its scratch.
	vaxpy4 func(acc, p []float32, ld, n int, v qmat, alpha *[4]float32, pf int, ws *vScratch) bool
	// vaxpy1 is vaxpy4 for one row (alpha[0]; acc and p one row each).
	vaxpy1 func(acc, p []float32, n int, v qmat, alpha *[4]float32, pf int, ws *vScratch) bool
	// sumsq2, when set, returns sum_i a[i]^2 + sum_i b[i]^2 in float32
	// (any order of summation): scalesSafe's check in one call instead of
	// a dot per run.
	sumsq2 func(a, b []float32) float32
	// prefetchK, when set, hints a segment's K scales and zeros into L2.
	prefetchK func(q *cache.QuantSegment)
	// intParts and vaxpyParts, when set (with intDots4 and vaxpy4), are
	// the score and accumulation loops of four rows [r, r+4) over the
	// tokens [a, e) of a super-block's parts in one call: intDots4 per part
	// with the part's argument block (quantPart.aff), scores ld apart
	// (intParts, every part intOn and not bad; it prefetches the scales of
	// ahead[i] while it computes part i), and vaxpy4 per part (vaxpyParts,
	// every part intV), alpha rescaling acc before the first part only.
	// apart (the chunks' rows and scales do not follow one another, the
	// paged layout): the loops prefetch by parts instead of pf rows ahead,
	// intParts the K rows two parts ahead and the V rows of the part it
	// computes, vaxpyParts the K rows of the first two ahead segments.
	intParts   func(s []float32, ld int, parts []quantPart, ahead []cache.Segment, r, a, e, dk, pf int, apart bool)
	vaxpyParts func(acc, p []float32, ld int, parts []quantPart, ahead []cache.Segment, a, e int, alpha *[4]float32, pf int, ws *vScratch, apart bool)
}

// vwMax is the largest int16 weight of the integer accumulation loop (quantOps.vaxpy4); vwMaxTokens bounds the
// tokens of one call so that its int32 sums of |w*q| <= vwMax*128 stay
// exact (a call takes one sealed chunk, at most 64 tokens).
const (
	vwMax       = 16383
	vwMaxTokens = (1<<31 - 1) / (vwMax * 128)
)

// vIntShape reports whether n tokens of V rows m with head dim d are a
// shape the integer accumulation loops take: two or four scale groups a
// row, head dim a multiple of 128, at most vwMaxTokens tokens.
func vIntShape(d, n int, m *qmat) bool {
	return n > 0 && n <= vwMaxTokens && d%128 == 0 && (m.ng == 4 || m.ng == 2) && m.g*m.ng == d
}

// vScratch is vaxpy4's per-unit scratch: the int16 weight pairs of a part,
// the rows' maxima, inverse steps and steps (ms[0], ms[1], ms[2]) and zero
// terms.
type vScratch struct {
	w  []int32
	ms [3][4]float32
	zt [16]float32
}

// IntDotsEnv is the environment variable that chooses the integer loops at
// start-up: "0" none, anything else (or unset) both, the default; see
// SetQuantIntLoops.
const IntDotsEnv = "OLKV_QUANT_INT_DOTS"

// intScores and intAccum: the integer score and accumulation loops are on.
var intScores, intAccum atomic.Bool

func init() {
	switch os.Getenv(IntDotsEnv) {
	case "0":
	default:
		SetQuantIntLoops(true, true)
	}
}

// SetQuantIntLoops turns on or off the integer loops over quantized
// segments on the AVX-512 path where the CPU has AVX-512 VNNI and on the
// AVX2 path; they change nothing on other CPUs and paths. Given the same
// inputs both instruction sets' loops compute the same integers and the
// same float32 steps: bit-identical results (the float steps around them,
// such as the softmax, may differ by a rounding).
//
// The score loop (scores), over int8 K per channel (head dim a multiple of
// 64) and int4 K per channel (a multiple of 128), head dims up to 256: the
// query rows times the chunk's channel
// scales are quantized to int16 per row (steps of 1/32767 of the row's
// largest element) and dotted with VPDPWSSD (AVX2: VPMADDWD). Each score
// errs by up to half a step times the keys' sum: with K channels whose
// scales are 30 times the others' (outliers, as trained models have) the
// attention output erred by 1.7e-3 (int8) and 2.6e-3 (int4) against the
// dequantize-then-reference oracle, 6.5% and 1% of the quantization's own
// error against float32 attention there. A chunk whose channel scales
// spread wider (cache.KSpreadMax, QuantSegment.KUneven: one channel with a
// large offset) takes the float loop. Rows go four at a time, and one
// at a time where fewer are left (a KV head with one query row: MHA
// decode). It is on by default.
//
// The accumulation loop (accum), over V rows with two or four scale groups
// (head dim a multiple of 128: group 32 or 64 at 128): the softmax weights
// times the rows' V scales are quantized to int16 per row and chunk (steps
// of 1/16383 of the chunk's largest) and dotted with VPDPWSSD (AVX2:
// VPMADDWD); its output error stays within about 1e-4 of the weights' sum
// times the largest V value. A chunk whose scale groups lie more than
// vSpreadMax apart, or whose steps would not be normal floats, goes to the
// float loop. It takes four rows at a time, and one at a time for int4 V
// (int8 V rows of a single query row take the float loop, which was as
// fast). It is on by default.
func SetQuantIntLoops(scores, accum bool) {
	intScores.Store(scores)
	intAccum.Store(accum)
}

// QuantIntLoops reports which integer loops are on (see SetQuantIntLoops);
// it says nothing of whether the CPU has them.
func QuantIntLoops() (scores, accum bool) { return intScores.Load(), intAccum.Load() }

// SetQuantIntDots turns both integer loops on or off (SetQuantIntLoops(on,
// on)).
func SetQuantIntDots(on bool) { SetQuantIntLoops(on, on) }

// Super-blocks. A sealed chunk is a segment of a few dozen rows (the
// cache's quantization chunk), far fewer than the native path's block
// (blockTokens). runUnit hands every run of consecutive quantized segments
// to quantRun, which groups whole chunks into super-blocks of up to bt
// tokens: per chunk it folds the chunk's per-channel scales into the
// query rows (a quantPart), then unitState.block runs once over the
// super-block: the score loop per part into the shared score rows at the
// part's offset, the online-softmax bookkeeping (max, exp, l, rescale)
// once, and the accumulation per part. Where every
// part takes the integer loops, the score and accumulation loops walk all
// the parts in one call each (quantOps.intParts, vaxpyParts). A chunk
// longer than bt is cut in blocks of bt as the native path does.

// quantPart is one chunk (or a block of a long one) of the super-block
// unitState.block is walking.
type quantPart struct {
	off, n int       // its tokens [off, off+n) of the super-block
	k, v   qmat      // their rows
	q      []float32 // the query rows the K loops dot with (folded per channel)
	kc     []float32 // per-row score constants (per-channel int4 zeros), or nil
	// intOn: the K loops use qi (int16 query rows) with per-row scales isc
	// and offsets ioff (intDots4).
	intOn     bool
	qi        []int16
	isc, ioff []float32
	// aff: intDots4's argument blocks of the part's rows, 24 floats per
	// four rows (rows a multiple of four)
	aff []float32
	// intV: vaxpy4 takes the part's V rows (two or four scale groups a
	// row, head dim a multiple of 128)
	intV bool
	// bad: a scale or zero of the chunk is not finite, or a dequantized
	// value could overflow float32 (|s|*qmax + |z|), or the integer query
	// rows could not be formed: its scores are made NaN so that the rows
	// seeing it are recomputed by exactRow.
	bad bool
}

// quantBlock is the super-block runUnit is walking: while on,
// unitState.block reads K and V through its parts instead of
// float32/16-bit rows.
type quantBlock struct {
	on    bool
	ops   *quantOps
	parts []quantPart
	ahead []cache.Segment // the segments after the super-block (prefetched)
	aff   [24]float32     // intDots4's four-row argument block
	aff1  [2]float32      // intDots1's: the row's scale and offset
	intV  bool            // the integer accumulation loop (vaxpy4) is on
	vs    vScratch
	// pfScales: prefetch the next super-block's scales (quantScalePrefetch,
	// and the run's scales do not stream, scalesStream)
	pfScales bool
	// allInt, allIntV: every part so far is intOn and not bad, intV (the
	// parts loops, quantOps.intParts and vaxpyParts, take the super-block)
	allInt, allIntV bool
}

// quantPartsLoops: the super-block's parts go to quantOps.intParts and
// vaxpyParts in one call each where they take them (true), or one call
// per part through dots and axpy (false: the path before them, kept for
// paired benchmarks).
var quantPartsLoops = true

// quantScalePrefetch: the loops prefetch the scales of the next
// super-block's chunks (quantOps.prefetch) while they compute this one,
// unless the chunks' scales follow one another in memory (scalesStream).
var quantScalePrefetch = true

// quantPartPrefetch: where the chunks lie apart (pfScales), the parts
// loops prefetch the rows by parts (quantOps.intParts) instead of a
// distance in rows, which runs into other heads' rows there.
var quantPartPrefetch = true

// scalesStream reports whether the scales of segment b start at most a page
// after those of segment a, its predecessor, K's and V's alike (the
// contiguous layout stores a head's chunk scales one after the other):
// then the hardware prefetchers follow them as the loops read them, and the
// software prefetch of the next super-block's scales only costs (paired,
// GQA 32/8 d128 16k one thread, contiguous layout: 0.96-1.01 off/on time
// with the prefetch; paged layout, chunks apart: 1.12-1.13).
func scalesStream(a, b *cache.QuantSegment) bool {
	near := func(x, y []float32) bool {
		if len(x) == 0 || len(y) == 0 {
			return len(x) == len(y)
		}
		d := uintptr(unsafe.Pointer(&y[0])) - uintptr(unsafe.Pointer(&x[0]))
		return d > 0 && d <= 4096
	}
	return near(a.KScale, b.KScale) && near(a.VScale, b.VScale)
}

// quantPrepAff: quantPart has intPrepAff set the parts' offsets and
// argument blocks where the ops have it (true), or intPrep and Go code
// (false: the code before it, for paired runs).
var quantPrepAff = true

// quantKScaleAhead: quantRun prefetches the K scales of the segment this
// many ahead of the one it prepares (quantOps.prefetchK; 0: none), which
// quantPart reads first.
var quantKScaleAhead = 2

// qones4 is the rescale of every part after a super-block's first: none
// (never written).
var qones4 = [4]float32{1, 1, 1, 1}

// quantPrefetchTokens is how many rows ahead the loops over quantized
// rows prefetch (prefetchTokens is the native loops').
var quantPrefetchTokens = 64

// superFloats bounds the folded query rows the parts of one super-block
// keep (rows*dk floats per part): 128 KiB, at least one part.
const superFloats = 32 << 10

// dots computes the scores of rows [r, r+nr) (nr is 1 or 4) for the
// super-block's tokens [a, e) into sc (nr rows of e-a).
func (qb *quantBlock) dots(sc []float32, r, nr, a, e, dk, pf int) {
	cnt := e - a
	// (the parts' argument blocks are per four rows from row 0: a run of four
	// that starts elsewhere, as groups of 5-7 query heads per KV head form
	// with several query tokens, goes part by part through intScores)
	if nr == 4 && r%4 == 0 && qb.allInt && quantPartsLoops && qb.ops.intParts != nil {
		ahead := qb.ahead
		if !qb.pfScales {
			ahead = nil
		}
		apart := qb.pfScales && quantPartPrefetch
		if apart {
			pf = 0
		}
		qb.ops.intParts(sc, cnt, qb.parts, ahead, r, a, e, dk, pf, apart)
		return
	}
	for i := range qb.parts {
		p := &qb.parts[i]
		if i < len(qb.ahead) && qb.ops.prefetch != nil && qb.pfScales {
			qb.ops.prefetch(&qb.ahead[i].Q)
		}
		pa, pe := max(a, p.off), min(e, p.off+p.n)
		if pa >= pe {
			continue
		}
		n, s := pe-pa, sc[pa-a:]
		if p.bad {
			nan := float32(math.NaN())
			for j := 0; j < nr; j++ {
				row := s[j*cnt : j*cnt+n]
				for t := range row {
					row[t] = nan
				}
			}
			continue
		}
		k := p.k.rows(pa-p.off, pe-p.off)
		switch {
		case p.intOn:
			qb.intScores(p, s, cnt, r, nr, k, n, dk, pf)
			continue
		case nr == 4:
			qb.ops.dots4(s, cnt, n, p.q[r*dk:(r+4)*dk], k, dk, pf)
		default:
			qb.ops.dots(s[:n], p.q[r*dk:(r+1)*dk], k, dk, pf)
		}
		if p.kc != nil {
			for j := 0; j < nr; j++ {
				c := p.kc[r+j]
				row := s[j*cnt : j*cnt+n]
				for t := range row {
					row[t] += c
				}
			}
		}
	}
}

// intScores is dots for the integer loop over part p's rows k (n tokens,
// score rows ld apart): four rows by intDots4, a single row by intDots1.
func (qb *quantBlock) intScores(p *quantPart, s []float32, ld, r, nr int, k qmat, n, dk, pf int) {
	if nr == 4 {
		c, o := (*[4]float32)(p.isc[r:r+4]), (*[4]float32)(p.ioff[r:r+4])
		// [r0 r0 r1 r1] [r2 r2 r3 r3] scales and offsets (the pair order),
		// then [r0 r1 r2 r3] scales and offsets
		qb.aff = [24]float32{c[0], c[0], c[1], c[1], c[2], c[2], c[3], c[3],
			o[0], o[0], o[1], o[1], o[2], o[2], o[3], o[3],
			c[0], c[1], c[2], c[3], o[0], o[1], o[2], o[3]}
		qb.ops.intDots4(s, ld, n, p.qi[r*dk:(r+4)*dk], k, dk, &qb.aff, pf)
		return
	}
	qb.aff1 = [2]float32{p.isc[r], p.ioff[r]} // int8: the offset is 0
	qb.ops.intDots1(s[:n], n, p.qi[r*dk:(r+1)*dk], k, dk, &qb.aff1, pf)
}

// qi16Elem is the element of a K row that position j of a query row in
// qi16Order multiplies: in each block of 64 elements, positions [0, 32)
// hold the even elements, [32, 64) the odd ones, the order in which the
// bytes of an int4 row widened to words (VPMOVZXBW) give their low nibbles
// (VPAND) and high nibbles (VPSRLW) (intPrep stores int4 K's query rows
// so: qi16Order).
func qi16Elem(j int) int {
	b, p := j/64*64, j%64
	return b + p%32*2 + p/32
}

// axpy accumulates the super-block's V rows [a, e) into acc (nr rows),
// weighted by sc (nr rows of e-a); alpha rescales acc once, before the
// first part.
func (qb *quantBlock) axpy(acc, sc []float32, a, e, nr, pf int, alpha *[4]float32) {
	cnt := e - a
	if nr == 4 && qb.allIntV && quantPartsLoops && qb.ops.vaxpyParts != nil {
		apart := qb.pfScales && quantPartPrefetch
		if apart {
			pf = 0
		}
		qb.ops.vaxpyParts(acc, sc, cnt, qb.parts, qb.ahead, a, e, alpha, pf, &qb.vs, apart)
		return
	}
	for i := range qb.parts {
		p := &qb.parts[i]
		pa, pe := max(a, p.off), min(e, p.off+p.n)
		if pa >= pe {
			continue
		}
		v, s := p.v.rows(pa-p.off, pe-p.off), sc[pa-a:]
		if nr == 4 {
			if !qb.intV || !qb.ops.vaxpy4(acc, s, cnt, pe-pa, v, alpha, pf, &qb.vs) {
				qb.ops.axpy4(acc, s, cnt, pe-pa, v, alpha, pf)
			}
		} else if !qb.intV || qb.ops.vaxpy1 == nil || !qb.ops.vaxpy1(acc, s[:pe-pa], pe-pa, v, alpha, pf, &qb.vs) {
			qb.ops.axpy(acc, s[:pe-pa], v, alpha, pf)
		}
		alpha = &qones4
	}
}

// quantRun folds the leading run of consecutive quantized segments of segs,
// the first starting at pos, into the unit's online-softmax state in
// super-blocks of up to bt tokens (the quantized counterpart of runUnit's
// block loop). It returns how many segments it consumed and the position
// after them.
func (u *unitState) quantRun(ops *kernelOps, s *shape, segs []cache.Segment, pos, rows, bt int) (used, end int, err error) {
	dk := s.dk
	qb := &u.qb
	qb.ops = ops.quant
	if qb.ops == nil {
		qb.ops = &goQuantOps
	}
	intOK := qb.ops.intDots4 != nil && qb.ops.intDots1 != nil && intScores.Load() && dk%64 == 0 && dk <= 256
	qb.intV = qb.ops.vaxpy4 != nil && intAccum.Load()
	maxParts := max(1, min(bt, superFloats/(rows*dk)))
	u.qq = grow(u.qq, maxParts*rows*dk)
	u.qc = grow(u.qc, maxParts*rows)
	if intOK {
		u.qi = grow(u.qi, maxParts*rows*dk)
		u.isc, u.ioff = grow(u.isc, maxParts*rows), grow(u.ioff, maxParts*rows)
		u.aff = grow(u.aff, maxParts*rows/4*24)
	}
	qb.allInt, qb.allIntV = rows%4 == 0, true
	qb.pfScales = quantScalePrefetch && !(len(segs) > 1 && segs[1].Q.Format != cache.QuantNone &&
		scalesStream(&segs[0].Q, &segs[1].Q))
	qb.parts = qb.parts[:0]
	qb.on = true
	defer func() { qb.on = false }()
	tot := 0 // tokens of the pending super-block, which ends at pos
	for ; used < len(segs); used++ {
		sg := &segs[used]
		if sg.Q.Format == cache.QuantNone || sg.Start != pos {
			break
		}
		if err := checkQuantSegment(sg, dk, s.dv); err != nil {
			return used, pos, err
		}
		if sg.Len == 0 {
			continue
		}
		if len(qb.parts) > 0 && (tot+sg.Len > bt || len(qb.parts) == maxParts) {
			qb.ahead = segs[used:]
			u.block(ops, s, nil, nil, nil, nil, pos-tot, tot, rows, quantPrefetchTokens, nil)
			qb.parts, tot = qb.parts[:0], 0
			qb.allInt, qb.allIntV = rows%4 == 0, true
		}
		if n := len(qb.parts); n < cap(qb.parts) {
			qb.parts = qb.parts[:n+1] // quantPart clears it
		} else {
			qb.parts = append(qb.parts, quantPart{})
		}
		p := &qb.parts[len(qb.parts)-1]
		if j := used + quantKScaleAhead; quantKScaleAhead > 0 && j < len(segs) && qb.ops.prefetchK != nil {
			qb.ops.prefetchK(&segs[j].Q)
		}
		u.quantPart(p, ops, s, sg, len(qb.parts)-1, rows, intOK)
		qb.allInt = qb.allInt && p.intOn && !p.bad
		qb.allIntV = qb.allIntV && p.intV
		u.read += quantBytes(sg, dk, s.dv)
		if sg.Len <= bt {
			p.off, p.n = tot, sg.Len
			tot += sg.Len
			pos += sg.Len
			continue
		}
		// a chunk longer than bt, alone in the super-block: its blocks of bt
		// one by one
		k, v := p.k, p.v
		qb.ahead = nil
		for off := 0; off < sg.Len; off += bt {
			p.n = min(bt, sg.Len-off)
			p.k, p.v = k.rows(off, off+p.n), v.rows(off, off+p.n)
			u.block(ops, s, nil, nil, nil, nil, pos+off, p.n, rows, quantPrefetchTokens, nil)
		}
		qb.parts = qb.parts[:0]
		qb.allInt, qb.allIntV = rows%4 == 0, true
		pos += sg.Len
	}
	qb.ahead = nil
	if tot > 0 {
		u.block(ops, s, nil, nil, nil, nil, pos-tot, tot, rows, quantPrefetchTokens, nil)
		qb.parts = qb.parts[:0]
	}
	return used, pos, nil
}

// quantPart prepares one quantized segment (already checked) as the part
// p in slot i of a super-block (cleared and set in place, off and n 0: the
// part is a few hundred bytes): its rows, and the query rows folded with
// its per-channel K scales in slot i of the unit's buffers.
func (u *unitState) quantPart(p *quantPart, ops *kernelOps, s *shape, sg *cache.Segment, i, rows int, intOK bool) {
	dk, dv := s.dk, s.dv
	qs := &sg.Q
	qb := &u.qb
	// cleared in place, then its non-zero fields set (a composite literal
	// with values is built on the stack and copied: a few hundred bytes
	// twice per chunk); a field added to quantPart starts zero here too
	*p = quantPart{}
	// (field by field: a qmat literal is built on the stack and copied too)
	p.k.b, p.k.f, p.k.rb = sg.K, qs.Format, qs.Format.RowBytes(dk)
	p.v.b, p.v.f, p.v.rb, p.v.s, p.v.z = sg.V, qs.Format, qs.Format.RowBytes(dv), qs.VScale, qs.VZero
	p.v.g, p.v.ng = qs.VGroup, dv/qs.VGroup
	p.q = u.qs
	switch {
	case qs.KAxis == cache.KPerChannel && intOK && !qs.KUneven && (qs.Format == cache.QuantInt8 || dk%128 == 0):
		// int32 sums of dk products of at most 32767*127 (int8) or
		// 32767*15 (int4) stay within int32 up to dk = 256; every path
		// reduces them as integers and converts once (VCVTDQ2PS)
		p.intOn = true
		p.qi = u.qi[i*rows*dk : (i+1)*rows*dk]
		p.isc, p.ioff = u.isc[i*rows:(i+1)*rows], u.ioff[i*rows:(i+1)*rows]
		// (int4: the offsets summed as ops.dots sums them at head dim 128)
		if rows%4 == 0 && qb.ops.intPrepAff != nil && quantPrepAff && (qs.Format == cache.QuantInt8 || dk == 128) {
			p.aff = u.aff[i*rows/4*24 : (i+1)*rows/4*24]
			p.bad = !qb.ops.intPrepAff(p.qi, u.qs[:rows*dk], qs.KScale[:dk], qs.KZero, qs.Format, p.isc, p.ioff, p.aff)
			break
		}
		p.bad = !qb.ops.intPrep(p.qi, u.qs[:rows*dk], qs.KScale[:dk], qs.Format, p.isc, p.ioff)
		if qs.Format == cache.QuantInt8 {
			clear(p.ioff) // signed products: no offset
		} else {
			// x = s*q + z: the zero term qs_r . zero is the offset (the
			// nibbles need no +128)
			ops.dots(p.ioff, qs.KZero[:dk], u.qs[:rows*dk], dk, 0)
		}
		if rows%4 == 0 {
			p.aff = u.aff[i*rows/4*24 : (i+1)*rows/4*24]
			for j := 0; j < rows; j += 4 {
				c, o := (*[4]float32)(p.isc[j:j+4]), (*[4]float32)(p.ioff[j:j+4])
				// as intScores: [r0 r0 r1 r1] [r2 r2 r3 r3] scales and
				// offsets (the pair order), then [r0 r1 r2 r3] both
				*(*[24]float32)(p.aff[j/4*24:]) = [24]float32{c[0], c[0], c[1], c[1], c[2], c[2], c[3], c[3],
					o[0], o[0], o[1], o[1], o[2], o[2], o[3], o[3],
					c[0], c[1], c[2], c[3], o[0], o[1], o[2], o[3]}
			}
		}
	case qs.KAxis == cache.KPerChannel:
		p.q = u.qq[i*rows*dk : (i+1)*rows*dk]
		for r := 0; r < rows; r++ {
			qb.ops.mul(p.q[r*dk:(r+1)*dk], u.qs[r*dk:(r+1)*dk], qs.KScale[:dk])
		}
		if qs.Format == cache.QuantInt4 {
			p.kc = u.qc[i*rows : (i+1)*rows]
			ops.dots(p.kc, qs.KZero[:dk], u.qs[:rows*dk], dk, 0) // kc[r] = qs_r . zero
		}
	default:
		p.k.s, p.k.z, p.k.g, p.k.ng = qs.KScale, qs.KZero, qs.KGroup, dk/qs.KGroup
	}
	// a chunk the cache bounded when it sealed it needs no check
	p.bad = p.bad || (!qs.Bounded && !scalesSafe(ops, qb.ops, &u.ss, qs, sg.Len, dk, dv))
	p.intV = qb.intV && vIntShape(dv, sg.Len, &p.v)
}

// scalesSafe reports whether every scale and zero of a segment of n rows is
// below 2^64 in magnitude (the sum of their squares is finite: NaN and
// ±Inf fail too). Then no dequantized value |s*q + z| can leave float32's
// range, so folding the scales into q or dequantizing with a fused
// multiply-add stays finite exactly where cache.DequantizeSegment does. A segment that
// fails sends the rows that see it to exactRow (always correct, only slow).
// Segments the cache marks Bounded (every scale and zero below
// cache.ScaleBound, checked when sealed) skip it.
// qo.sumsq2, where set, sums the squares (two runs a call).
func scalesSafe(ops *kernelOps, qo *quantOps, ss *[4]float32, qs *cache.QuantSegment, n, dk, dv int) bool {
	nk := dk
	if qs.KAxis == cache.KPerToken {
		nk = n * (dk / qs.KGroup)
	}
	nv := n * (dv / qs.VGroup)
	if qo.sumsq2 != nil {
		t := qo.sumsq2(qs.KScale[:nk], qs.VScale[:nv])
		if qs.Format == cache.QuantInt4 {
			t += qo.sumsq2(qs.KZero[:nk], qs.VZero[:nv])
		}
		return t-t == 0
	}
	*ss = [4]float32{}
	ops.dots(ss[0:1], qs.KScale[:nk], qs.KScale[:nk], nk, 0)
	ops.dots(ss[1:2], qs.VScale[:nv], qs.VScale[:nv], nv, 0)
	if qs.Format == cache.QuantInt4 {
		ops.dots(ss[2:3], qs.KZero[:nk], qs.KZero[:nk], nk, 0)
		ops.dots(ss[3:4], qs.VZero[:nv], qs.VZero[:nv], nv, 0)
	}
	t := ss[0] + ss[1] + ss[2] + ss[3]
	return t-t == 0
}

// quantBytes is what reading a quantized segment costs: its rows plus the
// scales and zeros that cover them (per-channel ones once per segment).
func quantBytes(sg *cache.Segment, dk, dv int) int64 {
	qs := &sg.Q
	n := int64(sg.Len)
	per := int64(1)
	if qs.Format == cache.QuantInt4 {
		per = 2 // scale and zero
	}
	b := n * int64(qs.Format.RowBytes(dk)+qs.Format.RowBytes(dv))
	b += 4 * per * n * int64(dv/qs.VGroup)
	if qs.KAxis == cache.KPerChannel {
		b += 4 * per * int64(dk)
	} else {
		b += 4 * per * n * int64(dk/qs.KGroup)
	}
	return b
}

// checkQuantSegment validates a quantized segment against the
// cache.QuantSegment contract for head dims dk, dv.
func checkQuantSegment(sg *cache.Segment, dk, dv int) error {
	qs := &sg.Q
	if qs.Format != cache.QuantInt8 && qs.Format != cache.QuantInt4 {
		return badQuantSegment(sg, "unknown format")
	}
	int4 := qs.Format == cache.QuantInt4
	if sg.Len < 0 || len(sg.K) < sg.Len*qs.Format.RowBytes(dk) || len(sg.V) < sg.Len*qs.Format.RowBytes(dv) {
		return badQuantSegment(sg, "rows shorter than len")
	}
	if qs.VGroup <= 0 || dv%qs.VGroup != 0 || len(qs.VScale) < sg.Len*(dv/qs.VGroup) ||
		(int4 && len(qs.VZero) < sg.Len*(dv/qs.VGroup)) {
		return badQuantSegment(sg, "V scales do not cover the rows")
	}
	switch qs.KAxis {
	case cache.KPerChannel:
		if len(qs.KScale) < dk || (int4 && len(qs.KZero) < dk) {
			return badQuantSegment(sg, "K channel scales shorter than head_dim_k")
		}
	case cache.KPerToken:
		if qs.KGroup <= 0 || dk%qs.KGroup != 0 || len(qs.KScale) < sg.Len*(dk/qs.KGroup) ||
			(int4 && len(qs.KZero) < sg.Len*(dk/qs.KGroup)) {
			return badQuantSegment(sg, "K scales do not cover the rows")
		}
	default:
		return badQuantSegment(sg, "unknown K axis")
	}
	return nil
}

func badQuantSegment(sg *cache.Segment, what string) error {
	return fmt.Errorf("%w: cache view returned a malformed quantized segment (start %d len %d, %s %s): %s",
		cache.ErrInvalidArgument, sg.Start, sg.Len, sg.Q.Format, sg.Q.KAxis, what)
}
