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
