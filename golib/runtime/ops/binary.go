package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// binaryOp holds one arithmetic op per element type family.
type binaryOp struct {
	f32 func(x, y float32) float32
	f64 func(x, y float64) float64
	i64 func(x, y int64) (int64, error)
}

var errDivZero = fmt.Errorf("%w: integer division by zero", errs.ErrInvalidArgument)

var binaryOps = map[string]binaryOp{
	"Add": {func(x, y float32) float32 { return x + y }, func(x, y float64) float64 { return x + y },
		func(x, y int64) (int64, error) { return x + y, nil }},
	"Sub": {func(x, y float32) float32 { return x - y }, func(x, y float64) float64 { return x - y },
		func(x, y int64) (int64, error) { return x - y, nil }},
	"Mul": {func(x, y float32) float32 { return x * y }, func(x, y float64) float64 { return x * y },
		func(x, y int64) (int64, error) { return x * y, nil }},
	"Div": {func(x, y float32) float32 { return x / y }, func(x, y float64) float64 { return x / y },
		func(x, y int64) (int64, error) {
			if y == 0 {
				return 0, errDivZero
			}
			return x / y, nil
		}},
	"Pow": {powf32, math.Pow, func(x, y int64) (int64, error) { return int64(math.Pow(float64(x), float64(y))), nil }},
}

// powf32 special-cases the exponents exporters emit (x^2 in RMSNorm, x^0.5)
// so they are exact and fast.
// PowF32 is the float32 Pow kernel's function (x**y, exact for the
// exponents 0.5, 1, 2 and 3), for fused kernels that repeat a Pow.
func PowF32(x, y float32) float32 { return powf32(x, y) }

func powf32(x, y float32) float32 {
	switch y {
	case 2:
		return x * x
	case 1:
		return x
	case 0.5:
		return float32(math.Sqrt(float64(x)))
	case 3:
		return x * x * x
	}
	return float32(math.Pow(float64(x), float64(y)))
}

func init() {
	for _, op := range []string{"Add", "Sub", "Mul", "Div"} {
		Register("", op, 7, 0, newBinary(op))
	}
	Register("", "Pow", 7, 0, newBinary("Pow"))
	Register("", "Equal", 7, 0, newCompare("Equal"))
	Register("", "Less", 7, 0, newCompare("Less"))
	Register("", "Greater", 7, 0, newCompare("Greater"))
}

func newBinary(name string) Factory {
	op, k := binaryOps[name], f32Kinds[name]
	return func(n *Node) (Kernel, error) {
		return KernelFunc(func(ctx *Context) error {
			a, b, err := twoInputs(ctx)
			if err != nil {
				return err
			}
			if a.DType() != b.DType() && name != "Pow" {
				return errOperandTypes(name, a, b)
			}
			out, err := newBroadcastOutput(ctx, a.DType(), a, b)
			if err != nil {
				return err
			}
			if name == "Pow" && a.DType().IsInt() && b.DType().IsFloat() {
				return powIntFloat(a, b, out)
			}
			if name == "Pow" && a.DType().IsFloat() && b.DType().IsInt() {
				return powFloatInt(ctx, a, b, out)
			}
			if k != 0 && a.DType() == tensor.Float32 && b.DType() == tensor.Float32 {
				return binaryF32(k, a.Float32(), a.Shape(), b.Float32(), b.Shape(), out.Float32(), out.Shape())
			}
			if k != 0 && isHalf(a.DType()) {
				return binaryHalf(ctx, k, a, b, out)
			}
			return binaryCompute(ctx, op, a, b, out)
		}), nil
	}
}

// binaryCompute is the generic path of the binary ops; float16/bfloat16
// operands are converted in ctx's scratch (nil: fresh slices).
func binaryCompute(ctx *Context, op binaryOp, a, b, out *tensor.Tensor) error {
	as, bs, os := a.Shape(), b.Shape(), out.Shape()
	switch {
	case a.DType() == tensor.Float64 && b.DType() == tensor.Float64:
		return binaryApply(a.Float64(), as, b.Float64(), bs, out.Float64(), os, op.f64)
	case a.DType().IsFloat():
		x, y, err := convertBoth(ctx.AsFloat32, a, b)
		if err != nil {
			return err
		}
		dst := f32Result(ctx, out)
		if err := binaryApply(x, as, y, bs, dst, os, op.f32); err != nil {
			return err
		}
		return storeF32Result(out, dst)
	case a.DType().IsInt():
		x, y, err := convertBoth(int64OrBoolValues, a, b)
		if err != nil {
			return err
		}
		var res []int64
		if out.DType() == tensor.Int64 {
			res = out.Int64() // a fresh output: it aliases neither operand
		} else {
			res = make([]int64, out.Len())
		}
		var opErr error
		if err := binaryApply(x, as, y, bs, res, os, func(p, q int64) int64 {
			v, e := op.i64(p, q)
			if e != nil {
				opErr = e
			}
			return v
		}); err != nil {
			return err
		}
		if opErr != nil {
			return opErr
		}
		if out.DType() == tensor.Int64 {
			return nil
		}
		return storeInt64(out, res)
	}
	return fmt.Errorf("%w: arithmetic on %v", errs.ErrType, a.DType())
}

