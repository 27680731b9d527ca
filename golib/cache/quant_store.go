package cache

import (
	"errors"
	"fmt"
	"sort"
)

// quantSeq is the storage of one sequence of a quantized cache.
//
// Positions [0, sealed) are sealed: quantized rows, in the contiguous
// layout in qk/qv at their position (Capacity rows per head), in the paged
// layout in one block per chunk (blks; qk, qv and the per-token scale
// arrays are then empty), cut into chunks whose start positions are chunks (chunk i spans [chunks[i], chunks[i+1]), the last one up to
// sealed). Positions [sealed, len) are native rows in a ring of ring rows
// per head: position p lives in slot p % ring. sealed may exceed the
// sequence's length after a truncate or rollback; the first append below
// sealed cuts it there (cut), which only shortens the chunk it falls in.
type quantSeq struct {
	ringK, ringV []byte    // [KVHeads][ring] native rows
	qk, qv       []byte    // [KVHeads][Capacity] sealed rows
	kts, kzs     []float32 // per-token K scales/zeros: [KVHeads][Capacity][ngK]
	vts, vzs     []float32 // V scales/zeros: [KVHeads][Capacity][ngV]
	// kch holds the per-channel K scales of the contiguous layout's chunks,
	// head by head (a head's chunks one after the other, so the decode
	// kernel reads them as one stream): chunk i, head h at
	// [(h*kchCap+i)*chStride:], HeadDimK scales then (int4) HeadDimK zeros.
	// It is part of the sequence's arena buffer, room for kchCap =
	// Capacity/Group+1 chunks; truncations into sealed chunks can create
	// more (shorter) chunks, and then it moves to a larger arena buffer of
	// its own, kchBuf (reserveKchLocked: under the arena's budget, before
	// the operation that needs it changes anything).
	kch    []float32
	kchCap int
	kchBuf []byte
	chunks []int
	// flags[i]: what sealing found of chunk i (every head): chunkBounded
	// (QuantSegment.Bounded), chunkUneven (QuantSegment.KUneven)
	flags  []uint8
	sealed int
	// blks are the paged layout's chunk blocks, one per entry of chunks
	// (nil once a sliding window gave the chunk back).
	blks []*qchunk
}

// quantGeom is the derived geometry of a quantized cache.
type quantGeom struct {
	q              QuantConfig
	ring           int // native rows per (sequence, head)
	qRowK, qRowV   int // bytes per sealed row
	kGroup, vGroup int // elements per per-token scale group
	ngK, ngV       int // per-token scales per row (ngK 0 for per-channel K)
	zeros          bool
	chStride       int // per-channel floats per (chunk, head): d or 2d; 0 per token
	maxChunks      int // chunks the arena buffer has room for
	seqBytes       int // one sequence's arena buffer
}

func newQuantGeom(cfg Config) quantGeom {
	q := cfg.Quant
	g := quantGeom{q: q, ring: min(cfg.Capacity, q.Residual+q.Group),
		qRowK: q.Format.RowBytes(cfg.HeadDimK), qRowV: q.Format.RowBytes(cfg.HeadDimV),
		kGroup: RowGroup(cfg.HeadDimK, q.Group), vGroup: RowGroup(cfg.HeadDimV, q.Group),
		zeros: q.Format == QuantInt4}
	g.ngV = cfg.HeadDimV / g.vGroup
	if q.KAxis == KPerToken {
		g.ngK = cfg.HeadDimK / g.kGroup
	} else {
		g.chStride = cfg.HeadDimK
		if g.zeros {
			g.chStride *= 2
		}
	}
	if cfg.Layout != Paged {
		g.maxChunks = (cfg.Capacity+q.Group-1)/q.Group + 1
	}
	p := g.parts(cfg)
	g.seqBytes = alignedSize(p[:])
	return g
}

// parts are the byte sizes of a sequence's buffer, in the order carve
// takes them. The paged layout keeps only the ring there (sealed rows are
// in chunk blocks).
func (g quantGeom) parts(cfg Config) [9]int {
	H, C, es := cfg.KVHeads, cfg.Capacity, cfg.Elem.Size()
	if cfg.Layout == Paged {
		C = 0
	}
	z := 0
	if g.zeros {
		z = 1
	}
	return [9]int{
		H * g.ring * cfg.HeadDimK * es, H * g.ring * cfg.HeadDimV * es,
		H * C * g.qRowK, H * C * g.qRowV,
		4 * H * C * g.ngK, 4 * H * C * g.ngK * z,
		4 * H * C * g.ngV, 4 * H * C * g.ngV * z,
		4 * H * g.maxChunks * g.chStride,
	}
}

