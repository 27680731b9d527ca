package model

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// littleEndian is true on the hosts whose memory order matches raw_data's
// (ONNX stores raw_data little-endian).
var littleEndian = func() bool { x := uint16(1); return *(*byte)(unsafe.Pointer(&x)) == 1 }()

// TensorFromProto decodes a TensorProto that has no external data (a
// Constant's value attribute, for example).
func TensorFromProto(tp *onnxpb.TensorProto) (*tensor.Tensor, error) {
	return tensorFromProto(tp, "", &extBudget{})
}

func tensorFromProto(tp *onnxpb.TensorProto, baseDir string, ext *extBudget) (*tensor.Tensor, error) {
	dt := tensor.DType(tp.GetDataType())
	if !dt.Valid() {
		if dt == 8 {
			return nil, fmt.Errorf("%w: string tensors", errs.ErrNotImplemented)
		}
		return nil, fmt.Errorf("%w: element type %d", errs.ErrNotImplemented, tp.GetDataType())
	}
	if tp.GetSegment() != nil {
		return nil, fmt.Errorf("%w: segmented tensors", errs.ErrNotImplemented)
	}
	shape := make(tensor.Shape, len(tp.GetDims()))
	for i, d := range tp.GetDims() {
		if d < 0 || d > tensor.MaxElements {
			return nil, fmt.Errorf("%w: dimension %d is %d", errs.ErrInvalidModel, i, d)
		}
		shape[i] = int(d)
	}
	n, err := shape.NumElements()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", errs.ErrInvalidModel, err)
	}
	if !littleEndian {
		return nil, fmt.Errorf("%w: loading tensors on a big-endian host", errs.ErrNotImplemented)
	}
	nbytes := n * dt.Size() // n <= MaxElements, so no overflow
	if tp.GetDataLocation() == onnxpb.TensorProto_EXTERNAL {
		return readExternal(tp, dt, shape, nbytes, baseDir, ext)
	}
	if raw := tp.GetRawData(); raw != nil || n == 0 {
		if len(raw) != nbytes {
			return nil, fmt.Errorf("%w: raw_data has %d bytes, shape %v of %v needs %d", errs.ErrInvalidModel, len(raw), shape, dt, nbytes)
		}
		if t, err := tensor.FromBytes(dt, shape, raw); err == nil {
			return normBool(t), nil
		}
		t, err := tensor.New(dt, shape) // misaligned: copy once
		if err != nil {
			return nil, err
		}
		copy(t.Bytes(), raw)
		return normBool(t), nil
	}
	return typedFields(tp, dt, shape, n)
}

// normBool maps every non-zero byte of a bool tensor to 1, so that the
// []bool view holds only valid Go bools.
func normBool(t *tensor.Tensor) *tensor.Tensor {
	if t.DType() != tensor.Bool {
		return t
	}
	b := t.Bytes()
	for i, v := range b {
		if v > 1 {
			c := t.Clone()
			cb := c.Bytes()
			for j := i; j < len(cb); j++ {
				if cb[j] != 0 {
					cb[j] = 1
				}
			}
			return c
		}
	}
	return t
}

func typedFields(tp *onnxpb.TensorProto, dt tensor.DType, shape tensor.Shape, n int) (*tensor.Tensor, error) {
	count := 0
	switch dt {
	case tensor.Float32:
		count = len(tp.GetFloatData())
	case tensor.Float64:
		count = len(tp.GetDoubleData())
	case tensor.Int64:
		count = len(tp.GetInt64Data())
	case tensor.Uint32:
		count = len(tp.GetUint64Data())
	default: // int32, int16, uint16, int8, uint8, bool, float16, bfloat16 live in int32_data
		count = len(tp.GetInt32Data())
	}
	if count != n {
		return nil, fmt.Errorf("%w: tensor of shape %v has %d values in its typed field, want %d", errs.ErrInvalidModel, shape, count, n)
	}
	t, err := tensor.New(dt, shape)
	if err != nil {
		return nil, err
	}
	switch dt {
	case tensor.Float32:
		copy(t.Float32(), tp.GetFloatData())
	case tensor.Float64:
		copy(t.Float64(), tp.GetDoubleData())
	case tensor.Int64:
		copy(t.Int64(), tp.GetInt64Data())
	case tensor.Int32:
		copy(t.Int32(), tp.GetInt32Data())
	case tensor.Int8:
		err = narrowInts(t.Int8(), tp.GetInt32Data(), math.MinInt8, math.MaxInt8, "int8")
	case tensor.Uint8:
		err = narrowInts(t.Uint8(), tp.GetInt32Data(), 0, math.MaxUint8, "uint8")
	case tensor.Int16:
		err = narrowInts(tensor.Data[int16](t), tp.GetInt32Data(), math.MinInt16, math.MaxInt16, "int16")
	case tensor.Uint16:
		err = narrowInts(tensor.Data[uint16](t), tp.GetInt32Data(), 0, math.MaxUint16, "uint16")
	case tensor.Uint32:
		d := tensor.Data[uint32](t)
		for i, v := range tp.GetUint64Data() {
			if v > math.MaxUint32 {
				return nil, fmt.Errorf("%w: uint32 value %d out of range", errs.ErrInvalidModel, v)
			}
			d[i] = uint32(v)
		}
	case tensor.Bool:
		d := t.Bool()
		for i, v := range tp.GetInt32Data() {
			d[i] = v != 0
		}
	case tensor.Float16:
		d := t.Float16()
		for i, v := range tp.GetInt32Data() {
			d[i] = tensor.Float16Bits(uint16(v))
		}
	case tensor.BFloat16:
		d := t.BFloat16()
		for i, v := range tp.GetInt32Data() {
			d[i] = tensor.BFloat16Bits(uint16(v))
		}
	}
	if err != nil {
		return nil, err
	}
	return t, nil
}

// narrowInts stores int32_data values into dst, refusing any value outside
// [lo, hi] (name is the element type, for the message).
func narrowInts[D int8 | uint8 | int16 | uint16](dst []D, src []int32, lo, hi int32, name string) error {
	for i, v := range src {
		if v < lo || v > hi {
			return fmt.Errorf("%w: %s value %d out of range", errs.ErrInvalidModel, name, v)
		}
		dst[i] = D(v)
	}
	return nil
}
