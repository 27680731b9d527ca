package cache

import (
	"fmt"
	"sync/atomic"
)

// TensorView presents caller-owned K and V buffers of shape
// [batch, kv_heads, max_len, head_dim] (row-major, one element type) plus
// per-sequence lengths as a View, without copying: the past/present buffer
// that onnxruntime's GroupQueryAttention shares between steps has exactly
// this layout. Sequence b's valid tokens are rows [0, lens[b]) of each of
// its heads; rows beyond are ignored. Nothing is evicted (WindowStart is 0).
//
// A TensorView is a plain value that Reset re-targets in place, so a kernel
// keeps one per call site and builds no new value per step. The buffers and
// the lens slice are borrowed: they must stay unchanged while a kernel reads
// the view.
type TensorView struct {
	elem           ElemType
	batch, kvHeads int
	maxLen         int
	dk, dv         int
	rowK, rowV     int // bytes per row
	k, v           []byte
	lens           []int
	bytesRead      atomic.Int64
}

var _ View = (*TensorView)(nil)

// Reset points the view at new buffers. k must hold batch*kvHeads*maxLen
// rows of headDimK elements and v as many rows of headDimV; every
// lens[b] must be in [0, maxLen]. It returns an error wrapping
// ErrInvalidArgument (and leaves the view unchanged) otherwise.
func (t *TensorView) Reset(elem ElemType, batch, kvHeads, maxLen, headDimK, headDimV int, k, v []byte, lens []int) error {
	es := elem.Size()
	switch {
	case es == 0:
		return fmt.Errorf("%w: tensor view element type %v", ErrInvalidArgument, elem)
	case batch <= 0 || kvHeads <= 0 || maxLen < 0 || headDimK <= 0 || headDimV <= 0:
		return fmt.Errorf("%w: tensor view geometry batch=%d kv_heads=%d max_len=%d head_dim_k=%d head_dim_v=%d",
			ErrInvalidArgument, batch, kvHeads, maxLen, headDimK, headDimV)
	case len(lens) != batch:
		return fmt.Errorf("%w: tensor view has %d lengths for batch %d", ErrInvalidArgument, len(lens), batch)
	}
	rows := batch * kvHeads * maxLen
	if rows/batch/kvHeads != maxLen || len(k) != rows*headDimK*es || len(v) != rows*headDimV*es {
		return fmt.Errorf("%w: tensor view buffers of %d and %d bytes, want %d rows of %d and %d %v elements",
			ErrInvalidArgument, len(k), len(v), rows, headDimK, headDimV, elem)
	}
	for b, n := range lens {
		if n < 0 || n > maxLen {
			return fmt.Errorf("%w: tensor view sequence %d has length %d, buffer holds %d", ErrInvalidArgument, b, n, maxLen)
		}
	}
	t.elem, t.batch, t.kvHeads, t.maxLen = elem, batch, kvHeads, maxLen
	t.dk, t.dv, t.rowK, t.rowV = headDimK, headDimV, headDimK*es, headDimV*es
	t.k, t.v, t.lens = k, v, lens
	return nil
}

// ElemType implements View.
func (t *TensorView) ElemType() ElemType { return t.elem }

// Batch implements View.
func (t *TensorView) Batch() int { return t.batch }

// KVHeads implements View.
func (t *TensorView) KVHeads() int { return t.kvHeads }

// HeadDimK implements View.
func (t *TensorView) HeadDimK() int { return t.dk }

// HeadDimV implements View.
func (t *TensorView) HeadDimV() int { return t.dv }

// SeqLen implements View.
func (t *TensorView) SeqLen(b int) int { return t.lens[b] }

// WindowStart implements View: a tensor buffer evicts nothing.
func (t *TensorView) WindowStart(int) int { return 0 }

// AppendSegments implements View: each (sequence, head) is one contiguous
// run of max_len rows, so a range is one segment.
func (t *TensorView) AppendSegments(dst []Segment, b, h, from, to int) []Segment {
	if to <= from {
		return dst
	}
	head := b*t.kvHeads + h
	bk, bv := head*t.maxLen*t.rowK, head*t.maxLen*t.rowV
	return append(dst, Segment{
		Start: from,
		Len:   to - from,
		K:     t.k[bk+from*t.rowK : bk+to*t.rowK],
		V:     t.v[bv+from*t.rowV : bv+to*t.rowV],
	})
}

// AddBytesRead implements View.
func (t *TensorView) AddBytesRead(n int64) { t.bytesRead.Add(n) }

// BytesRead returns the bytes attention kernels reported reading through
// the view since it was created.
func (t *TensorView) BytesRead() int64 { return t.bytesRead.Load() }
