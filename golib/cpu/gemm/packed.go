package gemm

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/hugepage"
)

// Packed B. A decode step multiplies one to a few rows by every weight
// matrix; streamed row by row (skinnyAxpy) each group of B rows reads
// several short runs at once and loads and stores C for every group. A
// constant B is therefore packed once into slivers of packNR columns, laid
// out exactly as the cache-blocked algorithm packs its B blocks: column
// blocks of ncBlock columns (the last one narrower, zero-padded to a
// multiple of packNR), each stored k-block by k-block (kcBlock rows, the
// last shorter), each k-block sliver by sliver (kc rows of packNR values).
// Short products (decode) read each k-block of their slivers as one
// contiguous run and add its partial sums into a small scratch tile;
// longer ones (prefill) take the k-blocks as their packed B blocks, so the
// weights are not packed again on every call.

// packNR is the width of a panel: two AVX-512 vectors, four AVX2 vectors.
const packNR = 32

// PackedB is a k x n matrix op(B) packed for SgemmPacked. It is read-only
// once built and may be shared by concurrent calls.
type PackedB struct {
	k, n int
	p    []float32 // the slivers, in the layout above
	// h replaces p for a 16-bit B (PackBHalf): the same layout, half the
	// bytes; kernels widen each k-block of slivers as they read it.
	h    []uint16
	half Half
	// q replaces p for a block-quantized B (PackBQuant): the same layout
	// at one byte a value, or with nibbles two (byte c of a sliver row
	// holds column c in its low nibble and column c+16 in its high one).
	// Each group of qblock rows (of groups per column) of sliver s has
	// its packNR scales and zeros at qs/qz[(s*groups+g)*packNR:].
	q       []byte
	nibbles bool
	qblock  int
	groups  int
	qs, qz  []float32
}

// Bytes returns the memory the pack holds: its values (float32, 16-bit or
// quantized) plus, for a quantized pack, its scales and zeros.
func (b *PackedB) Bytes() int {
	return 4*len(b.p) + 2*len(b.h) + len(b.q) + 4*(len(b.qs)+len(b.qz))
}

// float reports whether the pack holds float32 values (PackB).
func (b *PackedB) float() bool { return b.h == nil && b.q == nil }

// K returns the inner dimension of the packed matrix.
func (b *PackedB) K() int { return b.k }

// N returns the number of columns of the packed matrix.
func (b *PackedB) N() int { return b.n }

// PackBytes returns the bytes of the pack of a k x n op(B) with elem-byte
// values: PackB's (elem 4) or PackBHalf's (elem 2), the padding columns of
// the last sliver included.
func PackBytes(k, n, elem int) int64 {
	return int64(k) * int64(roundUp(n, packNR)) * int64(elem)
}

// PackB packs op(B) (k x n; B is n x k when transB), row stride ldb as
// stored, for SgemmPacked.
func PackB(transB bool, k, n int, b []float32, ldb int) (*PackedB, error) {
	if err := checkLens(false, transB, 0, n, k, 0, max(k, 1), len(b), ldb, 0, max(n, 1)); err != nil {
		return nil, err
	}
	pb := &PackedB{k: k, n: n, p: newPack[float32](k * roundUp(n, packNR))}
	// Each block is what the blocked algorithm's packB builds from B.
	p := product{transB: transB, n: n, k: k, b: b, ldb: ldb}
	for j0 := 0; j0 < n; j0 += ncBlock {
		for l0 := 0; l0 < k; l0 += kcBlock {
			kc := min(kcBlock, k-l0)
			p.packB(pb.slab(j0/ncBlock, l0, kc), j0, min(ncBlock, n-j0), l0, kc, packNR)
		}
	}
	return pb, nil
}

