package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// quantView is a test-only cache.View with sealed (quantized) chunks: for
// every sequence, positions below sealed[b] (a multiple of the group) are
// stored as chunks of cfg.Group tokens quantized by quantizeChunk, the rest
// (the residual window) natively in native (a testView, optionally paged).
// orig keeps the float32 values before quantization and rounding, for the
// comparison with unquantized attention.
type quantView struct {
	native      *testView
	orig        *testView // float32, the same values unquantized
	cfg         cache.QuantConfig
	kgroup      int // RowGroup(dk, Group)
	vgroup      int
	sealed      []int
	kq, vq      [][][]byte    // [b][h] quantized rows of the sealed positions
	ks, kz      [][][]float32 // per channel: [chunk*dk+j]; per token: [pos*ngk+g]
	vs, vz      [][][]float32 // [pos*ngv+g]
	evictedRead atomic.Bool
	mutate      func(*cache.Segment) // applied to every sealed segment returned (error tests)
}

// quantViewOpts are the knobs of newQuantView.
type quantViewOpts struct {
	elem     cache.ElemType // native type of the residual rows
	kvh      int
	dk, dv   int
	lens     []int
	cfg      cache.QuantConfig
	page     int // page size of the residual rows (0: one segment)
	outliers int // K channels whose values are multiplied by outlierGain
}

// outlierGain is the magnitude of the synthetic outlier K channels (as
// reported for real LLMs: a few channels an order of magnitude larger).
const outlierGain = 20

// newQuantView draws normal-ish K/V rows (as newTestView) and stores them.
func newQuantView(rng *rand.Rand, o quantViewOpts) *quantView {
	g := o.cfg.Group
	if g == 0 {
		g = cache.DefaultQuantGroup
	}
	qv := &quantView{cfg: o.cfg, kgroup: cache.RowGroup(o.dk, g), vgroup: cache.RowGroup(o.dv, g)}
	qv.cfg.Group = g
	qv.orig = newTestView(rng, cache.Float32, o.kvh, o.dk, o.dv, o.lens)
	if o.outliers > 0 {
		for b := range qv.orig.k {
			for h := range qv.orig.k[b] {
				rows := qv.orig.k[b][h]
				for p := 0; p < o.lens[b]; p++ {
					for c := 0; c < o.outliers; c++ {
						j := (7 + c*o.dk/o.outliers) % o.dk
						i := 4 * (p*o.dk + j)
						x := math.Float32frombits(binary.LittleEndian.Uint32(rows[i:]))
						binary.LittleEndian.PutUint32(rows[i:], math.Float32bits(outlierGain*x))
					}
				}
			}
		}
	}
	qv.native = &testView{elem: o.elem, batch: len(o.lens), kvh: o.kvh, dk: o.dk, dv: o.dv,
		lens: o.lens, ws: make([]int, len(o.lens)), page: o.page}
	nb := len(o.lens)
	qv.sealed = make([]int, nb)
	qv.native.k, qv.native.v = make([][][]byte, nb), make([][][]byte, nb)
	qv.kq, qv.vq = make([][][]byte, nb), make([][][]byte, nb)
	qv.ks, qv.kz = make([][][]float32, nb), make([][][]float32, nb)
	qv.vs, qv.vz = make([][][]float32, nb), make([][][]float32, nb)
	for b, L := range o.lens {
		qv.sealed[b] = max(L-o.cfg.Residual, 0) / g * g
		for _, p := range []*[][][]byte{&qv.native.k, &qv.native.v, &qv.kq, &qv.vq} {
			(*p)[b] = make([][]byte, o.kvh)
		}
		for _, p := range []*[][][]float32{&qv.ks, &qv.kz, &qv.vs, &qv.vz} {
			(*p)[b] = make([][]float32, o.kvh)
		}
		for h := 0; h < o.kvh; h++ {
			k := decodeRow(qv.orig.k[b][h], L*o.dk, cache.Float32)
			v := decodeRow(qv.orig.v[b][h], L*o.dv, cache.Float32)
			qv.native.k[b][h] = encodeF32(k, o.elem)
			qv.native.v[b][h] = encodeF32(v, o.elem)
			n := qv.sealed[b]
			if o.cfg.KAxis == cache.KPerChannel {
				for c := 0; c < n; c += g {
					rows, s, z := quantizeChannels(k[c*o.dk:(c+g)*o.dk], o.dk, o.cfg.Format)
					qv.kq[b][h] = append(qv.kq[b][h], rows...)
					qv.ks[b][h] = append(qv.ks[b][h], s...)
					qv.kz[b][h] = append(qv.kz[b][h], z...)
				}
			} else {
				qv.kq[b][h], qv.ks[b][h], qv.kz[b][h] = quantizeTokens(k[:n*o.dk], o.dk, qv.kgroup, o.cfg.Format)
			}
			qv.vq[b][h], qv.vs[b][h], qv.vz[b][h] = quantizeTokens(v[:n*o.dv], o.dv, qv.vgroup, o.cfg.Format)
		}
	}
	return qv
}

