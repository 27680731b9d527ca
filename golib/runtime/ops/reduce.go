package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

type reduceKind int

const (
	reduceSum reduceKind = iota
	reduceMean
	reduceMax
	reduceMin
)

func init() {
	// The axes moved from an attribute to an input: ReduceSum at 13, the
	// others at 18.
	Register("", "ReduceSum", 1, 12, newReduce(reduceSum, false))
	Register("", "ReduceSum", 13, 0, newReduce(reduceSum, true))
	Register("", "ReduceMean", 1, 17, newReduce(reduceMean, false))
	Register("", "ReduceMean", 18, 0, newReduce(reduceMean, true))
	Register("", "ReduceMax", 1, 17, newReduce(reduceMax, false))
	Register("", "ReduceMax", 18, 0, newReduce(reduceMax, true))
	Register("", "ReduceMin", 1, 17, newReduce(reduceMin, false))
	Register("", "ReduceMin", 18, 0, newReduce(reduceMin, true))
}

func newReduce(kind reduceKind, axesInput bool) Factory {
	return func(n *Node) (Kernel, error) {
		keep, err := n.Attrs.Int("keepdims", 1)
		if err != nil {
			return nil, err
		}
		noop, err := n.Attrs.Int("noop_with_empty_axes", 0)
		if err != nil {
			return nil, err
		}
		attrAxes, _, err := n.Attrs.Ints("axes")
		if err != nil {
			return nil, err
		}
		return KernelFunc(func(ctx *Context) error {
			x, err := ctx.RequireInput(0)
			if err != nil {
				return err
			}
			axes := attrAxes
			if axesInput {
				if axes, err = optionalInt64s(ctx, 1); err != nil {
					return err
				}
			}
			if len(axes) == 0 && noop != 0 {
				out, err := ctx.NewOutput(0, x.DType(), x.Shape())
				if err != nil {
					return err
				}
				copy(out.Bytes(), x.Bytes())
				return nil
			}
			return reduceCompute(ctx, x, axes, keep != 0, kind)
		}), nil
	}
}

func reduceCompute(ctx *Context, x *tensor.Tensor, axes []int64, keep bool, kind reduceKind) error {
	sh := x.Shape()
	red := make([]bool, len(sh))
	if len(axes) == 0 {
		for i := range red {
			red[i] = true
		}
	}
	for _, a := range axes {
		ax, err := tensor.NormAxis(int(a), len(sh))
		if err != nil {
			return err
		}
		red[ax] = true
	}
	keepShape := make(tensor.Shape, len(sh))
	var outShape tensor.Shape
	for i, d := range sh {
		keepShape[i] = d
		if red[i] {
			keepShape[i] = 1
			if keep {
				outShape = append(outShape, 1)
			}
		} else {
			outShape = append(outShape, d)
		}
	}
	if outShape == nil {
		outShape = tensor.Shape{}
	}
	if (kind == reduceMax || kind == reduceMin) && x.Len() == 0 {
		return fmt.Errorf("%w: ReduceMax/Min of an empty tensor", errs.ErrInvalidArgument)
	}
	out, err := ctx.NewOutput(0, x.DType(), outShape)
	if err != nil {
		return err
	}
	if !x.DType().IsFloat() && kind == reduceMean {
		return fmt.Errorf("%w: ReduceMean of %v", errs.ErrNotImplemented, x.DType())
	}
	src, err := reduceSource(x)
	if err != nil {
		return err
	}
	acc := make([]float64, out.Len())
	switch kind {
	case reduceMax:
		for i := range acc {
			acc[i] = math.Inf(-1)
		}
	case reduceMin:
		for i := range acc {
			acc[i] = math.Inf(1)
		}
	}
	idx := make([]int, len(src))
	if err := tensor.BroadcastIndex(keepShape, sh, idx); err != nil {
		return err
	}
	for i, v := range src {
		o := idx[i]
		switch kind {
		case reduceMax:
			acc[o] = max(acc[o], v)
		case reduceMin:
			acc[o] = min(acc[o], v)
		default:
			acc[o] += v
		}
	}
	if kind == reduceMean && len(acc) > 0 {
		cnt := float64(len(src) / len(acc))
		for i := range acc {
			acc[i] /= cnt
		}
	}
	if x.DType().IsFloat() {
		return storeFloat64(out, acc)
	}
	iv := make([]int64, len(acc))
	for i, v := range acc {
		iv[i] = int64(v)
	}
	return storeInt64(out, iv)
}

// reduceSource widens x to float64 (exact for every supported type except
// int64 magnitudes above 2^53, which shape arithmetic never reaches).
func reduceSource(x *tensor.Tensor) ([]float64, error) {
	out := make([]float64, x.Len())
	switch {
	case x.DType() == tensor.Float64:
		copy(out, x.Float64())
	case x.DType().IsFloat():
		f, err := tensor.AsFloat32(x)
		if err != nil {
			return nil, err
		}
		for i, v := range f {
			out[i] = float64(v)
		}
	case x.DType().IsInt():
		v, err := tensor.Int64Values(x)
		if err != nil {
			return nil, err
		}
		for i, e := range v {
			out[i] = float64(e)
		}
	default:
		return nil, fmt.Errorf("%w: reduction of %v", errs.ErrType, x.DType())
	}
	return out, nil
}
