package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Slice", 10, 0, newSlice)
}

func newSlice(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		var args [4][]int64
		for i := 1; i <= 4; i++ {
			if args[i-1], err = optionalInt64s(ctx, i); err != nil {
				return err
			}
		}
		if ctx.Input(1) == nil || ctx.Input(2) == nil {
			return fmt.Errorf("%w: Slice needs starts and ends", errs.ErrMissingInput)
		}
		starts, ends, axes, steps := args[0], args[1], args[2], args[3]
		if len(ends) != len(starts) || (axes != nil && len(axes) != len(starts)) || (steps != nil && len(steps) != len(starts)) {
			return fmt.Errorf("%w: Slice starts/ends/axes/steps lengths differ", errs.ErrInvalidArgument)
		}
		r := x.Rank()
		sh := x.Shape()
		begin := ctx.Ints(r)
		step := ctx.Ints(r)
		outShape := append(ctx.ScratchShape(len(sh))[:0], sh...)
		for i := range step {
			step[i] = 1
		}
		seen := ctx.Bools(r)
		for i := range starts {
			a := i
			if axes != nil {
				if a, err = tensor.NormAxis(int(axes[i]), r); err != nil {
					return err
				}
			} else if i >= r {
				return fmt.Errorf("%w: Slice without axes takes at most one start per dimension: %d starts for rank %d",
					errs.ErrInvalidArgument, len(starts), r)
			}
			if seen[a] {
				return fmt.Errorf("%w: Slice axis %d repeated", errs.ErrInvalidArgument, a)
			}
			seen[a] = true
			st := int64(1)
			if steps != nil {
				st = steps[i]
			}
			if st == 0 {
				return fmt.Errorf("%w: Slice step 0", errs.ErrInvalidArgument)
			}
			b, cnt := sliceRange(starts[i], ends[i], st, int64(sh[a]))
			begin[a], step[a], outShape[a] = int(b), int(st), int(cnt)
		}
		out, err := ctx.NewOutputUninit(0, x.DType(), outShape)
		if err != nil {
			return err
		}
		inStrides := ctx.Ints(r)
		for d, acc := r-1, 1; d >= 0; d-- {
			inStrides[d] = acc
			acc *= sh[d]
		}
		base := 0
		strides := ctx.Ints(r)
		for d := 0; d < r; d++ {
			base += begin[d] * inStrides[d]
			strides[d] = step[d] * inStrides[d]
		}
		es := x.DType().Size()
		src, dst := x.Bytes(), out.Bytes()
		walkStrided(outShape, base, strides, func(o, i, s, n int) {
			stridedCopy(dst, src, o, i, s, n, es)
		})
		return nil
	}), nil
}

// sliceRange clamps start and end as the ONNX Slice spec does and returns
// the first index and the element count.
func sliceRange(start, end, step, dim int64) (int64, int64) {
	clamp := func(v, lo, hi int64) int64 { return max(lo, min(v, hi)) }
	if dim == 0 {
		return 0, 0
	}
	if start < 0 {
		start += dim
	}
	if end < 0 && end > math.MinInt64+dim {
		end += dim
	} else if end < 0 {
		end = -1
	}
	var cnt int64
	if step > 0 {
		start = clamp(start, 0, dim)
		end = clamp(end, 0, dim)
		if end > start { // (in this order: step may be near 2^63)
			cnt = (end-start-1)/step + 1
		}
	} else {
		start = clamp(start, 0, dim-1)
		end = clamp(end, -1, dim-1)
		if start > end {
			if step == math.MinInt64 { // (-step would overflow; the range is far shorter)
				cnt = 1
			} else {
				cnt = (start-end-1)/(-step) + 1
			}
		}
	}
	return start, cnt
}
