package cache

import (
	"errors"
	"fmt"
	"slices"
)

// The paged layout's side of the KVCache operations. Every method here runs
// with c.mu held exclusively and c.pg != nil.

// pagedReserveLocked makes the blocks that positions [lens[b], lens[b]+cnt)
// land in writable by this cache: missing blocks are taken from the pool and
// a shared block is replaced by a private copy of its valid rows
// (copy-on-write; only the partially filled block a write starts in holds
// such rows, so at most one block per sequence is copied). Every block is
// taken before anything changes: a *BudgetError leaves the cache as it was.
func (c *KVCache) pagedReserveLocked(n int, counts []int) error {
	ps := c.pg
	ps.reqs = ps.reqs[:0]
	for b := range c.cfg.Batch {
		cnt := appendCount(n, counts, b)
		ps.need[b] = 0
		if cnt == 0 {
			continue
		}
		t := ps.tables[b]
		pos := c.lens[b]
		chained := false
		for i := pos / ps.bs; i <= (pos+cnt-1)/ps.bs; i++ {
			if i < len(t) && t[i] != nil && ps.pool.exclusive(t[i]) {
				chained = false
				continue
			}
			r := takeReq{chain: chained}
			if !chained && i > 0 && i-1 < len(t) {
				r.after = t[i-1]
			}
			ps.reqs = append(ps.reqs, r)
			ps.need[b]++
			chained = true
		}
	}
	if len(ps.reqs) == 0 {
		return nil
	}
	fresh, err := ps.pool.take(ps.reqs, ps.fresh[:0])
	// under budget pressure, unreferenced shared prefixes go first
	for err != nil && errors.Is(err, ErrBudget) && c.arena.reclaim() {
		fresh, err = ps.pool.take(ps.reqs, ps.fresh[:0])
	}
	ps.fresh = fresh
	if err != nil {
		return err
	}
	j := 0
	var copied int64
	for b := range c.cfg.Batch {
		if ps.need[b] == 0 {
			continue
		}
		cnt := appendCount(n, counts, b)
		t := ps.tables[b]
		pos := c.lens[b]
		for i := pos / ps.bs; i <= (pos+cnt-1)/ps.bs; i++ {
			// a block shared with an earlier sequence of this cache may
			// have become exclusive by that sequence's copy: write in place
			if i < len(t) && t[i] != nil && ps.pool.exclusive(t[i]) {
				continue
			}
			nb := fresh[j]
			j++
			if i >= len(t) {
				t = append(t, nb)
				continue
			}
			if old := t[i]; old != nil {
				// rows of this block below pos are valid (or restorable
				// by a checkpoint): copy them once
				if rows := pos - i*ps.bs; rows > 0 {
					for h := range c.cfg.KVHeads {
						copied += int64(copy(ps.pool.kRows(nb, h, 0, rows), ps.pool.kRows(old, h, 0, rows)))
						copied += int64(copy(ps.pool.vRows(nb, h, 0, rows), ps.pool.vRows(old, h, 0, rows)))
					}
				}
				ps.pool.release(t[i : i+1])
			}
			t[i] = nb
		}
		ps.tables[b] = t
	}
	ps.pool.release(fresh[j:]) // taken for blocks that became exclusive
	clear(fresh)
	c.copyBytes += copied
	return nil
}

// pagedWriteLocked writes cnt rows per head of sequence b from position pos
// (the blocks are reserved) from the source rows srcK/srcV of type src.
func (c *KVCache) pagedWriteLocked(b, pos, cnt int, k, v []byte, src ElemType, n int, scratch []float32) {
	ps, cfg := c.pg, c.cfg
	ss := src.Size()
	t := ps.tables[b]
	for h := range cfg.KVHeads {
		unit := b*cfg.KVHeads + h
		srcK := k[unit*n*cfg.HeadDimK*ss:]
		srcV := v[unit*n*cfg.HeadDimV*ss:]
		for done := 0; done < cnt; {
			p := pos + done
			i := p / ps.bs
			r0 := p - i*ps.bs
			rows := min(ps.bs-r0, cnt-done)
			convertRows(ps.pool.kRows(t[i], h, r0, r0+rows), cfg.Elem, srcK[done*cfg.HeadDimK*ss:], src, rows*cfg.HeadDimK, scratch)
			convertRows(ps.pool.vRows(t[i], h, r0, r0+rows), cfg.Elem, srcV[done*cfg.HeadDimV*ss:], src, rows*cfg.HeadDimV, scratch)
			done += rows
		}
	}
}

