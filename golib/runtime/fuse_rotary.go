package runtime

import (
	"fmt"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
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
// chain (bit-identical). Otherwise it runs the chain's own nodes, in
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
			// the chain's nodes in plan order, for the fallback
			var nodes []*PlanNode
			for j := 0; j <= i; j++ {
				for _, c := range chain {
					if c == j {
						nodes = append(nodes, fc.p.Nodes[j])
					}
				}
			}
			inputs := append([]string{x, cos, sin}, sliceArgs(sl1)...)
			inputs = append(inputs, sliceArgs(sl2)...)
			pn := &PlanNode{Name: n.Name, OpType: "RotaryHalf", Domain: ops.FusedDomain, Inputs: inputs,
				Outputs: []string{n.Outputs[0]}}
			pn.Info = &ops.Node{Name: pn.Name, OpType: pn.OpType, Domain: pn.Domain, Opset: 1,
				NumInputs: len(inputs), NumOutputs: 1, InputPresent: make([]bool, len(inputs)),
				OutputPresent: []bool{true}, Constants: make([]*tensor.Tensor, len(inputs))}
			for j, in := range inputs {
				pn.Info.InputPresent[j] = in != ""
				pn.Info.Constants[j] = fc.consts[in]
			}
			pn.Kernel = &rotaryHalf{axis: axis, chain: nodes, inputs: inputs}
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
	axis   int64       // the Concat's axis
	chain  []*PlanNode // the replaced nodes in plan order (the fallback)
	inputs []string    // the fused node's input names
	// fallbacks counts the runs that took the chain (tests read it).
	fallbacks atomic.Int64
}

// Compute runs the fused computation when this run's values allow it, else
// the chain.
func (k *rotaryHalf) Compute(ctx *ops.Context) error {
	x, cos, sin := ctx.Input(0), ctx.Input(1), ctx.Input(2)
	if h, ok := k.fast(ctx, x, cos, sin); ok {
		out, err := ctx.NewOutputUninit(0, tensor.Float32, x.Shape())
		if err != nil {
			return err
		}
		rotateHalfF32(out.Float32(), x, cos, sin, h)
		return nil
	}
	k.fallbacks.Add(1)
	return k.fallback(ctx)
}

// fast reports whether this run is the canonical rotate_half (see
// matchRotary) and returns the half length.
func (k *rotaryHalf) fast(ctx *ops.Context, x, cos, sin *tensor.Tensor) (int, bool) {
	if x == nil || cos == nil || sin == nil || x.DType() != tensor.Float32 || cos.DType() != tensor.Float32 ||
		sin.DType() != tensor.Float32 || x.Rank() == 0 || !cos.Shape().Equal(sin.Shape()) {
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

// rotateHalfF32 writes x*cos + rotate_half(x)*sin into out, cos and sin
// broadcast to x's shape (last axis of length 2h, not broadcast).
func rotateHalfF32(out []float32, x, cos, sin *tensor.Tensor, h int) {
	xs, c, s := x.Float32(), cos.Float32(), sin.Float32()
	d := 2 * h
	shape := x.Shape()
	r := len(shape)
	// the offset of each x row's cos/sin row, advanced like an odometer
	var stBuf, idxBuf [8]int
	st, idx := stBuf[:0], idxBuf[:0]
	if r-1 > len(stBuf) {
		st, idx = make([]int, 0, r-1), make([]int, 0, r-1)
	}
	cs := cos.Shape()
	for j := 0; j < r-1; j++ {
		stride := 0
		if cj := j - (r - len(cs)); cj >= 0 && cs[cj] != 1 {
			stride = 1
			for _, v := range cs[cj+1:] {
				stride *= v
			}
		}
		st = append(st, stride)
		idx = append(idx, 0)
	}
	off := 0
	for row := 0; row*d < len(xs); row++ {
		xr, o := xs[row*d:row*d+d], out[row*d:row*d+d]
		cr, sr := c[off:off+d], s[off:off+d]
		for j := range h {
			o[j] = float32(xr[j]*cr[j]) + float32(-xr[j+h]*sr[j])
		}
		for j := h; j < d; j++ {
			o[j] = float32(xr[j]*cr[j]) + float32(xr[j-h]*sr[j])
		}
		for j := len(idx) - 1; j >= 0; j-- { // next row
			idx[j]++
			off += st[j]
			if idx[j] < shape[j] {
				break
			}
			off -= st[j] * idx[j]
			idx[j] = 0
		}
	}
}

// fallback runs the replaced chain node by node on this run's inputs.
func (k *rotaryHalf) fallback(ctx *ops.Context) error {
	vals := make(map[string]*tensor.Tensor, len(k.inputs)+len(k.chain))
	for j, name := range k.inputs {
		if name != "" {
			vals[name] = ctx.Input(j)
		}
	}
	var last *tensor.Tensor
	for _, n := range k.chain {
		in := make([]*tensor.Tensor, len(n.Inputs))
		for j, name := range n.Inputs {
			if name != "" {
				if in[j] = vals[name]; in[j] == nil {
					return fmt.Errorf("%w: rotary chain value %q is not available", errs.ErrMissingInput, name)
				}
			}
		}
		c := ops.NewContext(in, n.Info.OutputPresent, ctx.Threads(), ctx.Scope())
		if err := n.Kernel.Compute(c); err != nil {
			return withNode(n, err)
		}
		last = c.Output(0)
		if last == nil {
			return fmt.Errorf("%w: rotary chain node %q produced no value", errs.ErrInvalidModel, n.Name)
		}
		vals[n.Outputs[0]] = last
	}
	return ctx.SetOutput(0, last)
}
