package gemm

import "sync"

// Cache blocking (Goto/BLIS order). A task owns an mcBlock x ncBlock block of
// C; for each kcBlock slice of the inner dimension it packs its op(A) rows
// (mc x kc) and op(B) columns (kc x nc, sized for L2), then runs each
// mr-high A panel (kept in L1) against every nr-wide B sliver. Tasks share
// nothing, so the only synchronization is the parallel-for itself.
const (
	kcBlock = 256
	mcBlock = 120 // a multiple of every mr (3, 8)
	ncBlock = 512 // a multiple of every nr
)

// packBufs are the per-task packing buffers, reused across calls.
type packBufs struct {
	a, b []float32
	tile []float32
	// wide holds one widened packNR-wide sliver of a prepacked k-block
	// while repackSlivers narrows it to the kernel's nr.
	wide []float32
}

var bufPool = sync.Pool{New: func() any {
	return &packBufs{
		a:    make([]float32, mcBlock*kcBlock),
		b:    make([]float32, kcBlock*ncBlock),
		tile: make([]float32, 16*64),
		wide: make([]float32, kcBlock*packNR),
	}
}}

func (p *product) blocked() {
	// Equal row blocks (a multiple of mr each) so no task is a sliver.
	mBlocks := (p.m + mcBlock - 1) / mcBlock
	mr, nr := p.ks.mr, p.ks.nr
	nBlocks := (p.n + ncBlock - 1) / ncBlock
	nSplit := 1
	if p.threads > 1 && mBlocks*nBlocks < 2*p.threads && p.ks.sliverMajor {
		// Too few blocks to keep the threads busy (a prefill of tens of
		// tokens times a 1024-column weight is two blocks). In sliverMajor
		// order a task reads each of its slivers once for all its rows, so
		// the column blocks are cut into parts of whole slivers first:
		// each thread then streams its own part of B, where row blocks
		// would each stream all of it.
		want := (2*p.threads + mBlocks*nBlocks - 1) / (mBlocks * nBlocks)
		nSplit = min(want, (min(p.n, ncBlock)+nr-1)/nr)
	}
	if p.threads > 1 && mBlocks*nBlocks*nSplit < 2*p.threads {
		// Still too few: split the rows further, down to one mr panel
		// per task. The tasks of one column block then pack the same B
		// block each (or share the prepacked one), which costs less than
		// the idle threads.
		want := (2*p.threads + nBlocks*nSplit - 1) / (nBlocks * nSplit)
		mBlocks = max(mBlocks, min(want, (p.m+mr-1)/mr))
	}
	mc := ((p.m+mBlocks-1)/mBlocks + mr - 1) / mr * mr
	mBlocks = (p.m + mc - 1) / mc
	g := blockGrid{mc: mc, nBlocks: nBlocks, nSplit: nSplit}
	tasks := mBlocks * nBlocks * nSplit
	if p.threads <= 1 {
		// One thread: no closure (it would move to the heap, with p).
		bufs := bufPool.Get().(*packBufs)
		for t := range tasks {
			p.blockTask(bufs, t, g)
		}
		bufPool.Put(bufs)
		return
	}
	ForThreads(p.threads, tasks, func(t int) {
		bufs := bufPool.Get().(*packBufs)
		p.blockTask(bufs, t, g)
		bufPool.Put(bufs)
	})
}

// blockGrid is blocked's division of C into tasks: row blocks of mc rows
// by column blocks of ncBlock columns, each cut into nSplit parts of whole
// slivers.
type blockGrid struct{ mc, nBlocks, nSplit int }

// blockTask runs task t of blocked: row block t/(nBlocks*nSplit) by part
// t%nSplit of column block t/nSplit%nBlocks.
func (p *product) blockTask(bufs *packBufs, t int, g blockGrid) {
	cols := g.nBlocks * g.nSplit
	i0 := (t / cols) * g.mc
	jb, part := (t%cols)/g.nSplit, t%g.nSplit
	b0, b1 := jb*ncBlock, min((jb+1)*ncBlock, p.n)
	w := roundUp((b1-b0+g.nSplit-1)/g.nSplit, p.ks.nr)
	j0 := b0 + part*w
	if j0 >= b1 {
		return
	}
	p.block(bufs, i0, min(i0+g.mc, p.m), j0, min(j0+w, b1))
}

