package mha

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// Decode-shaped calls (a few query tokens against a past) are a bandwidth
// problem: each K/V byte serves only the query heads of its group. They
// run on the streaming engine of package cpu, the one that reads a
// KVCache: the call's keys and values present themselves as a cache.View
// (presentView), and cpu.Attention walks every (sequence, KV head) in
// blocks of keys with all query rows of its group, the online softmax and
// split-KV over the session's threads on the shared worker pool. Nothing of
// the context's length is materialized; the present outputs, when wanted,
// are filled block by block just before the engine reads the block.

// unitDecode enables the streaming engine for the calls streamMath accepts
// (tests and benchmarks turn it off to compare with the general unit).
var unitDecode = true

// streamMath reports whether the call is plain softmax attention with a
// causal rule (if any) aligned to the end of the keys, which is what the
// streaming engine computes (softcap, attn_mask read alongside K as a
// cpu.Mask, nonpad lengths as each sequence's length, see nonpadFits, and
// sliding windows that end at the query, as cpu's Window): no smooth
// softmax, qk_matmul_output, float64 softmax or opset-25 masking with a
// mask, and either no causal rule (every row attends every key, cpu's
// NonCausal) or one aligned to the end of the keys: as many new keys as
// query tokens (query row i sees keys up to PastLen+i) or the nonpad
// lengths' rule. Beyond
// cpu.MaxQLen query tokens (a prefill) the engine runs on tiles of query
// rows (cpu.AttentionPrefill), each K/V block serving a whole tile; measured
// faster than the general unit's products for causal prefill (16/8 heads
// of 64, 512 tokens, one thread: 16.5-18.4 ms against 22-23 ms).
//
// Under these conditions the last query row sees every position (causal
// rows need KVLen == QLen), so the engine reads every row of every head and
// the view fills all of the present outputs; the Attention op relies on it
// and does not zero them.
func (g *Geometry) streamMath(out Outputs) bool {
	if g.SlidingWindow && !g.IsCausal && g.RightWindow != 0 {
		return false // keys after the query: not the engine's window
	}
	return !(g.InfMasking && g.HasMask) && !g.SmoothSoftmax && out.QK == nil &&
		g.Scale > 0 && g.SoftmaxPrecision != PrecisionDouble &&
		g.Batch > 0 && g.QLen >= 1 && g.QLen <= g.TotalLen &&
		(!g.causal() || g.KVLen == g.QLen || g.HasNonpad)
}

// causal reports whether the engine runs the call with its causal rule: is_causal, or
// a sliding window that ends at the query (right window 0).
func (g *Geometry) causal() bool { return g.IsCausal || g.SlidingWindow }

// window is the engine's cpu.Options.Window for a sliding window (0: none).
func (g *Geometry) window() int {
	if g.SlidingWindow && g.LeftWindow >= 0 {
		return g.LeftWindow + 1
	}
	return 0
}

// nonpadFits reports whether every sequence's nonpad length holds the query
// tokens (the engine's end-aligned rule needs them; shorter sequences have
// rows with no key, which the general unit handles).
func (g *Geometry) nonpadFits(in Inputs) bool {
	if !g.HasNonpad {
		return true
	}
	for _, n := range in.NonpadKVSeqlen {
		if n < int64(g.QLen) {
			return false
		}
	}
	return true
}

// presentView is the cache.View of one call's keys and values: sequence
// b, KV head h holds the past's rows followed by the new tokens' (positions
// 0 .. TotalLen-1). Without present buffers its segments point into the
// inputs (one for the past rows, one for the new rows; nothing copied).
// With present buffers (keys, values: [batch, kv_heads, total, dim]) a
// request for positions [from, to) first copies them into the buffers and
// returns a segment of the buffers, so the engine reads each block right
// after it was written, while it is in cache; the copies are idempotent,
// and the engine's tasks ask for disjoint ranges.
// After fill, the buffers hold every row and requests copy nothing.
type presentView struct {
	g            *Geometry
	past, pastV  []float32
	cur, curV    []float32
	keys, values []float32 // nil: zero-copy segments of the inputs
	filled       bool      // keys and values hold every row already
	lens         []int64   // nonpad_kv_seqlen: sequence b's length (nil: TotalLen)
}

