package ops

import (
	"fmt"
	"math"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("com.microsoft", "GroupQueryAttention", 1, 0, newGroupQueryAttention)
}

// GroupQueryAttention inputs and outputs by position (onnxruntime's
// contrib schema).
const (
	gqaQuery, gqaKey, gqaValue, gqaPastKey, gqaPastValue, gqaSeqlensK, gqaTotalSeqLen = 0, 1, 2, 3, 4, 5, 6
	gqaCos, gqaSin, gqaPositionIDs, gqaBias, gqaHeadSink                              = 7, 8, 9, 10, 11
	gqaKScale, gqaVScale, gqaQNorm, gqaKNorm, gqaQuerySeqlens                         = 12, 13, 14, 15, 16
	gqaOutput, gqaPresentKey, gqaPresentValue, gqaOutputQK                            = 0, 1, 2, 3
)

// gqaAttrs are GroupQueryAttention's attributes.
type gqaAttrs struct {
	numHeads, kvHeads int
	scale, softcap    float32 // scale 0: 1/sqrt(head_size)
	window            int     // local_window_size: keys p-window+1 .. p; -1: none
	rotary            bool
	interleaved       bool
	smooth            bool
	windowCache       bool // sliding_window_cache: window-sized buffers, evicting internally
}

// newGroupQueryAttention: com.microsoft GroupQueryAttention on the tensor
// path, as onnxruntime's CPU provider computes it (checked against 1.32):
//
//   - query [B, S, num_heads*D] (or packed [B, S, (num_heads+2*kv_num_heads)*D]
//     with key and value omitted), key/value [B, S, kv_num_heads*D];
//     past_key/past_value [B, kv_num_heads, P, D], present of
//     max(total_sequence_length, P) positions (the buffer onnxruntime-genai
//     shares between past and present).
//   - seqlens_k[b] + 1 = T_b is sequence b's length after the step. A call is
//     the first prompt when S == total_sequence_length: then the S new tokens
//     go to positions 0..S-1 (right-padded prompts have T_b < S; the padded
//     rows' outputs are unspecified). Otherwise the new tokens go to positions
//     T_b-S .. T_b-1 and S > 1 needs batch 1 (onnxruntime's rule).
//   - present holds the past's first T_b-S rows, the new rows, and zeros
//     after them. With sliding_window_cache=1 the buffers have C >=
//     local_window_size rows instead and present rows 0..L(T_b)-1 hold the
//     last L(T_b) positions, L(T) = T for T <= C, else T - G*ceil((T-C)/G)
//     with G = C - window + 1 (evicting G positions at once); the past holds
//     L(P_b) positions the same way, P_b = T_b - S.
//   - Query row s at position p attends keys max(0,
//     p-local_window_size+1) .. p with scale, then softcap, attention_bias
//     and a softmax (smooth with a zero sink, or with head_sink's logit).
//   - do_rotary rotates Q and the new K with cos/sin caches [max_pos, R/2]
//     (the first R dimensions of each head), at the positions above or
//     position_ids.
//
// Decode-shaped steps (S <= 16 after a past, plain softmax) run the
// streaming decode kernel over the present buffer in place through a
// cache.TensorView; the others run the Attention operator's unit (package
// mha). Quantized caches, query_seqlens, q/k norm
// weights, causal=0 and qk_output are not implemented (the session reports
// it when it is created).
func newGroupQueryAttention(n *Node) (Kernel, error) {
	var a gqaAttrs
	var err error
	get := func(name string, def int64) int64 {
		v, e := n.Attrs.Int(name, def)
		if e != nil && err == nil {
			err = e
		}
		return v
	}
	nh, kvh := get("num_heads", 0), get("kv_num_heads", 0)
	window := get("local_window_size", -1)
	a.rotary, a.interleaved = get("do_rotary", 0) == 1, get("rotary_interleaved", 0) == 1
	a.smooth = get("smooth_softmax", 0) == 1
	causal, qkOut, swc, bits := get("causal", 1), get("qk_output", 0), get("sliding_window_cache", 0), get("kv_cache_bit_width", 0)
	if err != nil {
		return nil, err
	}
	if a.scale, err = n.Attrs.Float("scale", 0); err != nil {
		return nil, err
	}
	if a.softcap, err = n.Attrs.Float("softcap", 0); err != nil {
		return nil, err
	}
	if a.softcap < 0 {
		a.softcap = 0 // onnxruntime applies a softcap only when it is > 0
	}
	for _, name := range []string{"k_quant_type", "v_quant_type"} {
		q, err := n.Attrs.String(name, "NONE")
		if err != nil {
			return nil, err
		}
		if q != "NONE" {
			return nil, fmt.Errorf("%w: %s: quantized KV cache (%s=%s)", errs.ErrNotImplemented, n.Describe(), name, q)
		}
	}
	switch {
	case nh <= 0 || kvh <= 0 || nh%kvh != 0:
		return nil, fmt.Errorf("%w: %s: num_heads %d must be a positive multiple of kv_num_heads %d", errs.ErrInvalidArgument, n.Describe(), nh, kvh)
	case window == 0 || window < -1:
		return nil, fmt.Errorf("%w: %s: local_window_size %d must be -1 or > 0", errs.ErrInvalidArgument, n.Describe(), window)
	case math.IsNaN(float64(a.softcap)):
		return nil, fmt.Errorf("%w: %s: softcap %v", errs.ErrInvalidArgument, n.Describe(), a.softcap)
	case causal != 1:
		return nil, fmt.Errorf("%w: %s: causal=%d (bidirectional attention)", errs.ErrNotImplemented, n.Describe(), causal)
	case qkOut != 0 || (n.NumOutputs > gqaOutputQK && n.OutputPresent[gqaOutputQK]):
		return nil, fmt.Errorf("%w: %s: the output_qk output (qk_output=%d)", errs.ErrNotImplemented, n.Describe(), qkOut)
	case swc != 0 && window <= 0:
		return nil, fmt.Errorf("%w: %s: sliding_window_cache=1 needs local_window_size > 0", errs.ErrInvalidArgument, n.Describe())
	case bits != 0:
		return nil, fmt.Errorf("%w: %s: quantized KV cache (kv_cache_bit_width=%d)", errs.ErrNotImplemented, n.Describe(), bits)
	}
	for i, name := range map[int]string{gqaKScale: "k_scale", gqaVScale: "v_scale", gqaQNorm: "q_norm_weight",
		gqaKNorm: "k_norm_weight", gqaQuerySeqlens: "query_seqlens"} {
		if i < n.NumInputs && n.InputPresent[i] {
			return nil, fmt.Errorf("%w: %s: the %s input", errs.ErrNotImplemented, n.Describe(), name)
		}
	}
	a.numHeads, a.kvHeads, a.window, a.windowCache = int(nh), int(kvh), int(window), swc != 0
	return KernelFunc(func(ctx *Context) error {
		if err := gqaCompute(ctx, &a); err != nil {
			return fmt.Errorf("GroupQueryAttention: %w", err)
		}
		return nil
	}), nil
}

