package cpu

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/klauspost/cpuid/v2"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// Attention is the streaming decode kernel. Semantics, argument checks and
// errors are exactly those of ReferenceAttention (see attention.go).
//
// For every (sequence, KV head) it walks the cache segments in blocks of a
// few dozen tokens: the block's K rows are dotted with every query row of the
// GQA group (so each K/V byte is read once per call), a vectorized exp turns
// the block's scores into weights, the online-softmax state (m, l) of each
// row is updated and the block's V rows are accumulated at once. Nothing of
// the context's length is materialized. fp16/bf16 rows are widened to
// float32 as they are loaded (straight from storage on the AVX-512 path,
// through a small scratch block otherwise). Work is spread over the persistent worker pool
// (see SetThreads): (sequence, KV head) units first, and ranges of tokens
// with an exact (m, l, o) merge when the units cannot keep every worker busy.
// After warm-up a call does not allocate.
func Attention(dst, q []float32, qLen, qHeads int, v cache.View, o Options) error {
	s, err := checkArgs(dst, q, qLen, qHeads, v, o)
	if err != nil {
		return err
	}
	if qLen > maxQLen {
		return fmt.Errorf("%w: q_len %d outside 1..%d (AttentionPrefill takes any)", cache.ErrInvalidArgument, qLen, maxQLen)
	}
	return thePool.run(&s, dst, q, v, activeOps())
}

// prefetchTokens is how far ahead (in rows) the SIMD loops prefetch K and V
// rows that come straight from the cache's storage (into L2): half a block
// of head dim 128, so the rows needed next stream in while these are
// computed. 0, 16, 32, 128 and 256 rows measured no better.
var prefetchTokens = 64

// blockTokens picks the number of tokens of one KV block: a K block and a
// V block (as float32) of blockBytes each, between 16 and 512 tokens.
func blockTokens(dk, dv int) int {
	d := max(dk, dv)
	t := blockBytes / (4 * d)
	return min(max(t, 16), 512)
}

// blockBytes is the size of one tensor block: a quarter of the L2 cache
// per core, at least 64 KiB and at most 256 KiB (64 KiB where cpuid does
// not report the L2), so that the K and V blocks of the current step and
// the rows prefetched for the next stay in L2 while every query row of the
// group uses them. Every block ends with a change of stream (K to V, V to
// the next K) that the prefetchers take time to follow, and with the
// per-block work that does not scale with its length (max, exp and rescale
// per row), so larger blocks stream better. Interleaved A/B, fp32, head
// dim 128, 1 MiB L2, 128 tokens (64 KiB) against 512 (256 KiB): GQA 32/8
// beyond the L3 25.1 -> 27.8 GB/s on one thread, 32.1 -> 33.0 on two;
// L3-resident (4k tokens) 31.8 -> 33.7; MHA 32/32 +3-4%. 768 and 1024
// tokens were no better beyond the L3.
var blockBytes = l2BlockBytes(cpuid.CPU.Cache.L2)

func l2BlockBytes(l2 int) int {
	if l2 <= 0 {
		return 64 << 10
	}
	return min(max(l2/4, 64<<10), 256<<10)
}

// unitState is one worker's scratch for one (sequence, KV head, token range)
// task. It is reused across calls and only grows.
type unitState struct {
	qs     []float32 // scaled query rows of the group [rows][dk]
	acc    []float32 // [rows][dv]
	m, l   []float32 // online-softmax state per row
	lo, hi []int     // visible key range per row
	moff   []int     // start of each row's mask row (Options.Mask)
	sc     []float32 // scores of one block
	kbuf   []float32 // widened K block
	vbuf   []float32 // widened V block
	segs   []cache.Segment
	alpha  [4]float32 // per-row rescale factors of one block
	mx     [4]float32 // a four-row group's maxima (kernelOps.max4)
	zero   []float32  // dv zeros, never written (the finiteness check)
	chk    []float32  // per-row finiteness check of acc
	qq, qc []float32  // query rows folded with per-channel K scales, their zero constants
	qi     []int16    // int16 query rows of the integer score loop
	isc    []float32  // their scales
	ioff   []float32  // their score offsets
	aff    []float32  // intDots4's argument blocks (quantPart.aff)
	qb     quantBlock // the quantized segment being walked (quant.go)
	ss     [4]float32 // scalesSafe's sums (a field: a local escapes through the indirect call)
	read   int64      // K/V bytes (with scales) this state's units read in the current call
}