func align64(n int) int { return (n + 63) &^ 63 }

// alignedSize is the size of a buffer holding parts of the given sizes,
// each starting on a 64-byte boundary (the layout carver cuts).
func alignedSize(parts []int) int {
	n := 0
	for _, p := range parts {
		n += align64(p)
	}
	return n
}

// carver cuts consecutive parts, each starting on a 64-byte boundary, out
// of one buffer sized by alignedSize.
type carver struct {
	buf []byte
	off int
}

// next returns the next part of n bytes (capacity n, so appends cannot
// reach the part after it).
func (c *carver) next(n int) []byte {
	b := c.buf[c.off : c.off+n : c.off+n]
	c.off += align64(n)
	return b
}

// scaleBytesPerToken is the per-token scale and zero bytes of one token
// (all heads), without the per-channel K scales.
func (g quantGeom) scaleBytesPerToken(cfg Config) int {
	n := 4 * cfg.KVHeads * (g.ngK + g.ngV)
	if g.zeros {
		n *= 2
	}
	return n
}

// bytesPerToken is the amortized storage of one sealed token, all heads,
// K and V: rows, per-token scales and the per-channel K scales of a full
// chunk shared by its Group tokens.
func (g quantGeom) bytesPerToken(cfg Config) int64 {
	return int64(cfg.KVHeads*(g.qRowK+g.qRowV)+g.scaleBytesPerToken(cfg)) +
		int64(cfg.KVHeads*g.chStride*4/g.q.Group)
}

// carve splits one sequence's arena buffer into its parts.
func (g quantGeom) carve(cfg Config, buf []byte) *quantSeq {
	p := g.parts(cfg)
	next := (&carver{buf: buf}).next
	s := &quantSeq{ringK: next(p[0]), ringV: next(p[1]), qk: next(p[2]), qv: next(p[3]),
		kts: asF32(next(p[4])), kzs: asF32(next(p[5])), vts: asF32(next(p[6])), vzs: asF32(next(p[7]))}
	if g.chStride > 0 && cfg.Layout != Paged {
		s.kch, s.kchCap = asF32(next(p[8])), g.maxChunks
	}
	s.chunks = make([]int, 0, g.maxChunks)
	s.flags = make([]uint8, 0, g.maxChunks)
	return s
}

// validateQuant checks the quantization part of a (defaulted) Config.
func (cfg Config) validateQuant() error {
	q := cfg.Quant
	switch {
	case q.Format != QuantInt8 && q.Format != QuantInt4:
		return fmt.Errorf("%w: unsupported cache quantization %v", ErrInvalidArgument, q.Format)
	case q.Group != 32 && q.Group != 64:
		return fmt.Errorf("%w: quant_group must be 32 or 64 (got %d)", ErrInvalidArgument, q.Group)
	case q.KAxis != KPerChannel && q.KAxis != KPerToken:
		return fmt.Errorf("%w: unsupported k_axis %v", ErrInvalidArgument, q.KAxis)
	case q.Residual < 0 || q.Residual > maxResidual:
		return fmt.Errorf("%w: residual must be in 0..%d tokens (got %d)", ErrInvalidArgument, maxResidual, q.Residual)
	case q.Format == QuantInt4 && (cfg.HeadDimK%2 != 0 || cfg.HeadDimV%2 != 0):
		return fmt.Errorf("%w: int4 packs two values per byte: head dims must be even (got %d and %d)",
			ErrInvalidArgument, cfg.HeadDimK, cfg.HeadDimV)
	case cfg.Layout == Paged && cfg.BlockSize != q.Group:
		return fmt.Errorf("%w: a quantized paged cache's blocks are its sealed chunks: block size must equal quant_group %d (got %d)",
			ErrInvalidArgument, q.Group, cfg.BlockSize)
	}
	return nil
}

// maxResidual bounds Residual (far above any useful window).
const maxResidual = 1 << 20