// block computes C[i0:i1, j0:j1] += alpha * op(A)[i0:i1, :] * op(B)[:, j0:j1].
func (p *product) block(bufs *packBufs, i0, i1, j0, j1 int) {
	ks := p.ks
	mr, nr := ks.mr, ks.nr
	mc, nc := i1-i0, j1-j0
	for l0 := 0; l0 < p.k; l0 += kcBlock {
		kc := min(kcBlock, p.k-l0)
		p.packA(bufs.a, i0, mc, l0, kc, mr)
		bb := bufs.b
		var bh []uint16 // a 16-bit prepacked block the kernels read in place
		// A prepacked block's slivers from column j0 on (j0 is a sliver
		// boundary of column block jb).
		jb := j0 / ncBlock
		o, n := (j0-jb*ncBlock)*kc, roundUp(nc, nr)*kc
		switch {
		case p.pb != nil && nr != packNR:
			// A kernel with narrower slivers (the portable one) reads
			// the prepacked block through its own B block.
			bb = bufs.b[:n]
			p.pb.repackSlivers(ks, bb, bufs.wide, jb, l0, kc, j0-jb*ncBlock, nc, nr)
		case p.pb != nil && p.pb.h != nil && ks.microHalf != nil:
			bh = p.pb.slabHalf(jb, l0, kc)[o : o+n]
		case p.pb != nil && p.pb.h != nil:
			bb = bufs.b[:n]
			ks.cvt16(p.pb.half, bb, p.pb.slabHalf(jb, l0, kc)[o:o+n])
		case p.pb != nil && p.pb.q != nil:
			// Dequantized sliver by sliver (nr == packNR here).
			bb = bufs.b[:n]
			for jr := 0; jr < nc; jr += packNR {
				p.pb.widenQuant(ks, bb[jr*kc:(jr+packNR)*kc], jb, l0, kc, j0-jb*ncBlock+jr)
			}
		case p.pb != nil:
			bb = p.pb.slab(jb, l0, kc)[o : o+n]
		default:
			p.packB(bb, j0, nc, l0, kc, nr)
		}
		blk := bBlock{f: bb, h: bh}
		if ks.sliverMajor && p.pb != nil && nr == packNR && (bh != nil || p.pb.float()) {
			blk.nextF, blk.nextH = p.nextSliver(jb, j0, l0, kc)
		}
		// The B block (kc x nc) stays in L2. By default each A panel (mr
		// x kc, a few KiB, in L1) meets every nr-wide B sliver in turn:
		// with broadcast A and vector B the A panel is the reused operand.
		// With ks.sliverMajor each sliver (read from a prepacked B in L3
		// or memory the first time) meets every A panel of the block while
		// it is in L1/L2 instead: on the AVX2 path, whose 3-row panels
		// need three times the B bytes per multiply-add of the AVX-512
		// path's 8-row ones, a first panel's pass over a block waited for
		// the block to arrive.
		np := panelCount(ks, mc)
		if !ks.sliverMajor {
			for q := range np {
				for jr := 0; jr < nc; jr += nr {
					p.tile(bufs, &blk, i0, j0, q, jr, mc, nc, kc)
				}
			}
			continue
		}
		for jr := 0; jr < nc; jr += nr {
			for q := range np {
				p.tile(bufs, &blk, i0, j0, q, jr, mc, nc, kc)
			}
		}
	}
}

// bBlock is the packed B block a block's micro calls read: f (float32)
// or h (16-bit, read in place), and the first sliver of the block the
// same thread reads next where it is prepacked (nextF or nextH, of its
// own row count; see nextSliver), which the block's last sliver
// prefetches.
type bBlock struct {
	f     []float32
	h     []uint16
	nextF []float32
	nextH []uint16
}

// nextSliver returns the first sliver of the prepacked block that follows
// block (column block jb from column j0, rows l0:l0+kc) in this task: the
// next k-block of the same columns, or, on one thread, the first k-block
// of the next column block (the next task of the row block: PackB lays
// the column blocks out one after another). nil, nil
// where there is none.
func (p *product) nextSliver(jb, j0, l0, kc int) ([]float32, []uint16) {
	nr := p.ks.nr
	pb := p.pb
	l, j := l0+kc, j0
	if l >= p.k {
		if p.threads > 1 || (jb+1)*ncBlock >= p.n {
			return nil, nil
		}
		l, jb, j = 0, jb+1, (jb+1)*ncBlock
	}
	kc2 := min(kcBlock, p.k-l)
	o := (j - jb*ncBlock) * kc2
	if pb.h != nil {
		return nil, pb.slabHalf(jb, l, kc2)[o : o+nr*kc2]
	}
	return pb.slab(jb, l, kc2)[o : o+nr*kc2], nil
}