// grow returns b resized to n elements, reusing its storage when it holds
// them (the contents are then what it held), else a new zeroed slice: the
// per-unit scratch of the loops, allocated once and reused across calls.
func grow[T any](b []T, n int) []T {
	if cap(b) < n {
		return make([]T, n)
	}
	return b[:n]
}

// runUnit processes positions [from, to) of sequence b, KV head h for all
// rows of the group. When out != nil it writes the normalized result rows
// straight into out (dst layout); otherwise it leaves the unnormalized state
// (m, l, acc) in part as [rows](m, l, acc[dv]) for the split-KV merge.
func (u *unitState) runUnit(ops *kernelOps, s *shape, q []float32, v cache.View, b, h, from, to int, dst, part []float32) error {
	rows := s.group * s.qLen
	dk, dv := s.dk, s.dv
	// rowsP: rows and, where the last run of rows is three long (groups of
	// 3 and 7 at decode), one padding row that copies the last, so that
	// block runs those three in the four-row loops (see padRow).
	rowsP := rows
	if padRow(rows, s) {
		rowsP++
	}
	u.qs = grow(u.qs, rowsP*dk)
	u.acc = grow(u.acc, rowsP*dv)
	u.m = grow(u.m, rowsP)
	u.l = grow(u.l, rowsP)
	u.lo = grow(u.lo, rowsP)
	u.hi = grow(u.hi, rowsP)
	bt := blockTokens(dk, dv)
	u.sc = grow(u.sc, 4*bt)

	// Scale the group's query rows once; with a softcap the 1/cap factor is
	// folded in too, so the block only needs cap*tanh(dot).
	qscale := s.scale
	if s.softcap > 0 {
		qscale /= s.softcap
	}
	// Rows are kept query-position-major (r = i*group + g), so the rows of
	// one new token, which see the same keys, are adjacent.
	q0 := (b*s.qHeads + h*s.group) * s.qLen
	for r := 0; r < rows; r++ {
		e := q0 + s.extRow(r)
		ops.scale(u.qs[r*dk:(r+1)*dk], q[e*dk:(e+1)*dk], qscale)
	}
	L, ws := v.SeqLen(b), v.WindowStart(b)
	for r := 0; r < rows; r++ {
		lo, hi := s.rowRange(L, ws, r/s.group)
		u.lo[r], u.hi[r] = max(lo, from), min(hi, to)
		u.m[r] = negInf
		u.l[r] = 0
	}
	if rowsP > rows { // the padding row: the last row's query and range, its results unread
		copy(u.qs[rows*dk:rowsP*dk], u.qs[(rows-1)*dk:rows*dk])
		u.lo[rows], u.hi[rows] = u.lo[rows-1], u.hi[rows-1]
		u.m[rows], u.l[rows] = negInf, 0
	}
	if m := s.mask; m != nil {
		u.moff = grow(u.moff, rows)
		for r := 0; r < rows; r++ {
			u.moff[r] = b*m.StrideB + (h*s.group+r%s.group)*m.StrideH + (r/s.group)*m.StrideI
		}
	}
	clear(u.acc)

	esize := s.elem.Size()
	half := s.elem != cache.Float32 && ops.half != nil && ops.half.ok(dk, dv)
	// Segments are asked for the whole range at once, or chunk by chunk
	// from a view that does work per request (ChunkedView).
	chunk := to - from
	if cv, ok := v.(ChunkedView); ok && cv.SegmentChunk() > 0 {
		chunk = max(cv.SegmentChunk()/bt, 1) * bt
	}
	pos := from
	for c0 := from; c0 < to; c0 += chunk {
		u.segs = v.AppendSegments(u.segs[:0], b, h, c0, min(c0+chunk, to))
		for i := 0; i < len(u.segs); i++ {
			sg := &u.segs[i]
			if sg.Q.Format != cache.QuantNone && sg.Start == pos {
				n, end, err := u.quantRun(ops, s, u.segs[i:], pos, rows, bt)
				if err != nil {
					return err
				}
				i, pos = i+n-1, end
				continue
			}
			if sg.Start != pos || sg.Len < 0 || len(sg.K) < sg.Len*dk*esize || len(sg.V) < sg.Len*dv*esize {
				return fmt.Errorf("%w: cache view returned a malformed segment (start %d len %d, expected start %d)",
					cache.ErrInvalidArgument, sg.Start, sg.Len, pos)
			}
			for off := 0; off < sg.Len; off += bt {
				n := min(bt, sg.Len-off)
				if half && aligned16(sg.K) && aligned16(sg.V) {
					kh := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(sg.K))), sg.Len*dk)
					vh := unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(sg.V))), sg.Len*dv)
					u.block(ops, s, nil, nil, kh[off*dk:(off+n)*dk], vh[off*dv:(off+n)*dv], pos+off, n, rows, prefetchTokens, nil)
					continue
				}
				kb := u.loadBlock(ops, &u.kbuf, sg.K, off, n, dk, s.elem)
				vb := u.loadBlock(ops, &u.vbuf, sg.V, off, n, dv, s.elem)
				pf := 0
				var nk []float32 // the next K block in storage, for axpy4k to prefetch
				if s.elem == cache.Float32 {
					pf = prefetchTokens
					if dk == dv && off+2*n <= sg.Len && uintptr(unsafe.Pointer(unsafe.SliceData(sg.K)))%4 == 0 {
						nk = unsafe.Slice((*float32)(unsafe.Pointer(&sg.K[(off+n)*dk*4])), n*dk)
					}
				}
				u.block(ops, s, kb, vb, nil, nil, pos+off, n, rows, pf, nk)
			}
			u.read += int64(sg.Len * (dk + dv) * esize)
			pos += sg.Len
		}
	}
	if pos != to {
		return fmt.Errorf("%w: cache view segments cover positions %d..%d, want %d..%d",
			cache.ErrInvalidArgument, from, pos, from, to)
	}

	if dst != nil {
		// chk[r] = sum(0*acc[r]): NaN exactly when the row's accumulator
		// holds a NaN or an infinity (u.zero is never written).
		u.zero = grow(u.zero, dv)
		u.chk = grow(u.chk, rows)
		ops.dots(u.chk, u.zero, u.acc[:rows*dv], dv, 0)
		for r := 0; r < rows; r++ {
			e := q0 + s.extRow(r)
			if !finiteState(u.m[r], u.l[r]) || u.chk[r] != 0 || (s.mask != nil && u.m[r] <= lowest) {
				if err := s.exactRow(dst[e*dv:(e+1)*dv], q[e*dk:(e+1)*dk], v, b, h, r); err != nil {
					return err
				}
				continue
			}
			ops.scale(dst[e*dv:(e+1)*dv], u.acc[r*dv:(r+1)*dv], 1/u.l[r])
		}
		return nil
	}
	for r := 0; r < rows; r++ {
		p := part[r*(dv+2) : (r+1)*(dv+2)]
		p[0], p[1] = u.m[r], u.l[r]
		copy(p[2:], u.acc[r*dv:(r+1)*dv])
	}
	return nil
}