// newQuantSeqs reserves the storage of every sequence of a quantized
// contiguous cache, all or nothing.
func (c *KVCache) newQuantSeqs() error {
	bufs, err := c.arena.allocMany(c.qg.seqBytes, c.cfg.Batch)
	if err != nil {
		return err
	}
	c.seqs = make([]seqStore, c.cfg.Batch)
	for b := range c.seqs {
		c.seqs[b] = seqStore{k: bufs[b], q: c.qg.carve(c.cfg, bufs[b])}
	}
	return nil
}

// cut makes pos the end of the sealed rows when it lies below it: chunks
// starting at or after pos go, the one holding pos-1 becomes shorter. No
// sealed value changes.
func (s *quantSeq) cut(pos, heads, chStride int, a *Arena) {
	if pos >= s.sealed {
		return
	}
	s.sealed = pos
	i := sort.SearchInts(s.chunks, pos)
	s.chunks = s.chunks[:i]
	s.flags = s.flags[:i]
	if i < len(s.blks) {
		a.releaseChunks(s.blks[i:])
		s.blks = s.blks[:i]
	}
}

// reset empties the sealed area (giving the paged layout's blocks back).
func (s *quantSeq) reset(a *Arena) {
	s.sealed = 0
	s.chunks = s.chunks[:0]
	s.flags = s.flags[:0]
	a.releaseChunks(s.blks)
	s.blks = s.blks[:0]
}

// quantWriteLocked writes cnt new rows per head of sequence b from
// position pos (Append's contract), sealing chunks as rows leave the
// residual window. Rows go through the native ring in pieces that fit it,
// so the ring never holds more than its size; each chunk is sealed once.
func (c *KVCache) quantWriteLocked(b, pos, cnt int, k, v []byte, src ElemType, n int, scratch []float32) {
	cfg, g := c.cfg, &c.qg
	s := c.seqs[b].q
	s.cut(pos, cfg.KVHeads, g.chStride, c.arena)
	ss := src.Size()
	R := g.ring
	for done := 0; done < cnt; {
		p := pos + done
		m := min(cnt-done, R-(p-s.sealed))
		for h := range cfg.KVHeads {
			unit := b*cfg.KVHeads + h
			srcK := k[(unit*n+done)*cfg.HeadDimK*ss:]
			srcV := v[(unit*n+done)*cfg.HeadDimV*ss:]
			for w := 0; w < m; {
				slot := (p + w) % R
				r := min(m-w, R-slot)
				convertRows(s.ringK[(h*R+slot)*c.rowK:], cfg.Elem, srcK[w*cfg.HeadDimK*ss:], src, r*cfg.HeadDimK, scratch)
				convertRows(s.ringV[(h*R+slot)*c.rowV:], cfg.Elem, srcV[w*cfg.HeadDimV*ss:], src, r*cfg.HeadDimV, scratch)
				w += r
			}
		}
		done += m
		for pos+done-s.sealed >= g.q.Residual+g.q.Group {
			c.sealLocked(s)
		}
	}
}

// sealLocked quantizes the Group native rows after s.sealed, every head, as
// one new chunk (the paged layout's chunk block was reserved by Append).
func (c *KVCache) sealLocked(s *quantSeq) {
	cfg, g := c.cfg, &c.qg
	G, R := g.q.Group, g.ring
	dk, dv := cfg.HeadDimK, cfg.HeadDimV
	s0 := s.sealed
	ci := len(s.chunks)
	s.chunks = append(s.chunks, s0)
	if c.cfg.Layout == Paged {
		s.blks = append(s.blks, c.takeChunkLocked())
	}
	xk, xv := c.qscratch[:G*dk], c.qscratch[G*dk:G*(dk+dv)]
	var written int64
	bounded, uneven := true, false
	for h := range cfg.KVHeads {
		for w := 0; w < G; {
			slot := (s0 + w) % R
			r := min(G-w, R-slot)
			convertRows(asBytes(xk[w*dk:(w+r)*dk]), Float32, s.ringK[(h*R+slot)*c.rowK:], cfg.Elem, r*dk, nil)
			convertRows(asBytes(xv[w*dv:(w+r)*dv]), Float32, s.ringV[(h*R+slot)*c.rowV:], cfg.Elem, r*dv, nil)
			w += r
		}
		var d Segment
		c.sealedAt(&d, s, ci, h, s0, s0+G)
		q := &d.Q
		if g.chStride > 0 {
			written += quantizePerChannel(g.q.Format, d.K, q.KScale, q.KZero, xk, G, dk)
		} else {
			written += quantizePerToken(g.q.Format, d.K, q.KScale, q.KZero, xk, G, dk, g.kGroup)
		}
		written += quantizePerToken(g.q.Format, d.V, q.VScale, q.VZero, xv, G, dv, g.vGroup)
		bounded = bounded && scalesBounded(q.KScale, q.KZero, q.VScale, q.VZero)
		uneven = uneven || (g.chStride > 0 && scalesUneven(q.KScale[:dk]))
	}
	var fl uint8
	if bounded {
		fl |= chunkBounded
	}
	if uneven {
		fl |= chunkUneven
	}
	s.flags = append(s.flags, fl)
	s.sealed = s0 + G
	c.sealBytes += written
	c.sealCalls++
}

