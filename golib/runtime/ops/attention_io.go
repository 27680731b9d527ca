package ops

import (
	"fmt"
	"math"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/mha"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// The Attention kernel computes in float32. For float16/bfloat16/float64
// inputs the float32 copies (a whole KV cache per layer and step on the
// decode path) come from a pool instead of fresh allocations, and 16-bit
// conversion runs in parallel with a fast path for normal numbers.

var f32Pool = sync.Pool{New: func() any { return new([]float32) }}

// f32Arena hands out pooled float32 buffers for one Compute call.
type f32Arena struct {
	threads int
	held    []*[]float32
	err     error
	// geom is the call's attention geometry (mha.PlanInto), pooled with
	// the arena so planning a call allocates nothing.
	geom mha.Geometry
}

// buffer returns n float32s (contents unspecified) owned until release.
func (a *f32Arena) buffer(n int) []float32 {
	p := f32Pool.Get().(*[]float32)
	if cap(*p) < n {
		*p = make([]float32, n)
	}
	a.held = append(a.held, p)
	return (*p)[:n]
}

func (a *f32Arena) release() {
	for _, p := range a.held {
		f32Pool.Put(p)
	}
	clear(a.held)
	a.held = a.held[:0] // an arena kept by its caller reuses the list
}

// f16ToF32 widens src into d: normal numbers by bit arithmetic (inlined:
// this loop runs over the whole cache); zeros, subnormals, Inf, NaN by
// codec.
func f16ToF32(d []float32, src []tensor.Float16Bits) {
	for i, h := range src {
		x := uint32(h)
		if em := x & 0x7fff; em-0x400 < 0x7800 {
			d[i] = math.Float32frombits((x&0x8000)<<16 | (em<<13 + (127-15)<<23))
		} else {
			d[i] = codec.F16ToF32(uint16(h))
		}
	}
}

// f32Arenas recycles the arenas of the Attention calls (an arena and its
// list per call would be two allocations).
var f32Arenas = sync.Pool{New: func() any { return new(f32Arena) }}

// f32 returns t's values as float32: the tensor's own data for float32,
// otherwise a converted pooled copy. The first failure is kept in a.err.
func (a *f32Arena) f32(t *tensor.Tensor) []float32 {
	if t.DType() == tensor.Float32 {
		return t.Float32()
	}
	dst := a.buffer(t.Len())
	const grain = 1 << 16
	switch t.DType() {
	case tensor.Float16:
		src := t.Float16()
		if chunks := (len(src) + grain - 1) / grain; a.threads <= 1 || chunks <= 1 {
			f16ToF32(dst, src) // no closure: a decode step's conversions allocate nothing
		} else {
			gemm.ForThreads(a.threads, chunks, func(c int) {
				lo, hi := c*grain, min((c+1)*grain, len(src))
				f16ToF32(dst[lo:hi], src[lo:hi])
			})
		}
	case tensor.BFloat16:
		for i, h := range t.BFloat16() {
			dst[i] = math.Float32frombits(uint32(h) << 16)
		}
	default:
		if err := tensor.ToFloat32(t, dst); err != nil && a.err == nil {
			a.err = err
		}
	}
	return dst
}

// concatPresent fills dst ([batch, kv_heads, total, dim] of past's type)
// with past's bytes followed by the new tokens of cur (3D or 4D).
func concatPresent(g *mha.Geometry, dst, past, cur *tensor.Tensor, dim int) error {
	if cur.DType() != dst.DType() || (past != nil && past.DType() != dst.DType()) {
		return fmt.Errorf("%w: present of %v from %v", errs.ErrType, dst.DType(), cur.DType())
	}
	es := dst.DType().Size()
	out, src := dst.Bytes(), cur.Bytes()
	var old []byte
	if past != nil {
		old = past.Bytes()
	}
	row := dim * es
	for b := range g.Batch {
		for h := range g.KVHeads {
			bh := b*g.KVHeads + h
			d := out[bh*g.TotalLen*row : (bh+1)*g.TotalLen*row]
			n := copy(d, old[bh*g.PastLen*row:(bh+1)*g.PastLen*row])
			if !g.Input3D {
				copy(d[n:], src[bh*g.KVLen*row:(bh+1)*g.KVLen*row])
				continue
			}
			for s := range g.KVLen {
				off := ((b*g.KVLen+s)*g.KVHeads + h) * row
				copy(d[n+s*row:n+(s+1)*row], src[off:off+row])
			}
		}
	}
	return nil
}

func prodInts(shape []int) int {
	n := 1
	for _, d := range shape {
		n *= d
	}
	return n
}