// PackBHalf is PackB for a B stored as 16-bit floats of encoding kind: the
// panels keep that encoding (a decode step streams half the bytes of a
// float32 pack) and are widened, exactly, a k-block at a time as they are
// read. NaN payloads may come back quieted, which no product can observe.
func PackBHalf(kind Half, transB bool, k, n int, b []uint16, ldb int) (*PackedB, error) {
	if kind != Float16 && kind != BFloat16 {
		return nil, fmt.Errorf("%w: unknown 16-bit encoding %d", ErrShape, kind)
	}
	if err := checkLens(false, transB, 0, n, k, 0, max(k, 1), len(b), ldb, 0, max(n, 1)); err != nil {
		return nil, err
	}
	pb := &PackedB{k: k, n: n, h: newPack[uint16](k * roundUp(n, packNR)), half: kind}
	p := product{transB: transB, n: n, k: k, bh: b, half: kind, ldb: ldb, ks: active()}
	bufs := bufPool.Get().(*packBufs)
	defer bufPool.Put(bufs)
	for j0 := 0; j0 < n; j0 += ncBlock {
		for l0 := 0; l0 < k; l0 += kcBlock {
			kc := min(kcBlock, k-l0)
			dst := pb.slabHalf(j0/ncBlock, l0, kc)
			tmp := bufs.b[:len(dst)]
			p.packB(tmp, j0, min(ncBlock, n-j0), l0, kc, packNR)
			narrow(kind, dst, tmp) // exact: every value came from kind
		}
	}
	return pb, nil
}

// hugePacks: packs of at least hugepage.HeapMin are advised for
// transparent huge pages (a variable so that BenchmarkPackedHugePages can
// build packs without the advice). A decode step streams every weight once;
// with 4 KiB pages that stream takes a TLB miss every 4 KiB. On the
// AVX2-only Zen 3 the decode-step products of a 4-layer, hidden-1024
// decoder's weights (BenchmarkPackedHugePages, alternated step by step, two
// runs) measured with the advice 1.01-1.09x as fast for one row and
// 1.05-1.07x for four on one thread, 1.07-1.10x on two.
var hugePacks = true

// newPack returns n zeroed values for a new pack, advised for huge pages
// (hugepage.Advise, before the pack is written) from hugepage.HeapMin on. The
// pack stays Go heap memory, freed by the collector; the advice stays on
// its address range after that, so later heap objects there may be backed
// by huge pages too.
func newPack[T float32 | uint16 | byte](n int) []T {
	s := make([]T, n)
	if size := n * int(unsafe.Sizeof(s[0])); hugePacks && size >= hugepage.HeapMin {
		hugepage.Advise(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(s))), size))
	}
	return s
}

// narrow stores float32 values that are exactly representable in kind.
func narrow(kind Half, dst []uint16, src []float32) {
	if kind == BFloat16 {
		codec.EncodeBF16(dst, src)
		return
	}
	codec.EncodeF16(dst, src)
}

// slabOffset is the start and length, in values, of slab (jb, l0, kc).
func (b *PackedB) slabOffset(jb, l0, kc int) (int, int) {
	w := min(ncBlock, roundUp(b.n-jb*ncBlock, packNR))
	return jb*ncBlock*b.k + l0*w, kc * w
}

// slabHalf is slab for a 16-bit pack.
func (b *PackedB) slabHalf(jb, l0, kc int) []uint16 {
	off, n := b.slabOffset(jb, l0, kc)
	return b.h[off : off+n]
}

