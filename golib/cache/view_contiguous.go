package cache

// BeginRead takes the cache's shared lock and returns it as a View for an
// attention kernel. The caller must call EndRead when the kernel is done;
// mutations wait until then.
func (c *KVCache) BeginRead() (View, error) {
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return nil, ErrClosed
	}
	c.attnCalls.Add(1)
	return c, nil
}

// EndRead releases the shared lock taken by BeginRead.
func (c *KVCache) EndRead() { c.mu.RUnlock() }

// ElemType implements View.
func (c *KVCache) ElemType() ElemType { return c.cfg.Elem }

// Batch implements View.
func (c *KVCache) Batch() int { return c.cfg.Batch }

// KVHeads implements View.
func (c *KVCache) KVHeads() int { return c.cfg.KVHeads }

// HeadDimK implements View.
func (c *KVCache) HeadDimK() int { return c.cfg.HeadDimK }

// HeadDimV implements View.
func (c *KVCache) HeadDimV() int { return c.cfg.HeadDimV }

// SeqLen implements View.
func (c *KVCache) SeqLen(b int) int { return c.lens[b] }

// WindowStart implements View.
func (c *KVCache) WindowStart(b int) int { return c.winStart[b] }

// AppendSegments implements View: the contiguous layout has one segment per
// (sequence, head) range, the paged layout one per block, a quantized cache
// one per sealed chunk (Q filled) and one or two for its native rows.
func (c *KVCache) AppendSegments(dst []Segment, b, h, from, to int) []Segment {
	if to <= from {
		return dst
	}
	if c.pg != nil {
		return c.pg.segments(dst, b, h, from, to)
	}
	if c.qg.q.Enabled() {
		return c.quantSegments(dst, b, h, from, to)
	}
	s := c.seqs[b]
	baseK := h * c.cfg.Capacity * c.rowK
	baseV := h * c.cfg.Capacity * c.rowV
	return append(dst, Segment{
		Start: from,
		Len:   to - from,
		K:     s.k[baseK+from*c.rowK : baseK+to*c.rowK],
		V:     s.v[baseV+from*c.rowV : baseV+to*c.rowV],
	})
}

// AddBytesRead implements View.
func (c *KVCache) AddBytesRead(n int64) { c.attnBytes.Add(n) }