// fill copies every row into the present buffers at once (a prefill's
// tiles each read a prefix of the rows: copying per request would copy
// the prefix once per tile).
func (v *presentView) fill() {
	g := v.g
	gemm.ForThreads(g.Threads, g.Batch*g.KVHeads, func(bh int) {
		b, h := bh/g.KVHeads, bh%g.KVHeads
		g.copyRange(v.past, v.cur, v.keys, g.HeadDimK, b, h, 0, g.TotalLen)
		g.copyRange(v.pastV, v.curV, v.values, g.HeadDimV, b, h, 0, g.TotalLen)
	})
	v.filled = true
}

var _ cpu.ChunkedView = (*presentView)(nil)

// copyBlock is the number of positions the view copies into the present
// buffers per request: long copies stream faster, and a copied range of K
// and V (2 x 128 KiB at 64 dims) is still in L2 when the engine reads it.
const copyBlock = 512

// SegmentChunk implements cpu.ChunkedView: chunks of copyBlock positions
// when the view fills present buffers, else none (the inputs are read in
// place).
func (v *presentView) SegmentChunk() int {
	if v.keys != nil && !v.filled {
		return copyBlock
	}
	return 0
}

// ElemType implements cache.View: the unit computes in float32.
func (v *presentView) ElemType() cache.ElemType { return cache.Float32 }

// Batch implements cache.View.
func (v *presentView) Batch() int { return v.g.Batch }

// KVHeads implements cache.View.
func (v *presentView) KVHeads() int { return v.g.KVHeads }

// HeadDimK implements cache.View.
func (v *presentView) HeadDimK() int { return v.g.HeadDimK }

// HeadDimV implements cache.View.
func (v *presentView) HeadDimV() int { return v.g.HeadDimV }

// SeqLen implements cache.View: past + new tokens, or the nonpad length.
func (v *presentView) SeqLen(b int) int {
	if v.lens != nil {
		return int(v.lens[b])
	}
	return v.g.TotalLen
}

// WindowStart implements cache.View: nothing is evicted.
func (v *presentView) WindowStart(int) int { return 0 }

// AddBytesRead implements cache.View; the operator keeps no counter.
func (v *presentView) AddBytesRead(int64) {}

// AppendSegments implements cache.View.
func (v *presentView) AppendSegments(dst []cache.Segment, b, h, from, to int) []cache.Segment {
	if to <= from {
		return dst
	}
	g := v.g
	dk, dv, T, P := g.HeadDimK, g.HeadDimV, g.TotalLen, g.PastLen
	bh := b*g.KVHeads + h
	if v.keys != nil {
		if !v.filled {
			g.copyRange(v.past, v.cur, v.keys, dk, b, h, from, to)
			g.copyRange(v.pastV, v.curV, v.values, dv, b, h, from, to)
		}
		return append(dst, cache.Segment{Start: from, Len: to - from,
			K: f32Bytes(v.keys[(bh*T+from)*dk : (bh*T+to)*dk]),
			V: f32Bytes(v.values[(bh*T+from)*dv : (bh*T+to)*dv])})
	}
	if from < P {
		e := min(to, P)
		dst = append(dst, cache.Segment{Start: from, Len: e - from,
			K: f32Bytes(v.past[(bh*P+from)*dk : (bh*P+e)*dk]),
			V: f32Bytes(v.pastV[(bh*P+from)*dv : (bh*P+e)*dv])})
		from = e
	}
	if from < to { // new rows: [batch, kv_heads, kv_len, dim] (or 3D with kv_len 1, the same)
		n, s, e := g.KVLen, from-P, to-P
		dst = append(dst, cache.Segment{Start: from, Len: to - from,
			K: f32Bytes(v.cur[(bh*n+s)*dk : (bh*n+e)*dk]),
			V: f32Bytes(v.curV[(bh*n+s)*dv : (bh*n+e)*dv])})
	}
	return dst
}

// f32Bytes is the byte view of float32 elements (the View's segments are
// bytes of the element type).
func f32Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// engineScratch is the per-call state of the engine path, pooled: the
// view, for 3D inputs with several query tokens Q and Y in the engine's
// [batch, q_heads, q_len, dim] layout, and what the non-finite rows need.
type engineScratch struct {
	view presentView
	q, y []float32

	g       *Geometry
	in      Inputs
	exactFn func(out []float32, b, h, i int) error // sc.exact, bound once
	mu      sync.Mutex                             // keys, values (assembled once, when needed)
	keys    []float32
	values  []float32
	bad     []bool // per (sequence, KV head): a row took exact
	mask    cpu.Mask
}