// slab returns the packed B block of column block jb (ncBlock columns
// from jb*ncBlock) and rows l0..l0+kc: its slivers one after another.
func (b *PackedB) slab(jb, l0, kc int) []float32 {
	off, n := b.slabOffset(jb, l0, kc)
	return b.p[off : off+n]
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

// PackedRows is the largest number of rows of op(A) SgemmPacked computes
// by streaming the packed slivers (a decode step); longer products take
// the packed k-blocks as the cache-blocked algorithm's B blocks (read in
// place where the kernel's slivers are packNR wide, narrowed block by
// block for the portable kernel's), so a pack serves every row count and
// a session needs no other copy of a packed weight.
const PackedRows = skinnyRows

// packedTasksPerThread is the number of panel ranges per thread: with a
// few per thread a helper that joins late still takes a share.
const packedTasksPerThread = 4

// SgemmPacked computes C = alpha*op(A)*B + beta*C for a packed B (k x n)
// and m rows of op(A) (m x k; A is k x m as stored when transA), using at most threads threads (<= 0:
// Threads()). beta 0 does not read C, as in Sgemm.
func SgemmPacked(threads int, transA bool, m int, alpha float32, a []float32, lda int,
	b *PackedB, beta float32, c []float32, ldc int) error {
	if b == nil {
		return fmt.Errorf("%w: nil packed B", ErrShape)
	}
	k, n := b.k, b.n
	if err := checkLens(transA, false, m, n, k, len(a), lda, k*n, max(n, 1), len(c), ldc); err != nil {
		return err
	}
	if m == 0 || n == 0 {
		return nil
	}
	if beta != 1 {
		for i := range m {
			scaleRow(c[i*ldc:i*ldc+n], beta)
		}
	}
	if k == 0 || alpha == 0 {
		return nil
	}
	ks := active()
	if m > PackedRows {
		p := getProduct()
		*p = product{transA: transA, m: m, n: n, k: k, alpha: alpha, a: a, lda: lda, c: c, ldc: ldc,
			ks: ks, threads: parallelism(threads, m, n, k), pb: b}
		p.blocked()
		putProduct(p)
		return nil
	}
	var rows [skinnyRows][]float32
	if transA {
		buf := make([]float32, m*k)
		for i := range m {
			r := buf[i*k : (i+1)*k]
			for l := range r {
				r[l] = a[l*lda+i]
			}
			rows[i] = r
		}
	} else {
		for i := range m {
			rows[i] = a[i*lda : i*lda+k]
		}
	}
	slivers := (n + packNR - 1) / packNR
	t := parallelism(threads, m, n, k)
	tasks := min(slivers, t*packedTasksPerThread)
	if t <= 1 {
		tasks = 1
	}
	per := (slivers + tasks - 1) / tasks
	tasks = (slivers + per - 1) / per
	if tasks == 1 { // one thread (a decode step): no closure, so rows stays on the stack
		packedSlivers(ks, b, m, &rows, 0, slivers, alpha, c, ldc)
		return nil
	}
	shared := rows
	ForThreads(t, tasks, func(u int) {
		packedSlivers(ks, b, m, &shared, u*per, min((u+1)*per, slivers), alpha, c, ldc)
	})
	return nil
}

// slabSlivers is the number of slivers in one column block.
const slabSlivers = ncBlock / packNR

// sliverScratch is one packedSlivers call's partial sums and row views,
// pooled: passed to the kernel through a function value they would escape
// and cost an 8 KiB allocation per call.
type sliverScratch struct {
	acc [slabSlivers][skinnyRows][packNR]float32
	sub [skinnyRows][]float32
	// wide holds one widened sliver of a 16-bit or quantized pack.
	wide [kcBlock * packNR]float32
}

var sliverScratchPool = sync.Pool{New: func() any { return new(sliverScratch) }}

// packedSlivers adds alpha * op(A) * B[:, 32*s0 : 32*s1] to C. Within each
// column block it walks the k-blocks in order and, in each, its slivers
// one after another (one contiguous run), keeping the partial sums of
// those slivers aside between k-blocks.
func packedSlivers(ks *kernels, b *PackedB, m int, rows *[skinnyRows][]float32, s0, s1 int, alpha float32,
	c []float32, ldc int) {
	k, n := b.k, b.n
	if m == 1 && alpha == 1 && b.float() && ks.panelRow != nil && s1 <= n/packNR {
		packedRow(ks, b, rows[0], s0, s1, c)
		return
	}
	sc := sliverScratchPool.Get().(*sliverScratch)
	defer func() {
		sc.sub = [skinnyRows][]float32{} // keep no caller memory alive in the pool
		sliverScratchPool.Put(sc)
	}()
	acc, sub := &sc.acc, &sc.sub
	for s := s0; s < s1; {
		jb := s / slabSlivers
		e := min(s1, (jb+1)*slabSlivers)
		for q := range e - s {
			for i := range m {
				acc[q][i] = [packNR]float32{}
			}
		}
		for l0 := 0; l0 < k; l0 += kcBlock {
			kc := min(kcBlock, k-l0)
			for i := range m {
				sub[i] = rows[i][l0 : l0+kc]
			}
			if b.h != nil {
				// Widened in registers by panelHalf, or one sliver at a
				// time into L1 for the float32 panel kernel.
				slab := b.slabHalf(jb, l0, kc)
				for q := s; q < e; q++ {
					jr := (q - jb*slabSlivers) * packNR
					ph := slab[jr*kc : (jr+packNR)*kc]
					if ks.panelHalf != nil {
						ks.panelHalf(b.half, m, kc, sub, ph, &acc[q-s])
						continue
					}
					w := sc.wide[:kc*packNR]
					ks.cvt16(b.half, w, ph)
					ks.panel(m, kc, sub, w, &acc[q-s])
				}
				continue
			}
			if b.q != nil && m == 1 && ks.panelQuantRow != nil {
				// Dequantized in registers.
				for q := s; q < e; q++ {
					b.panelQuantRow(ks, sub[0], jb, l0, kc, (q-jb*slabSlivers)*packNR, &acc[q-s][0])
				}
				continue
			}
			if b.q != nil {
				// Dequantized one sliver at a time into L1.
				w := sc.wide[:kc*packNR]
				for q := s; q < e; q++ {
					b.widenQuant(ks, w, jb, l0, kc, (q-jb*slabSlivers)*packNR)
					ks.panel(m, kc, sub, w, &acc[q-s])
				}
				continue
			}
			slab := b.slab(jb, l0, kc)
			for q := s; q < e; q++ {
				jr := (q - jb*slabSlivers) * packNR
				ks.panel(m, kc, sub, slab[jr*kc:(jr+packNR)*kc], &acc[q-s])
			}
		}
		for q := s; q < e; q++ {
			j0 := q * packNR
			w := min(packNR, n-j0)
			for i := range m {
				ci := c[i*ldc+j0 : i*ldc+j0+w]
				for j := range ci {
					ci[j] += alpha * acc[q-s][i][j]
				}
			}
		}
		s = e
	}
}

// packedRow is packedSlivers for one row of op(A), alpha 1, a float32 pack
// and full slivers only (a decode step's projection): each sliver's sums go
// straight into its 32 columns of C, k-block after k-block, with no
// partial tile to clear and add back and no pooled scratch.
func packedRow(ks *kernels, b *PackedB, a []float32, s0, s1 int, c []float32) {
	k := b.k
	for s := s0; s < s1; {
		jb := s / slabSlivers
		e := min(s1, (jb+1)*slabSlivers)
		for l0 := 0; l0 < k; l0 += kcBlock {
			kc := min(kcBlock, k-l0)
			slab := b.slab(jb, l0, kc)
			for q := s; q < e; q++ {
				jr := (q - jb*slabSlivers) * packNR
				ks.panelRow(kc, a[l0:l0+kc], slab[jr*kc:(jr+packNR)*kc], (*[packNR]float32)(c[q*packNR:(q+1)*packNR]))
			}
		}
		s = e
	}
}

// panelGo is the portable panel kernel: out[i][j] += sum_l a[i][l] *
// p[l*packNR+j] for i < m.
func panelGo(m, k int, a *[skinnyRows][]float32, p []float32, out *[skinnyRows][packNR]float32) {
	p = p[:k*packNR]
	for i := range m {
		ai := a[i][:k]
		o := &out[i]
		for l, av := range ai {
			row := (*[packNR]float32)(p[l*packNR : (l+1)*packNR])
			for j := range o {
				o[j] += av * row[j]
			}
		}
	}
}

// repackSlivers writes columns c0..c0+nc (from the start of column block
// jb) of k-block (l0, kc) of the pack into dst as nr-wide slivers (nr a
// divisor of packNR; c0 a multiple of nr), the layout packB builds from B
// as stored: each packNR-wide sliver is widened to float32 in wide (kc *
// packNR values; a float32 pack is read in place) and its columns copied
// out, the columns past nc of the last sliver zero.
func (b *PackedB) repackSlivers(ks *kernels, dst, wide []float32, jb, l0, kc, c0, nc, nr int) {
	n := roundUp(nc, nr)
	clear(dst[:n*kc])
	for s0 := c0 / packNR * packNR; s0 < c0+nc; s0 += packNR {
		var src []float32
		switch {
		case b.q != nil:
			src = wide[:kc*packNR]
			b.widenQuant(ks, src, jb, l0, kc, s0)
		case b.h != nil:
			src = wide[:kc*packNR]
			ks.cvt16(b.half, src, b.slabHalf(jb, l0, kc)[s0*kc:(s0+packNR)*kc])
		default:
			src = b.slab(jb, l0, kc)[s0*kc : (s0+packNR)*kc]
		}
		lo, hi := max(s0, c0), min(s0+packNR, c0+nc)
		for c := lo; c < hi; c++ {
			jr, x := (c-c0)/nr*nr, (c-c0)%nr
			d := dst[jr*kc+x:]
			for l := range kc {
				d[l*nr] = src[l*packNR+c-s0]
			}
		}
	}
}
