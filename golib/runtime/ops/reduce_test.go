package ops

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func emptyT(dt tensor.DType, shape tensor.Shape) *tensor.Tensor {
	t, err := tensor.New(dt, shape)
	if err != nil {
		return nil
	}
	return t
}

// TestReduceMaxMinEmptyAndBool covers ReduceMax/ReduceMin over empty sets
// (the type's lowest/highest value, -inf/+inf, false/true) and bool inputs.
func TestReduceMaxMinEmptyAndBool(t *testing.T) {
	b := bt(tensor.Shape{2, 3}, true, false, false, false, false, false)
	axis1 := it(tensor.Shape{1}, 1)
	runCases(t, []opCase{
		{name: "max bool rows", op: "ReduceMax", opset: 20, in: []*tensor.Tensor{b, axis1}, shape: tensor.Shape{2, 1}, want: "[true false]"},
		{name: "min bool rows", op: "ReduceMin", opset: 20, in: []*tensor.Tensor{b, axis1}, shape: tensor.Shape{2, 1}, want: "[false false]"},
		{name: "min bool all", op: "ReduceMin", opset: 20, attrs: attrs(intA("keepdims", 0)), in: []*tensor.Tensor{bt(tensor.Shape{2}, true, true)}, shape: tensor.Shape{}, want: "[true]"},
		{name: "max empty float", op: "ReduceMax", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Float32, tensor.Shape{2, 0, 4}), axis1}, shape: tensor.Shape{2, 1, 4}, want: "[-Inf -Inf -Inf -Inf -Inf -Inf -Inf -Inf]"},
		{name: "min empty float", op: "ReduceMin", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Float32, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[+Inf]"},
		{name: "max empty bool", op: "ReduceMax", opset: 20, in: []*tensor.Tensor{emptyT(tensor.Bool, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[false]"},
		{name: "min empty bool", op: "ReduceMin", opset: 20, in: []*tensor.Tensor{emptyT(tensor.Bool, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[true]"},
		{name: "max empty int8", op: "ReduceMax", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Int8, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[-128]"},
		{name: "min empty uint8", op: "ReduceMin", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Uint8, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[255]"},
		{name: "max empty int64", op: "ReduceMax", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Int64, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[-9223372036854775808]"},
		{name: "min empty int64", op: "ReduceMin", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Int64, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[9223372036854775807]"},
		{name: "min empty int32", op: "ReduceMin", opset: 13, attrs: attrs(intA("keepdims", 0)), in: []*tensor.Tensor{emptyT(tensor.Int32, tensor.Shape{0})}, shape: tensor.Shape{}, want: "[2147483647]"},
	})
	if _, err := call("ReduceSum", 13, nil, 1, b); err == nil {
		t.Errorf("ReduceSum of bool: no error")
	}
}

// TestNarrowIntTypes covers int16, uint16 and uint32 in arithmetic (which
// wraps like numpy), comparison, Cast and reductions.
func TestNarrowIntTypes(t *testing.T) {
	i16, _ := tensor.FromSlice(tensor.Shape{3}, []int16{32767, -5, 7})
	one16, _ := tensor.FromSlice(tensor.Shape{1}, []int16{1})
	u16, _ := tensor.FromSlice(tensor.Shape{2}, []uint16{65535, 3})
	u32, _ := tensor.FromSlice(tensor.Shape{2}, []uint32{4294967295, 10})
	two32, _ := tensor.FromSlice(tensor.Shape{1}, []uint32{2})
	boolT, f32 := tensor.Bool, tensor.Float32
	runCases(t, []opCase{
		{name: "int16 add wraps", op: "Add", opset: 14, in: []*tensor.Tensor{i16, one16}, shape: tensor.Shape{3}, want: "[-32768 -4 8]"},
		{name: "uint16 mul wraps", op: "Mul", opset: 14, in: []*tensor.Tensor{u16, u16}, shape: tensor.Shape{2}, want: "[1 9]"},
		{name: "uint32 div", op: "Div", opset: 14, in: []*tensor.Tensor{u32, two32}, shape: tensor.Shape{2}, want: "[2147483647 5]"},
		{name: "uint32 greater", op: "Greater", opset: 13, in: []*tensor.Tensor{u32, two32}, shape: tensor.Shape{2}, want: "[true true]", dtype: boolT},
		{name: "int16 max", op: "Max", opset: 13, in: []*tensor.Tensor{i16, one16}, shape: tensor.Shape{3}, want: "[32767 1 7]"},
		{name: "int16 reducemin", op: "ReduceMin", opset: 18, attrs: attrs(intA("keepdims", 0)), in: []*tensor.Tensor{i16}, shape: tensor.Shape{}, want: "[-5]"},
		{name: "uint32 to float", op: "Cast", opset: 13, attrs: attrs(intA("to", 1)), in: []*tensor.Tensor{u32}, shape: tensor.Shape{2}, want: "[4.295e+09 10]", dtype: f32},
		{name: "float to uint16", op: "Cast", opset: 13, attrs: attrs(intA("to", 4)), in: []*tensor.Tensor{ft(tensor.Shape{2}, 3.7, 65535)}, shape: tensor.Shape{2}, want: "[3 65535]", dtype: tensor.Uint16},
		{name: "int64 to int16 wraps", op: "Cast", opset: 13, attrs: attrs(intA("to", 5)), in: []*tensor.Tensor{it(tensor.Shape{2}, 32768, -1)}, shape: tensor.Shape{2}, want: "[-32768 -1]", dtype: tensor.Int16},
	})
}