// ChunkedView is a cache.View that does work per AppendSegments request
// (the tensor-path Attention op's view fills its present outputs as they
// are read): the streaming kernel asks it for SegmentChunk positions at a
// time (rounded to whole K/V blocks), so each chunk is read right after it
// was produced, while it is in cache; 0 or less: no chunks. Other views
// are asked for a task's whole range at once.
type ChunkedView interface {
	cache.View
	SegmentChunk() int
}

// loadBlock returns rows [off, off+n) of a segment's bytes as float32: a
// view of the storage for aligned float32 rows, else widened into *buf.
func (u *unitState) loadBlock(ops *kernelOps, buf *[]float32, raw []byte, off, n, d int, elem cache.ElemType) []float32 {
	cnt := n * d
	switch elem {
	case cache.Float32:
		b := raw[off*d*4 : (off+n)*d*4]
		if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 == 0 {
			return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), cnt)
		}
		*buf = grow(*buf, cnt)
		for i := range *buf {
			(*buf)[i] = math.Float32frombits(uint32(b[4*i]) | uint32(b[4*i+1])<<8 | uint32(b[4*i+2])<<16 | uint32(b[4*i+3])<<24)
		}
		return *buf
	default:
		b := raw[off*d*2 : (off+n)*d*2]
		*buf = grow(*buf, cnt)
		var src []uint16
		if uintptr(unsafe.Pointer(unsafe.SliceData(b)))%2 == 0 {
			src = unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), cnt)
		} else {
			for i := range *buf {
				h := uint16(b[2*i]) | uint16(b[2*i+1])<<8
				if elem == cache.Float16 {
					(*buf)[i] = goF16(h)
				} else {
					(*buf)[i] = math.Float32frombits(uint32(h) << 16)
				}
			}
			return *buf
		}
		if elem == cache.Float16 {
			ops.cvtF16(*buf, src)
		} else {
			ops.cvtBF16(*buf, src)
		}
		return *buf
	}
}

