package cache

import "fmt"

// Reset empties every sequence and drops all checkpoints; the contiguous
// layout keeps its reserved memory for reuse, the paged layout gives every
// block back to the pool.
func (c *KVCache) Reset() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	for b := range c.lens {
		c.setWinLocked(b, 0)
		c.setLenLocked(b, 0)
	}
	c.cks.invalidateAll()
	if c.pg != nil {
		c.pg.releaseAll()
	}
	for _, s := range c.seqs {
		if s.q != nil {
			s.q.reset(c.arena)
		}
	}
	return nil
}

// Truncate sets the valid length of every sequence to n[b] (one value for all
// sequences when len(n) == 1). A length may only shrink, and not below the
// sliding-window start; otherwise nothing changes and an ErrInvalidArgument
// error is returned. Rows past the new length are not cleared: a checkpoint
// taken before the truncate can restore them until they are overwritten (the
// paged layout gives back the whole blocks past the new length that no live
// checkpoint covers).
func (c *KVCache) Truncate(n []int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	at := func(b int) int {
		if len(n) == 1 {
			return n[0]
		}
		return n[b]
	}
	if len(n) != 1 && len(n) != c.cfg.Batch {
		return fmt.Errorf("%w: truncate takes 1 or %d lengths, got %d", ErrInvalidArgument, c.cfg.Batch, len(n))
	}
	for b := range c.lens {
		if l := at(b); l < c.winStart[b] || l > c.lens[b] {
			return fmt.Errorf("%w: cannot truncate sequence %d to %d (valid range %d..%d)",
				ErrInvalidArgument, b, l, c.winStart[b], c.lens[b])
		}
	}
	for b := range c.lens {
		c.setLenLocked(b, at(b))
	}
	c.trimLocked()
	return nil
}

// Evict applies a sliding window: every sequence keeps at most its last
// keep tokens readable; older positions become unreadable (attention starts
// at WindowStart). In the contiguous layout the rows stay reserved; the paged
// layout gives back the whole blocks that left every sequence's window (and
// that no live checkpoint covers); a window that is not a multiple of the
// block size leaves the first block partly unread.
func (c *KVCache) Evict(keep int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if keep < 0 {
		return fmt.Errorf("%w: negative window %d", ErrInvalidArgument, keep)
	}
	for b, l := range c.lens {
		if w := l - keep; w > c.winStart[b] {
			c.setWinLocked(b, w)
		}
	}
	c.trimLocked()
	return nil
}

// Fork returns an independent copy of the cache in the same arena: same
// geometry and valid rows, no shared writable storage. The contiguous layout
// copies the valid rows (counted in this cache's CopyBytes); the paged layout
// shares every block by reference and copies none: the first write into a
// shared, partially filled block copies that block (copy-on-write).
func (c *KVCache) Fork() (*KVCache, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	f, err := New(c.arena, c.cfg)
	if err != nil {
		return nil, err
	}
	if c.pg != nil {
		c.pagedForkLocked(f)
		return f, nil
	}
	for b := range c.lens {
		if err := f.reserveKchLocked(f.seqs[b].q, c.seqs[b].q.chunksBelow(c.lens[b])); err != nil {
			f.Close()
			return nil, err
		}
	}
	var copied int64
	for b := range c.lens {
		copied += c.copySeqLocked(f.seqs[b], c.seqs[b], c.winStart[b], c.lens[b])
		f.setWinLocked(b, c.winStart[b])
		f.setLenLocked(b, c.lens[b])
	}
	c.copyBytes += copied
	return f, nil
}

// copySeqLocked copies positions [lo, hi) of every head from src to dst and
// returns the bytes copied.
func (c *KVCache) copySeqLocked(dst, src seqStore, lo, hi int) int64 {
	if src.q != nil {
		return c.copyQuantSeqLocked(dst.q, src.q, lo, hi)
	}
	if hi <= lo {
		return 0
	}
	var n int64
	for h := range c.cfg.KVHeads {
		kb := (h*c.cfg.Capacity + lo) * c.rowK
		ke := (h*c.cfg.Capacity + hi) * c.rowK
		vb := (h*c.cfg.Capacity + lo) * c.rowV
		ve := (h*c.cfg.Capacity + hi) * c.rowV
		n += int64(copy(dst.k[kb:ke], src.k[kb:ke]))
		n += int64(copy(dst.v[vb:ve], src.v[vb:ve]))
	}
	return n
}

// Reorder makes sequence b a copy of old sequence idx[b] (beam search
// reordering). A permutation moves no data: storage is handed over by
// reference. In the contiguous layout, sequences chosen more than once are
// copied into the storage of sequences chosen by nobody; the paged layout
// copies nothing: page tables are permuted and blocks shared by reference
// count (the next write into a shared partial block copies that one block). Indices outside 0..Batch-1 return
// ErrOutOfRange and change nothing. Checkpoints are invalidated.
func (c *KVCache) Reorder(idx []int) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	B := c.cfg.Batch
	if len(idx) != B {
		return fmt.Errorf("%w: reorder needs %d beam indices, got %d", ErrInvalidArgument, B, len(idx))
	}
	for b, i := range idx {
		if i < 0 || i >= B {
			return fmt.Errorf("%w: beam index %d at position %d outside 0..%d", ErrOutOfRange, i, b, B-1)
		}
	}
	if c.pg != nil {
		// the lengths and windows move with the tables (scratch slices:
		// a beam step allocates nothing)
		lens, wins := c.reused, c.pg.need
		for b, i := range idx {
			lens[b], wins[b] = c.lens[i], c.winStart[i]
		}
		live := c.liveBytesLocked()
		copy(c.lens, lens)
		copy(c.winStart, wins)
		c.arena.addLive(c.liveBytesLocked() - live)
		c.pagedReorderLocked(idx)
		c.cks.invalidateAll()
		c.trimLocked()
		return nil
	}
	// reused[i] counts how often old sequence i is taken.
	for i := range c.reused {
		c.reused[i] = 0
	}
	for _, i := range idx {
		c.reused[i]++
	}
	oldSeqs := append([]seqStore(nil), c.seqs...)
	oldLens := append([]int(nil), c.lens...)
	oldWin := append([]int(nil), c.winStart...)
	var spare []seqStore
	for i, n := range c.reused {
		if n == 0 {
			spare = append(spare, oldSeqs[i])
		}
	}
	// sequence b gets old sequence idx[b] itself the first time it is
	// taken, then a spare that receives a copy of it
	taken := make([]bool, B)
	seqs := make([]seqStore, B)
	var copies []int // the b whose sequence is a copy
	for b, i := range idx {
		if !taken[i] {
			taken[i] = true
			seqs[b] = oldSeqs[i]
			continue
		}
		seqs[b] = spare[len(spare)-1]
		spare = spare[:len(spare)-1]
		copies = append(copies, b)
	}
	// room for the copied chunk scales before anything changes, so that a
	// *BudgetError leaves the cache as it was
	for _, b := range copies {
		i := idx[b]
		if err := c.reserveKchLocked(seqs[b].q, oldSeqs[i].q.chunksBelow(oldLens[i])); err != nil {
			return err
		}
	}
	var copied int64
	for _, b := range copies {
		i := idx[b]
		copied += c.copySeqLocked(seqs[b], oldSeqs[i], oldWin[i], oldLens[i])
	}
	copy(c.seqs, seqs)
	for b, i := range idx {
		c.setWinLocked(b, oldWin[i])
		c.setLenLocked(b, oldLens[i])
	}
	c.copyBytes += copied
	c.cks.invalidateAll()
	return nil
}
