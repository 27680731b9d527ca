package cache

import "fmt"

// Select keeps a subset of the sequences: sequence b becomes old sequence
// idx[b] and the batch becomes len(idx) (1 <= len(idx) <= Batch). Indices
// must be distinct and in 0..Batch-1 (else ErrOutOfRange or
// ErrInvalidArgument, and nothing changes). No K/V byte is copied: kept
// sequences hand their storage over by reference and the storage of the
// others goes back to the arena. Checkpoints are invalidated.
func (c *KVCache) Select(idx []int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	B := c.cfg.Batch
	if len(idx) == 0 || len(idx) > B {
		return fmt.Errorf("%w: select keeps 1..%d sequences, got %d", ErrInvalidArgument, B, len(idx))
	}
	for i := range c.reused {
		c.reused[i] = 0
	}
	for p, i := range idx {
		if i < 0 || i >= B {
			return fmt.Errorf("%w: sequence index %d at position %d outside 0..%d", ErrOutOfRange, i, p, B-1)
		}
		if c.reused[i]++; c.reused[i] > 1 {
			return fmt.Errorf("%w: sequence %d selected twice (select keeps a subset; use Reorder or Fork to copy)",
				ErrInvalidArgument, i)
		}
	}
	seqs := make([]seqStore, len(idx))
	lens := make([]int, len(idx))
	win := make([]int, len(idx))
	for b, i := range idx {
		seqs[b], lens[b], win[b] = c.seqs[i], c.lens[i], c.winStart[i]
	}
	for i, n := range c.reused {
		if n == 0 {
			c.setWinLocked(i, 0)
			c.setLenLocked(i, 0)
			c.arena.release(c.seqs[i].k, c.seqs[i].v)
		}
	}
	c.seqs, c.lens, c.winStart = seqs, lens, win
	c.reused = make([]int, len(idx))
	c.cfg.Batch = len(idx)
	c.cks.invalidateAll()
	return nil
}

// Adopt moves every sequence of src to the end of c: c's batch grows by
// src's, and src is closed. Both caches must have the same geometry (all
// but Batch), storage type and arena, and neither may be closed; otherwise
// nothing changes. No K/V byte is copied. Checkpoints of both are
// invalidated. c.Adopt(src) must not run concurrently with src.Adopt(c).
func (c *KVCache) Adopt(src *KVCache) error {
	if src == nil || src == c {
		return fmt.Errorf("%w: a cache adopts the sequences of another, non-nil cache", ErrInvalidArgument)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	src.mu.Lock()
	defer src.mu.Unlock()
	if c.closed || src.closed {
		return ErrClosed
	}
	a, b := c.cfg, src.cfg
	a.Batch, b.Batch = 0, 0
	if a != b || c.arena != src.arena {
		return fmt.Errorf("%w: adopting needs the same geometry, storage type and arena (have %+v, got %+v)",
			ErrInvalidArgument, c.cfg, src.cfg)
	}
	if c.cfg.Batch+src.cfg.Batch > maxBatch {
		return fmt.Errorf("%w: batch %d + %d exceeds %d", ErrInvalidArgument, c.cfg.Batch, src.cfg.Batch, maxBatch)
	}
	c.seqs = append(c.seqs, src.seqs...)
	c.lens = append(c.lens, src.lens...)
	c.winStart = append(c.winStart, src.winStart...)
	c.cfg.Batch += src.cfg.Batch
	c.reused = make([]int, c.cfg.Batch)
	c.cks.invalidateAll()
	// the live bytes and the storage now belong to c (same arena): src is
	// closed without releasing anything
	src.seqs, src.lens, src.winStart = nil, nil, nil
	src.closed = true
	src.cks.invalidateAll()
	return nil
}