// gqaCall is one validated call: geometry, per-sequence lengths and the
// float32 views of the inputs.
type gqaCall struct {
	*gqaAttrs
	dt               tensor.DType
	batch, seq, head int // B, S, D
	packed           bool
	past             int  // P: positions of past_key (0 without)
	present          int  // C: positions of present_key
	first            bool // first prompt: new tokens at 0..S-1
	total            int  // total_sequence_length
	// The attention reads a key buffer of keyLen rows per (sequence, KV
	// head): the present outputs, or with a window cache a staging buffer
	// of the resident past followed by the new tokens. Sequence b's first
	// new token is row offsets[b] there and absolute position posBase[b];
	// rows 0..lens[b]-1 are its keys.
	keyLen       int
	lens         []int
	offsets      []int
	posBase      []int
	ends         []int // T_b, the absolute length after the step
	pastK, pastV *tensor.Tensor
	positions    []int // rotary position of token (b, s), with do_rotary
}

// gqaScratch is one call's state, recycled so that a decode step does not
// allocate its bookkeeping anew.
type gqaScratch struct {
	call gqaCall
	op   gqaOperands
	ar   f32Arena
}

var gqaScratches = sync.Pool{New: func() any { return new(gqaScratch) }}

func gqaCompute(ctx *Context, a *gqaAttrs) error {
	sc := gqaScratches.Get().(*gqaScratch)
	defer gqaScratches.Put(sc)
	c := &sc.call
	if err := planGQA(ctx, a, c); err != nil {
		return err
	}
	sc.ar = f32Arena{threads: ctx.Threads(), held: sc.ar.held[:0]}
	defer sc.ar.release()
	sc.op = gqaOperands{}
	return c.run(ctx, &sc.ar, &sc.op)
}

// growInts returns b resized to n zeros, reallocating only when it is too small.
func growInts(b []int, n int) []int {
	if cap(b) < n {
		return make([]int, n)
	}
	b = b[:n]
	clear(b)
	return b
}

