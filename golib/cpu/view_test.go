package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// testView is a test-only cache.View: contiguous token-major storage per
// (sequence, KV head), optionally presented as fixed-size pages (several
// segments) to exercise the kernels' segment walking, and an optional
// window start per sequence (positions below it are "evicted": reading them
// is a test failure).
type testView struct {
	elem        cache.ElemType
	batch, kvh  int
	dk, dv      int
	lens, ws    []int
	page        int        // segment size in tokens; 0: one segment
	k, v        [][][]byte // [b][h] rows
	read        atomic.Int64
	evictedRead atomic.Bool // a kernel asked for positions below the window start
	badSegment  bool        // return a segment with a wrong start (error path)
}

// newTestView fills a view with normal random K/V rows, rounded to elem.
func newTestView(rng *rand.Rand, elem cache.ElemType, kvh, dk, dv int, lens []int) *testView {
	tv := &testView{elem: elem, batch: len(lens), kvh: kvh, dk: dk, dv: dv,
		lens: lens, ws: make([]int, len(lens))}
	tv.k = make([][][]byte, len(lens))
	tv.v = make([][][]byte, len(lens))
	for b, L := range lens {
		tv.k[b] = make([][]byte, kvh)
		tv.v[b] = make([][]byte, kvh)
		for h := 0; h < kvh; h++ {
			tv.k[b][h] = encodeRows(rng, elem, L*dk)
			tv.v[b][h] = encodeRows(rng, elem, L*dv)
		}
	}
	return tv
}

func encodeRows(rng *rand.Rand, elem cache.ElemType, n int) []byte {
	out := make([]byte, n*elem.Size())
	for i := 0; i < n; i++ {
		x := 3.4*rng.Float32() - 1.7 // uniform, unit-ish variance, cheap to draw
		switch elem {
		case cache.Float32:
			binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
		case cache.Float16:
			binary.LittleEndian.PutUint16(out[2*i:], codec.F32ToF16(x))
		case cache.BFloat16:
			binary.LittleEndian.PutUint16(out[2*i:], codec.F32ToBF16(x))
		}
	}
	return out
}

func (tv *testView) ElemType() cache.ElemType { return tv.elem }
func (tv *testView) Batch() int               { return tv.batch }
func (tv *testView) KVHeads() int             { return tv.kvh }
func (tv *testView) HeadDimK() int            { return tv.dk }
func (tv *testView) HeadDimV() int            { return tv.dv }
func (tv *testView) SeqLen(b int) int         { return tv.lens[b] }
func (tv *testView) WindowStart(b int) int    { return tv.ws[b] }
func (tv *testView) AddBytesRead(n int64)     { tv.read.Add(n) }

func (tv *testView) AppendSegments(dst []cache.Segment, b, h, from, to int) []cache.Segment {
	if from < tv.ws[b] {
		tv.evictedRead.Store(true)
	}
	rk, rv := tv.dk*tv.elem.Size(), tv.dv*tv.elem.Size()
	for pos := from; pos < to; {
		end := to
		if tv.page > 0 {
			end = min(to, (pos/tv.page+1)*tv.page)
		}
		sg := cache.Segment{Start: pos, Len: end - pos,
			K: tv.k[b][h][pos*rk : end*rk], V: tv.v[b][h][pos*rv : end*rv]}
		if tv.badSegment {
			sg.Start++
		}
		dst = append(dst, sg)
		pos = end
	}
	return dst
}

// randHalfVec returns n random values rounded to bfloat16 (bf) or float16,
// as the 16-bit encodings h and their exact float32 values f.
func randHalfVec(rng *rand.Rand, n int, bf bool) (f []float32, h []uint16) {
	f, h = randVec(rng, n, 1), make([]uint16, n)
	if bf {
		codec.EncodeBF16(h, f)
		codec.DecodeBF16(f, h)
	} else {
		codec.EncodeF16(h, f)
		codec.DecodeF16(f, h)
	}
	return f, h
}

func randVec(rng *rand.Rand, n int, scale float32) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = scale * float32(rng.NormFloat64())
	}
	return out
}
