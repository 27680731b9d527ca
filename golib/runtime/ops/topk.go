package ops

import (
	"fmt"
	"slices"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	// K moved from an attribute to an input at 10; largest and sorted
	// came at 11.
	Register("", "TopK", 1, 9, newTopK(false))
	Register("", "TopK", 10, 0, requireInputs(2, newTopK(true)))
	Register("", "ArgMax", 1, 0, newArgExtreme(true))
	Register("", "ArgMin", 1, 0, newArgExtreme(false))
}

// orderKeys holds a tensor's values in a type that orders them exactly:
// float64 for the floating-point types, int64 for the integer ones.
type orderKeys struct {
	f []float64
	i []int64
}

// keysOf reads x's values as orderKeys (into scratch); op names the op in
// the error for a type it does not order.
func keysOf(ctx *Context, op string, x *tensor.Tensor) (orderKeys, error) {
	switch dt := x.DType(); {
	case dt == tensor.Float64:
		return orderKeys{f: x.Float64()}, nil
	case dt.IsFloat():
		f, err := tensor.AsFloat32(x)
		if err != nil {
			return orderKeys{}, err
		}
		out := ctx.Float64s(len(f))
		for j, v := range f {
			out[j] = float64(v)
		}
		return orderKeys{f: out}, nil
	case dt.IsInt():
		v, err := ctx.Int64Values(x)
		if err != nil {
			return orderKeys{}, fmt.Errorf("%w: %s of %v", errs.ErrType, op, dt)
		}
		return orderKeys{i: v}, nil
	default:
		return orderKeys{}, fmt.Errorf("%w: %s of %v; it computes %v", errs.ErrType, op, dt, numericTypes)
	}
}

// before reports whether element a of row comes before element b in the
// order of TopK (largest: descending, else ascending), which is
// onnxruntime's: NaN is greater than every number, and equal values keep
// their index order.
func before[T float64 | int64](row []T, stride, a, b int, largest bool) bool {
	x, y := row[a*stride], row[b*stride]
	xn, yn := x != x, y != y // NaN (never for integers)
	if xn || yn {
		if xn && yn {
			return a < b
		}
		return xn == largest
	}
	if x != y {
		return (x > y) == largest
	}
	return a < b
}

// selectTop writes into sel (len k) the positions along the row (dim
// elements stride apart from row[0]) of its first k elements in
// before's order.
func selectTop[T float64 | int64](row []T, stride, dim int, largest bool, sel []int, all []int) {
	k := len(sel)
	if k == 0 {
		return
	}
	if k <= 16 {
		// insertion into a sorted buffer: the MoE router's k of 1 to 8
		n := 0
		for j := 0; j < dim; j++ {
			if n == k && !before(row, stride, j, sel[k-1], largest) {
				continue
			}
			p := min(n, k-1)
			for p > 0 && before(row, stride, j, sel[p-1], largest) {
				sel[p] = sel[p-1]
				p--
			}
			sel[p] = j
			if n < k {
				n++
			}
		}
		return
	}
	for j := range all {
		all[j] = j
	}
	slices.SortFunc(all, func(a, b int) int {
		if before(row, stride, a, b, largest) {
			return -1
		}
		if before(row, stride, b, a, largest) {
			return 1
		}
		return 0
	})
	copy(sel, all[:k])
}

// newTopK: the k largest (or smallest) elements along axis and their int64
// indices, sorted in that order whatever sorted says (the order of an
// unsorted result is unspecified); equal values in index order, NaN above
// every number, as onnxruntime.
func newTopK(kInput bool) Factory {
	return func(n *Node) (Kernel, error) {
		axis, err := n.Attrs.Int("axis", -1)
		if err != nil {
			return nil, err
		}
		largest, sorted, kAttr := int64(1), int64(1), int64(-1)
		if n.Opset >= 11 {
			if largest, err = n.Attrs.Int("largest", 1); err != nil {
				return nil, err
			}
			if sorted, err = n.Attrs.Int("sorted", 1); err != nil {
				return nil, err
			}
		}
		_ = sorted // a sorted result is a valid unsorted one
		if !kInput {
			if !n.Attrs.Has("k") {
				return nil, fmt.Errorf("%w: %s requires the k attribute", errs.ErrInvalidModel, n.Describe())
			}
			if kAttr, err = n.Attrs.Int("k", 0); err != nil {
				return nil, err
			}
			if kAttr < 0 {
				return nil, fmt.Errorf("%w: %s k=%d", errs.ErrInvalidArgument, n.Describe(), kAttr)
			}
		}
		if err := n.checkTypes(numericTypes, 0); err != nil {
			return nil, err
		}
		if kInput {
			if dt := n.InputType(1); dt != tensor.Undefined && dt != tensor.Int64 {
				return nil, fmt.Errorf("%w: %s K of %v; K is int64", errs.ErrInvalidModel, n.Describe(), dt)
			}
		}
		desc := n.Describe()
		return KernelFunc(func(ctx *Context) error {
			x, err := ctx.RequireInput(0)
			if err != nil {
				return err
			}
			k := kAttr
			if kInput {
				kt, err := ctx.RequireInput(1)
				if err != nil {
					return err
				}
				if kt.DType() != tensor.Int64 || kt.Rank() > 1 || kt.Len() != 1 {
					return fmt.Errorf("%w: %s K must be one int64 value, got %v %v", errs.ErrInvalidArgument, desc, kt.DType(), kt.Shape())
				}
				k = kt.Int64()[0]
			}
			if x.Rank() == 0 {
				return fmt.Errorf("%w: %s of a scalar", errs.ErrShape, desc)
			}
			ax, err := tensor.NormAxis(int(axis), x.Rank())
			if err != nil {
				return fmt.Errorf("%s: %w", desc, err)
			}
			sh := x.Shape()
			dim := sh[ax]
			if k < 0 || k > int64(dim) {
				return fmt.Errorf("%w: %s K=%d for axis %d of %d elements", errs.ErrInvalidArgument, desc, k, ax, dim)
			}
			outShape := ctx.ScratchShape(len(sh))
			copy(outShape, sh)
			outShape[ax] = int(k)
			vals, err := ctx.NewOutputUninit(0, x.DType(), outShape)
			if err != nil {
				return err
			}
			inds, err := ctx.NewOutputUninit(1, tensor.Int64, outShape)
			if err != nil {
				return err
			}
			if vals.Len() == 0 {
				return nil
			}
			keys, err := keysOf(ctx, "TopK", x)
			if err != nil {
				return err
			}
			outer := tensor.Shape(sh[:ax]).Size()
			inner := tensor.Shape(sh[ax+1:]).Size()
			sel := ctx.Ints(int(k))
			var all []int
			if k > 16 {
				all = ctx.Ints(dim)
			}
			es := x.DType().Size()
			src, dst, idx := x.Bytes(), vals.Bytes(), inds.Int64()
			kk := int(k)
			for o := 0; o < outer; o++ {
				for i := 0; i < inner; i++ {
					base := o*dim*inner + i
					if keys.f != nil {
						selectTop(keys.f[base:], inner, dim, largest != 0, sel, all)
					} else {
						selectTop(keys.i[base:], inner, dim, largest != 0, sel, all)
					}
					for r, j := range sel {
						d := o*kk*inner + r*inner + i
						s := base + j*inner
						idx[d] = int64(j)
						copy(dst[d*es:(d+1)*es], src[s*es:(s+1)*es])
					}
				}
			}
			return nil
		}), nil
	}
}

