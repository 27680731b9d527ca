package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/mha"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Float unary ops compute in float32 (float64 inputs in float64); fp16 and
// bf16 are converted to float32 and back.
type unaryOp struct {
	f32 func(x float32) float32
	f64 func(x float64) float64
	i64 func(x int64) int64 // nil: integer inputs are a type error
}

// bulkF32 maps whole float32 slices for the ops on the decode path, without
// a function call per element.
var bulkF32 = map[string]func(dst, src []float32){"Sigmoid": sigmoidSlice, "Tanh": mha.Tanh}

func f32of(f func(float64) float64) func(float32) float32 {
	return func(x float32) float32 { return float32(f(float64(x))) }
}

func sigmoid64(x float64) float64 {
	if x >= 0 {
		return 1 / (1 + math.Exp(-x))
	}
	e := math.Exp(x)
	return e / (1 + e)
}

var unaryOps = map[string]unaryOp{
	"Sqrt":       {f32of(math.Sqrt), math.Sqrt, nil},
	"Reciprocal": {func(x float32) float32 { return 1 / x }, func(x float64) float64 { return 1 / x }, nil},
	"Neg":        {func(x float32) float32 { return -x }, func(x float64) float64 { return -x }, func(x int64) int64 { return -x }},
	"Abs":        {f32of(math.Abs), math.Abs, func(x int64) int64 { return max(x, -x) }},
	"Exp":        {f32of(math.Exp), math.Exp, nil},
	"Log":        {f32of(math.Log), math.Log, nil},
	"Sigmoid":    {sigmoidf, sigmoid64, nil},
	"Tanh":       {f32of(math.Tanh), math.Tanh, nil},
	"Erf":        {f32of(math.Erf), math.Erf, nil},
	"Relu": {func(x float32) float32 { return max(x, 0) }, func(x float64) float64 { return max(x, 0) },
		func(x int64) int64 { return max(x, 0) }},
	"Cos": {f32of(math.Cos), math.Cos, nil},
	"Sin": {f32of(math.Sin), math.Sin, nil},
}

func init() {
	for name, op := range unaryOps {
		Register("", name, 6, 0, newUnary(name, op))
	}
	Register("", "Gelu", 20, 0, newGelu)
	Register("com.microsoft", "Gelu", 1, 0, newGelu)
	Register("com.microsoft", "FastGelu", 1, 0, newFastGelu)
}

func newUnary(name string, op unaryOp) Factory {
	types := floatTypes
	if op.i64 != nil {
		types = numericTypes
	}
	return func(n *Node) (Kernel, error) {
		if err := n.checkTypes(types, 0); err != nil {
			return nil, err
		}
		return KernelFunc(func(ctx *Context) error { return unaryCompute(ctx, name, op) }), nil
	}
}

// unaryF32 maps src into dst with bulk, or element by element with op.
func unaryF32(bulk func(dst, src []float32), op unaryOp, dst, src []float32) {
	if bulk != nil {
		bulk(dst, src)
		return
	}
	for i := range src {
		dst[i] = op.f32(src[i])
	}
}

func unaryCompute(ctx *Context, name string, op unaryOp) error {
	return unaryComputeBulk(ctx, name, op, bulkF32[name])
}

// unaryComputeBulk is unaryCompute with the float32 slice map given (nil:
// op.f32 element by element).
func unaryComputeBulk(ctx *Context, name string, op unaryOp, bulk func(dst, src []float32)) error {
	x, err := ctx.RequireInput(0)
	if err != nil {
		return err
	}
	out, err := ctx.NewOutputUninit(0, x.DType(), x.Shape())
	if err != nil {
		return err
	}
	switch dt := x.DType(); {
	case dt == tensor.Float32:
		src, dst := x.Float32(), out.Float32()
		const grain = 1 << 14
		if len(src) <= grain || ctx.Threads() == 1 {
			unaryF32(bulk, op, dst, src) // no closure for the usual decode-step sizes
			return nil
		}
		return ctx.ParallelFor(len(src), grain, func(lo, hi int) {
			unaryF32(bulk, op, dst[lo:hi], src[lo:hi])
		})
	case dt == tensor.Float64:
		src, dst := x.Float64(), out.Float64()
		for i, v := range src {
			dst[i] = op.f64(v)
		}
	case dt.IsFloat():
		v, err := ctx.AsFloat32(x)
		if err != nil {
			return err
		}
		unaryF32(bulk, op, v, v) // the float32 kernel's values, then rounded
		return tensor.FromFloat32(out, v)
	case dt.IsInt() && op.i64 != nil:
		v, err := tensor.Int64Values(x)
		if err != nil {
			return err
		}
		for i := range v {
			v[i] = op.i64(v[i])
		}
		return storeInt64(out, v)
	default:
		return fmt.Errorf("%w: %s of %v", errs.ErrType, name, dt)
	}
	return nil
}

