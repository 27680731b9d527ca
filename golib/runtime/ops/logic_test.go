package ops

import (
	"errors"
	"math"
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
		{name: "float mod takes the divisor's sign", op: "Mod", opset: 13, in: []*tensor.Tensor{x, tensor.Scalar(float32(-1))}, shape: tensor.Shape{4}, want: "[-0.5 -0.5 -0.5 -0.5]"},
	})
	if _, err := call("And", 7, nil, 1, x, x); !errors.Is(err, errs.ErrType) {
		t.Errorf("And of floats: %v", err)
	}
}

func TestScatterND(t *testing.T) {
	data := ft(tensor.Shape{2, 3}, 0, 0, 0, 0, 0, 0)
	runCases(t, []opCase{
		{name: "rows", op: "ScatterND", opset: 18, in: []*tensor.Tensor{data, it(tensor.Shape{1, 1}, 1), ft(tensor.Shape{1, 3}, 7, 8, 9)}, shape: tensor.Shape{2, 3}, want: "[0 0 0 7 8 9]"},
		{name: "elements", op: "ScatterND", opset: 18, in: []*tensor.Tensor{data, it(tensor.Shape{2, 2}, 0, 2, -1, 0), ft(tensor.Shape{2}, 5, 6)}, shape: tensor.Shape{2, 3}, want: "[0 0 5 6 0 0]"},
		{name: "add, repeated index", op: "ScatterND", opset: 16, attrs: attrs(strA("reduction", "add")), in: []*tensor.Tensor{ft(tensor.Shape{2, 2}, 1, 2, 3, 4), it(tensor.Shape{2, 1}, 1, 1), ft(tensor.Shape{2, 2}, 10, 20, 100, 200)}, shape: tensor.Shape{2, 2}, want: "[1 2 113 224]"},
		{name: "mul", op: "ScatterND", opset: 16, attrs: attrs(strA("reduction", "mul")), in: []*tensor.Tensor{ft(tensor.Shape{2, 2}, 1, 2, 3, 4), it(tensor.Shape{2, 1}, 0, 0), ft(tensor.Shape{2, 2}, 2, 3, 4, 5)}, shape: tensor.Shape{2, 2}, want: "[8 30 3 4]"},
		{name: "max int64", op: "ScatterND", opset: 18, attrs: attrs(strA("reduction", "max")), in: []*tensor.Tensor{it(tensor.Shape{3}, 5, 5, 5), it(tensor.Shape{3, 1}, 0, 1, 0), it(tensor.Shape{3}, 9, 1, 7)}, shape: tensor.Shape{3}, want: "[9 5 5]"},
		{name: "min element indices", op: "ScatterND", opset: 18, attrs: attrs(strA("reduction", "min")), in: []*tensor.Tensor{ft(tensor.Shape{2, 2}, 1, 2, 3, 4), it(tensor.Shape{2, 2}, 1, 1, 0, 0), ft(tensor.Shape{2}, -1, 0)}, shape: tensor.Shape{2, 2}, want: "[0 2 3 -1]"},
	})
	if _, err := call("ScatterND", 18, attrs(strA("reduction", "avg")), 1, data, it(tensor.Shape{1, 1}, 1), ft(tensor.Shape{1, 3}, 1, 2, 3)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("unknown reduction: %v", err)
	}
	if _, err := call("ScatterND", 18, nil, 1, data, it(tensor.Shape{1, 1}, 2), ft(tensor.Shape{1, 3}, 1, 2, 3)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("index out of range: %v", err)
	}
}

// TestFloorMod checks Mod fmod=0 on floats against numpy.mod's values.
func TestFloorMod(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	for _, c := range []struct{ x, y, want float64 }{
		{-4.3, 2.1, 2.0000000000000004}, {7.2, -3.4, -2.9999999999999996}, {5, 8, 5}, {8, 5, 3},
		{4, 2, 0}, {-4, 2, 0}, {4, -2, math.Copysign(0, -1)}, {2, inf, 2}, {-2, inf, inf},
		{2, -inf, -inf}, {-2, -inf, -2}, {1, 0, nan}, {inf, 2, nan}, {nan, 2, nan},
	} {
		got := floorMod(c.x, c.y)
		same := got == c.want && math.Signbit(got) == math.Signbit(c.want) || math.IsNaN(got) && math.IsNaN(c.want)
		if !same {
			t.Errorf("floorMod(%v, %v) = %v, want %v", c.x, c.y, got, c.want)
		}
	}
}