// planGQA checks the inputs against the contract (see
// newGroupQueryAttention) and derives the call's geometry into c (whose
// slices it reuses).
func planGQA(ctx *Context, a *gqaAttrs, c *gqaCall) error {
	q, err := ctx.RequireInput(gqaQuery)
	if err != nil {
		return err
	}
	*c = gqaCall{gqaAttrs: a, dt: q.DType(), lens: c.lens, offsets: c.offsets, posBase: c.posBase, ends: c.ends, positions: c.positions}
	if c.dt != tensor.Float32 && c.dt != tensor.Float16 && c.dt != tensor.BFloat16 {
		return fmt.Errorf("%w: query must be float32, float16 or bfloat16, got %v", errs.ErrType, c.dt)
	}
	qs := q.Shape()
	if len(qs) != 3 {
		return fmt.Errorf("%w: query must be 3D [batch, sequence, hidden], got %v", errs.ErrShape, qs)
	}
	c.batch, c.seq = qs[0], qs[1]
	k, v := ctx.Input(gqaKey), ctx.Input(gqaValue)
	if (k == nil) != (v == nil) {
		return fmt.Errorf("%w: key and value must be given together (or both omitted for packed QKV)", errs.ErrShape)
	}
	c.packed = k == nil
	heads := a.numHeads
	if c.packed {
		heads += 2 * a.kvHeads
	}
	if qs[2]%heads != 0 || qs[2] == 0 {
		return fmt.Errorf("%w: query hidden size %d is not a multiple of %d heads", errs.ErrShape, qs[2], heads)
	}
	c.head = qs[2] / heads
	want := ctx.ScratchShape(3) // a literal shape would escape to the heap
	want[0], want[1], want[2] = c.batch, c.seq, a.kvHeads*c.head
	for _, t := range []*tensor.Tensor{k, v} {
		if t == nil {
			continue
		}
		if t.DType() != c.dt {
			return fmt.Errorf("%w: key/value %v, query %v", errs.ErrType, t.DType(), c.dt)
		}
		if !t.Shape().Equal(want) {
			return fmt.Errorf("%w: key/value %v, want %v", errs.ErrShape, t.Shape(), want)
		}
	}
	pk, pv := ctx.Input(gqaPastKey), ctx.Input(gqaPastValue)
	if (pk == nil) != (pv == nil) {
		return fmt.Errorf("%w: past_key and past_value must be given together", errs.ErrShape)
	}
	if pk != nil {
		ps := pk.Shape()
		if pk.DType() != c.dt || pv.DType() != c.dt {
			return fmt.Errorf("%w: past_key/past_value %v/%v, query %v (quantized caches are not implemented)", errs.ErrType, pk.DType(), pv.DType(), c.dt)
		}
		if len(ps) != 4 || ps[0] != c.batch || ps[1] != a.kvHeads || ps[3] != c.head || !pv.Shape().Equal(ps) {
			return fmt.Errorf("%w: past_key %v and past_value %v, want [%d, %d, past, %d]", errs.ErrShape, ps, pv.Shape(), c.batch, a.kvHeads, c.head)
		}
		c.past, c.pastK, c.pastV = ps[2], pk, pv
	}
	if err := c.planLengths(ctx); err != nil {
		return err
	}
	return c.planRotary(ctx)
}

