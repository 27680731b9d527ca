package ops

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/mha"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// gqaMaxDecodeLen is the most new tokens a step may have to run on the
// streaming decode kernel (its q_len limit, for speculative verification).
const gqaMaxDecodeLen = 16

// gqaDecodeKernel routes decode-shaped steps to the streaming decode
// kernel (tests turn it off to run them on the mha unit too).
var gqaDecodeKernel = true

// gqaViews recycles the views that present a step's present buffers to the
// decode kernel.
var gqaViews = sync.Pool{New: func() any { return new(cache.TensorView) }}

// gqaOperands are the float32 views of a call's inputs.
type gqaOperands struct {
	q, k, v         []float32
	ldq, ldkv       int // elements per token row of q and of k/v
	kOff, vOff      int // offset of the first K/V head in a row
	cos, sin        []float32
	half            int // rotary pairs per head (0: no rotation)
	bias, sink      []float32
	biasShape       tensor.Shape
	presentK, presV *tensor.Tensor
	keyK, keyV      *tensor.Tensor // the key buffer (the presents without a window cache)
	elem            cache.ElemType
}

func (c *gqaCall) run(ctx *Context, ar *f32Arena, op *gqaOperands) error {
	if err := c.operands(ctx, ar, op); err != nil {
		return err
	}
	if err := c.assembleKeys(ctx, op); err != nil {
		return err
	}
	if c.windowCache {
		c.keepResident(op)
		if op.bias != nil {
			c.rebaseBias(op)
		}
	}
	ys := ctx.ScratchShape(3) // a literal shape would escape to the heap
	ys[0], ys[1], ys[2] = c.batch, c.seq, c.numHeads*c.head
	y, err := ctx.NewOutputUninit(gqaOutput, c.dt, ys)
	if err != nil {
		return err
	}
	if y.Len() == 0 {
		return nil
	}
	qf, err := c.queries(ctx, op, ar)
	if err != nil {
		return err
	}
	dst := f32Result(ctx, y)
	var res []float32 // [B, num_heads, S, D]
	if c.seq == 1 {
		res = dst // the same layout
	} else {
		res = ar.buffer(len(dst))
	}
	if c.decodable(op) {
		err = c.decode(op, qf, res, attentionThreads(ctx.Threads(), c.batch*c.numHeads*c.seq, c.keyLen, 2*c.head))
	} else {
		err = c.prefill(ctx, op, ar, qf, res)
	}
	if err != nil {
		return err
	}
	if c.seq != 1 {
		if err := c.toTokenMajor(ctx, dst, res); err != nil {
			return err
		}
	}
	return storeF32Result(y, dst)
}

// operands converts the inputs to float32 (views for float32 data) and
// allocates the present outputs.
func (c *gqaCall) operands(ctx *Context, ar *f32Arena, op *gqaOperands) error {
	nh, kvh, D := c.numHeads, c.kvHeads, c.head
	op.q = ar.f32(ctx.Input(gqaQuery))
	if c.packed {
		op.k, op.v = op.q, op.q
		op.ldq, op.ldkv = (nh+2*kvh)*D, (nh+2*kvh)*D
		op.kOff, op.vOff = nh*D, (nh+kvh)*D
	} else {
		op.k, op.v = ar.f32(ctx.Input(gqaKey)), ar.f32(ctx.Input(gqaValue))
		op.ldq, op.ldkv = nh*D, kvh*D
	}
	if c.rotary {
		op.cos, op.sin = ar.f32(ctx.Input(gqaCos)), ar.f32(ctx.Input(gqaSin))
		op.half = ctx.Input(gqaCos).Shape()[1]
	}
	if b := ctx.Input(gqaBias); b != nil {
		bs := b.Shape()
		if b.DType() != c.dt {
			return fmt.Errorf("%w: attention_bias %v, query %v", errs.ErrType, b.DType(), c.dt)
		}
		if len(bs) != 4 || (bs[0] != 1 && bs[0] != c.batch) || (bs[1] != 1 && bs[1] != nh) || bs[2] != c.seq || bs[3] != c.total {
			return fmt.Errorf("%w: attention_bias %v, want [%d or 1, %d or 1, %d, %d]", errs.ErrShape, bs, c.batch, nh, c.seq, c.total)
		}
		op.bias, op.biasShape = ar.f32(b), bs
	}
	// a head_sink with smooth_softmax=1 is the sink alone, as onnxruntime
	// reads them (its smooth softmax's extra logit is the head's sink, 0
	// without one)
	if s := ctx.Input(gqaHeadSink); s != nil {
		if s.DType() != c.dt || !s.Shape().Equal(tensor.Shape{nh}) {
			return fmt.Errorf("%w: head_sink %v %v, want %v [%d]", errs.ErrShape, s.DType(), s.Shape(), c.dt, nh)
		}
		op.sink = ar.f32(s)
	}
	if ar.err != nil {
		return ar.err
	}
	switch c.dt {
	case tensor.Float32:
		op.elem = cache.Float32
	case tensor.Float16:
		op.elem = cache.Float16
	default:
		op.elem = cache.BFloat16
	}
	shape := ctx.ScratchShape(4) // a literal shape would escape to the heap
	shape[0], shape[1], shape[2], shape[3] = c.batch, kvh, c.present, D
	for i, dst := range []**tensor.Tensor{&op.presentK, &op.presV} {
		slot := gqaPresentKey + i
		var err error
		if ctx.OutputWanted(slot) {
			*dst, err = ctx.NewOutputUninit(slot, c.dt, shape) // every row is written
		} else {
			*dst, err = tensor.New(c.dt, shape)
		}
		if err != nil {
			return err
		}
	}
	op.keyK, op.keyV = op.presentK, op.presV
	if c.windowCache {
		ks := tensor.Shape{c.batch, kvh, c.keyLen, D}
		var err error
		if op.keyK, err = tensor.New(c.dt, ks); err != nil {
			return err
		}
		if op.keyV, err = tensor.New(c.dt, ks); err != nil {
			return err
		}
	}
	return nil
}