func encodeF32(x []float32, elem cache.ElemType) []byte {
	out := make([]byte, len(x)*elem.Size())
	for i, v := range x {
		switch elem {
		case cache.Float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
		case cache.Float16:
			binary.LittleEndian.PutUint16(out[2*i:], codec.F32ToF16(v))
		case cache.BFloat16:
			binary.LittleEndian.PutUint16(out[2*i:], codec.F32ToBF16(v))
		}
	}
	return out
}

// quantParams and quantOne mirror the sealing formulas of the cache
// (golib/cache/quant_codec.go, unexported there): int8 scale = max|x|/127,
// int4 zero = min x and scale = (max-min)/15, a constant group scale 0;
// rounding to nearest even. The test view seals its own chunks so that it
// can present any segment layout (windows, evicted prefixes, malformed
// segments); TestQuantRealCache runs the cache's own sealing.
func quantParams(lo, hi float32, f cache.QuantFormat) (s, z float32) {
	if f == cache.QuantInt8 {
		return max(-lo, hi) / 127, 0
	}
	return (hi - lo) / 15, lo
}

func quantOne(x, s, z float32, f cache.QuantFormat) int {
	if s == 0 {
		return 0
	}
	if f == cache.QuantInt8 {
		return int(min(max(math.RoundToEven(float64(x/s)), -127), 127))
	}
	return int(min(max(math.RoundToEven(float64(float32(x-z)/s)), 0), 15))
}

// packRow stores the integers of one row in the format's byte layout.
func packRow(dst []byte, qi []int, f cache.QuantFormat) {
	for j, v := range qi {
		if f == cache.QuantInt8 {
			dst[j] = byte(int8(v))
		} else {
			dst[j>>1] |= byte(v) << (4 * (j & 1))
		}
	}
}

// quantizeChannels quantizes the rows of x (row length d) with one scale
// (and zero) per channel over all rows: K per channel within a chunk.
func quantizeChannels(x []float32, d int, f cache.QuantFormat) (rows []byte, s, z []float32) {
	n := len(x) / d
	s, z = make([]float32, d), make([]float32, d)
	for j := 0; j < d; j++ {
		lo, hi := x[j], x[j]
		for t := 0; t < n; t++ {
			lo, hi = min(lo, x[t*d+j]), max(hi, x[t*d+j])
		}
		s[j], z[j] = quantParams(lo, hi, f)
	}
	rb := f.RowBytes(d)
	rows = make([]byte, n*rb)
	qi := make([]int, d)
	for t := 0; t < n; t++ {
		for j := range qi {
			qi[j] = quantOne(x[t*d+j], s[j], z[j], f)
		}
		packRow(rows[t*rb:(t+1)*rb], qi, f)
	}
	if f == cache.QuantInt8 {
		z = nil
	}
	return rows, s, z
}

