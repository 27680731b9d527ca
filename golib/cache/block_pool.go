package cache

import (
	"fmt"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/hugepage"
)

// block is one page of the paged layout: BlockSize tokens of K and V for
// every KV head, in slot slot of a slab.
type block struct {
	s    *slab
	slot int
	refs int32 // page-table entries that point here; guarded by the pool's lock
}

// slab is one arena buffer holding slots blocks, laid out head-major so
// that consecutive slots form one contiguous run per head:
// K[KVHeads][slots][BlockSize][HeadDimK] then V[KVHeads][slots][BlockSize][HeadDimV].
// A sequence whose consecutive logical blocks sit in consecutive slots is
// read by the kernel as one segment per run (up to a slab), not one per
// block; slabs of 2 MiB or more are backed by huge pages (see osAlloc).
type slab struct {
	buf    []byte
	blocks []block // one per slot
	used   int     // slots with refs > 0
}

// poolKey is the geometry a block pool serves.
type poolKey struct{ bs, kvHeads, rowK, rowV int }

// blockPool hands out blocks of one geometry for an arena and counts their
// references. Slabs come from the arena (its budget, its free list of
// same-size buffers): memory is committed a slab at a time when blocks are
// taken, and a slab goes back to the arena when its last block is released.
//
// blockPool is safe for concurrent use; a block is written only by a cache
// that holds its only reference (copy-on-write otherwise).
type blockPool struct {
	mu           sync.Mutex
	arena        *Arena
	key          poolKey
	slots        int // blocks per slab
	kHead, vHead int // bytes of one head's K (V) rows in one block
	blockBytes   int
	slabBytes    int
	slabs        []*slab
	used         int64 // blocks with refs > 0
	shared       int64 // blocks with refs > 1
}

// slabTokens is the tokens of one slab: a run of consecutive slots is one
// segment, and the decode kernel streams long segments as it streams the
// contiguous layout (runs of 512 tokens measured 1.1-1.3x the contiguous
// decode time at 4k-16k, runs of 2048 about 1.0-1.15x). Slabs are shared by
// every cache of the arena with the same geometry, so this is the commit
// granularity of the whole pool, not of each sequence.
const slabTokens = 2048

// maxSlabBlocks bounds the slots of a slab.
const maxSlabBlocks = 128

// blockPool returns the arena's pool for blocks of bs tokens of kvHeads
// heads with K and V rows of rowK and rowV bytes, creating it on first use.
func (a *Arena) blockPool(bs, kvHeads, rowK, rowV int) *blockPool {
	key := poolKey{bs, kvHeads, rowK, rowV}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.pools == nil {
		a.pools = map[poolKey]*blockPool{}
	}
	p := a.pools[key]
	if p == nil {
		p = &blockPool{arena: a, key: key, kHead: bs * rowK, vHead: bs * rowV}
		p.blockBytes = kvHeads * (p.kHead + p.vHead)
		// one kernel tile per run, and at least a huge page per slab; under a
		// budget at most half of it, so that a small cache under a budget that
		// holds it many times over is not refused its first slab
		p.slots = min(maxSlabBlocks, max(slabTokens/bs, (hugepage.Size+p.blockBytes-1)/p.blockBytes))
		if a.budget > 0 {
			p.slots = max(1, min(p.slots, int(a.budget/2/int64(p.blockBytes))))
		}
		p.slabBytes = p.slots * p.blockBytes
		a.pools[key] = p
	}
	return p
}

// kRows returns the K bytes of rows [r0, r1) of head h of blk.
func (p *blockPool) kRows(blk *block, h, r0, r1 int) []byte {
	base := (h*p.slots + blk.slot) * p.kHead
	return blk.s.buf[base+r0*p.key.rowK : base+r1*p.key.rowK]
}

// vRows returns the V bytes of rows [r0, r1) of head h of blk.
func (p *blockPool) vRows(blk *block, h, r0, r1 int) []byte {
	base := p.key.kvHeads*p.slots*p.kHead + (h*p.slots+blk.slot)*p.vHead
	return blk.s.buf[base+r0*p.key.rowV : base+r1*p.key.rowV]
}

// adjacent reports whether b2 directly follows b1 in memory (the next slot
// of the same slab), so their rows form one run per head.
func adjacent(b1, b2 *block) bool { return b2.s == b1.s && b2.slot == b1.slot+1 }

// takeReq is one block wanted by take: the block it should follow in its
// sequence (nil: none), or chain to follow the block of the previous
// request.
type takeReq struct {
	after *block
	chain bool
}