// assembleKeys writes the key buffer, per (sequence, KV head): the past's
// first offsets[b] rows, the S new rows (K rotated) and zeros up to the end
// of the buffer, as onnxruntime does for separate past and present buffers.
// (Sequence, KV head) pairs are split over the threads.
func (c *gqaCall) assembleKeys(ctx *Context, op *gqaOperands) error {
	D, kvh, C := c.head, c.kvHeads, c.keyLen
	row := D * c.dt.Size()
	var pk, pv []byte
	if c.past > 0 {
		pk, pv = c.pastK.Bytes(), c.pastV.Bytes()
	}
	kb, vb := op.keyK.Bytes(), op.keyV.Bytes()
	kf, vf := op.keyK.Float32(), op.keyV.Float32() // float32 buffers are written directly
	grain := max(1, (1<<16)/max(1, C*row))
	if n := c.batch * kvh; ctx.Serial(n, grain) {
		kk := gqaKeyRows{c: c, op: op, pk: pk, pv: pv, kb: kb, vb: vb, kf: kf, vf: vf}
		kk.run(0, n) // no closure: a one-thread step allocates nothing here
		return nil
	}
	kk := &gqaKeyRows{c: c, op: op, pk: pk, pv: pv, kb: kb, vb: vb, kf: kf, vf: vf}
	return ctx.ParallelFor(c.batch*kvh, grain, kk.run)
}

// gqaKeyRows is assembleKeys' work over (sequence, KV head) pairs.
type gqaKeyRows struct {
	c              *gqaCall
	op             *gqaOperands
	pk, pv, kb, vb []byte
	kf, vf         []float32
}

func (w *gqaKeyRows) run(lo, hi int) {
	c, op, pk, pv, kb, vb, kf, vf := w.c, w.op, w.pk, w.pv, w.kb, w.vb, w.kf, w.vf
	S, D, kvh, C := c.seq, c.head, c.kvHeads, c.keyLen
	row := D * c.dt.Size()
	var tmp []float32
	if kf == nil {
		tmp = make([]float32, D)
	}
	for head := lo; head < hi; head++ {
		b, kh := head/kvh, head%kvh
		off := c.offsets[b]
		for i, dst := range [][]byte{kb, vb} {
			d := dst[head*C*row : (head+1)*C*row]
			if off > 0 {
				src := pk
				if i == 1 {
					src = pv
				}
				copy(d[:off*row], src[head*c.past*row:(head*c.past+off)*row])
			}
			clear(d[(off+S)*row:])
		}
		for s := range S {
			base := (b*S + s) * op.ldkv
			kr := op.k[base+op.kOff+kh*D : base+op.kOff+(kh+1)*D]
			vr := op.v[base+op.vOff+kh*D : base+op.vOff+(kh+1)*D]
			r := head*C + off + s
			kd := tmp
			if kf != nil {
				kd = kf[r*D : (r+1)*D]
				copy(vf[r*D:(r+1)*D], vr)
			}
			copy(kd, kr)
			if c.rotary {
				p := c.positions[b*S+s]
				rotateHead(kd, kr, op.cos[p*op.half:(p+1)*op.half], op.sin[p*op.half:(p+1)*op.half], c.interleaved)
			}
			if kf == nil {
				encodeRow(kb[r*row:(r+1)*row], c.dt, kd)
				encodeRow(vb[r*row:(r+1)*row], c.dt, vr)
			}
		}
	}
}