// block folds the n tokens starting at absolute position pos into the
// online-softmax state of every row that sees some of them. The rows are
// float32 in kb/vb, or 16-bit rows of the cache's type in kh/vh (read
// straight from storage by ops.half). Runs of four
// rows with the same visible range (all rows of a decode step) go through
// the four-row inner loops, so each K/V row is loaded once for four rows.
// nk, when not nil, is the next K block in storage: the first four-row V
// accumulation prefetches it (ops.axpy4k) while it reads V from cache.
func (u *unitState) block(ops *kernelOps, s *shape, kb, vb []float32, kh, vh []uint16, pos, n, rows, pf int, nk []float32) {
	bf := s.elem == cache.BFloat16
	dk, dv := s.dk, s.dv
	for r := 0; r < rows; {
		a, e := max(u.lo[r], pos), min(u.hi[r], pos+n)
		if a >= e {
			r++
			continue
		}
		nr := 1
		for nr < 4 && r+nr < rows && u.lo[r+nr] == u.lo[r] && u.hi[r+nr] == u.hi[r] {
			nr++
		}
		switch {
		case nr == 3 && r+3 == rows && padRow(rows, s) && !u.qb.on:
			nr = 4 // the last three rows and runUnit's padding row (padRow)
		case nr != 4:
			nr = 1
		}
		cnt := e - a
		sc := u.sc[:nr*cnt]
		switch {
		case u.qb.on:
			u.qb.dots(sc, r, nr, a-pos, e-pos, dk, pf)
		case kh != nil && nr == 4:
			ops.half.dots4(sc, u.qs[r*dk:(r+4)*dk], kh[(a-pos)*dk:(e-pos)*dk], dk, pf, bf)
		case kh != nil:
			ops.half.dots(sc, u.qs[r*dk:(r+1)*dk], kh[(a-pos)*dk:(e-pos)*dk], dk, pf, bf)
		case nr == 4:
			ops.dots4(sc, u.qs[r*dk:(r+4)*dk], kb[(a-pos)*dk:(e-pos)*dk], dk, pf)
		default:
			ops.dots(sc, u.qs[r*dk:(r+1)*dk], kb[(a-pos)*dk:(e-pos)*dk], dk, pf)
		}
		alpha := &u.alpha // a field: a local would escape through the indirect call
		// four rows' maxima in one call where nothing changes the scores
		// after the score loop (a call per row costs about as much as a
		// short row's scan)
		four := nr == 4 && ops.max4 != nil && s.softcap <= 0 && s.mask == nil
		if four {
			ops.max4(sc, cnt, cnt, &u.mx)
		}
		for j := 0; j < nr; j++ {
			sj := sc[j*cnt : (j+1)*cnt]
			if s.softcap > 0 {
				ops.tanhCap(sj, s.softcap)
			}
			if s.mask != nil {
				applyMask(sj, s.mask, u.moff[r+j], a)
			}
			var m float32
			if four {
				m = u.mx[j]
			} else {
				m = ops.maxOf(sj)
			}
			mOld := u.m[r+j]
			mNew := max(mOld, m)
			alpha[j] = 1
			switch {
			case mOld == negInf:
				alpha[j] = 0 // the first block of the row: nothing to rescale
			case mNew != mOld:
				alpha[j] = expf(mOld - mNew)
			}
			u.l[r+j] = u.l[r+j]*alpha[j] + ops.expSub(sj, mNew)
			u.m[r+j] = mNew
		}
		switch {
		case u.qb.on:
			u.qb.axpy(u.acc[r*dv:(r+nr)*dv], sc, a-pos, e-pos, nr, pf, alpha)
		case vh != nil && nr == 4:
			ops.half.axpy4(u.acc[r*dv:(r+4)*dv], sc, vh[(a-pos)*dv:(e-pos)*dv], alpha, pf, bf)
		case vh != nil:
			ops.half.axpy(u.acc[r*dv:(r+1)*dv], sc, vh[(a-pos)*dv:(e-pos)*dv], alpha[0], pf, bf)
		case nr == 4 && nk != nil && ops.axpy4k != nil:
			ops.axpy4k(u.acc[r*dv:(r+4)*dv], sc, vb[(a-pos)*dv:(e-pos)*dv], alpha, pf, nk)
			nk = nil // once per block
		case nr == 4:
			ops.axpy4(u.acc[r*dv:(r+4)*dv], sc, vb[(a-pos)*dv:(e-pos)*dv], alpha, pf)
		default:
			ops.axpy(u.acc[r*dv:(r+1)*dv], sc, vb[(a-pos)*dv:(e-pos)*dv], alpha[0], pf)
		}
		r += nr
	}
}