// tile adds alpha * A panel q times B sliver jr of a packed k-block (kc
// steps) to C[i0+ir:, j0+jr:] (ir the panel's first row): one micro
// kernel call on blk.
func (p *product) tile(bufs *packBufs, blk *bBlock, i0, j0, q, jr, mc, nc, kc int) {
	bb, bh := blk.f, blk.h
	ks := p.ks
	mr, nr := ks.mr, ks.nr
	ir, rows := panelRows(ks, mc, q)
	ap := bufs.a[q*mr*kc : (q+1)*mr*kc]
	cols := min(nr, nc-jr)
	off := (i0+ir)*p.ldc + j0 + jr
	// An edge tile is computed aside (only its valid rows where the
	// kernels allow) and its valid part added.
	aside := cols < nr || rows < mr && ks.microRows == nil && bh == nil
	dst, ldd := p.c[off:], p.ldc
	if aside {
		dst, ldd = bufs.tile[:mr*nr], nr
		clear(dst)
	}
	b0, b1 := jr*kc, (jr+nr)*kc
	// In sliverMajor order the full panels that meet a sliver prefetch
	// the next one into L2, rows s0:s1 each (see nextRows): the block's
	// next sliver, or for its last one the next block's first.
	nf, nh := bb[min(b1, len(bb)):], bh[min(b1, len(bh)):]
	if jr+nr >= nc {
		nf, nh = blk.nextF, blk.nextH
	}
	s0, s1 := 0, 0
	if ks.sliverMajor && rows == mr && !aside {
		rowsNext := len(nf) / nr
		if bh != nil {
			rowsNext = len(nh) / nr
		}
		s0, s1 = nextRows(ks, mc, q, min(kc, rowsNext))
	}
	next := s1 > s0
	switch {
	case next && bh != nil && ks.microHalfNext != nil:
		ks.microHalfNext(p.pb.half, kc, ap, bh[b0:b1], p.alpha, dst, ldd, nh[s0*nr:s1*nr])
	case next && bh == nil && ks.microNext != nil:
		ks.microNext(kc, ap, bb[b0:b1], p.alpha, dst, ldd, nf[s0*nr:s1*nr])
	case bh != nil:
		ks.microHalf(p.pb.half, rows, kc, ap, bh[b0:b1], p.alpha, dst, ldd)
	case rows < mr && ks.microRows != nil:
		ks.microRows(rows, kc, ap, bb[b0:b1], p.alpha, dst, ldd)
	default:
		ks.micro(kc, ap, bb[b0:b1], p.alpha, dst, ldd)
	}
	if !aside {
		return
	}
	for r := range rows {
		d := p.c[off+r*p.ldc : off+r*p.ldc+cols]
		for x, v := range dst[r*nr : r*nr+cols] {
			d[x] += v
		}
	}
}

// nextRows returns the rows s0:s1 (of kc) of the next sliver that full A
// panel q of a block of mc rows prefetches: the block's first
// ks.nextPanels full panels (all where 0) take an even share each, in
// whole pairs of rows (the prefetching kernels run two steps a loop), so
// the next sliver streams in while the whole current one is computed,
// not in a burst during its first panel (a 16-row block has four full
// panels; a 128-row one forty-two). s0 == s1: panel q prefetches nothing.
func nextRows(ks *kernels, mc, q, kc int) (int, int) {
	full := mc / ks.mr
	if splitTail(ks, mc) {
		full--
	}
	if ks.nextPanels > 0 {
		full = min(full, ks.nextPanels)
	}
	if q >= full {
		return 0, 0
	}
	pairs := (kc + 1) / 2
	return min(kc, 2*(q*pairs/full)), min(kc, 2*((q+1)*pairs/full))
}

// panelCount is the number of A panels of a block of mc rows: mc/mr
// rounded up (where the tail is split, its one-row panel and the full one
// before it become two panels: the same count; see panelRows).
func panelCount(ks *kernels, mc int) int { return (mc + ks.mr - 1) / ks.mr }

// splitTail reports whether a block of mc rows ends in two shorter panels
// (mr=3: 2 + 2 rows) instead of a full panel and a one-row one: the
// one-row kernel has a quarter of the accumulators and ran at about a
// third of the full tile's rate per row (a 16-row product spent 16% of its
// kernel time on its last row).
func splitTail(ks *kernels, mc int) bool {
	return ks.microRows != nil && ks.mr > 2 && mc > ks.mr && mc%ks.mr == 1
}

// panelRows returns the first row (within the block) and the row count of
// A panel q of a block of mc rows. Panel q is packed at q*mr*kc whatever
// its height.
func panelRows(ks *kernels, mc, q int) (int, int) {
	mr := ks.mr
	if splitTail(ks, mc) {
		if full := (mc - mr - 1) / mr; q >= full {
			h := (mr + 2) / 2 // the taller of the last two panels
			if q == full {
				return q * mr, h
			}
			return full*mr + h, mr + 1 - h
		}
	}
	return q * mr, min(mr, mc-q*mr)
}

