package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Clip", 11, 0, newClip)
	Register("", "Tile", 6, 0, newTile)
	Register("", "CumSum", 11, 0, newCumSum)
	Register("", "Mod", 10, 0, newMod)
}

// newClip clamps to optional scalar min/max inputs (opset 11+). Integer
// inputs are clamped in int64, which holds every integer type exactly;
// floats in float64.
func newClip(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		var bounds [2]*tensor.Tensor
		for i := range bounds {
			t := ctx.Input(i + 1)
			if t != nil && (t.Len() != 1 || t.DType() != x.DType()) {
				return fmt.Errorf("%w: Clip bounds must be scalars of the input type", errs.ErrInvalidArgument)
			}
			bounds[i] = t
		}
		out, err := ctx.NewOutput(0, x.DType(), x.Shape())
		if err != nil {
			return err
		}
		if x.DType().IsInt() {
			lo, hi := int64(math.MinInt64), int64(math.MaxInt64)
			for i, p := range []*int64{&lo, &hi} {
				if bounds[i] == nil {
					continue
				}
				b, err := tensor.Int64Values(bounds[i])
				if err != nil {
					return err
				}
				*p = b[0]
			}
			v, err := tensor.Int64Values(x)
			if err != nil {
				return err
			}
			for i := range v {
				v[i] = min(max(v[i], lo), hi)
			}
			return storeInt64(out, v)
		}
		// An absent bound is the type's lowest / largest finite value, as
		// the spec says (numeric_limits::lowest() and max()) and onnxruntime
		// does: infinities are clamped to them.
		top := maxFinite(x.DType())
		lo, hi := -top, top
		for i, p := range []*float64{&lo, &hi} {
			if bounds[i] == nil {
				continue
			}
			b, err := scalarFloat64(bounds[i])
			if err != nil {
				return err
			}
			*p = b
		}
		v, err := reduceSource(nil, x)
		if err != nil {
			return err
		}
		for i := range v {
			if v[i] == v[i] { // NaN stays NaN
				v[i] = min(max(v[i], lo), hi)
			}
		}
		return storeFloat64(out, v)
	}), nil
}

// maxFinite is the largest finite value of a floating-point type.
func maxFinite(dt tensor.DType) float64 {
	switch dt {
	case tensor.Float16:
		return 65504
	case tensor.BFloat16:
		return 0x1.fep127 // 3.3895314e38
	case tensor.Float64:
		return math.MaxFloat64
	}
	return math.MaxFloat32
}

func scalarFloat64(t *tensor.Tensor) (float64, error) {
	v, err := reduceSource(nil, t)
	if err != nil {
		return 0, err
	}
	if len(v) != 1 {
		return 0, fmt.Errorf("%w: want a scalar, got %v", errs.ErrShape, t.Shape())
	}
	return v[0], nil
}

func newTile(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		reps, err := shapeInput(ctx, 1)
		if err != nil {
			return err
		}
		if len(reps) != x.Rank() {
			return fmt.Errorf("%w: Tile repeats %v for rank %d", errs.ErrInvalidArgument, reps, x.Rank())
		}
		outShape := make(tensor.Shape, x.Rank())
		for i, r := range reps {
			if r < 0 || r > tensor.MaxElements {
				return fmt.Errorf("%w: Tile repeat %d", errs.ErrInvalidArgument, r)
			}
			// an input with no elements may have dimensions above the
			// limit: their product must not wrap around
			if d := x.Shape()[i]; d != 0 && int(r) > math.MaxInt/d {
				return fmt.Errorf("%w: Tile of %v by %v", errs.ErrLimit, x.Shape(), reps)
			}
			outShape[i] = x.Shape()[i] * int(r)
		}
		if _, err := outShape.NumElements(); err != nil {
			return err
		}
		out, err := ctx.NewOutput(0, x.DType(), outShape)
		if err != nil {
			return err
		}
		// out index -> in index: coordinate-wise modulo the input dims
		idx := make([]int, out.Len())
		inStrides := x.Shape().Strides()
		ctr := make([]int, len(outShape))
		for o := range idx {
			off := 0
			for d, c := range ctr {
				off += (c % x.Shape()[d]) * inStrides[d]
			}
			idx[o] = off
			for d := len(ctr) - 1; d >= 0; d-- {
				if ctr[d]++; ctr[d] < outShape[d] {
					break
				}
				ctr[d] = 0
			}
		}
		gatherElems(out.Bytes(), x.Bytes(), idx, x.DType().Size())
		return nil
	}), nil
}