// powIntFloat is Pow with an integer base and a float exponent: computed
// in float64 and truncated to the base's integer type.
func powIntFloat(a, b, out *tensor.Tensor) error {
	x, y, err := convertBoth(func(t *tensor.Tensor) ([]float64, error) { return reduceSource(nil, t) }, a, b)
	if err != nil {
		return err
	}
	res := make([]int64, out.Len())
	if err := binaryApply(x, a.Shape(), y, b.Shape(), res, out.Shape(), func(p, q float64) int64 {
		return tensor.SaturateInt(math.Pow(p, q), math.MinInt64, math.MaxInt64)
	}); err != nil {
		return err
	}
	return storeInt64(out, res)
}

// powFloatInt is Pow with a float base and an integer exponent, computed in
// float64 with the exponent read exactly: converted to float32 with the
// base, an odd exponent above 2^24 rounded to an even one and lost the sign
// of a negative base. Beyond 2^53, where float64 has no odd integers either,
// the parity comes from the integer.
func powFloatInt(ctx *Context, a, b, out *tensor.Tensor) error {
	x, err := reduceSource(ctx, a)
	if err != nil {
		return err
	}
	y, err := int64OrBoolValues(b)
	if err != nil {
		return err
	}
	res := ctx.Float64s(out.Len())
	if err := binaryApply(x, a.Shape(), y, b.Shape(), res, out.Shape(), powInt); err != nil {
		return err
	}
	return storeFloat64(out, res)
}

// powInt is x**e for an integer exponent, the sign of a negative base taken
// from e's parity.
func powInt(x float64, e int64) float64 {
	if e >= -1<<53 && e <= 1<<53 {
		return math.Pow(x, float64(e))
	}
	r := math.Pow(math.Abs(x), float64(e))
	if x < 0 && e&1 != 0 {
		r = -r
	}
	return r
}

// storeInt64 writes int64 values into an integer tensor, wrapping like C.
func storeInt64(out *tensor.Tensor, v []int64) error {
	switch out.DType() {
	case tensor.Int64:
		copy(out.Int64(), v)
	case tensor.Int32:
		tensor.ConvertSlice(out.Int32(), v)
	case tensor.Int8:
		tensor.ConvertSlice(out.Int8(), v)
	case tensor.Uint8:
		tensor.ConvertSlice(out.Uint8(), v)
	case tensor.Int16:
		tensor.ConvertSlice(tensor.Data[int16](out), v)
	case tensor.Uint16:
		tensor.ConvertSlice(tensor.Data[uint16](out), v)
	case tensor.Uint32:
		tensor.ConvertSlice(tensor.Data[uint32](out), v)
	default:
		return fmt.Errorf("%w: integer result into %v", errs.ErrType, out.DType())
	}
	return nil
}

func newCompare(name string) Factory {
	return func(n *Node) (Kernel, error) {
		// Made once per node: a generic closure is a heap allocation.
		cmpI64, cmpF32, cmpF64 := cmpFunc[int64](name), cmpFunc[float32](name), cmpFunc[float64](name)
		return KernelFunc(func(ctx *Context) error {
			a, b, err := twoInputs(ctx)
			if err != nil {
				return err
			}
			if a.DType() != b.DType() {
				return errOperandTypes(name, a, b)
			}
			out, err := newBroadcastOutput(ctx, tensor.Bool, a, b)
			if err != nil {
				return err
			}
			as, bs, os, dst := a.Shape(), b.Shape(), out.Shape(), out.Bool()
			if a.DType().IsInt() || a.DType() == tensor.Bool {
				x, y, err := convertBoth(int64OrBoolValues, a, b)
				if err != nil {
					return err
				}
				return binaryApply(x, as, y, bs, dst, os, cmpI64)
			}
			if a.DType() == tensor.Float64 {
				return binaryApply(a.Float64(), as, b.Float64(), bs, dst, os, cmpF64)
			}
			x, y, err := convertBoth(ctx.AsFloat32, a, b)
			if err != nil {
				return err
			}
			return binaryApply(x, as, y, bs, dst, os, cmpF32)
		}), nil
	}
}

// convertBoth reads both operands of a binary op as one computing type
// with conv (tensor.AsFloat32, tensor.Int64Values, ...).
func convertBoth[T any](conv func(*tensor.Tensor) ([]T, error), a, b *tensor.Tensor) (x, y []T, err error) {
	if x, err = conv(a); err != nil {
		return nil, nil, err
	}
	if y, err = conv(b); err != nil {
		return nil, nil, err
	}
	return x, y, nil
}

// int64OrBoolValues returns an integer or bool tensor's values as int64
// (true is 1): an int64 tensor's own elements, otherwise a copy, so callers
// only read them.
func int64OrBoolValues(t *tensor.Tensor) ([]int64, error) {
	if t.DType() == tensor.Int64 {
		return t.Int64(), nil
	}
	if t.DType() != tensor.Bool {
		return tensor.Int64Values(t)
	}
	v := make([]int64, t.Len())
	for i, x := range t.Bool() {
		if x {
			v[i] = 1
		}
	}
	return v, nil
}

func cmpFunc[T int64 | float32 | float64](name string) func(x, y T) bool {
	switch name {
	case "Less":
		return func(x, y T) bool { return x < y }
	case "Greater":
		return func(x, y T) bool { return x > y }
	case "LessOrEqual":
		return func(x, y T) bool { return x <= y }
	case "GreaterOrEqual":
		return func(x, y T) bool { return x >= y }
	}
	return func(x, y T) bool { return x == y }
}