// take returns one fresh block per request (one reference each), all or
// nothing: when the free slots do not suffice, the slabs still needed are
// taken from the arena in one allocation, and a *BudgetError leaves the
// pool and the arena as they were. A request gets the slot after the
// block it follows when that slot is free.
func (p *blockPool) take(reqs []takeReq, dst []*block) ([]*block, error) {
	if len(reqs) == 0 {
		return dst, nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	free := 0
	for _, s := range p.slabs {
		free += p.slots - s.used
	}
	if need := len(reqs) - free; need > 0 {
		bufs, err := p.arena.allocMany(p.slabBytes, (need+p.slots-1)/p.slots)
		if err != nil {
			return dst, err
		}
		for _, b := range bufs {
			s := &slab{buf: b, blocks: make([]block, p.slots)}
			for i := range s.blocks {
				s.blocks[i] = block{s: s, slot: i}
			}
			p.slabs = append(p.slabs, s)
		}
	}
	var prev *block
	start := len(dst)
	for _, r := range reqs {
		after := r.after
		if r.chain {
			after = prev
		}
		blk := p.pickLocked(after)
		if blk == nil { // cannot happen: the free slots were counted above
			for _, b := range dst[start:] {
				b.refs = 0
				b.s.used--
				p.used--
			}
			return dst[:start], fmt.Errorf("%w: block pool accounting out of step", ErrBudget)
		}
		blk.refs = 1
		blk.s.used++
		p.used++
		dst = append(dst, blk)
		prev = blk
	}
	return dst, nil
}

// pickLocked returns a free block (nil when there is none): the slot after
// after when free, else a slot that leaves the sequence room to grow into
// consecutive slots: the start of the longest free run when nothing
// precedes it, else the middle of that run (the slots before stay free for
// the block that precedes them).
func (p *blockPool) pickLocked(after *block) *block {
	if after != nil && after.s != nil && after.slot+1 < p.slots {
		if b := &after.s.blocks[after.slot+1]; b.refs == 0 {
			return b
		}
	}
	var best *slab
	bestStart, bestLen := 0, 0
	for _, s := range p.slabs {
		for i := 0; i < p.slots; {
			if s.blocks[i].refs != 0 {
				i++
				continue
			}
			j := i
			for j < p.slots && s.blocks[j].refs == 0 {
				j++
			}
			if j-i > bestLen {
				best, bestStart, bestLen = s, i, j-i
			}
			i = j
		}
	}
	if best == nil {
		return nil
	}
	if bestStart > 0 {
		bestStart += bestLen / 2
	}
	return &best.blocks[bestStart]
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

// release drops one reference from every non-nil block; a slab left with
// no referenced block goes back to the arena.
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
			if b.s.used--; b.s.used == 0 {
				free = append(free, p.dropSlabLocked(b.s))
			}
		}
	}
	p.mu.Unlock()
	if len(free) > 0 {
		p.arena.release(free...)
	}
}

// dropSlabLocked removes an unused slab from the pool and returns its buffer.
func (p *blockPool) dropSlabLocked(s *slab) []byte {
	for i, x := range p.slabs {
		if x == s {
			p.slabs = append(p.slabs[:i], p.slabs[i+1:]...)
			break
		}
	}
	buf := s.buf
	s.buf = nil
	return buf
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
	BlockSize  int   // tokens per block
	BlockBytes int   // bytes per block
	SlabBlocks int   // blocks per slab (the unit memory is committed in)
	Used       int64 // blocks referenced by some cache
	Shared     int64 // blocks referenced more than once
	Free       int64 // unreferenced blocks of the slabs held
}

// BlockPools returns the accounting of the arena's block pools, one entry
// per geometry in use.
func (a *Arena) BlockPools() []BlockPoolStats {
	a.mu.Lock()
	pools := make([]*blockPool, 0, len(a.pools))
	for _, p := range a.pools {
		pools = append(pools, p)
	}
	a.mu.Unlock()
	out := make([]BlockPoolStats, 0, len(pools))
	for _, p := range pools {
		out = append(out, p.stats())
	}
	return out
}

func (p *blockPool) stats() BlockPoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return BlockPoolStats{BlockSize: p.key.bs, BlockBytes: p.blockBytes, SlabBlocks: p.slots,
		Used: p.used, Shared: p.shared, Free: int64(len(p.slabs)*p.slots) - p.used}
}
