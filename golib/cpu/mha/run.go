package mha

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// Mask is the attn_mask data: exactly one of Float or Bool is set when the
// geometry has a mask.
type Mask struct {
	Float []float32 // added to the scores
	Bool  []bool    // true: the key takes part
}

// Inputs hold the input data in the shapes given to Plan (row-major).
// Optional inputs not given to Plan are nil.
type Inputs struct {
	Q, K, V            []float32
	Mask               Mask
	PastKey, PastValue []float32
	NonpadKVSeqlen     []int64
	// HeadSink, with Attrs.SmoothSoftmax, holds the sink logit of each
	// query head (nil: 0 for every head).
	HeadSink []float32
}

// Outputs receive the results. Y is required; PresentKey, PresentValue and
// QK are written when non-nil. Every slice must have exactly the length of
// its shape in the Geometry.
type Outputs struct {
	Y, PresentKey, PresentValue, QK []float32
}

// rowBlock is the number of query rows scored at once: a rowBlock x total
// score block is the only per-task temporary.
const rowBlock = 32

// lowest is the score onnxruntime gives excluded positions.
const lowest = -math.MaxFloat32

var scratch = sync.Pool{New: func() any { return new([]float32) }}

// Run computes the attention described by g.
func (g *Geometry) Run(in Inputs, out Outputs) error {
	if err := g.checkData(in, out); err != nil {
		return err
	}
	nonFinite := pickNonFinite()
	if unitDecode && g.streamMath(out) && g.nonpadFits(in) {
		return g.engine(in, out, nonFinite)
	}
	return g.runUnits(in, out, nonFinite)
}

// runUnits is Run on the products-based units (the calls the streaming
// engine does not take).
func (g *Geometry) runUnits(in Inputs, out Outputs, nonFinite func([]float32) bool) error {
	spans := g.Batch * (g.QHeads / g.spanHeads())
	rows := g.spanHeads() * g.QLen
	blocks := (rows + rowBlock - 1) / rowBlock
	// When every (sequence, KV head) is exactly one unit, the unit copies
	// its head into the present buffers itself, in parallel with the other
	// heads and right before it reads the head back from the cache.
	fused := blocks == 1 && g.spanHeads() == g.QHeads/g.KVHeads
	var keys, values []float32
	if fused {
		keys = g.presentBuffer(in.K, out.PresentKey, g.HeadDimK)
		values = g.presentBuffer(in.V, out.PresentValue, g.HeadDimV)
	} else {
		keys, values = g.present(in, out)
	}
	// Units run in parallel; a unit's products get threads of their own
	// only when there are fewer units than threads.
	inner := g.Threads
	if t := gemm.Threads(); spans*blocks >= t || (g.Threads > 0 && spans*blocks >= g.Threads) {
		inner = 1
	}
	ex := pickExp()
	var pad padCheck
	if g.HasNonpad && out.QK == nil {
		pad = make(padCheck, g.Batch*g.KVHeads)
	}
	errc := make(chan error, 1)
	gemm.ForThreads(g.Threads, spans*blocks, func(u int) {
		sp := g.span(u / blocks)
		r0 := (u % blocks) * rowBlock
		if fused {
			if !sameSlice(keys, in.K) {
				g.concatHead(in.PastKey, in.K, keys, g.HeadDimK, sp.b, sp.kvh)
			}
			if !sameSlice(values, in.V) {
				g.concatHead(in.PastValue, in.V, values, g.HeadDimV, sp.b, sp.kvh)
			}
		}
		if err := g.unit(in, out, keys, values, sp, r0, min(r0+rowBlock, rows), inner, ex, nonFinite, pad); err != nil {
			select {
			case errc <- err:
			default:
			}
		}
	})
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
}

func (g *Geometry) checkData(in Inputs, out Outputs) error {
	qShape, kShape, vShape := g.inputShapes()
	r := 4
	if g.Input3D {
		r = 3
	}
	pk := [4]int{g.Batch, g.KVHeads, g.PastLen, g.HeadDimK}
	pv := [4]int{g.Batch, g.KVHeads, g.PastLen, g.HeadDimV}
	if err := firstErr(
		checkLen("Q", len(in.Q), qShape[:r]), checkLen("K", len(in.K), kShape[:r]), checkLen("V", len(in.V), vShape[:r]),
		checkLen("Y", len(out.Y), g.YShape)); err != nil {
		return err
	}
	if g.HasPast {
		if err := firstErr(checkLen("past_key", len(in.PastKey), pk[:]),
			checkLen("past_value", len(in.PastValue), pv[:])); err != nil {
			return err
		}
	}
	if out.PresentKey != nil {
		if err := checkLen("present_key", len(out.PresentKey), g.PresentKeyShape); err != nil {
			return err
		}
	}
	if out.PresentValue != nil {
		if err := checkLen("present_value", len(out.PresentValue), g.PresentValueShape); err != nil {
			return err
		}
	}
	if out.QK != nil {
		if err := checkLen("qk_matmul_output", len(out.QK), g.QKShape); err != nil {
			return err
		}
	}
	if g.HasMask {
		if (in.Mask.Float == nil) == (in.Mask.Bool == nil) {
			return fmt.Errorf("%w: attn_mask needs exactly one of Float or Bool data", ErrShape)
		}
		n := len(in.Mask.Float) + len(in.Mask.Bool)
		if err := checkLen("attn_mask", n, g.maskDims[:]); err != nil {
			return err
		}
	}
	if in.HeadSink != nil && (!g.SmoothSoftmax || len(in.HeadSink) != g.QHeads) {
		return fmt.Errorf("%w: head_sink has %d values, want one per query head (%d) with SmoothSoftmax", ErrShape, len(in.HeadSink), g.QHeads)
	}
	if g.HasNonpad {
		if len(in.NonpadKVSeqlen) != g.Batch {
			return fmt.Errorf("%w: nonpad_kv_seqlen has %d values, want %d", ErrShape, len(in.NonpadKVSeqlen), g.Batch)
		}
		for b, n := range in.NonpadKVSeqlen {
			if n < 0 || n > int64(g.TotalLen) {
				return fmt.Errorf("%w: nonpad_kv_seqlen[%d] = %d not in [0, %d]", ErrValue, b, n, g.TotalLen)
			}
		}
	}
	return nil
}

