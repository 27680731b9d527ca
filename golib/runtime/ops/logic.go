package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "LessOrEqual", 12, 0, newCompare("LessOrEqual"))
	Register("", "GreaterOrEqual", 12, 0, newCompare("GreaterOrEqual"))
	Register("", "Not", 1, 0, newNot)
	for _, op := range []string{"And", "Or", "Xor"} {
		Register("", op, 7, 0, newLogical(op))
	}
	Register("", "Max", 8, 0, newVariadic("Max"))
	Register("", "Min", 8, 0, newVariadic("Min"))
	Register("", "Sum", 8, 0, newVariadic("Sum"))
	Register("", "Floor", 6, 0, newUnary("Floor", unaryOp{f32of(math.Floor), math.Floor, nil}))
	Register("", "Ceil", 6, 0, newUnary("Ceil", unaryOp{f32of(math.Ceil), math.Ceil, nil}))
	Register("", "Round", 11, 0, newUnary("Round", unaryOp{f32of(math.RoundToEven), math.RoundToEven, nil}))
}

func newNot(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		if x.DType() != tensor.Bool {
			return fmt.Errorf("%w: Not of %v", errs.ErrType, x.DType())
		}
		out, err := ctx.NewOutput(0, tensor.Bool, x.Shape())
		if err != nil {
			return err
		}
		d := out.Bool()
		for i, v := range x.Bool() {
			d[i] = !v
		}
		return nil
	}), nil
}

func newLogical(name string) Factory {
	f := map[string]func(a, b bool) bool{
		"And": func(a, b bool) bool { return a && b },
		"Or":  func(a, b bool) bool { return a || b },
		"Xor": func(a, b bool) bool { return a != b },
	}[name]
	return func(n *Node) (Kernel, error) {
		return KernelFunc(func(ctx *Context) error {
			a, b, err := twoInputs(ctx)
			if err != nil {
				return err
			}
			if a.DType() != tensor.Bool || b.DType() != tensor.Bool {
				return errOperandTypes(name, a, b)
			}
			out, err := newBroadcastOutput(ctx, tensor.Bool, a, b)
			if err != nil {
				return err
			}
			return binaryApply(a.Bool(), a.Shape(), b.Bool(), b.Shape(), out.Bool(), out.Shape(), f)
		}), nil
	}
}

// newVariadic folds Max, Min or Sum over all inputs with broadcasting.
func newVariadic(name string) Factory {
	op := binaryOp{}
	switch name {
	case "Max":
		op = binaryOp{func(x, y float32) float32 { return nanMax(x, y) }, func(x, y float64) float64 { return max(x, y) },
			func(x, y int64) (int64, error) { return max(x, y), nil }}
	case "Min":
		op = binaryOp{func(x, y float32) float32 { return nanMin(x, y) }, func(x, y float64) float64 { return min(x, y) },
			func(x, y int64) (int64, error) { return min(x, y), nil }}
	default:
		op = binaryOps["Add"]
	}
	return func(n *Node) (Kernel, error) {
		return KernelFunc(func(ctx *Context) error {
			acc, err := ctx.RequireInput(0)
			if err != nil {
				return err
			}
			for i := 1; i < ctx.NumInputs(); i++ {
				b, err := ctx.RequireInput(i)
				if err != nil {
					return err
				}
				if b.DType() != acc.DType() {
					return errOperandTypes(name, acc, b)
				}
				os, err := tensor.BroadcastShapes(acc.Shape(), b.Shape())
				if err != nil {
					return err
				}
				next, err := tensor.New(acc.DType(), os)
				if err != nil {
					return err
				}
				if err := binaryCompute(ctx, op, acc, b, next); err != nil {
					return err
				}
				acc = next
			}
			if ctx.NumInputs() == 1 {
				acc = acc.Clone()
			}
			ctx.Allocated += int64(acc.NumBytes())
			return ctx.SetOutput(0, acc)
		}), nil
	}
}

// nanMax and nanMin propagate NaN like onnxruntime's Max/Min.
func nanMax(x, y float32) float32 {
	if x != x || y != y {
		return float32(math.NaN())
	}
	return max(x, y)
}

func nanMin(x, y float32) float32 {
	if x != x || y != y {
		return float32(math.NaN())
	}
	return min(x, y)
}