// chunkScales returns the per-channel K scales (and zeros) of chunk i,
// head h, in the contiguous layout.
func (s *quantSeq) chunkScales(i, h, chStride int) []float32 {
	off := (h*s.kchCap + i) * chStride
	return s.kch[off : off+chStride]
}

// reserveKchLocked makes room in s's per-channel scale table for n chunks
// per head: a larger arena buffer (doubling), each head's chunk scales
// moved to their new place, the old buffer given back. A *BudgetError
// leaves s as it was. The paged layout has no table (its chunk blocks hold
// their scales): nothing to reserve.
func (c *KVCache) reserveKchLocked(s *quantSeq, n int) error {
	chStride, heads := c.qg.chStride, c.cfg.KVHeads
	if chStride == 0 || n <= s.kchCap || c.cfg.Layout == Paged {
		return nil
	}
	nc := max(n, 2*s.kchCap)
	buf, err := c.arena.alloc(4 * nc * heads * chStride)
	for err != nil && errors.Is(err, ErrBudget) && c.arena.reclaim() {
		buf, err = c.arena.alloc(4 * nc * heads * chStride)
	}
	if err != nil {
		return err
	}
	k := asF32(buf)
	for h := range heads {
		copy(k[h*nc*chStride:(h*nc+s.kchCap)*chStride], s.kch[h*s.kchCap*chStride:(h+1)*s.kchCap*chStride])
	}
	if s.kchBuf != nil {
		c.arena.release(s.kchBuf)
	}
	s.kch, s.kchCap, s.kchBuf = k, nc, buf
	return nil
}

// sealsLocked is the number of chunks an Append of cnt tokens seals in
// sequence b (after cutting its sealed rows at its length).
func (c *KVCache) sealsLocked(b, cnt int) int {
	g, l := &c.qg, c.lens[b]
	n := 0
	for sealed := min(c.seqs[b].q.sealed, l); l+cnt-sealed >= g.q.Residual+g.q.Group; sealed += g.q.Group {
		n++
	}
	return n
}

// chunksBelow is the number of s's chunks that start below position l:
// those a copy of its first l positions holds, and those an append at l
// keeps (0 for a cache that is not quantized, s nil).
func (s *quantSeq) chunksBelow(l int) int {
	if s == nil {
		return 0
	}
	return sort.SearchInts(s.chunks, min(s.sealed, l))
}

// releaseKch gives a grown per-channel scale table back to the arena.
func (s *quantSeq) releaseKch(a *Arena) {
	if s != nil && s.kchBuf != nil {
		a.release(s.kchBuf)
		s.kchBuf = nil
	}
}

// copyKch makes the per-channel scales of s's first nc chunks those of src
// (s has room for them: reserveKchLocked).
func (s *quantSeq) copyKch(src *quantSeq, nc, heads, chStride int) {
	if chStride == 0 || nc == 0 {
		return
	}
	for h := range heads {
		copy(s.kch[h*s.kchCap*chStride:(h*s.kchCap+nc)*chStride], src.kch[h*src.kchCap*chStride:(h*src.kchCap+nc)*chStride])
	}
}

