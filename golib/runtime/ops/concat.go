package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Concat", 4, 0, newConcat)
	Register("", "Split", 2, 12, newSplit(false))
	Register("", "Split", 13, 0, newSplit(true))
}

func newConcat(n *Node) (Kernel, error) {
	if !n.Attrs.Has("axis") {
		return nil, fmt.Errorf("%w: Concat needs an axis attribute", errs.ErrInvalidModel)
	}
	axis, err := n.Attrs.Int("axis", 0)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		ins := presentInputs(ctx)
		if len(ins) == 0 {
			return fmt.Errorf("%w: Concat without inputs", errs.ErrMissingInput)
		}
		first := ins[0]
		r := first.Rank()
		ax, err := tensor.NormAxis(int(axis), r)
		if err != nil {
			return err
		}
		outShape := append(ctx.ScratchShape(first.Rank())[:0], first.Shape()...)
		outShape[ax] = 0
		for _, t := range ins {
			if t.DType() != first.DType() {
				return fmt.Errorf("%w: Concat of %v %v and %v %v", errs.ErrType, first.DType(), first.Shape(), t.DType(), t.Shape())
			}
			if t.Rank() != r {
				return fmt.Errorf("%w: Concat of %v and %v (ranks differ)", errs.ErrShape, first.Shape(), t.Shape())
			}
			for d := 0; d < r; d++ {
				if d != ax && t.Shape()[d] != first.Shape()[d] {
					return fmt.Errorf("%w: Concat of %v and %v on axis %d", errs.ErrShape, first.Shape(), t.Shape(), ax)
				}
			}
			outShape[ax] += t.Shape()[ax]
		}
		out, err := ctx.NewOutputUninit(0, first.DType(), outShape)
		if err != nil {
			return err
		}
		es := first.DType().Size()
		outer := tensor.Shape(outShape[:ax]).Size()
		inner := tensor.Shape(outShape[ax+1:]).Size() * es
		dst := out.Bytes()
		rowOut := outShape[ax] * inner
		off := 0
		for _, t := range ins {
			chunk := t.Shape()[ax] * inner
			if chunk == 0 {
				continue // outer may be huge when nothing is copied
			}
			src := t.Bytes()
			for o := 0; o < outer; o++ {
				copy(dst[o*rowOut+off:o*rowOut+off+chunk], src[o*chunk:(o+1)*chunk])
			}
			off += chunk
		}
		return nil
	}), nil
}

func newSplit(splitInput bool) Factory {
	return func(n *Node) (Kernel, error) {
		axis, err := n.Attrs.Int("axis", 0)
		if err != nil {
			return nil, err
		}
		attrSplit, _, err := n.Attrs.Ints("split")
		if err != nil {
			return nil, err
		}
		numOut, err := n.Attrs.Int("num_outputs", 0)
		if err != nil {
			return nil, err
		}
		if numOut != 0 && numOut != int64(n.NumOutputs) { // (before any use: 2^62 parts would exhaust memory)
			return nil, fmt.Errorf("%w: Split num_outputs=%d for a node of %d outputs", errs.ErrInvalidModel, numOut, n.NumOutputs)
		}
		return KernelFunc(func(ctx *Context) error {
			x, err := ctx.RequireInput(0)
			if err != nil {
				return err
			}
			ax, err := tensor.NormAxis(int(axis), x.Rank())
			if err != nil {
				return err
			}
			sizes := attrSplit
			if splitInput {
				if sizes, err = optionalInt64s(ctx, 1); err != nil {
					return err
				}
			}
			dim := x.Shape()[ax]
			k := ctx.NumOutputs()
			if len(sizes) == 0 {
				parts := k
				if numOut > 0 {
					parts = int(numOut)
				}
				if parts < 1 {
					return fmt.Errorf("%w: Split into %d parts", errs.ErrInvalidArgument, parts)
				}
				if numOut == 0 && dim%parts != 0 { // equal parts; only num_outputs (opset 18) allows a smaller last one
					return fmt.Errorf("%w: Split of a dimension of %d into %d equal parts", errs.ErrInvalidArgument, dim, parts)
				}
				each := (dim + parts - 1) / parts // the last part may be smaller
				for i := 0; i < parts; i++ {
					sizes = append(sizes, int64(max(0, min(each, dim-i*each))))
				}
			}
			if len(sizes) != k {
				return fmt.Errorf("%w: Split into %d sizes for %d outputs", errs.ErrInvalidArgument, len(sizes), k)
			}
			total := int64(0)
			for _, s := range sizes {
				if s < 0 {
					return fmt.Errorf("%w: negative Split size %d", errs.ErrInvalidArgument, s)
				}
				total += s
			}
			if total != int64(dim) {
				return fmt.Errorf("%w: Split sizes %v do not sum to %d", errs.ErrInvalidArgument, sizes, dim)
			}
			es := x.DType().Size()
			outer := tensor.Shape(x.Shape()[:ax]).Size()
			inner := tensor.Shape(x.Shape()[ax+1:]).Size() * es
			src := x.Bytes()
			rowIn := dim * inner
			off := 0
			for i, s := range sizes {
				shape := ctx.ScratchShape(x.Rank()) // a clone per output would allocate
				copy(shape, x.Shape())
				shape[ax] = int(s)
				out, err := ctx.NewOutputUninit(i, x.DType(), shape)
				if err != nil {
					return err
				}
				chunk := int(s) * inner
				dst := out.Bytes()
				for o := 0; o < outer && chunk > 0; o++ { // outer may be huge when nothing is copied
					copy(dst[o*chunk:(o+1)*chunk], src[o*rowIn+off:o*rowIn+off+chunk])
				}
				off += chunk
			}
			return nil
		}), nil
	}
}

// presentInputs returns ctx's inputs without the omitted ones: the
// context's own slice (read-only) when none is omitted, the usual case.
func presentInputs(ctx *Context) []*tensor.Tensor {
	for _, t := range ctx.inputs {
		if t == nil {
			var ins []*tensor.Tensor
			for _, u := range ctx.inputs {
				if u != nil {
					ins = append(ins, u)
				}
			}
			return ins
		}
	}
	return ctx.inputs
}
