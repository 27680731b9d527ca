package cache

import "sync"

// block is one page of the paged layout: BlockSize tokens of K and V for
// every KV head of a cache geometry, laid out as
// K[KVHeads][BlockSize][HeadDimK] then V[KVHeads][BlockSize][HeadDimV], so
// that each (head, block) is one token-major Segment of K and one of V.
type block struct {
	buf  []byte
	refs int32 // page-table entries (and prefix-store entries) that point here; guarded by the pool's lock
}

// blockPool hands out blocks of one byte size for an arena and counts
// their references. The bytes come from the arena (its budget, its free
// list of same-size buffers): memory is committed when a block is taken and
// goes back to the arena's free list when its last reference is dropped.
//
// blockPool is safe for concurrent use; a block is written only by a cache
// that holds its only reference (copy-on-write otherwise).
type blockPool struct {
	mu     sync.Mutex
	arena  *Arena
	size   int   // bytes per block
	used   int64 // blocks with refs > 0
	shared int64 // blocks with refs > 1
	spare  []*block
}

// blockPool returns the arena's pool of blocks of size bytes, creating it
// on first use.
func (a *Arena) blockPool(size int) *blockPool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pools == nil {
		a.pools = map[int]*blockPool{}
	}
	p := a.pools[size]
	if p == nil {
		p = &blockPool{arena: a, size: size}
		a.pools[size] = p
	}
	return p
}

// take returns n fresh zeroed blocks with one reference each, all or
// nothing: a *BudgetError leaves the pool and the arena as they were.
func (p *blockPool) take(n int, dst []*block) ([]*block, error) {
	if n == 0 {
		return dst, nil
	}
	bufs, err := p.arena.allocMany(p.size, n)
	if err != nil {
		return dst, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range bufs {
		var blk *block
		if k := len(p.spare); k > 0 {
			blk, p.spare = p.spare[k-1], p.spare[:k-1]
		} else {
			blk = &block{}
		}
		blk.buf, blk.refs = b, 1
		dst = append(dst, blk)
	}
	p.used += int64(n)
	return dst, nil
}

// retain adds one reference to every non-nil block.
func (p *blockPool) retain(blks []*block) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, b := range blks {
		if b == nil {
			continue
		}
		if b.refs == 1 {
			p.shared++
		}
		b.refs++
	}
}

// release drops one reference from every non-nil block; blocks left with
// none go back to the arena.
func (p *blockPool) release(blks []*block) {
	var free [][]byte
	p.mu.Lock()
	for _, b := range blks {
		if b == nil {
			continue
		}
		b.refs--
		switch b.refs {
		case 1:
			p.shared--
		case 0:
			p.used--
			free = append(free, b.buf)
			b.buf = nil
			p.spare = append(p.spare, b)
		}
	}
	p.mu.Unlock()
	if len(free) > 0 {
		p.arena.release(free...)
	}
}

// exclusive reports whether b has a single reference (the caller's), so
// the caller may write into it.
func (p *blockPool) exclusive(b *block) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return b.refs == 1
}

// refsOf returns b's reference count (for Info and tests).
func (p *blockPool) refsOf(b *block) int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return b.refs
}

// BlockPoolStats is a snapshot of one block pool of an arena.
type BlockPoolStats struct {
	BlockBytes int   // bytes per block
	Used       int64 // blocks referenced by some cache
	Shared     int64 // blocks referenced more than once
	Free       int64 // freed blocks the arena keeps for reuse
}

// BlockPools returns the accounting of the arena's block pools, one entry
// per block byte size in use.
func (a *Arena) BlockPools() []BlockPoolStats {
	a.mu.Lock()
	pools := make([]*blockPool, 0, len(a.pools))
	free := map[int]int64{}
	for size, p := range a.pools {
		pools = append(pools, p)
		free[size] = int64(len(a.free[size]))
	}
	a.mu.Unlock()
	out := make([]BlockPoolStats, 0, len(pools))
	for _, p := range pools {
		p.mu.Lock()
		out = append(out, BlockPoolStats{BlockBytes: p.size, Used: p.used, Shared: p.shared, Free: free[p.size]})
		p.mu.Unlock()
	}
	return out
}
