package ops

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestMalformedNodesAreRefused covers nodes that onnxruntime refuses (or
// computes) where a kernel used to ignore an attribute, read a required
// input as omitted, index past a shape (a panic) or name a type mismatch a
// shape mismatch: each must return an error of the given kind.
func TestMalformedNodesAreRefused(t *testing.T) {
	x23 := ft(tensor.Shape{2, 3}, 1, 2, 3, 4, 5, 6)
	scale23 := ft(tensor.Shape{2, 3}, 1, 1, 1, 2, 2, 2)
	scale3 := ft(tensor.Shape{3}, 1, 1, 1)
	scalar := ft(tensor.Shape{}, 5)
	one := it(tensor.Shape{1}, 0)
	three := it(tensor.Shape{3}, 0, 0, 0)
	cases := []struct {
		name  string
		op    string
		opset int
		attrs Attributes
		in    []*tensor.Tensor
		want  error
	}{
		{"ReduceMean-18 axes attribute", "ReduceMean", 18, attrs(ints("axes", 1)), []*tensor.Tensor{x23}, errs.ErrInvalidModel},
		{"ReduceSum-13 axes attribute", "ReduceSum", 13, attrs(ints("axes", -1)), []*tensor.Tensor{x23}, errs.ErrInvalidModel},
		{"Unsqueeze-13 without axes input", "Unsqueeze", 13, attrs(ints("axes", 0)), []*tensor.Tensor{x23}, errs.ErrInvalidModel},
		{"Slice of a scalar without axes", "Slice", 13, nil, []*tensor.Tensor{scalar, one, one}, errs.ErrInvalidArgument},
		{"Slice with more starts than dims", "Slice", 13, nil, []*tensor.Tensor{x23, three, three}, errs.ErrInvalidArgument},
		{"RMSNormalization per-row scale", "RMSNormalization", 23, nil, []*tensor.Tensor{x23, scale23}, errs.ErrNotImplemented},
		{"LayerNormalization per-row bias", "LayerNormalization", 17, nil, []*tensor.Tensor{x23, scale3, scale23}, errs.ErrNotImplemented},
		{"Split num_outputs past the outputs", "Split", 18, attrs(intA("num_outputs", 1<<62)), []*tensor.Tensor{x23}, errs.ErrInvalidModel},
		{"Split-13 into unequal parts", "Split", 13, attrs(intA("axis", 1)), []*tensor.Tensor{x23}, errs.ErrInvalidArgument},
		{"Concat of two types", "Concat", 13, attrs(intA("axis", 0)), []*tensor.Tensor{ft(tensor.Shape{1}, 1), it(tensor.Shape{1}, 1)}, errs.ErrType},
		{"ScatterND updates of another type", "ScatterND", 13, nil, []*tensor.Tensor{ft(tensor.Shape{2}, 1, 2), it(tensor.Shape{1, 1}, 0), it(tensor.Shape{1}, 7)}, errs.ErrType},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			nOut := 1
			if c.op == "Split" {
				nOut = 2 // Split-13 of 3 columns into 2: unequal
			}
			if _, err := call(c.op, c.opset, c.attrs, nOut, c.in...); !errors.Is(err, c.want) {
				t.Errorf("got %v, want %v", err, c.want)
			}
		})
	}
}

// TestSliceHugeSteps covers steps near the int64 limits, whose element count
// overflowed to an empty result: each takes one element, as numpy does.
func TestSliceHugeSteps(t *testing.T) {
	x := ft(tensor.Shape{5}, 0, 1, 2, 3, 4)
	const maxI, minI = int64(1<<63 - 1), int64(-1 << 63)
	runCases(t, []opCase{
		{name: "step max", op: "Slice", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{1}, 0), it(tensor.Shape{1}, 5), it(tensor.Shape{1}, 0), it(tensor.Shape{1}, maxI)}, shape: tensor.Shape{1}, want: "[0]"},
		{name: "step min", op: "Slice", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{1}, 4), it(tensor.Shape{1}, minI), it(tensor.Shape{1}, 0), it(tensor.Shape{1}, minI)}, shape: tensor.Shape{1}, want: "[4]"},
		{name: "step -max", op: "Slice", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{1}, maxI), it(tensor.Shape{1}, minI), it(tensor.Shape{1}, 0), it(tensor.Shape{1}, -maxI)}, shape: tensor.Shape{1}, want: "[4]"},
	})
}
