package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// matchRotary fuses the rotary embedding that torch.onnx (TorchScript and
// dynamo below opset 23) and optimum write for Hugging Face's
// apply_rotary_pos_emb, once for q and once for k of every layer:
//
//	x1 = Slice(x, 0, d/2, [-1], [1])       // starts/ends may be computed
//	x2 = Slice(x, d/2, end, [-1], [1])     // from Shape(x) at run time
//	r  = Concat(Neg(x2), x1, axis=-1)      // rotate_half(x)
//	out = Add(Mul(x, cos), Mul(r, sin))    // any operand orders
//
// into one RotaryHalf node (fused domain), seven nodes and their
// intermediate tensors fewer. The slice bounds of the exports depend on
// x's shape, so what the plan cannot prove is checked on every run: x,
// cos and sin float32, the slices the two halves of x's last axis (of even
// length), the concatenation along it, cos and sin of one shape that
// broadcasts to x's without growing it. Then the kernel computes
// float32(x*cos) + float32(r*sin) per element, the rounding steps of the
// chain (bit-identical); float16 tensors likewise, each step rounded to
// float16 as the chain's float16 kernels do. Otherwise it runs the chain's own nodes, in
// order, so the result is the unfused graph's in every case. Every value
// inside the chain must have one reader and be neither a graph output nor
// captured.
func matchRotary(fc *fuseContext, i int) (*PlanNode, []int, bool) {
	n := fc.p.Nodes[i]
	if n.OpType != "Add" || n.Domain != "" || len(n.Inputs) != 2 || len(n.Outputs) != 1 {
		return nil, nil, false
	}
	for k := range 2 {
		pi, p, ok := fc.node(n.Inputs[k], "Mul")
		if !ok || !fc.internal(n.Inputs[k]) || len(p.Inputs) != 2 {
			continue
		}
		qi, q, ok := fc.node(n.Inputs[1-k], "Mul")
		if !ok || !fc.internal(n.Inputs[1-k]) || len(q.Inputs) != 2 || qi == pi {
			continue
		}
		for a := range 2 {
			r, sin := q.Inputs[a], q.Inputs[1-a]
			if !fc.internal(r) {
				continue
			}
			ci, cat, ok := fc.node(r, "Concat")
			if !ok || len(cat.Inputs) != 2 {
				continue
			}
			axis, err := cat.Info.Attrs.Int("axis", 0)
			if err != nil {
				continue
			}
			x, sl1, sl2, core, ok := rotateHalf(fc, cat)
			if !ok {
				continue
			}
			var cos string
			switch x {
			case p.Inputs[0]:
				cos = p.Inputs[1]
			case p.Inputs[1]:
				cos = p.Inputs[0]
			default:
				continue
			}
			if cos == x || sin == x || sin == r {
				continue
			}
			chain := append([]int{i, pi, qi, ci}, core...)
			inputs := append([]string{x, cos, sin}, sliceArgs(sl1)...)
			inputs = append(inputs, sliceArgs(sl2)...)
			k := &rotaryHalf{axis: axis, chain: fc.chainRun(chain, inputs)}
			pn := fc.plannedNode(n.Name, "RotaryHalf", inputs, n.Outputs[0], k)
			return pn, chain, true
		}
	}
	return nil, nil, false
}

// rotateHalf matches cat = Concat(Neg(Slice(x, ...)), Slice(x, ...)) and
// returns x, the first and the second half's slices and the indices of
// the Neg and the slices.
func rotateHalf(fc *fuseContext, cat *PlanNode) (x string, sl1, sl2 *PlanNode, core []int, ok bool) {
	a, b := cat.Inputs[0], cat.Inputs[1]
	if a == b || !fc.internal(a) || !fc.internal(b) {
		return "", nil, nil, nil, false
	}
	ni, neg, ok := fc.node(a, "Neg")
	if !ok || len(neg.Inputs) != 1 || !fc.internal(neg.Inputs[0]) {
		return "", nil, nil, nil, false
	}
	i2, s2, ok := fc.node(neg.Inputs[0], "Slice") // the second half, negated
	if !ok || len(s2.Inputs) < 3 || len(s2.Inputs) > 5 {
		return "", nil, nil, nil, false
	}
	i1, s1, ok := fc.node(b, "Slice") // the first half
	if !ok || len(s1.Inputs) < 3 || len(s1.Inputs) > 5 || s1.Inputs[0] != s2.Inputs[0] || s1.Inputs[0] == "" {
		return "", nil, nil, nil, false
	}
	return s1.Inputs[0], s1, s2, []int{ni, i2, i1}, true
}

// sliceArgs returns a Slice node's starts, ends, axes and steps ("" when
// absent).
func sliceArgs(s *PlanNode) []string {
	out := make([]string, 4)
	copy(out, s.Inputs[1:])
	return out
}

// rotaryHalf is RotaryHalf's kernel. Its inputs are x, cos, sin, then the
// first half's slice arguments (starts, ends, axes, steps) and the second
// half's.
type rotaryHalf struct {
	axis  int64 // the Concat's axis
	chain *chainRun
}

