package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// twoInputs returns the required inputs 0 and 1, or the error naming the
// first one missing.
func twoInputs(ctx *Context) (a, b *tensor.Tensor, err error) {
	if a, err = ctx.RequireInput(0); err != nil {
		return nil, nil, err
	}
	if b, err = ctx.RequireInput(1); err != nil {
		return nil, nil, err
	}
	return a, b, nil
}

// threeInputs is twoInputs with a required input 2.
func threeInputs(ctx *Context) (a, b, c *tensor.Tensor, err error) {
	if a, b, err = twoInputs(ctx); err != nil {
		return nil, nil, nil, err
	}
	if c, err = ctx.RequireInput(2); err != nil {
		return nil, nil, nil, err
	}
	return a, b, c, nil
}

// errOperandTypes is the error for two operands whose element types op
// does not accept together (they differ, or op wants another type).
func errOperandTypes(op string, a, b *tensor.Tensor) error {
	return fmt.Errorf("%w: %s of %v and %v", errs.ErrType, op, a.DType(), b.DType())
}

// newBroadcastOutput allocates output 0 of type dt in the shape a and b
// broadcast to (numpy rules). Its contents are unspecified: every caller
// writes each element (binaryApply and binaryCompute do).
func newBroadcastOutput(ctx *Context, dt tensor.DType, a, b *tensor.Tensor) (*tensor.Tensor, error) {
	shape, err := ctx.BroadcastShapes(a.Shape(), b.Shape())
	if err != nil {
		return nil, err
	}
	return ctx.NewOutputUninit(0, dt, shape)
}

// optionalInt64s returns the values of integer input i, or nil when the
// input is omitted (Split's split, the Reduce axes, Slice's arguments).
func optionalInt64s(ctx *Context, i int) ([]int64, error) {
	t := ctx.Input(i)
	if t == nil {
		return nil, nil
	}
	return ctx.Int64Values(t)
}
