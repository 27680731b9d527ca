package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Dropout", 12, 0, newDropout)
	Register("", "IsNaN", 13, 0, newFloatTest(func(v float64) bool { return v != v }))
	Register("", "IsInf", 10, 0, newIsInf)
	Register("", "GatherElements", 11, 0, newGatherElements)
	Register("", "Pad", 13, 0, newPad)
}

// newDropout is inference-mode Dropout: the identity, and an all-true mask
// when the second output is used. Training mode with ratio 0 is the same;
// training mode with a nonzero ratio (random) is not implemented.
func newDropout(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		if tm := ctx.Input(2); tm != nil && tm.Bool() != nil && tm.Len() == 1 && tm.Bool()[0] {
			ratio := float32(0.5)
			if r := ctx.Input(1); r != nil {
				v, err := ctx.AsFloat32(r)
				if err != nil || len(v) != 1 {
					return fmt.Errorf("%w: Dropout ratio must be a float scalar, got %v", errs.ErrInvalidArgument, r)
				}
				ratio = v[0]
			}
			if ratio != 0 {
				return fmt.Errorf("%w: Dropout in training mode with ratio %g", errs.ErrNotImplemented, ratio)
			}
		}
		if err := ctx.SetOutput(0, x); err != nil {
			return err
		}
		if ctx.OutputWanted(1) {
			m, err := ctx.NewOutput(1, tensor.Bool, x.Shape())
			if err != nil {
				return err
			}
			for i := range m.Bool() {
				m.Bool()[i] = true
			}
		}
		return nil
	}), nil
}

func newFloatTest(f func(float64) bool) Factory {
	return func(n *Node) (Kernel, error) {
		return KernelFunc(func(ctx *Context) error { return floatTest(ctx, f) }), nil
	}
}

func newIsInf(n *Node) (Kernel, error) {
	pos, err := n.Attrs.Int("detect_positive", 1)
	if err != nil {
		return nil, err
	}
	neg, err := n.Attrs.Int("detect_negative", 1)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		return floatTest(ctx, func(v float64) bool {
			return (pos != 0 && math.IsInf(v, 1)) || (neg != 0 && math.IsInf(v, -1))
		})
	}), nil
}

// requireFloat returns an ErrType error unless x is a floating-point tensor:
// the input rule of the ops ONNX defines for float types only (their integer
// arithmetic would return numbers, silently wrong).
func requireFloat(x *tensor.Tensor) error {
	if !x.DType().IsFloat() {
		return fmt.Errorf("%w: want a float tensor, got %v", errs.ErrType, x.DType())
	}
	return nil
}

func floatTest(ctx *Context, f func(float64) bool) error {
	x, err := ctx.RequireInput(0)
	if err != nil {
		return err
	}
	if err := requireFloat(x); err != nil {
		return err
	}
	out, err := ctx.NewOutputUninit(0, tensor.Bool, x.Shape())
	if err != nil {
		return err
	}
	d := out.Bool()
	if x.DType() == tensor.Float32 { // in place: float64(v) keeps NaN and the infinities
		for i, e := range x.Float32() {
			d[i] = f(float64(e))
		}
		return nil
	}
	v, err := reduceSource(nil, x)
	if err != nil {
		return err
	}
	for i, e := range v {
		d[i] = f(e)
	}
	return nil
}

// newGatherElements: out[i...] = data[i... with axis coordinate idx[i...]].
func newGatherElements(n *Node) (Kernel, error) {
	axis, err := n.Attrs.Int("axis", 0)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		x, it, err := twoInputs(ctx)
		if err != nil {
			return err
		}
		ax, err := tensor.NormAxis(int(axis), x.Rank())
		if err != nil {
			return err
		}
		if it.Rank() != x.Rank() {
			return fmt.Errorf("%w: GatherElements indices %v for data %v", errs.ErrShape, it.Shape(), x.Shape())
		}
		for d := range it.Shape() {
			if d != ax && it.Shape()[d] > x.Shape()[d] {
				return fmt.Errorf("%w: GatherElements indices %v exceed data %v", errs.ErrShape, it.Shape(), x.Shape())
			}
		}
		idx, err := tensor.Int64Values(it)
		if err != nil {
			return err
		}
		out, err := ctx.NewOutput(0, x.DType(), it.Shape())
		if err != nil {
			return err
		}
		src := make([]int, len(idx))
		if err := elementOffsets("GatherElements", src, idx, it.Shape(), x.Shape(), ax, make([]int, it.Rank())); err != nil {
			return err
		}
		gatherElems(out.Bytes(), x.Bytes(), src, x.DType().Size())
		return nil
	}), nil
}