// trimLocked gives back the blocks that neither the valid rows nor a
// restorable checkpoint need: whole blocks below the window start and past
// the length. It is called after every operation that shrinks a range.
func (c *KVCache) trimLocked() {
	ps := c.pg
	if ps == nil {
		c.quantTrimLocked()
		return
	}
	for b := range c.lens {
		lo, hi := c.neededRangeLocked(b)
		ps.keep(b, lo, hi)
	}
}

// neededRangeLocked returns the positions [lo, hi) of sequence b that the
// readable rows or a restorable checkpoint still need.
func (c *KVCache) neededRangeLocked(b int) (lo, hi int) {
	lo, hi = c.winStart[b], c.lens[b]
	for _, ck := range c.cks.list {
		if ck.floor[b] >= ck.lens[b] {
			lo = min(lo, ck.winStart[b])
			hi = max(hi, ck.lens[b])
		}
	}
	return lo, hi
}

// pagedForkLocked fills f (a new paged cache of the same geometry) with
// references to this cache's blocks of valid rows: no byte is copied.
func (c *KVCache) pagedForkLocked(f *KVCache) {
	ps, fs := c.pg, f.pg
	for b, t := range ps.tables {
		lo, hi := c.winStart[b]/ps.bs, min(len(t), (c.lens[b]+ps.bs-1)/ps.bs)
		ft := make([]*block, max(hi, lo))
		copy(ft[lo:], t[lo:max(hi, lo)])
		fs.pool.retain(ft)
		fs.tables[b] = ft
		f.winStart[b], f.lens[b] = c.winStart[b], c.lens[b]
	}
	f.arena.addLive(f.liveBytesLocked())
}

// pagedReorderLocked makes sequence b's page table a copy of old sequence
// idx[b]'s, adjusting reference counts: no row is copied (a later write
// into a shared partial block copies that block, see pagedReserveLocked).
func (c *KVCache) pagedReorderLocked(idx []int) {
	ps := c.pg
	if len(ps.spareTables) != len(ps.tables) {
		ps.spareTables = make([][]*block, len(ps.tables))
	}
	next := ps.spareTables
	for b, i := range idx {
		next[b] = append(next[b][:0], ps.tables[i]...)
		ps.pool.retain(next[b])
	}
	for _, t := range ps.tables {
		ps.pool.release(t)
		clear(t)
	}
	ps.spareTables, ps.tables = ps.tables, next
}

// pagedInfoLocked fills the paged figures of in.
func (c *KVCache) pagedInfoLocked(in *Info) {
	ps := c.pg
	distinct, entries := ps.held()
	in.BlocksUsed = int64(len(distinct))
	for blk := range distinct {
		if ps.pool.refsOf(blk) > 1 {
			in.BlocksShared++
		}
	}
	in.CommittedBytes = in.BlocksUsed * int64(ps.pool.blockBytes)
	in.PageTableBytes += int64(8 * entries)
	st := ps.pool.stats()
	in.BlocksFree = st.Free
	in.BlocksTotal = st.Used + st.Free
}

// retainPrefix returns the first n blocks of sequence 0 with one more
// reference each (the caller owns it), for a prefix store.
func (c *KVCache) retainPrefix(n int) ([]*block, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	ps := c.pg
	if c.winStart[0] != 0 || c.lens[0] < n*ps.bs || len(ps.tables[0]) < n {
		return nil, fmt.Errorf("%w: sequence 0 holds %d tokens from %d, not %d full blocks", ErrInvalidArgument,
			c.lens[0], c.winStart[0], n)
	}
	blks := slices.Clone(ps.tables[0][:n])
	ps.pool.retain(blks)
	return blks, nil
}

// attachPrefix makes blks the first blocks of every (empty) sequence.
func (c *KVCache) attachPrefix(blks []*block) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	ps := c.pg
	n := len(blks) * ps.bs
	if n > c.cfg.Capacity {
		return fmt.Errorf("%w: a prefix of %d tokens exceeds the capacity %d", ErrCapacity, n, c.cfg.Capacity)
	}
	for b := range c.lens {
		if c.lens[b] != 0 {
			return fmt.Errorf("%w: a prefix attaches only to an empty cache", ErrInvalidArgument)
		}
	}
	ps.releaseAll()
	for b := range c.lens {
		ps.tables[b] = append(ps.tables[b][:0], blks...)
		ps.pool.retain(blks)
		c.winStart[b] = 0
		c.setLenLocked(b, n)
	}
	c.cks.invalidateAll()
	return nil
}
