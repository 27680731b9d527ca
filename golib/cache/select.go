package cache

import "fmt"

// Select keeps the sequences idx (distinct indices in 0..Batch-1, in the
// order given) and drops the others: finished beams or requests leave the
// batch, the counterpart of transformers' batch_select_indices. Batch
// becomes len(idx). The dropped sequences' memory goes back to the arena
// (the contiguous layout's reserved rows, the paged layout's blocks that no
// one else references); no kept row is copied. Checkpoints are invalidated.
// Invalid indices return ErrInvalidArgument or ErrOutOfRange and change
// nothing.
func (c *KVCache) Select(idx []int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	B := c.cfg.Batch
	if len(idx) == 0 || len(idx) > B {
		return fmt.Errorf("%w: select keeps 1..%d sequences, got %d indices", ErrInvalidArgument, B, len(idx))
	}
	seen := make([]bool, B)
	for p, i := range idx {
		if i < 0 || i >= B {
			return fmt.Errorf("%w: sequence index %d at position %d outside 0..%d", ErrOutOfRange, i, p, B-1)
		}
		if seen[i] {
			return fmt.Errorf("%w: sequence index %d is selected twice", ErrInvalidArgument, i)
		}
		seen[i] = true
	}
	live := c.liveBytesLocked()
	n := len(idx)
	lens := make([]int, n)
	wins := make([]int, n)
	for p, i := range idx {
		lens[p], wins[p] = c.lens[i], c.winStart[i]
	}
	if c.pg != nil {
		tables := make([][]*block, n)
		for p, i := range idx {
			tables[p] = c.pg.tables[i]
		}
		for i, t := range c.pg.tables {
			if !seen[i] {
				c.pg.pool.release(t)
			}
		}
		c.pg.tables = tables
		c.pg.spareTables = nil
		c.pg.need = make([]int, n)
	} else {
		seqs := make([]seqStore, n)
		for p, i := range idx {
			seqs[p] = c.seqs[i]
		}
		for i, s := range c.seqs {
			if !seen[i] {
				c.arena.release(s.k, s.v)
				if s.q != nil {
					c.arena.releaseChunks(s.q.blks)
					s.q.releaseKch(c.arena)
				}
			}
		}
		c.seqs = seqs
	}
	c.cfg.Batch = n
	c.lens, c.winStart = lens, wins
	c.reused = make([]int, n)
	c.arena.addLive(c.liveBytesLocked() - live)
	c.cks.invalidateAll()
	c.trimLocked()
	return nil
}
