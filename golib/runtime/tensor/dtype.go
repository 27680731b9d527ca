// Package tensor is the runtime's dense tensor value: an element type, a
// shape and a byte buffer, with typed views that never copy, numpy-style
// broadcasting helpers and float16/bfloat16 conversions.
package tensor

import "fmt"

// DType is a tensor element type. Its values are the ONNX
// TensorProto.DataType codes, so Cast's "to" attribute and model
// initializers map onto it directly.
type DType int32

// Supported element types (ONNX TensorProto.DataType codes).
const (
	Undefined DType = 0
	Float32   DType = 1
	Uint8     DType = 2
	Int8      DType = 3
	Uint16    DType = 4
	Int16     DType = 5
	Int32     DType = 6
	Int64     DType = 7
	Bool      DType = 9
	Float16   DType = 10
	Float64   DType = 11
	Uint32    DType = 12
	BFloat16  DType = 16
)

// Size returns the size in bytes of one element, or 0 for an unsupported
// type.
func (d DType) Size() int {
	switch d {
	case Float32, Int32, Uint32:
		return 4
	case Uint8, Int8, Bool:
		return 1
	case Int64, Float64:
		return 8
	case Float16, BFloat16, Int16, Uint16:
		return 2
	}
	return 0
}

// Valid reports whether the runtime supports tensors of this type.
func (d DType) Valid() bool { return d.Size() > 0 }

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool {
	return d == Float32 || d == Float16 || d == BFloat16 || d == Float64
}

// IsInt reports whether d is an integer type (bool excluded).
func (d DType) IsInt() bool {
	switch d {
	case Int64, Int32, Int8, Uint8, Int16, Uint16, Uint32:
		return true
	}
	return false
}

var dtypeNames = map[DType]string{
	Float32: "float32", Uint8: "uint8", Int8: "int8", Int32: "int32", Int64: "int64",
	Bool: "bool", Float16: "float16", Float64: "float64", BFloat16: "bfloat16",
	Int16: "int16", Uint16: "uint16", Uint32: "uint32",
}

// onnxNames are the onnxruntime NodeArg type strings ("tensor(float)").
var onnxNames = map[DType]string{
	Float32: "float", Uint8: "uint8", Int8: "int8", Int32: "int32", Int64: "int64",
	Bool: "bool", Float16: "float16", Float64: "double", BFloat16: "bfloat16",
	Int16: "int16", Uint16: "uint16", Uint32: "uint32",
}

// String returns the numpy-style name ("float32", "bfloat16", ...).
func (d DType) String() string {
	if s, ok := dtypeNames[d]; ok {
		return s
	}
	return fmt.Sprintf("DType(%d)", int32(d))
}

// ONNXName returns the element name used in onnxruntime type strings
// ("float", "double", "int64", ...), e.g. for "tensor(float)".
func (d DType) ONNXName() string {
	if s, ok := onnxNames[d]; ok {
		return s
	}
	return fmt.Sprintf("dtype%d", int32(d))
}

// Float16Bits is the storage of one IEEE 754 half-precision value.
type Float16Bits uint16

// BFloat16Bits is the storage of one bfloat16 value.
type BFloat16Bits uint16

// Elem is the set of Go element types a typed view can have.
type Elem interface {
	float32 | float64 | int64 | int32 | int8 | uint8 | int16 | uint16 | uint32 | bool | Float16Bits | BFloat16Bits
}

// DTypeOf returns the DType whose elements are stored as T.
func DTypeOf[T Elem]() DType {
	var z T
	switch any(z).(type) {
	case float32:
		return Float32
	case float64:
		return Float64
	case int64:
		return Int64
	case int32:
		return Int32
	case int8:
		return Int8
	case uint8:
		return Uint8
	case int16:
		return Int16
	case uint16:
		return Uint16
	case uint32:
		return Uint32
	case bool:
		return Bool
	case Float16Bits:
		return Float16
	case BFloat16Bits:
		return BFloat16
	}
	return Undefined
}
