package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Reshape", 5, 0, newReshape)
	Register("", "Identity", 1, 0, newIdentity)
	Register("", "Flatten", 1, 0, newFlatten)
	Register("", "Unsqueeze", 1, 12, newAxesReshape(false, unsqueezeShape))
	Register("", "Unsqueeze", 13, 0, requireInputs(2, newAxesReshape(true, unsqueezeShape)))
	Register("", "Squeeze", 1, 12, newAxesReshape(false, squeezeShape))
	Register("", "Squeeze", 13, 0, newAxesReshape(true, squeezeShape))
	Register("", "Shape", 1, 0, newShape)
	Register("", "Size", 1, 0, newSize)
}

// shapeInput reads a 1D integer tensor of dimensions (Reshape's shape,
// Expand's shape, ...).
func shapeInput(ctx *Context, i int) ([]int64, error) {
	t, err := ctx.RequireInput(i)
	if err != nil {
		return nil, err
	}
	if t.Rank() > 1 {
		return nil, fmt.Errorf("%w: shape input must be 1D, got %v", errs.ErrShape, t.Shape())
	}
	return ctx.Int64Values(t)
}

func newReshape(n *Node) (Kernel, error) {
	allowZero, err := n.Attrs.Int("allowzero", 0)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		spec, err := shapeInput(ctx, 1)
		if err != nil {
			return err
		}
		shape, err := reshapeTarget(ctx, x.Shape(), spec, allowZero != 0)
		if err != nil {
			return err
		}
		return setReshaped(ctx, x, shape)
	}), nil
}

// reshapeTarget resolves Reshape's 0 (copy the input dim, unless allowzero)
// and -1 (inferred) entries.
func reshapeTarget(ctx *Context, in tensor.Shape, spec []int64, allowZero bool) (tensor.Shape, error) {
	out := ctx.ScratchShape(len(spec))
	infer := -1
	for i, d := range spec {
		switch {
		case d == -1:
			if infer >= 0 {
				return nil, fmt.Errorf("%w: Reshape with more than one -1 in %v", errs.ErrInvalidArgument, spec)
			}
			infer = i
			out[i] = 1 // counted as 1 in known below, then inferred
		case d == 0 && !allowZero:
			if i >= len(in) {
				return nil, fmt.Errorf("%w: Reshape copies dimension %d of a rank-%d input", errs.ErrInvalidArgument, i, len(in))
			}
			out[i] = in[i]
		case d < 0 || d > tensor.MaxElements:
			return nil, fmt.Errorf("%w: Reshape dimension %d", errs.ErrInvalidArgument, d)
		default:
			out[i] = int(d)
		}
	}
	// the element count of the given dimensions: 0 (never over the
	// limit) when one of them is 0, wherever it is
	known, err := out.NumElements()
	if err != nil {
		return nil, fmt.Errorf("%w: Reshape to %v", errs.ErrLimit, spec)
	}
	total := in.Size()
	if infer >= 0 {
		if known == 0 || total%known != 0 {
			return nil, fmt.Errorf("%w: cannot reshape %v to %v", errs.ErrShape, in, spec)
		}
		out[infer] = total / known
	}
	return out, nil
}

func newIdentity(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		return ctx.SetOutput(0, x)
	}), nil
}

func newFlatten(n *Node) (Kernel, error) {
	axis, err := n.Attrs.Int("axis", 1)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		r := x.Rank()
		a := int(axis)
		if a < 0 {
			a += r
		}
		if a < 0 || a > r {
			return fmt.Errorf("%w: Flatten axis %d for rank %d", errs.ErrInvalidArgument, axis, r)
		}
		// an empty tensor's other dimensions can multiply beyond the limit
		outer, err := tensor.Shape(x.Shape()[:a]).NumElements()
		if err != nil {
			return fmt.Errorf("Flatten of %v at axis %d: %w", x.Shape(), axis, err)
		}
		inner, err := tensor.Shape(x.Shape()[a:]).NumElements()
		if err != nil {
			return fmt.Errorf("Flatten of %v at axis %d: %w", x.Shape(), axis, err)
		}
		shape := ctx.ScratchShape(2) // a literal shape would escape to the heap
		shape[0], shape[1] = outer, inner
		return setReshaped(ctx, x, shape)
	}), nil
}

