package cache

import "fmt"

// MaxLen returns the longest valid length over the sequences: the sequence
// axis of exported present tensors.
func (c *KVCache) MaxLen() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	m := 0
	for _, l := range c.lens {
		m = max(m, l)
	}
	return m
}

// Export writes the cache as standard present tensors: k becomes
// [Batch, KVHeads, L, HeadDimK] and v [Batch, KVHeads, L, HeadDimV] in
// element type dt, where L >= MaxLen(). Sealed (quantized) rows are written
// as their dequantized values (DequantizeSegment). Positions at or past a sequence's
// length, and positions evicted by a sliding window, are written as zeros.
// Export is the only operation that materializes the whole cache; generation
// loops that do not observe present tensors never call it.
func (c *KVCache) Export(k, v []byte, dt ElemType, L int) error {
	c.mu.Lock() // exclusive: it updates counters
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	return c.exportLocked(k, v, dt, L)
}

// ExportUpTo is Export with the length read under the same lock as the
// copy, so a concurrent Append or Reset cannot make the two disagree. It
// reads L = MaxLen() and, when L <= maxL, writes the present tensors
// [Batch, KVHeads, L, HeadDim] into the leading bytes of k and v (which
// must hold them) and returns L. When L > maxL it writes nothing and
// returns L, so the caller can retry with buffers for that length.
func (c *KVCache) ExportUpTo(k, v []byte, dt ElemType, maxL int) (int, error) {
	c.mu.Lock() // exclusive: it updates counters
	defer c.mu.Unlock()
	if c.closed {
		return 0, ErrClosed
	}
	if dt.Size() == 0 {
		return 0, fmt.Errorf("%w: unsupported export type %v", ErrInvalidArgument, dt)
	}
	if maxL < 0 {
		return 0, fmt.Errorf("%w: negative export length bound %d", ErrInvalidArgument, maxL)
	}
	L := 0
	for _, l := range c.lens {
		L = max(L, l)
	}
	if L > maxL {
		return L, nil
	}
	cfg, ds := c.cfg, dt.Size()
	nk := cfg.Batch * cfg.KVHeads * L * cfg.HeadDimK * ds
	nv := cfg.Batch * cfg.KVHeads * L * cfg.HeadDimV * ds
	if len(k) < nk || len(v) < nv {
		return 0, fmt.Errorf("%w: export of length %d needs k of %d bytes and v of %d bytes, got %d and %d",
			ErrInvalidArgument, L, nk, nv, len(k), len(v))
	}
	return L, c.exportLocked(k[:nk], v[:nv], dt, L)
}

// ExportTail writes each sequence's last min(length, L) positions into
// rows 0.. of present tensors k [Batch, KVHeads, L, HeadDimK] and v
// [Batch, KVHeads, L, HeadDimV] of element type dt, and zeros after them
// (and for positions a sliding window evicted): the window-sized buffer
// onnxruntime-genai keeps for a GroupQueryAttention layer with
// sliding_window_cache=1 whose buffer is as long as its window. The cache
// itself keeps every position.
func (c *KVCache) ExportTail(k, v []byte, dt ElemType, L int) error {
	c.mu.Lock() // exclusive: it updates counters
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if L < 0 {
		return fmt.Errorf("%w: negative export length %d", ErrInvalidArgument, L)
	}
	return c.exportRows(k, v, dt, L, true)
}

// exportLocked is Export's body; c.mu is held exclusively.
func (c *KVCache) exportLocked(k, v []byte, dt ElemType, L int) error {
	for _, l := range c.lens {
		if L < l {
			return fmt.Errorf("%w: export length %d is shorter than a sequence of %d tokens", ErrInvalidArgument, L, l)
		}
	}
	return c.exportRows(k, v, dt, L, false)
}

// exportRows writes the present tensors of length L: position p of
// sequence b at row p, or with tail at row p - (length - L) for the last L
// positions. c.mu is held exclusively.
func (c *KVCache) exportRows(k, v []byte, dt ElemType, L int, tail bool) error {
	cfg := c.cfg
	if dt.Size() == 0 {
		return fmt.Errorf("%w: unsupported export type %v", ErrInvalidArgument, dt)
	}
	ds := dt.Size()
	wantK := cfg.Batch * cfg.KVHeads * L * cfg.HeadDimK * ds
	wantV := cfg.Batch * cfg.KVHeads * L * cfg.HeadDimV * ds
	if len(k) != wantK || len(v) != wantV {
		return fmt.Errorf("%w: export of length %d needs k of %d bytes and v of %d bytes, got %d and %d",
			ErrInvalidArgument, L, wantK, wantV, len(k), len(v))
	}
	var scratch []float32
	if dt != Float32 && dt != cfg.Elem && cfg.Elem != Float32 {
		scratch = make([]float32, 1024)
	}
	rowKd, rowVd := cfg.HeadDimK*ds, cfg.HeadDimV*ds
	var written int64
	for b := range cfg.Batch {
		lo, hi, base := c.winStart[b], c.lens[b], 0 // position p goes to row p - base
		if tail && hi > L {
			base = hi - L
			lo = max(lo, base)
		}
		for h := range cfg.KVHeads {
			unit := b*cfg.KVHeads + h
			dk := k[unit*L*rowKd : (unit+1)*L*rowKd]
			dv := v[unit*L*rowVd : (unit+1)*L*rowVd]
			clear(dk[:(lo-base)*rowKd])
			clear(dv[:(lo-base)*rowVd])
			c.segs = c.AppendSegments(c.segs[:0], b, h, lo, hi)
			for _, sg := range c.segs {
				r := sg.Start - base
				if sg.Q.Format != QuantNone {
					c.exportSealed(dk[r*rowKd:], dv[r*rowVd:], dt, sg)
					continue
				}
				convertRows(dk[r*rowKd:], dt, sg.K, cfg.Elem, sg.Len*cfg.HeadDimK, scratch)
				convertRows(dv[r*rowVd:], dt, sg.V, cfg.Elem, sg.Len*cfg.HeadDimV, scratch)
			}
			clear(dk[(hi-base)*rowKd:])
			clear(dv[(hi-base)*rowVd:])
			written += int64(len(dk) + len(dv))
		}
	}
	c.exportBytes += written
	return nil
}

// exportSealed writes the dequantized rows of a sealed segment (at most one
// chunk: qscratch holds it) to dk and dv in type dt.
func (c *KVCache) exportSealed(dk, dv []byte, dt ElemType, sg Segment) {
	dK, dV := c.cfg.HeadDimK, c.cfg.HeadDimV
	xk, xv := c.qscratch[:sg.Len*dK], c.qscratch[sg.Len*dK:sg.Len*(dK+dV)]
	// the segment comes from this cache's own view: well-formed
	_ = DequantizeSegment(xk, xv, sg, dK, dV)
	convertRows(dk, dt, asBytes(xk), Float32, len(xk), nil)
	convertRows(dv, dt, asBytes(xv), Float32, len(xv), nil)
}
