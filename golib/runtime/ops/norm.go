package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "LayerNormalization", 17, 0, newNorm(normSpec{bias: 2, skipBias: -1, mean: 1, inv: 2, sum: -1}))
	Register("", "RMSNormalization", 23, 0, newNorm(normSpec{rms: true, bias: -1, skipBias: -1, mean: -1, inv: -1, sum: -1}))
	// onnxruntime registers its contrib SimplifiedLayerNormalization (RMS
	// norm with an optional inv_std_var output) in the default domain, where
	// the onnxruntime-genai builder emits it.
	simplified := normSpec{rms: true, bias: -1, skipBias: -1, mean: -1, inv: 1, sum: -1}
	Register("", "SimplifiedLayerNormalization", 1, 0, newNorm(simplified))
	Register("com.microsoft", "SimplifiedLayerNormalization", 1, 0, newNorm(simplified))
	// The Skip variants add a residual (and an optional bias) first:
	// inputs (input, skip, gamma, beta?, bias?) and (input, skip, gamma,
	// bias?); outputs (output, mean?, inv_std_var?, input_skip_bias_sum?).
	Register("com.microsoft", "SkipLayerNormalization", 1, 0,
		newNorm(normSpec{skip: true, bias: 3, skipBias: 4, mean: 1, inv: 2, sum: 3, defaultEps: 1e-12}))
	Register("com.microsoft", "SkipSimplifiedLayerNormalization", 1, 0,
		newNorm(normSpec{rms: true, skip: true, bias: -1, skipBias: 3, mean: 1, inv: 2, sum: 3, defaultEps: 1e-12}))
}

// normSpec describes one member of the normalization family by the
// positions of its optional inputs and outputs (-1: the op has none).
type normSpec struct {
	rms  bool // no mean subtraction (RMS norm)
	skip bool // input 1 is a residual added to input 0 first
	// bias is the input added after scaling (LayerNormalization B, beta);
	// skipBias the input added with the residual before normalizing.
	bias, skipBias int
	// mean, inv and sum are the output slots of the statistics and of
	// input+skip+bias (the RMS Skip op reports a zero mean, as onnxruntime).
	mean, inv, sum int
	defaultEps     float32 // 0: 1e-5
}

// newNorm builds a kernel of the normalization family. Statistics are
// accumulated in float64 and applied in float32.
func newNorm(sp normSpec) Factory {
	return func(n *Node) (Kernel, error) {
		axis, err := n.Attrs.Int("axis", -1)
		if err != nil {
			return nil, err
		}
		def := sp.defaultEps
		if def == 0 {
			def = 1e-5
		}
		eps, err := n.Attrs.Float("epsilon", def)
		if err != nil {
			return nil, err
		}
		stash, err := n.Attrs.Int("stash_type", 1)
		if err != nil {
			return nil, err
		}
		if stash != 1 {
			return nil, fmt.Errorf("%w: %s stash_type=%d", errs.ErrNotImplemented, n.OpType, stash)
		}
		if sp.skip {
			axis = -1 // the Skip ops normalize the hidden (last) axis
		}
		return KernelFunc(func(ctx *Context) error { return normCompute(ctx, int(axis), eps, sp) }), nil
	}
}

// normInput returns optional input i (nil when the op has none or it is
// omitted).
func normInput(ctx *Context, i int) *tensor.Tensor {
	if i < 0 {
		return nil
	}
	return ctx.Input(i)
}

// normParam returns a scale/bias input as float32 with its index map onto
// the normalized shape (nil map: identity).
func normParam(ctx *Context, t *tensor.Tensor, normShape tensor.Shape, name string) ([]float32, []int, error) {
	if t == nil {
		return nil, nil, nil
	}
	idx, err := paramIndex(t, normShape)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	v, err := ctx.AsFloat32(t)
	if err != nil {
		return nil, nil, err
	}
	return v, idx, nil
}