// axesArg returns the axes from attribute (old opsets) or input 1.
func axesArg(ctx *Context, n *Node, fromInput bool) ([]int64, error) {
	if fromInput {
		return optionalInt64s(ctx, 1)
	}
	v, _, err := n.Attrs.Ints("axes")
	return v, err
}

// newAxesReshape builds Unsqueeze and Squeeze: output 0 is input 0 viewed
// (no copy) in the shape target computes from its shape and the axes.
func newAxesReshape(fromInput bool, target func(ctx *Context, in tensor.Shape, axes []int64) (tensor.Shape, error)) Factory {
	return func(n *Node) (Kernel, error) {
		return KernelFunc(func(ctx *Context) error {
			x, err := ctx.RequireInput(0)
			if err != nil {
				return err
			}
			axes, err := axesArg(ctx, n, fromInput)
			if err != nil {
				return err
			}
			shape, err := target(ctx, x.Shape(), axes)
			if err != nil {
				return err
			}
			return setReshaped(ctx, x, shape)
		}), nil
	}
}

// unsqueezeShape inserts a dimension of 1 at each of axes (axes index the
// result).
func unsqueezeShape(ctx *Context, in tensor.Shape, axes []int64) (tensor.Shape, error) {
	r := len(in) + len(axes)
	ins := ctx.Bools(r)
	for _, a := range axes {
		ax, err := tensor.NormAxis(int(a), r)
		if err != nil {
			return nil, err
		}
		if ins[ax] {
			return nil, fmt.Errorf("%w: Unsqueeze axis %d repeated", errs.ErrInvalidArgument, a)
		}
		ins[ax] = true
	}
	shape := ctx.ScratchShape(r)[:0]
	k := 0
	for i := 0; i < r; i++ {
		if ins[i] {
			shape = append(shape, 1)
		} else {
			shape = append(shape, in[k])
			k++
		}
	}
	return shape, nil
}

// squeezeShape drops axes, which must have size 1 (no axes: every
// dimension of size 1).
func squeezeShape(ctx *Context, in tensor.Shape, axes []int64) (tensor.Shape, error) {
	drop := ctx.Bools(len(in))
	for _, a := range axes {
		ax, err := tensor.NormAxis(int(a), len(in))
		if err != nil {
			return nil, err
		}
		if in[ax] != 1 {
			return nil, fmt.Errorf("%w: Squeeze axis %d has size %d", errs.ErrShape, a, in[ax])
		}
		drop[ax] = true
	}
	shape := ctx.ScratchShape(len(in))[:0]
	for i, d := range in {
		if (len(axes) == 0 && d == 1) || drop[i] {
			continue
		}
		shape = append(shape, d)
	}
	return shape, nil
}

// setReshaped sets output 0 to x viewed in shape (no copy).
func setReshaped(ctx *Context, x *tensor.Tensor, shape tensor.Shape) error {
	return ctx.SetReshaped(0, x, shape)
}

func newShape(n *Node) (Kernel, error) {
	start, err := n.Attrs.Int("start", 0)
	if err != nil {
		return nil, err
	}
	end, err := n.Attrs.Int("end", math.MaxInt32)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		r := int64(x.Rank())
		s, e := clampRange(start, r), clampRange(end, r)
		shape := ctx.ScratchShape(1) // a literal shape would escape to the heap
		shape[0] = int(max(e-s, 0))
		out, err := ctx.NewOutputUninit(0, tensor.Int64, shape)
		if err != nil {
			return err
		}
		dims := out.Int64()
		for i := s; i < e; i++ {
			dims[i-s] = int64(x.Shape()[i])
		}
		return nil
	}), nil
}

// clampRange maps a possibly negative index into [0, r].
func clampRange(i, r int64) int64 {
	if i < 0 {
		i += r
	}
	return max(0, min(i, r))
}

func newSize(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		out, err := ctx.NewOutput(0, tensor.Int64, tensor.Shape{})
		if err != nil {
			return err
		}
		out.Int64()[0] = int64(x.Len())
		return nil
	}), nil
}