// quantizeTokens quantizes every row of x (row length d) with one scale (and
// zero) per group of g elements: V, and K per token.
func quantizeTokens(x []float32, d, g int, f cache.QuantFormat) (rows []byte, s, z []float32) {
	n, ng := len(x)/d, d/g
	rb := f.RowBytes(d)
	rows = make([]byte, n*rb)
	s, z = make([]float32, n*ng), make([]float32, n*ng)
	qi := make([]int, d)
	for t := 0; t < n; t++ {
		for gi := 0; gi < ng; gi++ {
			grp := x[t*d+gi*g : t*d+(gi+1)*g]
			lo, hi := grp[0], grp[0]
			for _, v := range grp {
				lo, hi = min(lo, v), max(hi, v)
			}
			sc, zr := quantParams(lo, hi, f)
			s[t*ng+gi], z[t*ng+gi] = sc, zr
			for j, v := range grp {
				qi[gi*g+j] = quantOne(v, sc, zr, f)
			}
		}
		packRow(rows[t*rb:(t+1)*rb], qi, f)
	}
	if f == cache.QuantInt8 {
		z = nil
	}
	return rows, s, z
}

func (qv *quantView) ElemType() cache.ElemType { return qv.native.elem }
func (qv *quantView) Batch() int               { return qv.native.batch }
func (qv *quantView) KVHeads() int             { return qv.native.kvh }
func (qv *quantView) HeadDimK() int            { return qv.native.dk }
func (qv *quantView) HeadDimV() int            { return qv.native.dv }
func (qv *quantView) SeqLen(b int) int         { return qv.native.lens[b] }
func (qv *quantView) WindowStart(b int) int    { return qv.native.ws[b] }
func (qv *quantView) AddBytesRead(n int64)     { qv.native.read.Add(n) }

// AppendSegments returns the sealed chunks intersecting [from, to) (one
// segment per chunk, per-token scales sliced to the segment's rows), then
// the native rows.
func (qv *quantView) AppendSegments(dst []cache.Segment, b, h, from, to int) []cache.Segment {
	if from < qv.native.ws[b] {
		qv.evictedRead.Store(true)
	}
	f, g := qv.cfg.Format, qv.cfg.Group
	dk, dv := qv.native.dk, qv.native.dv
	rbk, rbv := f.RowBytes(dk), f.RowBytes(dv)
	ngk, ngv := dk/qv.kgroup, dv/qv.vgroup
	int4 := f == cache.QuantInt4
	pos := from
	for pos < to && pos < qv.sealed[b] {
		c := pos / g
		end := min(to, (c+1)*g)
		sg := cache.Segment{Start: pos, Len: end - pos,
			K: qv.kq[b][h][pos*rbk : end*rbk], V: qv.vq[b][h][pos*rbv : end*rbv]}
		q := cache.QuantSegment{Format: f, KAxis: qv.cfg.KAxis, KGroup: qv.kgroup, VGroup: qv.vgroup,
			VScale: qv.vs[b][h][pos*ngv : end*ngv]}
		if int4 {
			q.VZero = qv.vz[b][h][pos*ngv : end*ngv]
		}
		if qv.cfg.KAxis == cache.KPerChannel {
			q.KScale = qv.ks[b][h][c*dk : (c+1)*dk]
			if int4 {
				q.KZero = qv.kz[b][h][c*dk : (c+1)*dk]
			}
		} else {
			q.KScale = qv.ks[b][h][pos*ngk : end*ngk]
			if int4 {
				q.KZero = qv.kz[b][h][pos*ngk : end*ngk]
			}
		}
		sg.Q = q
		dst = append(dst, sg)
		if qv.mutate != nil {
			qv.mutate(&dst[len(dst)-1])
		}
		pos = end
	}
	if pos < to {
		dst = qv.native.AppendSegments(dst, b, h, pos, to)
	}
	return dst
}