// elementOffsets sets offs[u] to the flat offset, in a tensor of shape ds,
// of element u of an index tensor of shape is (row-major) whose value idx[u]
// replaces its coordinate on axis ax (negative values counted from the
// end; out of range: ErrInvalidArgument naming op): the addressing of
// GatherElements and ScatterElements. coord is scratch of len(is).
func elementOffsets(op string, offs []int, idx []int64, is, ds tensor.Shape, ax int, coord []int) error {
	strides, dim := ds.Strides(), int64(ds[ax])
	clear(coord)
	for u, v := range idx {
		v, err := normIndex(op, v, dim)
		if err != nil {
			return err
		}
		off := 0
		for j, c := range coord {
			if j == ax {
				c = int(v)
			}
			off += c * strides[j]
		}
		offs[u] = off
		for j := len(is) - 1; j >= 0; j-- {
			if coord[j]++; coord[j] < is[j] {
				break
			}
			coord[j] = 0
		}
	}
	return nil
}

// newPad implements Pad-13+ in "constant" and "edge" modes (pads may be
// negative, cropping); "reflect" and "wrap" are not implemented.
// padSource maps an output position s (relative to the input's start, outside
// [0, n)) to the input position it copies in a non-constant Pad mode: the
// nearest edge ("edge"), the mirror image without repeating the edge
// ("reflect", numpy's reflect), or the periodic repetition ("wrap").
func padSource(mode string, s, n int) int {
	switch mode {
	case "reflect":
		if n == 1 {
			return 0
		}
		p := 2 * (n - 1)
		s %= p
		if s < 0 {
			s += p
		}
		if s >= n {
			s = p - s
		}
		return s
	case "wrap":
		s %= n
		if s < 0 {
			s += n
		}
		return s
	}
	return max(0, min(s, n-1))
}

func newPad(n *Node) (Kernel, error) {
	mode, err := n.Attrs.String("mode", "constant")
	if err != nil {
		return nil, err
	}
	switch mode {
	case "constant", "edge", "reflect", "wrap":
	default:
		return nil, fmt.Errorf("%w: Pad mode %q", errs.ErrInvalidArgument, mode)
	}
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		pads, err := shapeInput(ctx, 1)
		if err != nil {
			return err
		}
		r := x.Rank()
		axes := make([]int, r)
		for i := range axes {
			axes[i] = i
		}
		if at := ctx.Input(3); at != nil {
			av, err := tensor.Int64Values(at)
			if err != nil {
				return err
			}
			axes = axes[:0]
			for _, a := range av {
				ax, err := tensor.NormAxis(int(a), r)
				if err != nil {
					return err
				}
				axes = append(axes, ax)
			}
		}
		if len(pads) != 2*len(axes) {
			return fmt.Errorf("%w: Pad with %d pads for %d axes", errs.ErrInvalidArgument, len(pads), len(axes))
		}
		before, after := make([]int, r), make([]int, r)
		for i, ax := range axes {
			before[ax], after[ax] = int(pads[i]), int(pads[i+len(axes)])
		}
		outShape := make(tensor.Shape, r)
		for d := range outShape {
			outShape[d] = x.Shape()[d] + before[d] + after[d]
			if outShape[d] < 0 || (x.Shape()[d] == 0 && outShape[d] > 0 && mode != "constant") {
				return fmt.Errorf("%w: Pad of %v by %v", errs.ErrInvalidArgument, x.Shape(), pads)
			}
		}
		out, err := ctx.NewOutput(0, x.DType(), outShape)
		if err != nil {
			return err
		}
		es := x.DType().Size()
		if v := ctx.Input(2); v != nil && mode == "constant" && v.Len() == 1 {
			if v.DType() != x.DType() {
				return fmt.Errorf("%w: Pad value of type %v for %v", errs.ErrType, v.DType(), x.DType())
			}
			fillRepeat(out.Bytes(), v.Bytes())
		}
		// map each output element to its source (or -1 for padding)
		xs := x.Shape().Strides()
		idx := make([]int, 0, out.Len())
		ctr := make([]int, r)
		for o := 0; o < out.Len(); o++ {
			off, inside := 0, true
			for d, c := range ctr {
				s := c - before[d]
				if s < 0 || s >= x.Shape()[d] {
					if mode == "constant" {
						inside = false
						break
					}
					s = padSource(mode, s, x.Shape()[d])
				}
				off += s * xs[d]
			}
			if inside {
				idx = append(idx, o, off)
			}
			for d := r - 1; d >= 0; d-- {
				if ctr[d]++; ctr[d] < outShape[d] {
					break
				}
				ctr[d] = 0
			}
		}
		src, dst := x.Bytes(), out.Bytes()
		for k := 0; k < len(idx); k += 2 {
			o, s := idx[k], idx[k+1]
			copy(dst[o*es:(o+1)*es], src[s*es:(s+1)*es])
		}
		return nil
	}), nil
}
