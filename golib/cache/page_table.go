package cache

// pagedStore is the storage of a paged cache: one page table per sequence
// mapping logical block i (positions [i*bs, (i+1)*bs)) to a pool block.
// Entries below a sliding window that were given back are nil; the table
// ends after the last block that holds a valid (or restorable) row.
type pagedStore struct {
	pool        *blockPool
	bs          int        // tokens per block
	kHead       int        // bytes of one head's K rows in a block (bs*rowK)
	vHead       int        // bytes of one head's V rows in a block (bs*rowV)
	vBase       int        // offset of V in a block (KVHeads*kHead)
	tables      [][]*block // per sequence
	spareTables [][]*block // the tables Reorder builds into (swapped with tables)
	fresh       []*block   // scratch for Append and the copy-on-write of shared blocks
	need        []int      // scratch: blocks Append takes per sequence
}

func newPagedStore(pool *blockPool, cfg Config, rowK, rowV int) *pagedStore {
	ps := &pagedStore{pool: pool, bs: cfg.BlockSize, kHead: cfg.BlockSize * rowK, vHead: cfg.BlockSize * rowV}
	ps.vBase = cfg.KVHeads * ps.kHead
	ps.tables = make([][]*block, cfg.Batch)
	ps.need = make([]int, cfg.Batch)
	return ps
}

// blockBytes is the size of one block for geometry cfg.
func blockBytes(cfg Config, rowK, rowV int) int {
	return cfg.BlockSize * cfg.KVHeads * (rowK + rowV)
}

// kRows returns the K bytes of head h of blk from row r0 to row r1.
func (ps *pagedStore) kRows(blk *block, h, r0, r1, rowK int) []byte {
	base := h * ps.kHead
	return blk.buf[base+r0*rowK : base+r1*rowK]
}

// vRows returns the V bytes of head h of blk from row r0 to row r1.
func (ps *pagedStore) vRows(blk *block, h, r0, r1, rowV int) []byte {
	base := ps.vBase + h*ps.vHead
	return blk.buf[base+r0*rowV : base+r1*rowV]
}

// segments appends the segments of positions [from, to) of sequence b,
// head h: one per block.
func (ps *pagedStore) segments(dst []Segment, b, h, from, to, rowK, rowV int) []Segment {
	t := ps.tables[b]
	for pos := from; pos < to; {
		i := pos / ps.bs
		r0 := pos - i*ps.bs
		r1 := min(ps.bs, to-i*ps.bs)
		blk := t[i]
		dst = append(dst, Segment{Start: pos, Len: r1 - r0, K: ps.kRows(blk, h, r0, r1, rowK), V: ps.vRows(blk, h, r0, r1, rowV)})
		pos += r1 - r0
	}
	return dst
}

// held returns the distinct blocks referenced by the tables, and how many
// references to pool blocks the tables hold.
func (ps *pagedStore) held() (distinct map[*block]struct{}, entries int) {
	distinct = map[*block]struct{}{}
	for _, t := range ps.tables {
		for _, blk := range t {
			if blk != nil {
				distinct[blk] = struct{}{}
				entries++
			}
		}
	}
	return distinct, entries
}

// releaseAll gives every block back and empties the tables.
func (ps *pagedStore) releaseAll() {
	for b, t := range ps.tables {
		ps.pool.release(t)
		clear(t)
		ps.tables[b] = t[:0]
	}
}

// keep releases the blocks of sequence b outside the token range [lo, hi):
// whole blocks below lo become nil entries, blocks at or past hi leave the
// table.
func (ps *pagedStore) keep(b, lo, hi int) {
	t := ps.tables[b]
	end := min(len(t), (hi+ps.bs-1)/ps.bs)
	if end < len(t) {
		ps.pool.release(t[end:])
		clear(t[end:])
		t = t[:end]
	}
	first := min(lo/ps.bs, len(t))
	ps.pool.release(t[:first])
	clear(t[:first])
	ps.tables[b] = t
}