// sigmoidSlice is the float32 Sigmoid: the vector loops of mha.Sigmoid
// (the scalar sigmoidf branches on the sign, which mispredicts on real
// activations, and takes about 20 ns an element).
func sigmoidSlice(dst, src []float32) { mha.Sigmoid(dst, src[:len(dst)]) }

// gelu is the exact GELU x/2 (1 + erf(x/sqrt 2)) of the float16/bfloat16
// path, computed in float64 (gelu64) and rounded; float32 tensors take
// mha.Gelu (vector erf, about 1 ulp), as the tanh form takes mha.GeluTanh.
func gelu(x float32) float32 { return float32(gelu64(float64(x))) }

// gelu64 is the exact GELU in float64: the float64 path's function.
func gelu64(v float64) float64 { return 0.5 * v * (1 + math.Erf(v/math.Sqrt2)) }

// geluTanh is the tanh approximation used by GPT-2, computed in float64
// (geluTanh64) and rounded.
func geluTanh(x float32) float32 { return float32(geluTanh64(float64(x))) }

// geluTanh64 is the tanh approximation in float64: the float64 path's
// function.
func geluTanh64(v float64) float64 {
	return 0.5 * v * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(v+0.044715*v*v*v)))
}

func newGelu(n *Node) (Kernel, error) {
	if err := n.checkTypes(floatTypes, 0); err != nil {
		return nil, err
	}
	approx, err := n.Attrs.String("approximate", "none")
	if err != nil {
		return nil, err
	}
	op, bulk := unaryOp{f32: gelu, f64: gelu64}, mha.Gelu
	switch approx {
	case "none":
	case "tanh":
		op, bulk = unaryOp{f32: geluTanh, f64: geluTanh64}, mha.GeluTanh
	default:
		return nil, fmt.Errorf("%w: Gelu approximate=%q", errs.ErrInvalidArgument, approx)
	}
	return KernelFunc(func(ctx *Context) error { return unaryComputeBulk(ctx, "Gelu", op, bulk) }), nil
}

// newFastGelu is com.microsoft FastGelu: tanh GELU of x (+ optional bias).
func newFastGelu(n *Node) (Kernel, error) {
	op := unaryOp{f32: geluTanh, f64: geluTanh64}
	return KernelFunc(func(ctx *Context) error {
		if b := ctx.Input(1); b != nil {
			return fastGeluBias(ctx, b)
		}
		return unaryComputeBulk(ctx, "FastGelu", op, mha.GeluTanh)
	}), nil
}

// fastGeluBias is FastGelu with its bias input: the tanh GELU of x + bias,
// bias 1-D over x's last dimension, computed in float32.
func fastGeluBias(ctx *Context, b *tensor.Tensor) error {
	x, err := ctx.RequireInput(0)
	if err != nil {
		return err
	}
	if b.DType() != x.DType() || !x.DType().IsFloat() || x.DType() == tensor.Float64 {
		return fmt.Errorf("%w: FastGelu takes float32, float16 or bfloat16 x and a bias of its type, got %v and %v",
			errs.ErrType, x.DType(), b.DType())
	}
	sh := x.Shape()
	if b.Rank() != 1 || x.Rank() == 0 || b.Shape()[0] != sh[len(sh)-1] {
		return fmt.Errorf("%w: FastGelu bias %v must be 1-D of x's last dimension (x %v)", errs.ErrShape, b.Shape(), sh)
	}
	xf, err := ctx.AsFloat32(x)
	if err != nil {
		return err
	}
	bf, err := ctx.AsFloat32(b)
	if err != nil {
		return err
	}
	out, err := ctx.NewOutputUninit(0, x.DType(), sh)
	if err != nil {
		return err
	}
	dst := f32Result(ctx, out)
	if err := binaryF32(f32Add, xf, sh, bf, b.Shape(), dst, sh); err != nil {
		return err
	}
	mha.GeluTanh(dst, dst)
	return storeF32Result(out, dst)
}