var engineScratches = sync.Pool{New: func() any { return new(engineScratch) }}

// engine runs a call that streamMath accepts on cpu.AttentionPrefill
// (cpu.Attention up to cpu.MaxQLen query tokens). The rows
// whose float32 computation met a non-finite value are recomputed with this
// package's definition (exactRow, see "Non-finite values" in the package
// doc) through cpu.Options.Exact, and every row of their (sequence, KV
// head) when V holds a NaN or an infinity: the definition's P*V product
// spreads it to the causal rows that do not attend it.
func (g *Geometry) engine(in Inputs, out Outputs, nonFinite func([]float32) bool) error {
	sc := engineScratches.Get().(*engineScratch)
	defer engineScratches.Put(sc)
	v := &sc.view
	*v = presentView{g: g, past: in.PastKey, pastV: in.PastValue, cur: in.K, curV: in.V,
		keys: out.PresentKey, values: out.PresentValue, lens: in.NonpadKVSeqlen}
	if (v.keys == nil) != (v.values == nil) || (g.Input3D && g.KVLen > 1 && v.keys == nil) {
		// One present wanted, or new rows strided by the hidden axis: the
		// view assembles both in buffers (the other present, or scratch).
		// (Without a past, 4D, a buffer may be the input itself: its copy
		// is then a copy onto itself.)
		v.keys = g.presentBuffer(in.K, out.PresentKey, g.HeadDimK)
		v.values = g.presentBuffer(in.V, out.PresentValue, g.HeadDimV)
	}
	sc.g, sc.in, sc.keys, sc.values = g, in, v.keys, v.values
	units := g.Batch * g.KVHeads
	if cap(sc.bad) < units {
		sc.bad = make([]bool, units)
	}
	sc.bad = sc.bad[:units]
	clear(sc.bad)
	if sc.exactFn == nil {
		sc.exactFn = sc.exact
	}
	defer func() {
		sc.g, sc.in, sc.keys, sc.values, sc.view, sc.mask = nil, Inputs{}, nil, nil, presentView{}, cpu.Mask{}
	}()

	q, y := in.Q, out.Y
	gather := g.Input3D && g.QLen > 1
	if gather {
		sc.q, sc.y = grow(sc.q, len(in.Q)), grow(sc.y, len(out.Y))
		q, y = sc.q, sc.y
		g.toHeadMajor(q, in.Q, g.HeadDimK)
	}
	window := g.window()
	if v.keys != nil && (g.QLen > cpu.MaxQLen || g.HasNonpad || window > 0) {
		v.fill() // (the engine reads no row past a nonpad length or before a window)
	}
	o := cpu.Options{Scale: g.Scale, Softcap: g.Softcap, Threads: g.Threads, Exact: sc.exactFn,
		NonCausal: !g.causal(), Window: window}
	if g.HasMask {
		ms := g.maskStrides
		sc.mask = cpu.Mask{Float: in.Mask.Float, Bool: in.Mask.Bool, StrideB: ms[0], StrideH: ms[1], StrideI: ms[2], Len: g.maskDims[3]}
		o.Mask = &sc.mask
	}
	if err := cpu.AttentionPrefill(y, q, g.QLen, g.QHeads, v, o); err != nil {
		if errors.Is(err, cache.ErrInvalidArgument) {
			return fmt.Errorf("%w: %w", ErrShape, err)
		}
		return err
	}
	if gather {
		g.fromHeadMajor(out.Y, y, g.HeadDimV)
	}
	partial := g.causal() && g.QLen > 1 // rows that stop before the last keys
	if !partial && !g.HasNonpad && window == 0 {
		return nil // every row read every key
	}
	group := g.QHeads / g.KVHeads
	T, dv := g.TotalLen, g.HeadDimV
	for u, bad := range sc.bad {
		// The V rows before a window or past a nonpad length were not
		// read: they are checked here, once per head (a window: all of the
		// head's rows, in the present buffers filled above). Otherwise V
		// was read by a row that failed.
		all := false
		switch {
		case window > 0 && sc.values != nil:
			all = nonFinite(sc.values[u*T*dv : (u+1)*T*dv])
		case window > 0:
			all = g.headNonFinite(in, u, nonFinite)
		case g.HasNonpad:
			n := int(in.NonpadKVSeqlen[u/g.KVHeads])
			if sc.values == nil {
				all = nonFinite(g.cur(in.V, g.HeadDimV, u, n, T))
			} else {
				all = nonFinite(sc.values[(u*T+n)*dv : (u+1)*T*dv])
			}
		}
		if !all && (!partial || !bad || !nonFinite(sc.values[u*T*dv:(u+1)*T*dv])) {
			continue
		}
		if sc.keys == nil {
			sc.keys, sc.values = g.present(in, Outputs{})
		}
		b, kvh := u/g.KVHeads, u%g.KVHeads
		for h := kvh * group; h < (kvh+1)*group; h++ {
			for i := range g.QLen {
				g.exactFallback(in, sc.keys, sc.values, b, h, i, g.yRow(out.Y, b, h, i), nil)
			}
		}
	}
	return nil
}

