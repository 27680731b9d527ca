package cache

import (
	"errors"
	"sync/atomic"
)

// The paged layout of a quantized cache. Its blocks are the sealed chunks:
// one block of Group tokens per chunk (all heads), taken from the arena when
// the chunk is sealed, immutable afterwards and shared by reference count
// between forks and beams (so copy-on-write never has to copy one: a cut
// only shortens the chunk in the page table that cut it). Native rows live
// in each sequence's ring, as in the contiguous layout; Capacity is a limit,
// nothing proportional to it is reserved.

// qchunk is one sealed chunk's block: head h's rows, scales and zeros at
// [h*Group, (h+1)*Group) rows, its per-channel K scales (and zeros) at
// kch[h*chStride:].
type qchunk struct {
	buf                     []byte
	qk, qv                  []byte
	kts, kzs, vts, vzs, kch []float32
	refs                    atomic.Int32
}

// chunkParts are the byte sizes of a chunk block, in carveChunk's order.
func (g quantGeom) chunkParts(cfg Config) [7]int {
	H, G := cfg.KVHeads, g.q.Group
	z := 0
	if g.zeros {
		z = 1
	}
	return [7]int{H * G * g.qRowK, H * G * g.qRowV, 4 * H * G * g.ngK, 4 * H * G * g.ngK * z,
		4 * H * G * g.ngV, 4 * H * G * g.ngV * z, 4 * H * g.chStride}
}

// chunkBytes is the size of one chunk block.
func (g quantGeom) chunkBytes(cfg Config) int {
	p := g.chunkParts(cfg)
	return alignedSize(p[:])
}

func (g quantGeom) carveChunk(cfg Config, buf []byte) *qchunk {
	p := g.chunkParts(cfg)
	next := (&carver{buf: buf}).next
	ch := &qchunk{buf: buf, qk: next(p[0]), qv: next(p[1]), kts: asF32(next(p[2])), kzs: asF32(next(p[3])),
		vts: asF32(next(p[4])), vzs: asF32(next(p[5])), kch: asF32(next(p[6]))}
	ch.refs.Store(1)
	return ch
}

// quantReserveLocked takes from the arena, before anything is written, the
// chunk blocks that an Append of n tokens (counts as Append's) will seal, so
// that a *BudgetError leaves the cache unchanged.
func (c *KVCache) quantReserveLocked(n int, counts []int) error {
	g := &c.qg
	need := 0
	for b := range c.cfg.Batch {
		cnt := appendCount(n, counts, b)
		if cnt == 0 {
			continue
		}
		need += c.sealsLocked(b, cnt)
	}
	if need == 0 {
		return nil
	}
	bufs, err := c.arena.allocMany(g.chunkBytes(c.cfg), need)
	for err != nil && errors.Is(err, ErrBudget) && c.arena.reclaim() {
		bufs, err = c.arena.allocMany(g.chunkBytes(c.cfg), need)
	}
	if err != nil {
		return err
	}
	for _, buf := range bufs {
		c.qfresh = append(c.qfresh, g.carveChunk(c.cfg, buf))
	}
	return nil
}

// takeChunkLocked returns a block reserved by quantReserveLocked.
func (c *KVCache) takeChunkLocked() *qchunk {
	ch := c.qfresh[len(c.qfresh)-1]
	c.qfresh[len(c.qfresh)-1] = nil
	c.qfresh = c.qfresh[:len(c.qfresh)-1]
	return ch
}

// releaseChunks drops one reference to each block (nil entries are chunks
// a window already gave back); the last one returns it to the arena.
func (a *Arena) releaseChunks(blks []*qchunk) {
	for i, ch := range blks {
		if ch != nil && ch.refs.Add(-1) == 0 {
			a.release(ch.buf)
		}
		blks[i] = nil
	}
}

// retainChunks adds one reference to each block.
func retainChunks(blks []*qchunk) {
	for _, ch := range blks {
		if ch != nil {
			ch.refs.Add(1)
		}
	}
}

// quantTrimLocked gives back, in the paged layout, the chunk blocks that
// neither the readable rows nor a restorable checkpoint need: chunks that
// end at or below the lowest window start, and chunks from the highest
// length on (the sealed end is cut there).
func (c *KVCache) quantTrimLocked() {
	if c.cfg.Layout != Paged || !c.qg.q.Enabled() {
		return
	}
	g := &c.qg
	for b := range c.lens {
		lo, hi := c.neededRangeLocked(b)
		s := c.seqs[b].q
		s.cut(hi, c.cfg.KVHeads, g.chStride, c.arena)
		for i := range s.blks {
			end := s.sealed
			if i+1 < len(s.chunks) {
				end = s.chunks[i+1]
			}
			if end > lo {
				break
			}
			c.arena.releaseChunks(s.blks[i : i+1])
		}
	}
}

// pagedQuantInfoLocked fills the block figures of a paged quantized cache.
func (c *KVCache) pagedQuantInfoLocked(in *Info) {
	distinct := map[*qchunk]struct{}{}
	entries := 0
	for _, sq := range c.seqs {
		for _, ch := range sq.q.blks {
			if ch != nil {
				distinct[ch] = struct{}{}
				entries++
			}
		}
	}
	in.BlocksUsed = int64(len(distinct))
	for ch := range distinct {
		if ch.refs.Load() > 1 {
			in.BlocksShared++
		}
	}
	in.PageTableBytes += int64(16 * entries)
	in.CommittedBytes = int64(c.cfg.Batch)*int64(c.qg.seqBytes) + in.BlocksUsed*int64(c.qg.chunkBytes(c.cfg))
}