// sealedAt sets sg's rows and scales (K, V and Q's KScale, KZero, VScale,
// VZero; zeros nil for int8, per-channel K scales cover the whole chunk) to
// head h's storage of positions [p0, p1) of chunk i of s: in the contiguous
// layout rows sit at their position in arrays of Capacity rows, in the
// paged layout at their offset in the chunk's block. It writes in place:
// the decode path builds one segment per chunk and step.
func (c *KVCache) sealedAt(sg *Segment, s *quantSeq, i, h, p0, p1 int) {
	g, dk := &c.qg, c.cfg.HeadDimK
	var r0, r1 int
	var qk, qv []byte
	var kts, kzs, vts, vzs, kch []float32
	if c.cfg.Layout == Paged {
		blk, st := s.blks[i], s.chunks[i]
		r0, r1 = h*g.q.Group+p0-st, h*g.q.Group+p1-st
		qk, qv, kts, kzs, vts, vzs = blk.qk, blk.qv, blk.kts, blk.kzs, blk.vts, blk.vzs
		kch = blk.kch[h*g.chStride : (h+1)*g.chStride]
	} else {
		r0, r1 = h*c.cfg.Capacity+p0, h*c.cfg.Capacity+p1
		qk, qv, kts, kzs, vts, vzs = s.qk, s.qv, s.kts, s.kzs, s.vts, s.vzs
		kch = s.chunkScales(i, h, g.chStride)
	}
	q := &sg.Q
	sg.K, sg.V, q.VScale = qk[r0*g.qRowK:r1*g.qRowK], qv[r0*g.qRowV:r1*g.qRowV], vts[r0*g.ngV:r1*g.ngV]
	q.KZero, q.VZero = nil, nil
	if g.zeros {
		q.VZero = vzs[r0*g.ngV : r1*g.ngV]
	}
	if g.chStride > 0 {
		q.KScale = kch[:dk]
		if g.zeros {
			q.KZero = kch[dk : 2*dk]
		}
	} else {
		q.KScale = kts[r0*g.ngK : r1*g.ngK]
		if g.zeros {
			q.KZero = kzs[r0*g.ngK : r1*g.ngK]
		}
	}
}

// quantSegments appends the segments of positions [from, to) of sequence
// b, head h of a quantized cache: one per sealed chunk (with Q
// filled), then the native rows of the ring (two segments when they wrap).
func (c *KVCache) quantSegments(dst []Segment, b, h, from, to int) []Segment {
	g := &c.qg
	s := c.seqs[b].q
	R := g.ring
	sEnd := min(s.sealed, to)
	pos := from
	if pos < sEnd {
		i := sort.SearchInts(s.chunks, pos+1) - 1
		for ; pos < sEnd; i++ {
			end := sEnd
			if i+1 < len(s.chunks) {
				end = min(end, s.chunks[i+1])
			}
			// filled in place (a literal is built on the stack and copied:
			// about 200 bytes per chunk and step); the slot may hold an
			// earlier step's segment, so every field of Segment and
			// QuantSegment is set here or in sealedAt
			if n := len(dst); n < cap(dst) {
				dst = dst[:n+1]
			} else {
				dst = append(dst, Segment{})
			}
			sg := &dst[len(dst)-1]
			c.sealedAt(sg, s, i, h, pos, end)
			sg.Start, sg.Len = pos, end-pos
			q := &sg.Q
			q.Format, q.KAxis, q.KGroup, q.VGroup = g.q.Format, g.q.KAxis, g.kGroup, g.vGroup
			q.Bounded, q.KUneven = s.flags[i]&chunkBounded != 0, s.flags[i]&chunkUneven != 0
			pos = end
		}
	}
	for pos < to {
		slot := pos % R
		n := min(to-pos, R-slot)
		dst = append(dst, Segment{Start: pos, Len: n,
			K: s.ringK[(h*R+slot)*c.rowK : (h*R+slot+n)*c.rowK],
			V: s.ringV[(h*R+slot)*c.rowV : (h*R+slot+n)*c.rowV]})
		pos += n
	}
	return dst
}