// checkLen reports a buffer of n elements that shape does not describe.
// Only the error path copies shape (so the callers' shape arrays stay on
// their stacks).
func checkLen(name string, n int, shape []int) error {
	if want := prod(shape); n != want {
		return fmt.Errorf("%w: %s has %d elements, shape %v needs %d", ErrShape, name, n, slices.Clone(shape), want)
	}
	return nil
}

// firstErr returns the first non-nil error.
func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// inputShapes returns the shapes of Q, K and V (the first three dimensions
// only with 3D inputs).
func (g *Geometry) inputShapes() (q, k, v [4]int) {
	if g.Input3D {
		return [4]int{g.Batch, g.QLen, g.QHeads * g.HeadDimK},
			[4]int{g.Batch, g.KVLen, g.KVHeads * g.HeadDimK},
			[4]int{g.Batch, g.KVLen, g.KVHeads * g.HeadDimV}
	}
	return [4]int{g.Batch, g.QHeads, g.QLen, g.HeadDimK},
		[4]int{g.Batch, g.KVHeads, g.KVLen, g.HeadDimK},
		[4]int{g.Batch, g.KVHeads, g.KVLen, g.HeadDimV}
}

func prod(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}

// present returns the keys and values in [batch, kv_heads, total, dim]
// layout: the inputs themselves when they already are (4D, no past, present
// not wanted), else the present outputs or fresh buffers filled with the
// past followed by the new tokens.
func (g *Geometry) present(in Inputs, out Outputs) (keys, values []float32) {
	keys = g.concat(in.PastKey, in.K, out.PresentKey, g.HeadDimK)
	values = g.concat(in.PastValue, in.V, out.PresentValue, g.HeadDimV)
	return keys, values
}

func (g *Geometry) concat(past, cur, dst []float32, dim int) []float32 {
	dst = g.presentBuffer(cur, dst, dim)
	if sameSlice(dst, cur) {
		return dst
	}
	for b := range g.Batch {
		for h := range g.KVHeads {
			g.concatHead(past, cur, dst, dim, b, h)
		}
	}
	return dst
}

// presentBuffer returns where the keys (or values) of width dim are
// assembled: dst when the present output is wanted, cur itself when it
// already has the layout (4D, no past), else a new buffer.
func (g *Geometry) presentBuffer(cur, dst []float32, dim int) []float32 {
	if dst != nil {
		return dst
	}
	if !g.HasPast && !g.Input3D {
		return cur
	}
	return make([]float32, g.Batch*g.KVHeads*g.TotalLen*dim)
}

// concatHead writes the past then the new tokens of (sequence b, KV head h)
// into dst.
func (g *Geometry) concatHead(past, cur, dst []float32, dim, b, h int) {
	bh := b*g.KVHeads + h
	d := dst[bh*g.TotalLen*dim : (bh+1)*g.TotalLen*dim]
	n := 0
	if g.HasPast {
		n = copy(d, past[bh*g.PastLen*dim:(bh+1)*g.PastLen*dim])
	}
	if !g.Input3D {
		copy(d[n:], cur[bh*g.KVLen*dim:(bh+1)*g.KVLen*dim])
		return
	}
	for s := range g.KVLen {
		src := (b*g.KVLen+s)*g.KVHeads*dim + h*dim
		copy(d[n+s*dim:n+(s+1)*dim], cur[src:src+dim])
	}
}

// copyRange writes positions [t0, t1) of (sequence b, KV head h) into dst:
// the past's rows, then the new tokens'.
func (g *Geometry) copyRange(past, cur, dst []float32, dim, b, h, t0, t1 int) {
	bh := b*g.KVHeads + h
	d := dst[bh*g.TotalLen*dim : (bh+1)*g.TotalLen*dim]
	if t0 < g.PastLen {
		e := min(t1, g.PastLen)
		copy(d[t0*dim:e*dim], past[(bh*g.PastLen+t0)*dim:(bh*g.PastLen+e)*dim])
		t0 = e
	}
	for t := t0; t < t1; t++ {
		s := t - g.PastLen
		src := (bh*g.KVLen + s) * dim
		if g.Input3D {
			src = (b*g.KVLen+s)*g.KVHeads*dim + h*dim
		}
		copy(d[t*dim:(t+1)*dim], cur[src:src+dim])
	}
}

// sameSlice reports whether a and b start at the same element.
func sameSlice(a, b []float32) bool {
	return len(a) > 0 && len(b) > 0 && unsafe.SliceData(a) == unsafe.SliceData(b)
}