// keepResident writes a window cache's presents: rows 0..L(T_b)-1 are the
// last L(T_b) positions of the key buffer, the rest zeros.
func (c *gqaCall) keepResident(op *gqaOperands) {
	row := c.head * c.dt.Size()
	C, K := c.present, c.keyLen
	for b := range c.batch {
		keep := c.resident(c.ends[b])
		from := c.lens[b] - keep // the key-buffer row of the first kept position
		for kh := range c.kvHeads {
			head := b*c.kvHeads + kh
			for _, t := range [][2]*tensor.Tensor{{op.presentK, op.keyK}, {op.presV, op.keyV}} {
				d, src := t[0].Bytes()[head*C*row:(head+1)*C*row], t[1].Bytes()[head*K*row:]
				copy(d[:keep*row], src[from*row:(from+keep)*row])
				clear(d[keep*row:])
			}
		}
	}
}

// rebaseBias re-indexes attention_bias, whose columns are absolute key
// positions, to the rows of a window cache's key buffer ([B, heads or 1,
// S, keyLen]; sequence b's row j is position posBase[b] - offsets[b] + j).
func (c *gqaCall) rebaseBias(op *gqaOperands) {
	bs := op.biasShape
	hb, S, K, tot := bs[1], c.seq, c.keyLen, c.total
	out := make([]float32, c.batch*hb*S*K)
	for b := range c.batch {
		sb := b
		if bs[0] == 1 {
			sb = 0
		}
		base := c.posBase[b] - c.offsets[b]
		for h := range hb {
			for s := range S {
				src := op.bias[((sb*hb+h)*S+s)*tot:][:tot]
				dst := out[((b*hb+h)*S+s)*K:][:K]
				for j := range min(K, c.lens[b]) {
					if p := base + j; p >= 0 && p < tot {
						dst[j] = src[p]
					}
				}
			}
		}
	}
	op.bias, op.biasShape = out, tensor.Shape{c.batch, hb, S, K}
}

// encodeRow stores float32 values as dt (float32, float16 or bfloat16,
// rounded to nearest even) into dst.
func encodeRow(dst []byte, dt tensor.DType, src []float32) {
	switch dt {
	case tensor.Float32:
		for i, x := range src {
			binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
		}
	case tensor.Float16:
		for i, x := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], codec.F32ToF16(x))
		}
	default:
		for i, x := range src {
			binary.LittleEndian.PutUint16(dst[2*i:], codec.F32ToBF16(x))
		}
	}
}

// queries returns Q as float32 [B, num_heads, S, D], rotated: the query
// input itself when it already is (float32, one token, not packed, no
// rotation).
func (c *gqaCall) queries(ctx *Context, op *gqaOperands, ar *f32Arena) ([]float32, error) {
	B, S, D, nh := c.batch, c.seq, c.head, c.numHeads
	if S == 1 && !c.packed && !c.rotary {
		return op.q, nil
	}
	qf := ar.buffer(B * nh * S * D)
	if grain := max(1, (1<<14)/(nh*D)); !ctx.Serial(B*S, grain) {
		w := &gqaQueryRows{c: c, op: op, qf: qf}
		return qf, ctx.ParallelFor(B*S, grain, w.run)
	}
	w := gqaQueryRows{c: c, op: op, qf: qf}
	w.run(0, B*S) // no closure: a one-thread step allocates nothing here
	return qf, nil
}

// gqaQueryRows is queries' work over tokens.
type gqaQueryRows struct {
	c  *gqaCall
	op *gqaOperands
	qf []float32
}

func (w *gqaQueryRows) run(lo, hi int) {
	c, op, qf := w.c, w.op, w.qf
	S, D, nh := c.seq, c.head, c.numHeads
	for t := lo; t < hi; t++ {
		b, s := t/S, t%S
		var cs, sn []float32
		if c.rotary {
			p := c.positions[t]
			cs, sn = op.cos[p*op.half:(p+1)*op.half], op.sin[p*op.half:(p+1)*op.half]
		}
		for h := range nh {
			src := op.q[t*op.ldq+h*D : t*op.ldq+(h+1)*D]
			dst := qf[((b*nh+h)*S+s)*D : ((b*nh+h)*S+s+1)*D]
			copy(dst, src)
			if c.rotary {
				rotateHead(dst, src, cs, sn, c.interleaved)
			}
		}
	}
}