// copyQuantSeqLocked makes dst a copy of src's positions [lo, hi) (the
// valid rows of a sequence) and returns the bytes copied: the sealed rows
// and scales of [lo, min(hi, sealed)), the chunk table and per-channel
// scales of the chunks below that, and the whole native ring.
func (c *KVCache) copyQuantSeqLocked(dst, src *quantSeq, lo, hi int) int64 {
	cfg, g := c.cfg, &c.qg
	C := cfg.Capacity
	dst.reset(c.arena)
	sEnd, nc := min(src.sealed, hi), src.chunksBelow(hi)
	var n int64
	n += int64(copy(dst.ringK, src.ringK) + copy(dst.ringV, src.ringV))
	if cfg.Layout == Paged {
		// the chunk blocks are immutable: shared, not copied
		dst.chunks = append(dst.chunks, src.chunks[:nc]...)
		dst.flags = append(dst.flags, src.flags[:nc]...)
		dst.blks = append(dst.blks, src.blks[:nc]...)
		retainChunks(dst.blks)
		dst.sealed = sEnd
		return n + int64(16*nc)
	}
	if sEnd > lo {
		for h := range cfg.KVHeads {
			r0, r1 := h*C+lo, h*C+sEnd
			n += int64(copy(dst.qk[r0*g.qRowK:r1*g.qRowK], src.qk[r0*g.qRowK:r1*g.qRowK]))
			n += int64(copy(dst.qv[r0*g.qRowV:r1*g.qRowV], src.qv[r0*g.qRowV:r1*g.qRowV]))
			n += 4 * int64(copy(dst.kts[r0*g.ngK:r1*g.ngK], src.kts[r0*g.ngK:r1*g.ngK]))
			n += 4 * int64(copy(dst.vts[r0*g.ngV:r1*g.ngV], src.vts[r0*g.ngV:r1*g.ngV]))
			if g.zeros {
				n += 4 * int64(copy(dst.kzs[r0*g.ngK:r1*g.ngK], src.kzs[r0*g.ngK:r1*g.ngK]))
				n += 4 * int64(copy(dst.vzs[r0*g.ngV:r1*g.ngV], src.vzs[r0*g.ngV:r1*g.ngV]))
			}
		}
	}
	dst.chunks = append(dst.chunks, src.chunks[:nc]...)
	dst.flags = append(dst.flags, src.flags[:nc]...)
	dst.copyKch(src, nc, cfg.KVHeads, g.chStride)
	n += int64(4*nc*cfg.KVHeads*g.chStride + 8*nc)
	dst.sealed = sEnd
	return n
}

// quantTokens returns the sealed and native readable tokens over the
// sequences.
func (c *KVCache) quantTokensLocked() (sealed, native int64) {
	for b, l := range c.lens {
		s := c.seqs[b].q
		ws := c.winStart[b]
		se := min(s.sealed, l)
		sealed += int64(max(0, se-ws))
		native += int64(l - max(se, ws))
	}
	return sealed, native
}

// quantInfoLocked fills the quantization figures of in.
func (c *KVCache) quantInfoLocked(in *Info) {
	g := &c.qg
	sealed, native := c.quantTokensLocked()
	in.SealedTokens, in.NativeTokens = sealed, native
	var chunkScales, heap int64
	for _, sq := range c.seqs {
		if g.chStride > 0 {
			chunkScales += int64(4 * len(sq.q.chunks) * c.cfg.KVHeads * g.chStride)
		}
		heap += int64(len(sq.q.kchBuf) + 8*cap(sq.q.chunks) + cap(sq.q.flags))
	}
	if c.cfg.Layout == Paged {
		// the chunk blocks still held (a window's evict gives the others back)
		chunkScales = 0
		for _, sq := range c.seqs {
			for _, b := range sq.q.blks {
				if b != nil {
					chunkScales += int64(4 * c.cfg.KVHeads * g.chStride)
				}
			}
		}
	}
	in.ScaleBytes = sealed*int64(g.scaleBytesPerToken(c.cfg)) + chunkScales
	in.BytesPerToken = g.bytesPerToken(c.cfg)
	in.NativeBytesPerToken = int64(c.cfg.KVHeads * (c.rowK + c.rowV))
	// the arena's live figure counts every token at the sealed rate; the
	// cache's own figure tells the two kinds apart
	in.LiveBytes = sealed*in.BytesPerToken + native*in.NativeBytesPerToken
	in.CommittedBytes = int64(c.cfg.Batch)*int64(g.seqBytes) + heap
	if c.cfg.Layout == Paged {
		c.pagedQuantInfoLocked(in)
	}
}