// skipOperand checks that the residual repeats over the leading dimensions
// of x (same shape, or a suffix of it of rank >= 2 with leading 1s, as
// onnxruntime accepts) and returns it as float32.
func skipOperand(ctx *Context, x, skip *tensor.Tensor) ([]float32, error) {
	xs, ss := x.Shape(), skip.Shape()
	if skip.DType() != x.DType() {
		return nil, fmt.Errorf("%w: skip %v, input %v", errs.ErrType, skip.DType(), x.DType())
	}
	trim := ss
	for len(trim) > 0 && trim[0] == 1 && len(trim) > 1 {
		trim = trim[1:]
	}
	ok := len(ss) == len(xs) || len(ss) >= 2
	if ok && (len(trim) > len(xs) || !tensor.Shape(xs[len(xs)-len(trim):]).Equal(trim)) {
		ok = false
	}
	if !ok || len(ss) > len(xs) {
		return nil, fmt.Errorf("%w: skip %v does not match input %v (same shape, or [1, S, H] / [S, H])", errs.ErrShape, ss, xs)
	}
	return ctx.AsFloat32(skip)
}

func normCompute(ctx *Context, axis int, eps float32, sp normSpec) error {
	x, err := ctx.RequireInput(0)
	if err != nil {
		return err
	}
	if err := requireFloat(x); err != nil {
		return err
	}
	scaleIn := 1
	var skipV []float32
	if sp.skip {
		skip, err := ctx.RequireInput(1)
		if err != nil {
			return err
		}
		if skipV, err = skipOperand(ctx, x, skip); err != nil {
			return err
		}
		scaleIn = 2
	}
	scale, err := ctx.RequireInput(scaleIn)
	if err != nil {
		return err
	}
	sh := x.Shape()
	if sp.skip && len(sh) < 2 {
		return fmt.Errorf("%w: input must have 2 or 3 dimensions, got %v", errs.ErrShape, sh)
	}
	ax, err := tensor.NormAxis(axis, len(sh))
	if err != nil {
		return err
	}
	normShape := sh[ax:]
	rows, cols := tensor.Shape(sh[:ax]).Size(), normShape.Size()
	sv, sIdx, err := normParam(ctx, scale, normShape, "scale")
	if err != nil {
		return err
	}
	bv, bIdx, err := normParam(ctx, normInput(ctx, sp.bias), normShape, "bias")
	if err != nil {
		return err
	}
	pre, preIdx, err := normParam(ctx, normInput(ctx, sp.skipBias), normShape, "bias")
	if err != nil {
		return err
	}
	y, err := ctx.NewOutputUninit(0, x.DType(), sh)
	if err != nil {
		return err
	}
	var statShape tensor.Shape // made only when a statistics output is wanted
	if (sp.mean >= 0 && ctx.OutputWanted(sp.mean)) || (sp.inv >= 0 && ctx.OutputWanted(sp.inv)) {
		statShape = append(tensor.Shape{}, sh[:ax]...)
		for range normShape {
			statShape = append(statShape, 1)
		}
	}
	var meanOut, invOut []float32
	if sp.mean >= 0 && ctx.OutputWanted(sp.mean) {
		t, err := ctx.NewOutput(sp.mean, tensor.Float32, statShape)
		if err != nil {
			return err
		}
		meanOut = t.Float32()
	}
	if sp.inv >= 0 && ctx.OutputWanted(sp.inv) {
		t, err := ctx.NewOutput(sp.inv, tensor.Float32, statShape)
		if err != nil {
			return err
		}
		invOut = t.Float32()
	}
	src, err := ctx.AsFloat32(x)
	if err != nil {
		return err
	}
	var sumT *tensor.Tensor
	var sum []float32 // input + skip + bias: the rows that are normalized
	if sp.skip {
		if sp.sum >= 0 && ctx.OutputWanted(sp.sum) {
			if sumT, err = ctx.NewOutputUninit(sp.sum, x.DType(), sh); err != nil {
				return err
			}
			sum = f32Result(ctx, sumT)
		} else {
			sum = ctx.Float32s(len(src))
		}
	}
	if len(src) == 0 && len(meanOut) == 0 && len(invOut) == 0 {
		return nil // nothing to write, though rows may be huge (2^30 x 2^30 x 0)
	}
	dst := f32Result(ctx, y)
	nr := normRows{src: src, dst: dst, sum: sum, skipV: skipV, pre: pre, preIdx: preIdx, sv: sv, sIdx: sIdx,
		bv: bv, bIdx: bIdx, meanOut: meanOut, invOut: invOut, cols: cols, eps: eps, rms: sp.rms}
	if rows <= 16 || ctx.Threads() == 1 {
		nr.run(0, rows) // no closure: a decode step's rows allocate nothing here
	} else {
		par := nr
		err = ctx.ParallelFor(rows, 16, func(lo, hi int) { par.run(lo, hi) })
	}
	if err != nil {
		return err
	}
	if sumT != nil {
		if err := storeF32Result(sumT, sum); err != nil {
			return err
		}
	}
	return storeF32Result(y, dst)
}