func newCumSum(n *Node) (Kernel, error) {
	exclusive, err := n.Attrs.Int("exclusive", 0)
	if err != nil {
		return nil, err
	}
	reverse, err := n.Attrs.Int("reverse", 0)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		x, at, err := twoInputs(ctx)
		if err != nil {
			return err
		}
		av, err := tensor.Int64Values(at)
		if err != nil || len(av) != 1 {
			return fmt.Errorf("%w: CumSum axis must be an integer scalar", errs.ErrInvalidArgument)
		}
		ax, err := tensor.NormAxis(int(av[0]), x.Rank())
		if err != nil {
			return err
		}
		sh := x.Shape()
		outer, dim, inner := tensor.Shape(sh[:ax]).Size(), sh[ax], tensor.Shape(sh[ax+1:]).Size()
		out, err := ctx.NewOutput(0, x.DType(), sh)
		if err != nil {
			return err
		}
		if out.Len() == 0 {
			return nil // outer * inner may be huge (2^30 x 2^30 x 0)
		}
		if x.DType().IsInt() {
			// int64 holds every integer type exactly, and its sums wrap
			// like the narrower type's once stored back.
			src, err := tensor.Int64Values(x)
			if err != nil {
				return err
			}
			res := make([]int64, len(src))
			cumScan(src, res, outer, dim, inner, exclusive != 0, reverse != 0)
			return storeInt64(out, res)
		}
		src, err := reduceSource(nil, x)
		if err != nil {
			return err
		}
		res := make([]float64, len(src))
		cumScan(src, res, outer, dim, inner, exclusive != 0, reverse != 0)
		return storeFloat64(out, res)
	}), nil
}

// cumScan writes into dst the running sums of src along the middle axis of
// its [outer, dim, inner] view: inclusive or exclusive (the sum before each
// element), from the start or, reversed, from the end of the axis.
func cumScan[T int64 | float64](src, dst []T, outer, dim, inner int, exclusive, reverse bool) {
	for o := 0; o < outer; o++ {
		for i := 0; i < inner; i++ {
			var acc T
			for k := 0; k < dim; k++ {
				kk := k
				if reverse {
					kk = dim - 1 - k
				}
				j := (o*dim+kk)*inner + i
				v := src[j]
				if exclusive {
					dst[j] = acc
					acc += v
				} else {
					acc += v
					dst[j] = acc
				}
			}
		}
	}
}

// floorMod is Mod with fmod=0 on floats: the remainder takes the divisor's
// sign (numpy.mod, Python's %). A zero remainder is a zero of the divisor's
// sign; x mod 0 and inf mod y are NaN; x mod inf is x when the signs agree
// (else inf with the divisor's sign), as in numpy.
func floorMod(x, y float64) float64 {
	m := math.Mod(x, y)
	if y == 0 {
		return m
	}
	if m == 0 {
		return math.Copysign(0, y)
	}
	if (m < 0) != (y < 0) {
		m += y
	}
	return m
}

func newMod(n *Node) (Kernel, error) {
	fmod, err := n.Attrs.Int("fmod", 0)
	if err != nil {
		return nil, err
	}
	fmodF64 := math.Mod
	if fmod == 0 {
		fmodF64 = floorMod
	}
	op := binaryOp{
		f32: func(x, y float32) float32 { return float32(fmodF64(float64(x), float64(y))) },
		f64: fmodF64,
		i64: func(x, y int64) (int64, error) {
			if y == 0 {
				return 0, errDivZero
			}
			m := x % y
			if fmod == 0 && m != 0 && (m < 0) != (y < 0) {
				m += y // integer Mod takes the divisor's sign, like Python
			}
			return m, nil
		},
	}
	return KernelFunc(func(ctx *Context) error {
		a, b, err := twoInputs(ctx)
		if err != nil {
			return err
		}
		if a.DType() != b.DType() {
			return errOperandTypes("Mod", a, b)
		}
		out, err := newBroadcastOutput(ctx, a.DType(), a, b)
		if err != nil {
			return err
		}
		return binaryCompute(ctx, op, a, b, out)
	}), nil
}