// planLengths reads seqlens_k and total_sequence_length.
func (c *gqaCall) planLengths(ctx *Context) error {
	sk, err := ctx.RequireInput(gqaSeqlensK)
	if err != nil {
		return err
	}
	tt, err := ctx.RequireInput(gqaTotalSeqLen)
	if err != nil {
		return err
	}
	if sk.DType() != tensor.Int32 || tt.DType() != tensor.Int32 {
		return fmt.Errorf("%w: seqlens_k and total_sequence_length must be int32, got %v and %v", errs.ErrType, sk.DType(), tt.DType())
	}
	if !sk.Shape().Equal(tensor.Shape{c.batch}) {
		return fmt.Errorf("%w: seqlens_k %v, want [%d]", errs.ErrShape, sk.Shape(), c.batch)
	}
	if tt.Len() != 1 {
		return fmt.Errorf("%w: total_sequence_length must have one element, got %v", errs.ErrShape, tt.Shape())
	}
	c.total = int(tt.Int32()[0])
	S := c.seq
	if c.total < max(S, 1) {
		return fmt.Errorf("%w: total_sequence_length %d is less than the sequence length %d", errs.ErrInvalidArgument, c.total, max(S, 1))
	}
	if !c.windowCache && c.total > c.past && c.past > 0 && c.total != c.past+S {
		return fmt.Errorf("%w: total_sequence_length %d must be past_sequence_length + sequence_length = %d (a growing cache) or at most past_sequence_length %d (a shared buffer)",
			errs.ErrInvalidArgument, c.total, c.past+S, c.past)
	}
	c.first = S == c.total
	if !c.first && S > 1 && c.batch != 1 {
		return fmt.Errorf("%w: batch %d: a multi-token step after a past (sequence_length %d != total_sequence_length %d) needs batch 1",
			errs.ErrInvalidArgument, c.batch, S, c.total)
	}
	c.present, c.keyLen = max(c.total, c.past), max(c.total, c.past)
	if c.windowCache {
		if c.past < c.window {
			return fmt.Errorf("%w: sliding_window_cache needs past_key with at least local_window_size %d positions, got %d",
				errs.ErrInvalidArgument, c.window, c.past)
		}
		c.present, c.keyLen = c.past, 0
	}
	c.lens, c.offsets, c.posBase, c.ends = growInts(c.lens, c.batch), growInts(c.offsets, c.batch), growInts(c.posBase, c.batch), growInts(c.ends, c.batch)
	for b, v := range sk.Int32() {
		T := int(v) + 1
		if T < 1 || T > c.total {
			return fmt.Errorf("%w: seqlens_k[%d] = %d: the length %d must be in 1..total_sequence_length %d", errs.ErrInvalidArgument, b, v, T, c.total)
		}
		if !c.first && T < S {
			return fmt.Errorf("%w: seqlens_k[%d] = %d: length %d is shorter than the %d new tokens", errs.ErrInvalidArgument, b, v, T, S)
		}
		P := T - min(S, T) // tokens before the step (0 for a first prompt)
		c.ends[b], c.posBase[b] = T, P
		if !c.windowCache {
			if P > c.past {
				return fmt.Errorf("%w: seqlens_k[%d] = %d needs %d past positions, past_key holds %d", errs.ErrInvalidArgument, b, v, P, c.past)
			}
			c.offsets[b], c.lens[b] = P, T
			continue
		}
		lp := c.resident(P)
		c.offsets[b], c.lens[b] = lp, lp+min(S, T)
		c.keyLen = max(c.keyLen, lp+S)
	}
	return nil
}

// resident is L(T), the number of positions a window cache keeps after T
// tokens (see newGroupQueryAttention).
func (c *gqaCall) resident(T int) int {
	C := c.present
	if T <= C {
		return T
	}
	g := C - c.window + 1
	return T - g*((T-C+g-1)/g)
}

// planRotary checks the cos/sin caches and position_ids and sets
// c.positions, the rotary position of each new token ([B, S]).
func (c *gqaCall) planRotary(ctx *Context) error {
	cosT, sinT, pid := ctx.Input(gqaCos), ctx.Input(gqaSin), ctx.Input(gqaPositionIDs)
	if !c.rotary {
		return nil
	}
	if cosT == nil || sinT == nil {
		return fmt.Errorf("%w: do_rotary=1 needs cos_cache and sin_cache", errs.ErrMissingInput)
	}
	cs := cosT.Shape()
	if len(cs) != 2 || !sinT.Shape().Equal(cs) || cs[1] == 0 || 2*cs[1] > c.head {
		return fmt.Errorf("%w: cos_cache %v and sin_cache %v, want [max_position, rotary_dim/2] with rotary_dim <= head size %d",
			errs.ErrShape, cs, sinT.Shape(), c.head)
	}
	if cosT.DType() != c.dt || sinT.DType() != c.dt {
		return fmt.Errorf("%w: cos_cache/sin_cache %v/%v, query %v", errs.ErrType, cosT.DType(), sinT.DType(), c.dt)
	}
	rows := cs[0]
	var ids []int64
	if pid != nil {
		if pid.DType() != tensor.Int64 {
			return fmt.Errorf("%w: position_ids must be int64, got %v", errs.ErrType, pid.DType())
		}
		if !pid.Shape().Equal(tensor.Shape{c.batch, c.seq}) {
			return fmt.Errorf("%w: position_ids %v, want [%d, %d]", errs.ErrShape, pid.Shape(), c.batch, c.seq)
		}
		ids = pid.Int64()
	}
	c.positions = growInts(c.positions, c.batch*c.seq)
	for b := range c.batch {
		for s := range c.seq {
			var p int64
			switch {
			case ids != nil && c.first: // onnxruntime reads only the first id then
				p = ids[0] + int64(s)
			case ids != nil:
				p = ids[b*c.seq+s]
			default:
				p = int64(c.posBase[b] + s)
			}
			if p < 0 || p >= int64(rows) {
				return fmt.Errorf("%w: rotary position %d outside the cos/sin caches of %d rows", errs.ErrInvalidArgument, p, rows)
			}
			c.positions[b*c.seq+s] = int(p)
		}
	}
	return nil
}