// padRow reports whether runUnit adds a padding row to rows query rows of
// shape s: when they end in a run of three that share their key range (a
// decode step of a GQA group of 3 or 7: Llama 3.2 3B, Qwen2 0.5B/7B), so
// that block runs those three in the four-row loops, which share every K/V
// load, instead of three single-row passes over the block (two of them from
// L2). Only without a mask (whose rows block would have to pad too).
// fp32 d128, the same K+V bytes as GQA 32/8 at 16k tokens, AVX2-only Zen 3,
// builds alternated run by run (four rounds, median K+V GB/s, one / two
// threads): GQA 24/8 13.0 -> 18.2 / 21.0 -> 30.1, 28/4 11.0 -> 11.7 /
// 18.9 -> 21.6; 32/8 unchanged (18-20 / 28-33).
func padRow(rows int, s *shape) bool {
	return s.mask == nil && s.qLen == 1 && rows%4 == 3
}

// lowest is the score of a position a mask excludes (onnxruntime's).
const lowest = -math.MaxFloat32

// applyMask applies mask m to the scores sc of the positions a, a+1, ...
// of the row whose mask row starts at element off (see Mask): an excluded
// position scores lowest (whatever its dot product gave), an additive value
// is added, and a finite score plus a value that gives -Inf (-Inf itself,
// or a sum below the float32 range such as -MaxFloat32 plus a negative
// score) becomes lowest: its weight is 0 either way, and a row whose best
// score is lowest goes to Exact. A NaN or an infinite score stays
// non-finite, for the exact path.
func applyMask(sc []float32, m *Mask, off, a int) {
	n := min(len(sc), max(m.Len-a, 0)) // positions inside the mask row
	switch {
	case n == 0:
	case m.Bool != nil:
		for t, ok := range m.Bool[off+a : off+a+n] {
			if !ok {
				sc[t] = lowest
			}
		}
	default:
		for t, x := range m.Float[off+a : off+a+n] {
			y := sc[t] + x
			if y == negInf && sc[t]-sc[t] == 0 {
				y = lowest // -Inf, or a finite sum below the float32 range
			}
			sc[t] = y
		}
	}
	for t := n; t < len(sc); t++ {
		sc[t] = lowest
	}
}