// normRows is one normalization call's operands: rows of cols values of
// src (plus skip and bias into sum when sum is set) normalized into dst.
type normRows struct {
	src, dst, sum, skipV, pre []float32
	preIdx                    []int
	sv                        []float32
	sIdx                      []int
	bv                        []float32
	bIdx                      []int
	meanOut, invOut           []float32
	cols                      int
	eps                       float32
	rms                       bool
}

// run normalizes rows lo..hi-1.
func (nr *normRows) run(lo, hi int) {
	src, dst, sum, skipV, pre, preIdx := nr.src, nr.dst, nr.sum, nr.skipV, nr.pre, nr.preIdx
	sv, sIdx, bv, bIdx, meanOut, invOut, cols, eps := nr.sv, nr.sIdx, nr.bv, nr.bIdx, nr.meanOut, nr.invOut, nr.cols, nr.eps
	for r := lo; r < hi; r++ {
		row, out := src[r*cols:(r+1)*cols], dst[r*cols:(r+1)*cols]
		if sum != nil {
			s := sum[r*cols : (r+1)*cols]
			base := (r * cols) % len(skipV)
			for i, v := range row {
				v += skipV[base+i]
				if pre != nil {
					v += pre[at(preIdx, i)]
				}
				s[i] = v
			}
			row = s
		}
		m32, inv32 := normRow(row, out, sv, sIdx, bv, bIdx, eps, nr.rms)
		if meanOut != nil {
			meanOut[r] = m32
		}
		if invOut != nil {
			invOut[r] = inv32
		}
	}
}

// normRow normalizes one row into out (scale, then bias) and returns the
// mean (0 for RMS) and the inverse standard deviation.
func normRow(row, out, sv []float32, sIdx []int, bv []float32, bIdx []int, eps float32, rms bool) (float32, float32) {
	cols := len(row)
	var mean, sq float64
	if !rms {
		for _, v := range row {
			mean += float64(v)
		}
		mean /= float64(cols)
	}
	for _, v := range row {
		d := float64(v) - mean
		sq += d * d
	}
	inv := 1 / math.Sqrt(sq/float64(cols)+float64(eps))
	m32, inv32 := float32(mean), float32(inv)
	switch {
	case sIdx == nil && bv == nil: // the common case: plain scale
		sc := sv[:len(row)]
		for i, v := range row {
			out[i] = (v - m32) * inv32 * sc[i]
		}
	case sIdx == nil && bIdx == nil:
		sc, bb := sv[:len(row)], bv[:len(row)]
		for i, v := range row {
			out[i] = (v-m32)*inv32*sc[i] + bb[i]
		}
	default:
		for i, v := range row {
			o := (v - m32) * inv32 * sv[at(sIdx, i)]
			if bv != nil {
				o += bv[at(bIdx, i)]
			}
			out[i] = o
		}
	}
	return m32, inv32
}

// at is idx[i], or i for the identity mapping (nil idx).
func at(idx []int, i int) int {
	if idx == nil {
		return i
	}
	return idx[i]
}

// paramIndex maps each element of the normalized shape to the element of a
// scale or bias tensor broadcast to it (leading 1 dims of p are ignored).
// It returns nil for the identity mapping (p has the normalized shape).
func paramIndex(p *tensor.Tensor, normShape tensor.Shape) ([]int, error) {
	ps := p.Shape()
	for len(ps) > len(normShape) && ps[0] == 1 {
		ps = ps[1:]
	}
	for len(ps) > 0 && len(ps) < len(normShape) && ps[0] == 1 {
		ps = ps[1:] // a leading 1 broadcasts like a missing dimension
	}
	if len(ps) > len(normShape) {
		// one scale per row (dimensions before the axis that are not 1)
		return nil, fmt.Errorf("%w: a scale or bias of shape %v over the normalized shape %v (its dimensions before the axis vary per row)",
			errs.ErrNotImplemented, p.Shape(), normShape)
	}
	if ps.Equal(normShape[len(normShape)-len(ps):]) && ps.Size() == normShape.Size() {
		return nil, nil
	}
	idx := make([]int, normShape.Size())
	if err := tensor.BroadcastIndex(ps, normShape, idx); err != nil {
		return nil, err
	}
	return idx, nil
}