// toTokenMajor moves [B, num_heads, S, D] results into the [B, S,
// num_heads*D] output.
func (c *gqaCall) toTokenMajor(ctx *Context, dst, res []float32) error {
	S, D, nh := c.seq, c.head, c.numHeads
	return ctx.ParallelFor(c.batch*nh, max(1, (1<<14)/(S*D)), func(lo, hi int) {
		for bh := lo; bh < hi; bh++ {
			b, h := bh/nh, bh%nh
			for s := range S {
				copy(dst[((b*S+s)*nh+h)*D:((b*S+s)*nh+h+1)*D], res[(bh*S+s)*D:(bh*S+s+1)*D])
			}
		}
	})
}

// decodable reports whether the step fits the streaming decode kernel:
// every sequence's new tokens end its buffer (a step after a past, or a
// prompt with no padding), few new tokens, and a plain softmax.
func (c *gqaCall) decodable(op *gqaOperands) bool {
	if !gqaDecodeKernel || c.seq < 1 || c.seq > gqaMaxDecodeLen || c.smooth || op.sink != nil || op.bias != nil || c.scale < 0 {
		return false
	}
	for b, T := range c.lens {
		if c.offsets[b] != T-c.seq {
			return false
		}
	}
	return true
}

// decode runs the streaming decode kernel over the present buffers in
// place: sequence b's keys are rows 0..T_b-1 of each head.
func (c *gqaCall) decode(op *gqaOperands, qf, res []float32, threads int) error {
	view := gqaViews.Get().(*cache.TensorView)
	defer gqaViews.Put(view)
	if err := view.Reset(op.elem, c.batch, c.kvHeads, c.keyLen, c.head, c.head, op.keyK.Bytes(), op.keyV.Bytes(), c.lens); err != nil {
		return fmt.Errorf("%w: %w", errs.ErrInvalidArgument, err)
	}
	o := cpu.Options{Scale: c.scale, Softcap: c.softcap, Threads: threads}
	if c.window > 0 {
		o.Window = c.window
	}
	if err := cpu.Attention(res, qf, c.seq, c.numHeads, view, o); err != nil {
		if errors.Is(err, cache.ErrInvalidArgument) {
			return fmt.Errorf("%w: %w", errs.ErrInvalidArgument, err)
		}
		return err
	}
	return nil
}

// prefill runs the Attention operator's unit over the present buffers:
// causal from each sequence's offset, limited to its T_b valid keys.
func (c *gqaCall) prefill(ctx *Context, op *gqaOperands, ar *f32Arena, qf, res []float32) error {
	B, S, D, nh, kvh, C := c.batch, c.seq, c.head, c.numHeads, c.kvHeads, c.keyLen
	a := mha.Attrs{Scale: c.scale, HasScale: c.scale != 0, Softcap: c.softcap, IsCausal: true,
		SmoothSoftmax: c.smooth || op.sink != nil}
	if c.window > 0 {
		a.SlidingWindow, a.LeftWindow, a.RightWindow = true, c.window-1, -1
	}
	sh := mha.Shapes{Q: []int{B, nh, S, D}, K: []int{B, kvh, C, D}, V: []int{B, kvh, C, D}}
	in := mha.Inputs{Q: qf, HeadSink: op.sink}
	if op.bias != nil {
		sh.Mask, in.Mask.Float = op.biasShape, op.bias
	}
	if !c.first { // query s of sequence b sits at T_b - S + s
		sh.NonpadKVSeqlen = []int{B}
		in.NonpadKVSeqlen = make([]int64, B)
		for b, T := range c.lens {
			in.NonpadKVSeqlen[b] = int64(T)
		}
	}
	in.K, in.V = ar.f32(op.keyK), ar.f32(op.keyV)
	if ar.err != nil {
		return ar.err
	}
	g, err := mha.Plan(a, sh)
	if err != nil {
		return mhaError(err)
	}
	g.Threads = ctx.Threads()
	return mhaError(g.Run(in, mha.Outputs{Y: res}))
}

// mhaError maps package mha's errors onto the runtime's.
func mhaError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, mha.ErrShape):
		return fmt.Errorf("%w: %w", errs.ErrShape, err)
	case errors.Is(err, mha.ErrValue):
		return fmt.Errorf("%w: %w", errs.ErrInvalidArgument, err)
	}
	return err
}