// exact is the engine's cpu.Options.Exact: row (b, h, i) by exactRow, on
// the present buffers (assembled on first use when the view reads the
// inputs in place). out is a row of the engine's output layout.
func (sc *engineScratch) exact(out []float32, b, h, i int) error {
	g := sc.g
	sc.mu.Lock()
	if sc.keys == nil {
		sc.keys, sc.values = g.present(sc.in, Outputs{})
	}
	keys, values := sc.keys, sc.values
	sc.bad[b*g.KVHeads+h/(g.QHeads/g.KVHeads)] = true
	sc.mu.Unlock()
	g.exactFallback(sc.in, keys, values, b, h, i, out, nil)
	return nil
}

// cur returns positions [from, to) of head u (sequence*KVHeads + KV head)
// of the new rows when they are [batch, kv_heads, kv_len, dim] without a
// past (the layout a nonpad call reads in place).
func (g *Geometry) cur(x []float32, dim, u, from, to int) []float32 {
	return x[(u*g.KVLen+from)*dim : (u*g.KVLen+to)*dim]
}

// headNonFinite reports whether head u's V rows (the past's and the new
// tokens', read in place) hold a NaN or an infinity.
func (g *Geometry) headNonFinite(in Inputs, u int, nonFinite func([]float32) bool) bool {
	dv := g.HeadDimV
	if g.HasPast && nonFinite(in.PastValue[u*g.PastLen*dv:(u+1)*g.PastLen*dv]) {
		return true
	}
	return nonFinite(g.cur(in.V, dv, u, 0, g.KVLen))
}

// yRow is output row (sequence b, query head h, query position i) of Y.
func (g *Geometry) yRow(y []float32, b, h, i int) []float32 {
	dv := g.HeadDimV
	if g.Input3D {
		off := (b*g.QLen+i)*g.QHeads*dv + h*dv
		return y[off : off+dv]
	}
	off := ((b*g.QHeads+h)*g.QLen + i) * dv
	return y[off : off+dv]
}

// toHeadMajor copies 3D rows [batch, q_len, q_heads*dim] into dst as
// [batch, q_heads, q_len, dim].
func (g *Geometry) toHeadMajor(dst, src []float32, dim int) {
	for b := range g.Batch {
		for i := range g.QLen {
			for h := range g.QHeads {
				s := (b*g.QLen+i)*g.QHeads*dim + h*dim
				d := ((b*g.QHeads+h)*g.QLen + i) * dim
				copy(dst[d:d+dim], src[s:s+dim])
			}
		}
	}
}

// fromHeadMajor is the inverse of toHeadMajor.
func (g *Geometry) fromHeadMajor(dst, src []float32, dim int) {
	for b := range g.Batch {
		for i := range g.QLen {
			for h := range g.QHeads {
				d := (b*g.QLen+i)*g.QHeads*dim + h*dim
				s := ((b*g.QHeads+h)*g.QLen + i) * dim
				copy(dst[d:d+dim], src[s:s+dim])
			}
		}
	}
}

// grow returns b resized to n, reallocating only when it is too small.
func grow(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