// packBRows is packB for a float32 B as stored (not transposed), in
// groups of 8 rows: for each sliver it writes the group's 8 rows (one
// contiguous run of the sliver) from 8 row pieces of B, so B is read as 8
// sequential streams and the slivers (in L2, kc*nr values apart: the same
// L1 sets) are written one at a time instead of all of them for every row.
// Full slivers of 16 or 32 columns move as fixed-size arrays.
func (p *product) packBRows(dst []float32, j0, nc, l0, kc, nr int) {
	full := nc / nr * nr
	if full < nc {
		clear(dst[full*kc : (full+nr)*kc])
	}
	const group = 8
	for g := 0; g < kc; g += group {
		ge := min(g+group, kc)
		for jr := 0; jr < nc; jr += nr {
			cols := min(nr, nc-jr)
			for l := g; l < ge; l++ {
				src := p.b[(l0+l)*p.ldb+j0+jr:]
				d := dst[jr*kc+l*nr:]
				switch {
				case cols == 32 && nr == 32:
					*(*[32]float32)(d) = *(*[32]float32)(src)
				case cols == 16 && nr == 16:
					*(*[16]float32)(d) = *(*[16]float32)(src)
				default:
					copy(d[:cols], src[:cols])
				}
			}
		}
	}
}

// packA stores op(A)[i0:i0+mc, l0:l0+kc] as mr-row panels (those of
// panelRows), column by column (panel-major, then l, then row), padding
// short panels with zeros.
func (p *product) packA(dst []float32, i0, mc, l0, kc, mr int) {
	for q := range panelCount(p.ks, mc) {
		ir, rows := panelRows(p.ks, mc, q)
		panel := dst[q*mr*kc : (q+1)*mr*kc]
		if rows < mr {
			clear(panel)
		}
		if !p.transA && rows == mr && (mr == 8 || mr == 3) {
			p.packAPanel(panel, i0+ir, l0, kc, mr)
			continue
		}
		for r := range rows {
			i := i0 + ir + r
			if p.transA {
				for l := range kc {
					panel[l*mr+r] = p.a[(l0+l)*p.lda+i]
				}
				continue
			}
			src := p.a[i*p.lda+l0 : i*p.lda+l0+kc]
			for l, v := range src {
				panel[l*mr+r] = v
			}
		}
	}
}

// packAPanel is packA for one full panel of 8 or 3 rows of A as stored
// (the AVX-512 and AVX2 tiles): it writes the panel in order, one column
// of mr values at a time, from mr row streams, where the loop above writes
// it with a stride of mr for every row (a 16-row prefill of a 256-wide
// weight spent about a tenth of its product there).
func (p *product) packAPanel(panel []float32, i, l0, kc, mr int) {
	var rs [8][]float32
	for r := range mr {
		o := (i+r)*p.lda + l0
		rs[r] = p.a[o : o+kc]
	}
	if mr == 3 {
		r0, r1, r2 := rs[0][:kc], rs[1][:kc], rs[2][:kc]
		for l := range kc {
			d := (*[3]float32)(panel[3*l : 3*l+3])
			d[0], d[1], d[2] = r0[l], r1[l], r2[l]
		}
		return
	}
	r0, r1, r2, r3 := rs[0][:kc], rs[1][:kc], rs[2][:kc], rs[3][:kc]
	r4, r5, r6, r7 := rs[4][:kc], rs[5][:kc], rs[6][:kc], rs[7][:kc]
	for l := range kc {
		d := (*[8]float32)(panel[8*l : 8*l+8])
		d[0], d[1], d[2], d[3] = r0[l], r1[l], r2[l], r3[l]
		d[4], d[5], d[6], d[7] = r4[l], r5[l], r6[l], r7[l]
	}
}

// packB stores op(B)[l0:l0+kc, j0:j0+nc] as nr-column slivers, row by row
// (sliver-major, then l, then column), padding short slivers with zeros.
func (p *product) packB(dst []float32, j0, nc, l0, kc, nr int) {
	if !p.transB && p.bh == nil {
		p.packBRows(dst, j0, nc, l0, kc, nr)
		return
	}
	for jr := 0; jr < nc; jr += nr {
		sliver := dst[jr*kc : (jr+nr)*kc]
		cols := min(nr, nc-jr)
		if cols < nr {
			clear(sliver)
		}
		if p.transB {
			var tmp [kcBlock]float32
			for q := range cols {
				row := (j0 + jr + q) * p.ldb
				var src []float32
				if p.bh != nil {
					src = tmp[:kc]
					p.widen(src, p.bh[row+l0:row+l0+kc])
				} else {
					src = p.b[row+l0 : row+l0+kc]
				}
				for l, v := range src {
					sliver[l*nr+q] = v
				}
			}
			continue
		}
		for l := range kc {
			row := (l0+l)*p.ldb + j0 + jr
			if p.bh != nil {
				p.widen(sliver[l*nr:l*nr+cols], p.bh[row:row+cols])
				continue
			}
			copy(sliver[l*nr:l*nr+cols], p.b[row:row+cols])
		}
	}
}
