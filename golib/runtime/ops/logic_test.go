package ops

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestLogicAndMiscOps(t *testing.T) {
	b := bt(tensor.Shape{4}, true, true, false, false)
	c := bt(tensor.Shape{4}, true, false, true, false)
	x := ft(tensor.Shape{4}, -1.5, -0.5, 0.5, 2.5)
	i := it(tensor.Shape{4}, -7, -1, 5, 7)
	boolT := tensor.Bool
	runCases(t, []opCase{
		{name: "not", op: "Not", opset: 1, in: []*tensor.Tensor{b}, shape: tensor.Shape{4}, want: "[false false true true]"},
		{name: "and", op: "And", opset: 7, in: []*tensor.Tensor{b, c}, shape: tensor.Shape{4}, want: "[true false false false]"},
		{name: "or", op: "Or", opset: 7, in: []*tensor.Tensor{b, c}, shape: tensor.Shape{4}, want: "[true true true false]"},
		{name: "xor", op: "Xor", opset: 7, in: []*tensor.Tensor{b, c}, shape: tensor.Shape{4}, want: "[false true true false]"},
		{name: "less or equal", op: "LessOrEqual", opset: 16, in: []*tensor.Tensor{x, tensor.Scalar(float32(0.5))}, shape: tensor.Shape{4}, want: "[true true true false]", dtype: boolT},
		{name: "greater", op: "Greater", opset: 13, in: []*tensor.Tensor{i, tensor.Scalar(int64(0))}, shape: tensor.Shape{4}, want: "[false false true true]", dtype: boolT},
		{name: "max variadic", op: "Max", opset: 13, in: []*tensor.Tensor{x, tensor.Scalar(float32(0)), ft(tensor.Shape{1}, -1)}, shape: tensor.Shape{4}, want: "[0 0 0.5 2.5]"},
		{name: "min int", op: "Min", opset: 13, in: []*tensor.Tensor{i, tensor.Scalar(int64(0))}, shape: tensor.Shape{4}, want: "[-7 -1 0 0]"},
		{name: "sum", op: "Sum", opset: 13, in: []*tensor.Tensor{x, x}, shape: tensor.Shape{4}, want: "[-3 -1 1 5]"},
		{name: "floor", op: "Floor", opset: 13, in: []*tensor.Tensor{x}, shape: tensor.Shape{4}, want: "[-2 -1 0 2]"},
		{name: "ceil", op: "Ceil", opset: 13, in: []*tensor.Tensor{x}, shape: tensor.Shape{4}, want: "[-1 0 1 3]"},
		{name: "round half to even", op: "Round", opset: 11, in: []*tensor.Tensor{x}, shape: tensor.Shape{4}, want: "[-2 0 0 2]"},
		{name: "clip", op: "Clip", opset: 13, in: []*tensor.Tensor{x, tensor.Scalar(float32(-1)), tensor.Scalar(float32(1))}, shape: tensor.Shape{4}, want: "[-1 -0.5 0.5 1]"},
		{name: "clip max only", op: "Clip", opset: 13, in: []*tensor.Tensor{i, nil, tensor.Scalar(int64(0))}, shape: tensor.Shape{4}, want: "[-7 -1 0 0]"},
		{name: "tile", op: "Tile", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{1, 2}, 1, 2), it(tensor.Shape{2}, 2, 2)}, shape: tensor.Shape{2, 4}, want: "[1 2 1 2 1 2 1 2]"},
		{name: "cumsum", op: "CumSum", opset: 14, in: []*tensor.Tensor{x, tensor.Scalar(int64(0))}, shape: tensor.Shape{4}, want: "[-1.5 -2 -1.5 1]"},
		{name: "cumsum exclusive reverse", op: "CumSum", opset: 14, attrs: attrs(intA("exclusive", 1), intA("reverse", 1)), in: []*tensor.Tensor{i, tensor.Scalar(int64(0))}, shape: tensor.Shape{4}, want: "[11 12 7 0]"},
		{name: "mod takes the divisor's sign", op: "Mod", opset: 13, in: []*tensor.Tensor{i, tensor.Scalar(int64(3))}, shape: tensor.Shape{4}, want: "[2 2 2 1]"},
		{name: "fmod", op: "Mod", opset: 13, attrs: attrs(intA("fmod", 1)), in: []*tensor.Tensor{x, tensor.Scalar(float32(1))}, shape: tensor.Shape{4}, want: "[-0.5 -0.5 0.5 0.5]"},
	})
	if _, err := call("Mod", 13, nil, 1, x, x); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("float Mod without fmod: %v", err)
	}
	if _, err := call("And", 7, nil, 1, x, x); !errors.Is(err, errs.ErrType) {
		t.Errorf("And of floats: %v", err)
	}
}

func TestScatterND(t *testing.T) {
	data := ft(tensor.Shape{2, 3}, 0, 0, 0, 0, 0, 0)
	runCases(t, []opCase{
		{name: "rows", op: "ScatterND", opset: 18, in: []*tensor.Tensor{data, it(tensor.Shape{1, 1}, 1), ft(tensor.Shape{1, 3}, 7, 8, 9)}, shape: tensor.Shape{2, 3}, want: "[0 0 0 7 8 9]"},
		{name: "elements", op: "ScatterND", opset: 18, in: []*tensor.Tensor{data, it(tensor.Shape{2, 2}, 0, 2, -1, 0), ft(tensor.Shape{2}, 5, 6)}, shape: tensor.Shape{2, 3}, want: "[0 0 5 6 0 0]"},
	})
	if _, err := call("ScatterND", 18, nil, 1, data, it(tensor.Shape{1, 1}, 2), ft(tensor.Shape{1, 3}, 1, 2, 3)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("index out of range: %v", err)
	}
}