// newArgExtreme is ArgMax (largest) or ArgMin: the int64 index of the largest
// (smallest) element along axis, the first one of equal values, or the
// last with select_last_index (opset 12+). NaN as onnxruntime: it is
// chosen only at position 0 (see argExtreme).
func newArgExtreme(largest bool) Factory {
	return func(n *Node) (Kernel, error) {
		axis, err := n.Attrs.Int("axis", 0)
		if err != nil {
			return nil, err
		}
		keep, err := n.Attrs.Int("keepdims", 1)
		if err != nil {
			return nil, err
		}
		last := int64(0)
		if n.Opset >= 12 {
			if last, err = n.Attrs.Int("select_last_index", 0); err != nil {
				return nil, err
			}
		}
		if err := n.checkTypes(numericTypes, 0); err != nil {
			return nil, err
		}
		desc := n.Describe()
		return KernelFunc(func(ctx *Context) error {
			x, err := ctx.RequireInput(0)
			if err != nil {
				return err
			}
			sh := x.Shape()
			r := max0(len(sh))
			ax, err := tensor.NormAxis(int(axis), r)
			if err != nil {
				return fmt.Errorf("%s: %w", desc, err)
			}
			dim := 1
			if len(sh) > 0 {
				dim = sh[ax]
			}
			outShape := ctx.ScratchShape(len(sh))[:0]
			for j, d := range sh {
				switch {
				case j != ax:
					outShape = append(outShape, d)
				case keep != 0:
					outShape = append(outShape, 1)
				}
			}
			if outShape == nil {
				outShape = tensor.Shape{}
			}
			outer := tensor.Shape(sh[:min(ax, len(sh))]).Size()
			inner := 1
			if len(sh) > 0 {
				inner = tensor.Shape(sh[ax+1:]).Size()
			}
			if dim == 0 && outer*inner > 0 {
				return fmt.Errorf("%w: %s over an empty axis", errs.ErrInvalidArgument, desc)
			}
			out, err := ctx.NewOutputUninit(0, tensor.Int64, outShape)
			if err != nil {
				return err
			}
			if out.Len() == 0 {
				return nil
			}
			keys, err := keysOf(ctx, n.OpType, x)
			if err != nil {
				return err
			}
			dst := out.Int64()
			for o := 0; o < outer; o++ {
				for i := 0; i < inner; i++ {
					base := o*dim*inner + i
					var j int
					if keys.f != nil {
						j = argExtreme(keys.f[base:], inner, dim, largest, last != 0)
					} else {
						j = argExtreme(keys.i[base:], inner, dim, largest, last != 0)
					}
					dst[o*inner+i] = int64(j)
				}
			}
			return nil
		}), nil
	}
}

// max0 is a scalar's rank as ArgMax reads it: a scalar has one axis of one
// element.
func max0(rank int) int { return max(rank, 1) }

// argExtreme returns the position of the first (or last) greatest (or
// least) of dim elements stride apart in row, as onnxruntime finds it: the
// running best is replaced only by a value that compares greater (less),
// or equal with last, so a NaN never replaces a number and a NaN at
// position 0 stays (no number compares greater than it).
func argExtreme[T float64 | int64](row []T, stride, dim int, largest, last bool) int {
	best, b := 0, row[0]
	for j := 1; j < dim; j++ {
		v := row[j*stride]
		take := v < b
		if largest {
			take = v > b
		}
		if take || (last && v == b) {
			best, b = j, v
		}
	}
	return best
}
