package cache

import "fmt"

// Adopt moves every sequence of src to the end of c: c's batch grows by
// src's, and src is closed. Both caches must have the same geometry (all
// but Batch), storage type and arena, and neither may be closed; otherwise
// nothing changes. No K/V byte is copied. Checkpoints of both are
// invalidated. c.Adopt(src) must not run concurrently with src.Adopt(c).
//
// Each sequence's storage moves with it: the contiguous layout's reserved
// rows, the paged layout's page tables (with their block references).
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
	if c.pg != nil {
		// same geometry and arena: the same block pool; the page tables
		// (and their references) move
		c.pg.tables = append(c.pg.tables, src.pg.tables...)
		c.pg.spareTables = nil
		c.pg.need = make([]int, c.cfg.Batch+src.cfg.Batch)
		src.pg.tables = nil
	}
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