// Compute runs the fused computation when this run's values allow it, else
// the chain.
func (k *rotaryHalf) Compute(ctx *ops.Context) error {
	x, cos, sin := ctx.Input(0), ctx.Input(1), ctx.Input(2)
	if h, ok := k.fast(ctx, x, cos, sin); ok {
		out, err := ctx.NewOutputUninit(0, x.DType(), x.Shape())
		if err != nil {
			return err
		}
		if x.DType() == tensor.Float16 {
			rotateHalfF16(out.Float16(), x, cos, sin, h)
		} else {
			rotateHalfF32(out.Float32(), x, cos, sin, h)
		}
		return nil
	}
	return k.chain.run(ctx)
}

// fast reports whether this run is the canonical rotate_half (see
// matchRotary) and returns the half length.
func (k *rotaryHalf) fast(ctx *ops.Context, x, cos, sin *tensor.Tensor) (int, bool) {
	if x == nil || cos == nil || sin == nil || (x.DType() != tensor.Float32 && x.DType() != tensor.Float16) ||
		cos.DType() != x.DType() || sin.DType() != x.DType() || x.Rank() == 0 || !cos.Shape().Equal(sin.Shape()) {
		return 0, false
	}
	r := x.Rank()
	d := x.Shape()[r-1]
	if d < 2 || d%2 != 0 || normAxis(k.axis, r) != r-1 {
		return 0, false
	}
	h := d / 2
	if !halfSlice(ctx, 3, r, d, 0, h) || !halfSlice(ctx, 7, r, d, h, d) {
		return 0, false
	}
	cs := cos.Shape()
	if len(cs) > r || len(cs) == 0 || cs[len(cs)-1] != d {
		return 0, false
	}
	for j := range cs {
		if c := cs[len(cs)-1-j]; c != 1 && c != x.Shape()[r-1-j] {
			return 0, false
		}
	}
	return h, true
}

func normAxis(a int64, rank int) int {
	if a < 0 {
		a += int64(rank)
	}
	if a < 0 || a >= int64(rank) {
		return -1
	}
	return int(a)
}

// halfSlice reports whether the Slice arguments at inputs at..at+3 select
// [lo, hi) of the last axis (rank r, length d) with step 1.
func halfSlice(ctx *ops.Context, at, r, d, lo, hi int) bool {
	start, ok1 := oneInt(ctx.Input(at))
	end, ok2 := oneInt(ctx.Input(at + 1))
	if !ok1 || !ok2 {
		return false
	}
	if t := ctx.Input(at + 2); t != nil {
		a, ok := oneInt(t)
		if !ok || normAxis(a, r) != r-1 {
			return false
		}
	} else if r != 1 { // no axes: the first axis
		return false
	}
	if t := ctx.Input(at + 3); t != nil {
		if s, ok := oneInt(t); !ok || s != 1 {
			return false
		}
	}
	clamp := func(v int64) int64 {
		if v < 0 {
			v += int64(d)
		}
		return min(max(v, 0), int64(d))
	}
	return clamp(start) == int64(lo) && clamp(end) == int64(hi)
}

// oneInt reads a one-element int64 or int32 tensor.
func oneInt(t *tensor.Tensor) (int64, bool) {
	if t == nil || t.Len() != 1 {
		return 0, false
	}
	switch t.DType() {
	case tensor.Int64:
		return t.Int64()[0], true
	case tensor.Int32:
		return int64(t.Int32()[0]), true
	}
	return 0, false
}

// bcastRows walks the rows (last axis) of a tensor of shape x and gives
// the offset of the matching row of a tensor of shape c broadcast to x
// (c's last axis is x's).
type bcastRows struct {
	shape    tensor.Shape
	n        int    // axes before the last
	stb, idb [8]int // strides and odometer digits, up to 8 such axes
	big      []int  // both (strides, then digits) for more axes
	off      int
}

// newBcastRows starts b at row 0 (b keeps no pointer into itself, so an
// iterator on the stack stays there).
func newBcastRows(b *bcastRows, x, c tensor.Shape) {
	r := len(x)
	b.shape, b.n, b.big, b.off = x, max(r-1, 0), nil, 0
	if b.n > len(b.stb) {
		b.big = make([]int, 2*b.n)
	}
	st, idx := b.lists()
	for j := range b.n {
		stride := 0
		if cj := j - (r - len(c)); cj >= 0 && c[cj] != 1 {
			stride = 1
			for _, v := range c[cj+1:] {
				stride *= v
			}
		}
		st[j], idx[j] = stride, 0
	}
}

// lists returns the strides and the odometer digits.
func (b *bcastRows) lists() (st, idx []int) {
	if b.big != nil {
		return b.big[:b.n], b.big[b.n:]
	}
	return b.stb[:b.n], b.idb[:b.n]
}

// next advances to the next row, like an odometer.
func (b *bcastRows) next() {
	st, idx := b.lists()
	for j := len(idx) - 1; j >= 0; j-- {
		idx[j]++
		b.off += st[j]
		if idx[j] < b.shape[j] {
			return
		}
		b.off -= st[j] * idx[j]
		idx[j] = 0
	}
}

