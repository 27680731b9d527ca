package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Transpose", 1, 0, newTranspose)
	Register("", "Trilu", 14, 0, newTrilu)
}

func newTranspose(n *Node) (Kernel, error) {
	perm, hasPerm, err := n.Attrs.Ints("perm")
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		r := x.Rank()
		p := ctx.Ints(r)
		if hasPerm {
			if len(perm) != r {
				return fmt.Errorf("%w: Transpose perm %v for rank %d", errs.ErrInvalidArgument, perm, r)
			}
			seen := ctx.Bools(r)
			for i, v := range perm {
				if v < 0 || int(v) >= r || seen[v] {
					return fmt.Errorf("%w: Transpose perm %v is not a permutation", errs.ErrInvalidArgument, perm)
				}
				seen[v] = true
				p[i] = int(v)
			}
		} else {
			for i := range p {
				p[i] = r - 1 - i
			}
		}
		inStrides := ctx.Ints(r)
		for i, acc := r-1, 1; i >= 0; i-- {
			inStrides[i] = acc
			acc *= x.Shape()[i]
		}
		outShape := ctx.ScratchShape(r)
		strides := ctx.Ints(r)
		for i, a := range p {
			outShape[i] = x.Shape()[a]
			strides[i] = inStrides[a]
		}
		if keepsOrder(x.Shape(), p) {
			return ctx.SetReshaped(0, x, outShape) // same bytes in the same order: a view
		}
		out, err := ctx.NewOutputUninit(0, x.DType(), outShape)
		if err != nil {
			return err
		}
		es := x.DType().Size()
		src, dst := x.Bytes(), out.Bytes()
		walkStrided(outShape, 0, strides, func(o, i, s, n int) {
			stridedCopy(dst, src, o, i, s, n, es)
		})
		return nil
	}), nil
}

// keepsOrder reports whether perm moves only axes of size 1 relative to
// the others (the [B, 1, H, D] -> [B, H, 1, D] transposes of a decode
// step): the transposed tensor then has the input's bytes in the input's
// order.
func keepsOrder(shape tensor.Shape, perm []int) bool {
	last := -1
	for _, a := range perm {
		if shape[a] == 1 {
			continue
		}
		if a < last {
			return false
		}
		last = a
	}
	return true
}

func newTrilu(n *Node) (Kernel, error) {
	upper, err := n.Attrs.Int("upper", 1)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		if x.Rank() < 2 {
			return fmt.Errorf("%w: Trilu needs rank >= 2, got %v", errs.ErrShape, x.Shape())
		}
		k := int64(0)
		if kt := ctx.Input(1); kt != nil {
			v, err := tensor.Int64Values(kt)
			if err != nil || len(v) != 1 {
				return fmt.Errorf("%w: Trilu k must be an integer scalar", errs.ErrInvalidArgument)
			}
			k = v[0]
		}
		out, err := ctx.NewOutput(0, x.DType(), x.Shape())
		if err != nil {
			return err
		}
		sh := x.Shape()
		rows, cols := sh[len(sh)-2], sh[len(sh)-1]
		// Beyond ±(rows+cols) every k keeps (or drops) the whole matrix
		// alike; clamping first keeps i+k+1 from overflowing int64 for a k
		// near its limits.
		bound := int64(rows) + int64(cols)
		k = min(max(k, -bound), bound)
		es := x.DType().Size()
		src, dst := x.Bytes(), out.Bytes()
		mats := x.Len() / max(rows*cols, 1)
		for m := 0; m < mats; m++ {
			for i := 0; i < rows; i++ {
				// keep columns j with j-i >= k (upper) or j-i <= k (lower)
				lo, hi := 0, cols
				if upper != 0 {
					lo = int(max(0, min(int64(cols), int64(i)+k)))
				} else {
					hi = int(max(0, min(int64(cols), int64(i)+k+1)))
				}
				if lo < hi {
					off := (m*rows + i) * cols
					copy(dst[(off+lo)*es:(off+hi)*es], src[(off+lo)*es:(off+hi)*es])
				}
			}
		}
		return nil
	}), nil
}
