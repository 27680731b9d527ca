package cpu

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// maxQLen is the largest number of new query tokens per call that the
// streaming kernel accepts (speculative-draft verification uses up to 16;
// AttentionPrefill tiles longer queries, the reference takes any).
const maxQLen = 16

// shape is the validated geometry of one attention call.
type shape struct {
	batch, qHeads, qLen, kvHeads int
	group                        int // query heads per KV head
	dk, dv                       int
	elem                         cache.ElemType
	scale                        float32
	softcap                      float32
	window                       int
	threads                      int // 0: the pool's
	exact                        func(out []float32, b, h, i int) error
	mask                         *Mask
	nonCausal                    bool
}

// checkArgs validates an attention call against the semantics documented in
// attention.go and returns its geometry. Every error wraps
// cache.ErrInvalidArgument.
func checkArgs(dst, q []float32, qLen, qHeads int, v cache.View, o Options) (shape, error) {
	var s shape
	if v == nil {
		return s, fmt.Errorf("%w: nil cache view", cache.ErrInvalidArgument)
	}
	s.batch, s.kvHeads = v.Batch(), v.KVHeads()
	s.dk, s.dv, s.elem = v.HeadDimK(), v.HeadDimV(), v.ElemType()
	s.qLen, s.qHeads = qLen, qHeads
	switch {
	case s.batch <= 0 || s.kvHeads <= 0 || s.dk <= 0 || s.dv <= 0:
		return s, fmt.Errorf("%w: cache geometry batch=%d kv_heads=%d head_dim_k=%d head_dim_v=%d",
			cache.ErrInvalidArgument, s.batch, s.kvHeads, s.dk, s.dv)
	case s.elem.Size() == 0:
		return s, fmt.Errorf("%w: unsupported cache element type %v", cache.ErrInvalidArgument, s.elem)
	case qLen < 1:
		return s, fmt.Errorf("%w: q_len %d must be positive", cache.ErrInvalidArgument, qLen)
	case qHeads <= 0 || qHeads%s.kvHeads != 0:
		return s, fmt.Errorf("%w: q_heads %d is not a positive multiple of kv_heads %d",
			cache.ErrInvalidArgument, qHeads, s.kvHeads)
	case o.Window < 0 || (o.Window > 0 && o.NonCausal):
		return s, fmt.Errorf("%w: window %d must be >= 0, and 0 with NonCausal", cache.ErrInvalidArgument, o.Window)
	case o.Threads < 0:
		return s, fmt.Errorf("%w: negative thread bound %d", cache.ErrInvalidArgument, o.Threads)
	case o.Softcap < 0 || o.Softcap != o.Softcap:
		return s, fmt.Errorf("%w: softcap %v must be >= 0", cache.ErrInvalidArgument, o.Softcap)
	case o.Scale != o.Scale || o.Scale < 0:
		return s, fmt.Errorf("%w: scale %v must be >= 0 (0 means 1/sqrt(head_dim_k))", cache.ErrInvalidArgument, o.Scale)
	}
	s.group = qHeads / s.kvHeads
	rows := s.batch * qHeads * qLen
	if len(q) != rows*s.dk {
		return s, fmt.Errorf("%w: q has %d elements, want batch*q_heads*q_len*head_dim_k = %d*%d*%d*%d = %d",
			cache.ErrInvalidArgument, len(q), s.batch, qHeads, qLen, s.dk, rows*s.dk)
	}
	if len(dst) != rows*s.dv {
		return s, fmt.Errorf("%w: dst has %d elements, want batch*q_heads*q_len*head_dim_v = %d*%d*%d*%d = %d",
			cache.ErrInvalidArgument, len(dst), s.batch, qHeads, qLen, s.dv, rows*s.dv)
	}
	for b := 0; b < s.batch; b++ {
		l, ws := v.SeqLen(b), v.WindowStart(b)
		if l < qLen {
			return s, fmt.Errorf("%w: sequence %d holds %d tokens, fewer than q_len %d",
				cache.ErrInvalidArgument, b, l, qLen)
		}
		if ws < 0 || ws > l-qLen {
			return s, fmt.Errorf("%w: sequence %d: window start %d leaves no stored key for the first query at position %d",
				cache.ErrInvalidArgument, b, ws, l-qLen)
		}
	}
	s.scale = o.Scale
	if s.scale == 0 {
		s.scale = float32(1 / sqrt64(float64(s.dk)))
	}
	s.softcap, s.window, s.threads, s.exact, s.nonCausal = o.Softcap, o.Window, o.Threads, o.Exact, o.NonCausal
	if m := o.Mask; m != nil {
		if err := checkMask(m, &s, o.Exact != nil); err != nil {
			return s, err
		}
		s.mask = m
	}
	return s, nil
}

// rowRange returns the key positions [lo, hi) that query row i (0-based
// among the qLen new tokens) of a sequence with L tokens and window start ws
// attends: all of them with NonCausal.
func (s *shape) rowRange(L, ws, i int) (lo, hi int) {
	if s.nonCausal {
		return ws, L
	}
	p := L - s.qLen + i
	lo = ws
	if s.window > 0 && p-s.window+1 > lo {
		lo = p - s.window + 1
	}
	return lo, p + 1
}

// checkMask validates a mask against the call's geometry: one kind of
// data, non-negative strides and length, every row inside the data, and an
// Exact function to define the rows the float32 path hands over.
func checkMask(m *Mask, s *shape, exact bool) error {
	n := len(m.Float) + len(m.Bool)
	switch {
	case !exact:
		return fmt.Errorf("%w: a mask needs Options.Exact", cache.ErrInvalidArgument)
	case (m.Float == nil) == (m.Bool == nil):
		return fmt.Errorf("%w: a mask needs exactly one of Float and Bool", cache.ErrInvalidArgument)
	case m.StrideB < 0 || m.StrideH < 0 || m.StrideI < 0 || m.Len < 0:
		return fmt.Errorf("%w: mask strides %d/%d/%d and length %d must be >= 0",
			cache.ErrInvalidArgument, m.StrideB, m.StrideH, m.StrideI, m.Len)
	}
	last := (s.batch-1)*m.StrideB + (s.qHeads-1)*m.StrideH + (s.qLen-1)*m.StrideI + m.Len
	if last > n {
		return fmt.Errorf("%w: mask rows reach element %d of %d", cache.ErrInvalidArgument, last, n)
	}
	return nil
}