// rotateHalfF32 writes x*cos + rotate_half(x)*sin into out, cos and sin
// broadcast to x's shape (last axis of length 2h, not broadcast), with
// the float32 roundings of the chain's Mul, Mul and Add.
func rotateHalfF32(out []float32, x, cos, sin *tensor.Tensor, h int) {
	xs, c, s := x.Float32(), cos.Float32(), sin.Float32()
	d := 2 * h
	var it bcastRows
	newBcastRows(&it, x.Shape(), cos.Shape())
	for row := 0; row*d < len(xs); row++ {
		xr, o := xs[row*d:row*d+d], out[row*d:row*d+d]
		cr, sr := c[it.off:it.off+d], s[it.off:it.off+d]
		for j := range h {
			o[j] = float32(xr[j]*cr[j]) + float32(-xr[j+h]*sr[j])
		}
		for j := h; j < d; j++ {
			o[j] = float32(xr[j]*cr[j]) + float32(xr[j-h]*sr[j])
		}
		it.next()
	}
}

// rotateHalfF16 is rotateHalfF32 for float16 tensors: each of the chain's
// steps computes in float32 and rounds to float16, as its float16 Mul and
// Add kernels do. Rows run in blocks of up to rotaryBlock values through the
// slice codecs (eight values a step on F16C CPUs, bit for bit as the scalar
// conversions), so a block costs a few conversion calls instead of five
// scalar conversions per value.
func rotateHalfF16(out []tensor.Float16Bits, x, cos, sin *tensor.Tensor, h int) {
	xs, c, s := tensor.Bits16(x.Float16()), tensor.Bits16(cos.Float16()), tensor.Bits16(sin.Float16())
	o16 := tensor.Bits16(out)
	d := 2 * h
	if d > rotaryBlock {
		rotateHalfF16Scalar(out, x, cos, sin, h)
		return
	}
	var xf, cf, sf, a, b [rotaryBlock]float32
	var t16 [rotaryBlock]uint16
	var it bcastRows
	newBcastRows(&it, x.Shape(), cos.Shape())
	per := rotaryBlock / d // rows a block
	for row0 := 0; row0*d < len(xs); row0 += per {
		rows := min(per, len(xs)/d-row0)
		n := rows * d
		codec.DecodeF16(xf[:n], xs[row0*d:row0*d+n])
		for r := range rows {
			codec.DecodeF16(cf[r*d:r*d+d], c[it.off:it.off+d])
			codec.DecodeF16(sf[r*d:r*d+d], s[it.off:it.off+d])
			it.next()
		}
		for r := 0; r < n; r += d {
			xr, cr, sr, ar, br := xf[r:r+d], cf[r:r+d], sf[r:r+d], a[r:r+d], b[r:r+d]
			for j := range h {
				ar[j] = xr[j] * cr[j]
				br[j] = -xr[j+h] * sr[j]
			}
			for j := h; j < d; j++ {
				ar[j] = xr[j] * cr[j]
				br[j] = xr[j-h] * sr[j]
			}
		}
		codec.EncodeF16(t16[:n], a[:n]) // the two Muls' float16 outputs
		codec.DecodeF16(a[:n], t16[:n])
		codec.EncodeF16(t16[:n], b[:n])
		codec.DecodeF16(b[:n], t16[:n])
		for j := range n {
			a[j] += b[j]
		}
		codec.EncodeF16(o16[row0*d:row0*d+n], a[:n])
	}
}

// rotaryBlock is the block of rotateHalfF16, in values (rows of more than
// this many values take rotateHalfF16Scalar).
const rotaryBlock = 512

// rotateHalfF16Scalar is rotateHalfF16 one value at a time (rows longer
// than rotaryBlock, and the reference of its tests).
func rotateHalfF16Scalar(out []tensor.Float16Bits, x, cos, sin *tensor.Tensor, h int) {
	xs, c, s := x.Float16(), cos.Float16(), sin.Float16()
	d := 2 * h
	f := func(v tensor.Float16Bits) float32 { return codec.F16ToF32(uint16(v)) }
	r16 := func(v float32) float32 { return codec.F16ToF32(codec.F32ToF16(v)) }
	var it bcastRows
	newBcastRows(&it, x.Shape(), cos.Shape())
	for row := 0; row*d < len(xs); row++ {
		xr, o := xs[row*d:row*d+d], out[row*d:row*d+d]
		cr, sr := c[it.off:it.off+d], s[it.off:it.off+d]
		for j := range h {
			o[j] = tensor.Float16Bits(codec.F32ToF16(r16(f(xr[j])*f(cr[j])) + r16(-f(xr[j+h])*f(sr[j]))))
		}
		for j := h; j < d; j++ {
			o[j] = tensor.Float16Bits(codec.F32ToF16(r16(f(xr[j])*f(cr[j])) + r16(f(xr[j-h])*f(sr[j]))))
		}
		it.next()
	}
}
