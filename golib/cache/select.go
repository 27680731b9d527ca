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