// mergeParts combines nsplit partial states of one unit into dst rows
// [q0, q0+rows): m = max m_i, l = sum l_i e^(m_i-m), o = sum o_i e^(m_i-m) / l.
// Partial rows are in the internal order of runUnit. A row that met a
// non-finite value is recomputed exactly (exactRow) from q and v; b and h
// are the unit's sequence and KV head.
func mergeParts(dst, parts []float32, s *shape, q0, nsplit int, q []float32, v cache.View, b, h int) error {
	rows, dv := s.group*s.qLen, s.dv
	stride := rows * (dv + 2)
	for r := 0; r < rows; r++ {
		e := q0 + s.extRow(r)
		out := dst[e*dv : (e+1)*dv]
		m := negInf
		for c := 0; c < nsplit; c++ {
			m = max(m, parts[c*stride+r*(dv+2)])
		}
		clear(out)
		var l float32
		for c := 0; c < nsplit; c++ {
			p := parts[c*stride+r*(dv+2) : c*stride+(r+1)*(dv+2)]
			if p[1] == 0 {
				continue
			}
			w := expf(p[0] - m)
			l += p[1] * w
			for i, x := range p[2:] {
				out[i] += x * w
			}
		}
		inv := 1 / l
		var z float32
		for i := range out {
			out[i] *= inv
			z += out[i] * 0
		}
		if !finiteState(m, l) || z != 0 || (s.mask != nil && m <= lowest) {
			if err := s.exactRow(out, q[e*s.dk:(e+1)*s.dk], v, b, h, r); err != nil {
				return err
			}
		}
	}
	return nil
}

// exactRow recomputes runUnit's internal row r of sequence b, KV head h
// (query row q, output out) after its float32 computation met a
// non-finite value: with the caller's Options.Exact when set, else with
// the reference's float64 math.
func (s *shape) exactRow(out, q []float32, v cache.View, b, h, r int) error {
	if s.exact != nil {
		return s.exact(out, b, h*s.group+r%s.group, r/s.group)
	}
	return exactRow(out, q, v, s, b, h, r/s.group)
}

// finiteState reports whether a row's online-softmax state (max score m,
// sum of weights l) stayed finite: maxOf makes m NaN when a score was not
// finite, and l >= 1 whenever m is finite.
func finiteState(m, l float32) bool { return m-m == 0 && l-l == 0 && l > 0 }

// extRow maps runUnit's internal row r = i*group + g (query position i,
// head g of the group) to the row g*qLen + i of the q/dst layout.
func (s *shape) extRow(r int) int { return (r%s.group)*s.qLen + r/s.group }

var negInf = float32(math.Inf(-1))

func aligned16(b []byte) bool { return uintptr(unsafe.Pointer(unsafe.SliceData(b)))%2 == 0 }
