package mha

import (
	"sync/atomic"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
)

// Decode-shaped calls (a few new query tokens against a past) are a
// bandwidth problem: each K/V byte is used by only the query heads of its
// group. The general path materializes a [rows, total] score block through a
// product and copies the whole past into the present outputs first, reading
// it twice. The streaming kernel of package cpu reads each K/V byte once with
// an online softmax; the adapter below hands it the past and the new tokens
// in place and copies a range into the present outputs just before the
// kernel reads it, so the copy and the attention share one pass over the
// past (the kernel then reads bytes that are still in the core's caches).

// streamDecode and unitDecode enable the streaming kernel of package cpu and
// the streaming unit on the gemm pool (tests and benchmarks turn them off to
// compare with the general path).
var streamDecode, unitDecode = true, true

// maxStreamQLen is the largest query length sent to the streaming kernel
// (the kernel's own limit; above it the general path is faster anyway).
const maxStreamQLen = 16

// streamable reports whether cpu.Attention computes exactly this call (see
// streamMath; its query and output layout is 4D, which 3D matches only for
// one token). threads must not be below the kernel pool's, which has no
// per-call bound.
func (g *Geometry) streamable(out Outputs) bool {
	return streamDecode && g.Batch > 0 && g.KVHeads > 0 && g.HeadDimK > 0 && g.HeadDimV > 0 &&
		g.streamMath(out) && g.QLen <= maxStreamQLen && (!g.Input3D || g.QLen == 1) &&
		(g.Threads <= 0 || g.Threads >= cpu.Threads())
}

// runStream computes the call with cpu.Attention. Q and Y have the kernel's
// [batch, q_heads, q_len, dim] layout here (4D, or 3D with one token).
func (g *Geometry) runStream(in Inputs, out Outputs) error {
	v := &pastView{g: g, in: in, out: out}
	if err := cpu.Attention(out.Y, in.Q, g.QLen, g.QHeads, v, cpu.Options{Scale: g.Scale}); err != nil {
		return err
	}
	// The kernel asks for every key of every (sequence, head) once; should
	// it ever skip a range, the present outputs are completed here.
	if (out.PresentKey != nil || out.PresentValue != nil) &&
		v.copied.Load() != int64(g.Batch*g.KVHeads*g.TotalLen) {
		g.concat(in.PastKey, in.K, out.PresentKey, g.HeadDimK)
		g.concat(in.PastValue, in.V, out.PresentValue, g.HeadDimV)
	}
	return nil
}

// pastView presents past_key/past_value followed by the new K/V tokens as a
// cache.View without copying them, and fills the present outputs range by
// range as the kernel requests the ranges.
type pastView struct {
	g      *Geometry
	in     Inputs
	out    Outputs
	copied atomic.Int64 // positions copied into the present outputs
}

func (v *pastView) ElemType() cache.ElemType { return cache.Float32 }
func (v *pastView) Batch() int               { return v.g.Batch }
func (v *pastView) KVHeads() int             { return v.g.KVHeads }
func (v *pastView) HeadDimK() int            { return v.g.HeadDimK }
func (v *pastView) HeadDimV() int            { return v.g.HeadDimV }
func (v *pastView) SeqLen(int) int           { return v.g.TotalLen }
func (v *pastView) WindowStart(int) int      { return 0 }
func (v *pastView) AddBytesRead(int64)       {}

// AppendSegments returns the past part of [from, to) as one segment and the
// new tokens as one segment (4D) or one per token (3D, where a head's rows
// are interleaved with the other heads'), after copying them into the
// present outputs when those are wanted.
func (v *pastView) AppendSegments(dst []cache.Segment, b, h, from, to int) []cache.Segment {
	g := v.g
	dk, dv := g.HeadDimK, g.HeadDimV
	bh := b*g.KVHeads + h
	if from < g.PastLen {
		end := min(to, g.PastLen)
		pk := v.in.PastKey[(bh*g.PastLen+from)*dk : (bh*g.PastLen+end)*dk]
		pv := v.in.PastValue[(bh*g.PastLen+from)*dv : (bh*g.PastLen+end)*dv]
		v.copyRows(bh, from, pk, pv)
		dst = append(dst, cache.Segment{Start: from, Len: end - from, K: bytesOf(pk), V: bytesOf(pv)})
		from = end
	}
	if from >= to {
		return dst
	}
	s0, s1 := from-g.PastLen, to-g.PastLen
	if !g.Input3D {
		k := v.in.K[(bh*g.KVLen+s0)*dk : (bh*g.KVLen+s1)*dk]
		vv := v.in.V[(bh*g.KVLen+s0)*dv : (bh*g.KVLen+s1)*dv]
		v.copyRows(bh, from, k, vv)
		return append(dst, cache.Segment{Start: from, Len: to - from, K: bytesOf(k), V: bytesOf(vv)})
	}
	for s := s0; s < s1; s++ {
		ko := (b*g.KVLen+s)*g.KVHeads*dk + h*dk
		vo := (b*g.KVLen+s)*g.KVHeads*dv + h*dv
		k, vv := v.in.K[ko:ko+dk], v.in.V[vo:vo+dv]
		v.copyRows(bh, g.PastLen+s, k, vv)
		dst = append(dst, cache.Segment{Start: g.PastLen + s, Len: 1, K: bytesOf(k), V: bytesOf(vv)})
	}
	return dst
}

// copyRows writes the rows k and v of (sequence, head) bh at position pos
// into the present outputs that are wanted.
func (v *pastView) copyRows(bh, pos int, k, vv []float32) {
	g := v.g
	if pk := v.out.PresentKey; pk != nil {
		copy(pk[(bh*g.TotalLen+pos)*g.HeadDimK:], k)
	}
	if pv := v.out.PresentValue; pv != nil {
		copy(pv[(bh*g.TotalLen+pos)*g.HeadDimV:], vv)
	}
	if v.out.PresentKey != nil || v.out.PresentValue != nil {
		v.copied.Add(int64(len(k) / g.HeadDimK))
	}
}

func bytesOf(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), len(x)*4)
}