// Regrown returns a copy of a quantized cache with room for capacity
// tokens per sequence (at least the current one): the same sealed chunks,
// scales and native rows bit for bit, the same lengths and windows, in the
// same arena; the copy is counted in this cache's CopyBytes. Growing a
// quantized cache through Export and Append would quantize dequantized
// values a second time; this copies the storage instead. Caches that are
// not quantized return ErrInvalidArgument (their rows copy exactly through
// Export and Append).
func (c *KVCache) Regrown(capacity int) (*KVCache, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, ErrClosed
	}
	if !c.qg.q.Enabled() || c.cfg.Layout == Paged {
		return nil, fmt.Errorf("%w: Regrown copies quantized contiguous caches only (a paged cache's capacity is a limit)", ErrInvalidArgument)
	}
	cfg := c.cfg
	cfg.Capacity = max(capacity, cfg.Capacity)
	g, err := New(c.arena, cfg)
	if err != nil {
		return nil, err
	}
	for b := range c.lens {
		if err := g.reserveKchLocked(g.seqs[b].q, c.seqs[b].q.chunksBelow(c.lens[b])); err != nil {
			g.Close()
			return nil, err
		}
	}
	var copied int64
	for b := range c.lens {
		copied += c.regrowSeqLocked(g, b)
		g.setWinLocked(b, c.winStart[b])
		g.setLenLocked(b, c.lens[b])
	}
	c.copyBytes += copied
	return g, nil
}

// regrowSeqLocked copies sequence b's readable rows into g (same geometry
// but the capacity, which sets the strides and may set the ring size).
func (c *KVCache) regrowSeqLocked(g *KVCache, b int) int64 {
	src, dst := c.seqs[b].q, g.seqs[b].q
	q, gq := &c.qg, &g.qg
	lo, hi := c.winStart[b], c.lens[b]
	sEnd := min(src.sealed, hi)
	var n int64
	for h := range c.cfg.KVHeads {
		for p := lo; p < sEnd; p++ {
			r, gr := h*c.cfg.Capacity+p, h*g.cfg.Capacity+p
			n += int64(copy(dst.qk[gr*q.qRowK:(gr+1)*q.qRowK], src.qk[r*q.qRowK:(r+1)*q.qRowK]))
			n += int64(copy(dst.qv[gr*q.qRowV:(gr+1)*q.qRowV], src.qv[r*q.qRowV:(r+1)*q.qRowV]))
			n += 4 * int64(copy(dst.kts[gr*q.ngK:(gr+1)*q.ngK], src.kts[r*q.ngK:(r+1)*q.ngK]))
			n += 4 * int64(copy(dst.vts[gr*q.ngV:(gr+1)*q.ngV], src.vts[r*q.ngV:(r+1)*q.ngV]))
			if q.zeros {
				n += 4 * int64(copy(dst.kzs[gr*q.ngK:(gr+1)*q.ngK], src.kzs[r*q.ngK:(r+1)*q.ngK]))
				n += 4 * int64(copy(dst.vzs[gr*q.ngV:(gr+1)*q.ngV], src.vzs[r*q.ngV:(r+1)*q.ngV]))
			}
		}
		// every native row, also those below the window: a later seal's
		// scales are computed over the whole chunk
		for p := sEnd; p < hi; p++ {
			s, gs := h*q.ring+p%q.ring, h*gq.ring+p%gq.ring
			n += int64(copy(dst.ringK[gs*c.rowK:(gs+1)*c.rowK], src.ringK[s*c.rowK:(s+1)*c.rowK]))
			n += int64(copy(dst.ringV[gs*c.rowV:(gs+1)*c.rowV], src.ringV[s*c.rowV:(s+1)*c.rowV]))
		}
	}
	nc := src.chunksBelow(hi)
	dst.chunks = append(dst.chunks[:0], src.chunks[:nc]...)
	dst.flags = append(dst.flags[:0], src.flags[:nc]...)
	dst.copyKch(src, nc, c.cfg.KVHeads, q.chStride)
	dst.sealed = sEnd
	return n + int64(4*nc*c.cfg.KVHeads*q.chStride+8*nc)
}
