package cache

// pagedStore is the storage of a paged cache: one page table per sequence
// mapping logical block i (positions [i*bs, (i+1)*bs)) to a pool block.
// Entries below a sliding window that were given back are nil; the table
// ends after the last block that holds a valid (or restorable) row.
type pagedStore struct {
	pool        *blockPool
	bs          int        // tokens per block
	tables      [][]*block // per sequence
	spareTables [][]*block // the tables Reorder builds into (swapped with tables)
	fresh       []*block   // scratch for Append and the copy-on-write of shared blocks
	reqs        []takeReq  // scratch: the blocks Append asks the pool for
	need        []int      // scratch: blocks Append takes per sequence
}

func newPagedStore(pool *blockPool, cfg Config) *pagedStore {
	return &pagedStore{pool: pool, bs: cfg.BlockSize, tables: make([][]*block, cfg.Batch), need: make([]int, cfg.Batch)}
}

// segments appends the segments of positions [from, to) of sequence b,
// head h: one per run of blocks in consecutive slots of a slab.
func (ps *pagedStore) segments(dst []Segment, b, h, from, to int) []Segment {
	t := ps.tables[b]
	p := ps.pool
	for pos := from; pos < to; {
		i := pos / ps.bs
		r0 := pos - i*ps.bs
		j := i // the run is blocks i..j
		for (j+1)*ps.bs < to && adjacent(t[j], t[j+1]) {
			j++
		}
		r1 := min(ps.bs, to-j*ps.bs) // end row within block j
		first := t[i]
		k0 := p.kRows(first, h, r0, r0)
		v0 := p.vRows(first, h, r0, r0)
		n := (j-i)*ps.bs + r1 - r0
		dst = append(dst, Segment{Start: pos, Len: n,
			K: k0[: n*p.key.rowK : n*p.key.rowK], V: v0[: n*p.key.rowV : n*p.key.rowV]})
		pos += n
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
