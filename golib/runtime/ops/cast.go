package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Cast", 6, 0, newCast)
	Register("", "CastLike", 15, 0, newCastLike)
}

func newCast(n *Node) (Kernel, error) {
	to, err := n.Attrs.Int("to", 0)
	if err != nil {
		return nil, err
	}
	if to == 0 { // absent, or TensorProto.UNDEFINED
		return nil, fmt.Errorf("%w: Cast needs its required attribute 'to' (an element type)", errs.ErrInvalidModel)
	}
	dt := tensor.DType(to)
	if !dt.Valid() {
		return nil, fmt.Errorf("%w: Cast to element type %d", errs.ErrNotImplemented, to)
	}
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		out, err := ctx.NewOutputUninit(0, dt, x.Shape())
		if err != nil {
			return err
		}
		return castInto(x, out)
	}), nil
}

func newCastLike(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, like, err := twoInputs(ctx)
		if err != nil {
			return err
		}
		out, err := ctx.NewOutputUninit(0, like.DType(), x.Shape())
		if err != nil {
			return err
		}
		return castInto(x, out)
	}), nil
}

// castInto converts x's elements into out (same element count). Floats go
// through float64 (exact for every float type), integers and bools through
// int64; float to integer truncates toward zero and saturates.
func castInto(x, out *tensor.Tensor) error {
	if x.DType() == out.DType() {
		copy(out.Bytes(), x.Bytes())
		return nil
	}
	if x.DType() == tensor.Float32 && out.DType() != tensor.Float64 && out.DType().IsFloat() {
		return tensor.FromFloat32(out, x.Float32())
	}
	if out.DType() == tensor.Float32 {
		return tensor.ToFloat32(x, out.Float32())
	}
	n := x.Len()
	if x.DType().IsFloat() {
		v := make([]float64, n)
		switch x.DType() {
		case tensor.Float64:
			copy(v, x.Float64())
		default:
			f, err := tensor.AsFloat32(x)
			if err != nil {
				return err
			}
			tensor.ConvertSlice(v, f)
		}
		return storeFloat64(out, v)
	}
	v, err := int64OrBoolValues(x)
	if err != nil {
		return err
	}
	switch {
	case out.DType() == tensor.Bool:
		d := out.Bool()
		for i, e := range v {
			d[i] = e != 0
		}
		return nil
	case out.DType().IsFloat():
		f := make([]float64, n)
		tensor.ConvertSlice(f, v)
		return storeFloat64(out, f)
	}
	return storeInt64(out, v)
}

// floatToInt64 and floatToInt32 truncate toward zero. ONNX leaves
// out-of-range and NaN conversions undefined; these follow what numpy's
// astype and onnxruntime produce on x86 (the "integer indefinite" minimum
// value), and narrower integer types wrap the int32 result, as a C cast
// does.
func floatToInt64(v float64) int64 {
	if v != v || v >= 9.223372036854775807e18 || v < -9.223372036854775808e18 {
		return math.MinInt64
	}
	return int64(v)
}

func floatToInt32(v float64) int32 {
	if v != v || v >= 2147483648 || v <= -2147483649 {
		return math.MinInt32
	}
	return int32(v)
}

// storeFloat64 writes float64 values into out, converting to its type.
func storeFloat64(out *tensor.Tensor, v []float64) error {
	switch out.DType() {
	case tensor.Float64:
		copy(out.Float64(), v)
	case tensor.Float32:
		tensor.ConvertSlice(out.Float32(), v)
	case tensor.Float16:
		d := out.Float16()
		for i, e := range v {
			d[i] = tensor.Float16Bits(codec.F32ToF16(float32(e)))
		}
	case tensor.BFloat16:
		d := out.BFloat16()
		for i, e := range v {
			d[i] = tensor.BFloat16Bits(codec.F32ToBF16(float32(e)))
		}
	case tensor.Bool:
		d := out.Bool()
		for i, e := range v {
			d[i] = e != 0
		}
	case tensor.Int64:
		d := out.Int64()
		for i, e := range v {
			d[i] = floatToInt64(e)
		}
	case tensor.Int32:
		d := out.Int32()
		for i, e := range v {
			d[i] = floatToInt32(e)
		}
	case tensor.Int8:
		d := out.Int8()
		for i, e := range v {
			d[i] = int8(floatToInt32(e))
		}
	case tensor.Uint8:
		d := out.Uint8()
		for i, e := range v {
			d[i] = uint8(floatToInt32(e))
		}
	case tensor.Int16:
		d := tensor.Data[int16](out)
		for i, e := range v {
			d[i] = int16(floatToInt32(e))
		}
	case tensor.Uint16:
		d := tensor.Data[uint16](out)
		for i, e := range v {
			d[i] = uint16(floatToInt32(e))
		}
	case tensor.Uint32:
		d := tensor.Data[uint32](out)
		for i, e := range v {
			d[i] = uint32(floatToInt64(e))
		}
	default:
		return fmt.Errorf("%w: cast to %v", errs.ErrType, out.DType())
	}
	return nil
}
