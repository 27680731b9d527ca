package tensor

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

// AsFloat32 returns t's values as float32. For a float32 tensor it is the
// aliased view (no copy); float16/bfloat16/float64 and integer tensors are
// converted into a new slice. Kernels compute fp16/bf16 in fp32 this way.
func AsFloat32(t *Tensor) ([]float32, error) {
	if t.dtype == Float32 {
		return t.Float32(), nil
	}
	out := make([]float32, t.Len())
	if err := ToFloat32(t, out); err != nil {
		return nil, err
	}
	return out, nil
}

// ToFloat32 converts every element of t into dst (len(dst) == t.Len()).
func ToFloat32(t *Tensor, dst []float32) error {
	if len(dst) != t.Len() {
		return fmt.Errorf("%w: destination of %d for %d elements", errs.ErrInvalidArgument, len(dst), t.Len())
	}
	switch t.dtype {
	case Float32:
		copy(dst, t.Float32())
	case Float16:
		codec.DecodeF16(dst, Bits16(t.Float16()))
	case BFloat16:
		codec.DecodeBF16(dst, Bits16(t.BFloat16()))
	case Float64:
		ConvertSlice(dst, t.Float64())
	case Int64:
		ConvertSlice(dst, t.Int64())
	case Int32:
		ConvertSlice(dst, t.Int32())
	case Int8:
		ConvertSlice(dst, t.Int8())
	case Uint8:
		ConvertSlice(dst, t.Uint8())
	case Int16:
		ConvertSlice(dst, Data[int16](t))
	case Uint16:
		ConvertSlice(dst, Data[uint16](t))
	case Uint32:
		ConvertSlice(dst, Data[uint32](t))
	case Bool:
		for i, v := range t.Bool() {
			if v {
				dst[i] = 1
			} else {
				dst[i] = 0
			}
		}
	default:
		return fmt.Errorf("%w: cannot convert %v to float32", errs.ErrType, t.dtype)
	}
	return nil
}

// FromFloat32 stores src into t (len(src) == t.Len()), converting to t's
// element type: round-to-nearest-even for float16/bfloat16, truncation toward
// zero (saturating at the type's range, NaN to 0) for integers, != 0 for bool.
func FromFloat32(t *Tensor, src []float32) error {
	if len(src) != t.Len() {
		return fmt.Errorf("%w: source of %d for %d elements", errs.ErrInvalidArgument, len(src), t.Len())
	}
	switch t.dtype {
	case Float32:
		copy(t.Float32(), src)
	case Float16:
		codec.EncodeF16(Bits16(t.Float16()), src)
	case BFloat16:
		codec.EncodeBF16(Bits16(t.BFloat16()), src)
	case Float64:
		ConvertSlice(t.Float64(), src)
	case Int64:
		saturateInto(t.Int64(), src, math.MinInt64, math.MaxInt64)
	case Int32:
		saturateInto(t.Int32(), src, math.MinInt32, math.MaxInt32)
	case Int8:
		saturateInto(t.Int8(), src, math.MinInt8, math.MaxInt8)
	case Uint8:
		saturateInto(t.Uint8(), src, 0, math.MaxUint8)
	case Int16:
		saturateInto(Data[int16](t), src, math.MinInt16, math.MaxInt16)
	case Uint16:
		saturateInto(Data[uint16](t), src, 0, math.MaxUint16)
	case Uint32:
		saturateInto(Data[uint32](t), src, 0, math.MaxUint32)
	case Bool:
		d := t.Bool()
		for i, v := range src {
			d[i] = v != 0
		}
	default:
		return fmt.Errorf("%w: cannot convert float32 to %v", errs.ErrType, t.dtype)
	}
	return nil
}

// Number is the element types that Go converts between with a plain
// conversion (every Elem but bool and the 16-bit float bit patterns; uint16
// without ~, so that Float16Bits and BFloat16Bits stay out).
type Number interface {
	~float32 | ~float64 | ~int64 | ~int32 | ~int8 | ~uint8 | ~int16 | uint16 | ~uint32
}

// ConvertSlice sets dst[i] = D(src[i]) for every element of src (dst is at
// least as long): integers widen or wrap like a C cast, int and float64 to
// float32 round to nearest. Float to integer goes through SaturateInt
// instead: Go leaves out-of-range float-to-int conversions undefined.
func ConvertSlice[D, S Number](dst []D, src []S) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = D(v)
	}
}

// saturateInto sets dst[i] to src[i] truncated toward zero and clamped to
// [lo, hi], the range of D (see SaturateInt).
func saturateInto[D int64 | int32 | int8 | uint8 | int16 | uint16 | uint32](dst []D, src []float32, lo, hi int64) {
	dst = dst[:len(src)]
	for i, v := range src {
		dst[i] = D(SaturateInt(float64(v), lo, hi))
	}
}

// SaturateInt truncates v toward zero and clamps it to [lo, hi]; NaN gives 0.
// Go's float-to-int conversion is implementation-defined out of range, so
// every float-to-integer cast in the runtime goes through this.
func SaturateInt(v float64, lo, hi int64) int64 {
	switch {
	case v != v:
		return 0
	case v <= float64(lo):
		return lo
	case v >= float64(hi):
		return hi
	}
	return int64(v)
}

// Float32Tensor allocates a float32 tensor holding a copy of src.
func Float32Tensor(shape Shape, src []float32) (*Tensor, error) {
	t, err := New(Float32, shape)
	if err != nil {
		return nil, err
	}
	if err := FromFloat32(t, src); err != nil {
		return nil, err
	}
	return t, nil
}

// Int64Values returns an integer tensor's values as int64 (a copy), for
// shape-like inputs (Reshape shape, Slice starts, Gather indices...).
func Int64Values(t *Tensor) ([]int64, error) {
	return Int64ValuesTo(make([]int64, t.Len()), t)
}

// Int64ValuesTo is Int64Values writing into out, which must have t.Len()
// elements.
func Int64ValuesTo(out []int64, t *Tensor) ([]int64, error) {
	if len(out) != t.Len() {
		return nil, fmt.Errorf("%w: %d values for a tensor of %d", errs.ErrInvalidArgument, len(out), t.Len())
	}
	switch t.dtype {
	case Int64:
		copy(out, t.Int64())
	case Int32:
		ConvertSlice(out, t.Int32())
	case Int8:
		ConvertSlice(out, t.Int8())
	case Uint8:
		ConvertSlice(out, t.Uint8())
	case Int16:
		ConvertSlice(out, Data[int16](t))
	case Uint16:
		ConvertSlice(out, Data[uint16](t))
	case Uint32:
		ConvertSlice(out, Data[uint32](t))
	default:
		return nil, fmt.Errorf("%w: want an integer tensor, got %v", errs.ErrType, t.dtype)
	}
	return out, nil
}

// Bits16 views 16-bit float elements as their bits, for the codec slice
// conversions (vectorized where the CPU allows).
func Bits16[T Float16Bits | BFloat16Bits](x []T) []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}
