package ops

import (
	"errors"
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestExtraOps(t *testing.T) {
	x := ft(tensor.Shape{2, 2}, 1, 2, 3, 4)
	row := ft(tensor.Shape{1, 3}, 1, 2, 3)
	odd := ft(tensor.Shape{3}, float32(math.NaN()), float32(math.Inf(-1)), 1)
	boolT := tensor.Bool
	runCases(t, []opCase{
		{name: "dropout identity", op: "Dropout", opset: 13, in: []*tensor.Tensor{x}, shape: tensor.Shape{2, 2}, want: "[1 2 3 4]"},
		{name: "dropout mask", op: "Dropout", opset: 13, in: []*tensor.Tensor{x}, nOut: 2, outIdx: 1, shape: tensor.Shape{2, 2}, want: "[true true true true]", dtype: boolT},
		{name: "dropout training ratio 0", op: "Dropout", opset: 13, in: []*tensor.Tensor{x, tensor.Scalar(float32(0)), tensor.Scalar(true)}, nOut: 2, shape: tensor.Shape{2, 2}, want: "[1 2 3 4]"},
		{name: "dropout training ratio 0 mask", op: "Dropout", opset: 13, in: []*tensor.Tensor{x, tensor.Scalar(float32(0)), tensor.Scalar(true)}, nOut: 2, outIdx: 1, shape: tensor.Shape{2, 2}, want: "[true true true true]", dtype: boolT},
		{name: "isnan", op: "IsNaN", opset: 13, in: []*tensor.Tensor{odd}, shape: tensor.Shape{3}, want: "[true false false]", dtype: boolT},
		{name: "isinf", op: "IsInf", opset: 13, in: []*tensor.Tensor{odd}, shape: tensor.Shape{3}, want: "[false true false]", dtype: boolT},
		{name: "gatherelements", op: "GatherElements", opset: 13, attrs: attrs(intA("axis", 1)), in: []*tensor.Tensor{x, it(tensor.Shape{2, 3}, 1, 0, -1, 0, 0, 1)},
			shape: tensor.Shape{2, 3}, want: "[2 1 2 3 3 4]"},
		{name: "pad constant", op: "Pad", opset: 18, in: []*tensor.Tensor{x, it(tensor.Shape{4}, 0, 1, 1, 0), tensor.Scalar(float32(9))},
			shape: tensor.Shape{3, 3}, want: "[9 1 2 9 3 4 9 9 9]"},
		{name: "pad edge crop", op: "Pad", opset: 18, attrs: attrs(strA("mode", "edge")), in: []*tensor.Tensor{x, it(tensor.Shape{4}, 1, -1, 0, 0)},
			shape: tensor.Shape{3, 1}, want: "[2 2 4]"},
		// expected values from numpy.pad with the same mode
		{name: "pad reflect", op: "Pad", opset: 18, attrs: attrs(strA("mode", "reflect")), in: []*tensor.Tensor{row, it(tensor.Shape{4}, 0, 2, 0, 3)},
			shape: tensor.Shape{1, 8}, want: "[3 2 1 2 3 2 1 2]"},
		{name: "pad reflect past the period", op: "Pad", opset: 18, attrs: attrs(strA("mode", "reflect")), in: []*tensor.Tensor{row, it(tensor.Shape{4}, 0, 5, 0, 6)},
			shape: tensor.Shape{1, 14}, want: "[2 1 2 3 2 1 2 3 2 1 2 3 2 1]"},
		{name: "pad reflect 2d", op: "Pad", opset: 18, attrs: attrs(strA("mode", "reflect")), in: []*tensor.Tensor{x, it(tensor.Shape{4}, 1, 0, 0, 1)},
			shape: tensor.Shape{3, 3}, want: "[3 4 3 1 2 1 3 4 3]"},
		{name: "pad wrap", op: "Pad", opset: 19, attrs: attrs(strA("mode", "wrap")), in: []*tensor.Tensor{row, it(tensor.Shape{4}, 0, 2, 0, 3)},
			shape: tensor.Shape{1, 8}, want: "[2 3 1 2 3 1 2 3]"},
	})
	if _, err := call("Dropout", 13, nil, 1, x, tensor.Scalar(float32(0.5)), tensor.Scalar(true)); !errors.Is(err, errs.ErrNotImplemented) {
		t.Errorf("Dropout training ratio 0.5: %v", err)
	}
	if _, err := call("Pad", 18, attrs(strA("mode", "mirror")), 1, x, it(tensor.Shape{4}, 0, 0, 0, 0)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("Pad mode mirror: %v", err)
	}
	if _, err := call("Pad", 19, attrs(strA("mode", "wrap")), 1, ft(tensor.Shape{0, 2}), it(tensor.Shape{4}, 1, 0, 0, 0)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("Pad wrap of an empty axis: %v", err)
	}
	if _, err := call("GatherElements", 13, nil, 1, x, it(tensor.Shape{1, 1}, 5)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("GatherElements out of range: %v", err)
	}
}
