package cache

import "fmt"

// Append writes n new tokens per sequence after the valid ones. k is
// [Batch, KVHeads, n, HeadDimK] and v is [Batch, KVHeads, n, HeadDimV], both
// row-major in element type src (Float32, or any storage type; values are
// converted to the cache's type). counts, when not nil, gives how many of the
// n tokens are real for each sequence (0..n; the rest is padding and is
// skipped), for ragged prefill.
//
// Only the new rows are copied: the work is proportional to the appended
// tokens, never to the existing length. The paged layout takes the blocks the
// new rows need first (and copies a shared, partially filled last block:
// copy-on-write). On any error (shape, capacity, budget) nothing is written.
func (c *KVCache) Append(k, v []byte, src ElemType, n int, counts []int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	cfg := c.cfg
	if src.Size() == 0 {
		return fmt.Errorf("%w: unsupported source type %v", ErrInvalidArgument, src)
	}
	if n < 0 {
		return fmt.Errorf("%w: negative token count %d", ErrInvalidArgument, n)
	}
	ss := src.Size()
	wantK := cfg.Batch * cfg.KVHeads * n * cfg.HeadDimK * ss
	wantV := cfg.Batch * cfg.KVHeads * n * cfg.HeadDimV * ss
	if len(k) != wantK || len(v) != wantV {
		return fmt.Errorf("%w: append of %d tokens needs k of %d bytes and v of %d bytes, got %d and %d",
			ErrInvalidArgument, n, wantK, wantV, len(k), len(v))
	}
	if counts != nil && len(counts) != cfg.Batch {
		return fmt.Errorf("%w: counts has %d entries for batch %d", ErrInvalidArgument, len(counts), cfg.Batch)
	}
	for b := range cfg.Batch {
		cnt := n
		if counts != nil {
			cnt = counts[b]
			if cnt < 0 || cnt > n {
				return fmt.Errorf("%w: counts[%d]=%d outside 0..%d", ErrInvalidArgument, b, cnt, n)
			}
		}
		if c.lens[b]+cnt > cfg.Capacity {
			return fmt.Errorf("%w: sequence %d holds %d of %d tokens, cannot append %d",
				ErrCapacity, b, c.lens[b], cfg.Capacity, cnt)
		}
	}
	if c.pg != nil {
		if err := c.pagedReserveLocked(n, counts); err != nil {
			return err
		}
	}
	if c.qg.q.Enabled() && cfg.Layout == Paged {
		if err := c.quantReserveLocked(n, counts); err != nil {
			return err
		}
	} else if c.qg.chStride > 0 {
		for b := range cfg.Batch {
			cnt := appendCount(n, counts, b)
			if cnt == 0 {
				continue
			}
			s := c.seqs[b].q
			if err := c.reserveKchLocked(s, s.chunksBelow(c.lens[b])+c.sealsLocked(b, cnt)); err != nil {
				return err
			}
		}
	}
	var scratch []float32
	if src != Float32 && src != cfg.Elem && cfg.Elem != Float32 {
		scratch = make([]float32, 1024)
	}
	var written, tokens int64
	for b := range cfg.Batch {
		cnt := appendCount(n, counts, b)
		if cnt == 0 {
			continue
		}
		pos := c.lens[b]
		tokens += int64(cnt)
		if c.qg.q.Enabled() {
			c.quantWriteLocked(b, pos, cnt, k, v, src, n, scratch)
			written += int64(cnt) * int64(cfg.KVHeads) * int64(c.rowK+c.rowV)
			c.cks.noteWrite(b, pos)
			c.lens[b] = pos + cnt
			continue
		}
		if c.pg != nil {
			c.pagedWriteLocked(b, pos, cnt, k, v, src, n, scratch)
			written += int64(cnt) * int64(cfg.KVHeads) * int64(c.rowK+c.rowV)
			c.cks.noteWrite(b, pos)
			c.lens[b] = pos + cnt
			continue
		}
		s := c.seqs[b]
		for h := range cfg.KVHeads {
			unit := b*cfg.KVHeads + h
			srcK := k[unit*n*cfg.HeadDimK*ss:]
			srcV := v[unit*n*cfg.HeadDimV*ss:]
			dstK := s.k[(h*cfg.Capacity+pos)*c.rowK:]
			dstV := s.v[(h*cfg.Capacity+pos)*c.rowV:]
			convertRows(dstK, cfg.Elem, srcK, src, cnt*cfg.HeadDimK, scratch)
			convertRows(dstV, cfg.Elem, srcV, src, cnt*cfg.HeadDimV, scratch)
			written += int64(cnt) * int64(c.rowK+c.rowV)
		}
		c.cks.noteWrite(b, pos)
		c.lens[b] = pos + cnt
	}
	// one update of the arena's live figure per call instead of one locked
	// update per sequence
	c.arena.addLive(tokens * c.tokBytes)
	c.appendBytes += written
	c.appendCalls++
	return nil
}

// appendCount is the number of tokens an Append of n tokens (per-sequence
// counts, nil: n for every sequence) writes to sequence b.
func appendCount(n int, counts []int, b int) int {
	if counts != nil {
		return counts[b]
	}
	return n
}
