package ops

import (
	"fmt"
	"math"
	"math/bits"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

type reduceKind int

const (
	reduceSum reduceKind = iota
	reduceMean
	reduceMax
	reduceMin
)

func init() {
	// The axes moved from an attribute to an input: ReduceSum at 13, the
	// others at 18.
	Register("", "ReduceSum", 1, 12, newReduce(reduceSum, false))
	Register("", "ReduceSum", 13, 0, newReduce(reduceSum, true))
	Register("", "ReduceMean", 1, 17, newReduce(reduceMean, false))
	Register("", "ReduceMean", 18, 0, newReduce(reduceMean, true))
	Register("", "ReduceMax", 1, 17, newReduce(reduceMax, false))
	Register("", "ReduceMax", 18, 0, newReduce(reduceMax, true))
	Register("", "ReduceMin", 1, 17, newReduce(reduceMin, false))
	Register("", "ReduceMin", 18, 0, newReduce(reduceMin, true))
}

func newReduce(kind reduceKind, axesInput bool) Factory {
	return func(n *Node) (Kernel, error) {
		keep, err := n.Attrs.Int("keepdims", 1)
		if err != nil {
			return nil, err
		}
		noop, err := n.Attrs.Int("noop_with_empty_axes", 0)
		if err != nil {
			return nil, err
		}
		attrAxes, hasAttr, err := n.Attrs.Ints("axes")
		if err != nil {
			return nil, err
		}
		if axesInput && hasAttr { // (ignored, it would reduce every axis)
			return nil, fmt.Errorf("%w: %s (opset %d) takes its axes as an input; the axes attribute was removed",
				errs.ErrInvalidModel, kind, n.Opset)
		}
		return KernelFunc(func(ctx *Context) error {
			x, err := ctx.RequireInput(0)
			if err != nil {
				return err
			}
			axes := attrAxes
			if axesInput {
				if axes, err = optionalInt64s(ctx, 1); err != nil {
					return err
				}
			}
			if len(axes) == 0 && noop != 0 {
				out, err := ctx.NewOutput(0, x.DType(), x.Shape())
				if err != nil {
					return err
				}
				copy(out.Bytes(), x.Bytes())
				return nil
			}
			return reduceCompute(ctx, x, axes, keep != 0, kind)
		}), nil
	}
}

func reduceCompute(ctx *Context, x *tensor.Tensor, axes []int64, keep bool, kind reduceKind) error {
	sh := x.Shape()
	red := ctx.Bools(len(sh))
	if len(axes) == 0 {
		for i := range red {
			red[i] = true
		}
	}
	for _, a := range axes {
		ax, err := tensor.NormAxis(int(a), len(sh))
		if err != nil {
			return err
		}
		red[ax] = true
	}
	keepShape := ctx.ScratchShape(len(sh))
	outShape := ctx.ScratchShape(len(sh))[:0]
	for i, d := range sh {
		keepShape[i] = d
		if red[i] {
			keepShape[i] = 1
			if keep {
				outShape = append(outShape, 1)
			}
		} else {
			outShape = append(outShape, d)
		}
	}
	if outShape == nil {
		outShape = tensor.Shape{}
	}
	isBool := x.DType() == tensor.Bool
	if isBool && kind != reduceMax && kind != reduceMin {
		return fmt.Errorf("%w: %s of bool", errs.ErrType, kind)
	}
	out, err := ctx.NewOutput(0, x.DType(), outShape)
	if err != nil {
		return err
	}
	if isBool && kind == reduceMean {
		return fmt.Errorf("%w: ReduceMean of bool", errs.ErrType)
	}
	if reduceTrailingF32(x, red, out, kind) {
		return nil
	}
	if x.DType().IsInt() {
		return reduceInt(ctx, x, keepShape, out, kind)
	}
	src, err := reduceSource(ctx, x)
	if err != nil {
		return err
	}
	acc := ctx.Float64s(out.Len())
	if kind == reduceMax || kind == reduceMin {
		// The identity is what a reduction over an empty set yields.
		id, err := reduceIdentity(kind, x.DType())
		if err != nil {
			return err
		}
		for i := range acc {
			acc[i] = id
		}
	}
	idx := ctx.Ints(len(src))
	if err := tensor.BroadcastIndex(keepShape, sh, idx); err != nil {
		return err
	}
	accumulate(acc, src, idx, kind)
	if kind == reduceMean && len(acc) > 0 && len(src) > 0 {
		// A mean over an empty set stays 0, as onnxruntime's (not 0/0).
		cnt := float64(len(src) / len(acc))
		for i := range acc {
			acc[i] /= cnt
		}
	}
	if x.DType().IsFloat() {
		return storeFloat64(out, acc)
	}
	// bool: the integer types took reduceInt
	dst := out.Bool()
	for i, v := range acc {
		dst[i] = v != 0
	}
	return nil
}

// reduceInt is reduceCompute for the integer types (keepShape: x's shape
// with the reduced axes set to 1): it reduces in int64, which holds every
// integer type exactly, so int64 values above 2^53 keep their last bits.
// Sums wrap modulo 2^64 like onnxruntime's, and a narrower type's, stored
// back truncated, wraps as its own arithmetic would.
func reduceInt(ctx *Context, x *tensor.Tensor, keepShape tensor.Shape, out *tensor.Tensor, kind reduceKind) error {
	src := x.Int64() // read in place when it is int64
	if src == nil {
		var err error
		if src, err = ctx.Int64Values(x); err != nil {
			return err
		}
	}
	acc := ctx.Int64s(out.Len())
	if kind == reduceMax || kind == reduceMin {
		lo, hi, ok := intRange(x.DType())
		if !ok {
			return fmt.Errorf("%w: %s of %v", errs.ErrType, kind, x.DType())
		}
		id := hi // the result over an empty set
		if kind == reduceMax {
			id = lo
		}
		for i := range acc {
			acc[i] = id
		}
	}
	idx := ctx.Ints(len(src))
	if err := tensor.BroadcastIndex(keepShape, x.Shape(), idx); err != nil {
		return err
	}
	if kind == reduceMean {
		meanInt(acc, src, idx)
	} else {
		accumulate(acc, src, idx, kind)
	}
	return storeInt64(out, acc)
}

// meanInt writes into each acc[o] the mean of the src[i] with idx[i] == o
// (every output reduces the same count of inputs), truncated toward zero as
// onnxruntime's integer ReduceMean does (0 over an empty set). The sums are
// kept in 128 bits, so they cannot overflow, and the mean of int64 values
// always fits int64.
func meanInt(acc, src []int64, idx []int) {
	if len(acc) == 0 || len(src) == 0 {
		clear(acc)
		return
	}
	cnt := uint64(len(src) / len(acc))
	hi := make([]int64, len(acc))
	lo := make([]uint64, len(acc))
	for i, v := range src {
		o := idx[i]
		var carry uint64
		lo[o], carry = bits.Add64(lo[o], uint64(v), 0)
		hi[o] += v>>63 + int64(carry) // v's sign extension and the carry
	}
	for o := range acc {
		h, l, neg := uint64(hi[o]), lo[o], hi[o] < 0
		if neg { // the magnitude: two's complement negation of the 128 bits
			var borrow uint64
			l, borrow = bits.Sub64(0, l, 0)
			h, _ = bits.Sub64(0, h, borrow)
		}
		q, _ := bits.Div64(h, l, cnt) // h < cnt: |sum| <= cnt * 2^63
		if neg {
			acc[o] = -int64(q)
		} else {
			acc[o] = int64(q)
		}
	}
}

// accumulate folds each src[i] into acc[idx[i]]: the largest or smallest
// value for reduceMax / reduceMin, else the sum.
func accumulate[T int64 | float64](acc, src []T, idx []int, kind reduceKind) {
	for i, v := range src {
		o := idx[i]
		switch kind {
		case reduceMax:
			acc[o] = max(acc[o], v)
		case reduceMin:
			acc[o] = min(acc[o], v)
		default:
			acc[o] += v
		}
	}
}

// reduceTrailingF32 is the path of the normalizations of exported decoders
// (ReduceMean over the last axis of a float32 tensor): a sum or mean over
// trailing axes, read in place. It computes what the general path does (a
// float64 sum in index order, divided by the count, rounded to float32)
// without widening the input or an index per element, and reports whether
// it applied.
func reduceTrailingF32(x *tensor.Tensor, red []bool, out *tensor.Tensor, kind reduceKind) bool {
	if x.DType() != tensor.Float32 || (kind != reduceSum && kind != reduceMean) {
		return false
	}
	sh := x.Shape()
	k := len(sh)
	for k > 0 && red[k-1] {
		k--
	}
	for _, r := range red[:k] {
		if r {
			return false // a reduced axis before a kept one
		}
	}
	inner := tensor.Shape(sh[k:]).Size()
	if inner == 0 || k == len(sh) {
		return false
	}
	src, dst := x.Float32(), out.Float32()
	for o := range dst {
		var acc float64
		for _, v := range src[o*inner : (o+1)*inner] {
			acc += float64(v)
		}
		if kind == reduceMean {
			acc /= float64(inner)
		}
		dst[o] = float32(acc)
	}
	return true
}

// String names the reduction as its ONNX op.
func (k reduceKind) String() string {
	return [...]string{"ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"}[k]
}

// reduceIdentity is the start value of ReduceMax/ReduceMin on the float64
// path, the result over an empty set: -inf (+inf) for floats, false (true)
// for bool (the integer types take reduceInt, with intRange).
func reduceIdentity(kind reduceKind, dt tensor.DType) (float64, error) {
	var lo, hi float64
	switch dt {
	case tensor.Float32, tensor.Float16, tensor.BFloat16, tensor.Float64:
		lo, hi = math.Inf(-1), math.Inf(1)
	case tensor.Bool:
		lo, hi = 0, 1
	default:
		return 0, fmt.Errorf("%w: %s of %v", errs.ErrType, kind, dt)
	}
	if kind == reduceMax {
		return lo, nil
	}
	return hi, nil
}

// intRange is the lowest and highest value of the integer type dt; ok is
// false for other types.
func intRange(dt tensor.DType) (lo, hi int64, ok bool) {
	switch dt {
	case tensor.Uint8:
		return 0, math.MaxUint8, true
	case tensor.Int8:
		return math.MinInt8, math.MaxInt8, true
	case tensor.Int16:
		return math.MinInt16, math.MaxInt16, true
	case tensor.Uint16:
		return 0, math.MaxUint16, true
	case tensor.Uint32:
		return 0, math.MaxUint32, true
	case tensor.Int32:
		return math.MinInt32, math.MaxInt32, true
	case tensor.Int64:
		return math.MinInt64, math.MaxInt64, true
	}
	return 0, 0, false
}

// reduceSource widens x to float64 (exact for every supported type except
// int64 magnitudes above 2^53, which shape arithmetic never reaches), in
// ctx's scratch (a nil ctx: a fresh slice).
func reduceSource(ctx *Context, x *tensor.Tensor) ([]float64, error) {
	out := ctx.Float64s(x.Len())
	switch {
	case x.DType() == tensor.Float64:
		copy(out, x.Float64())
	case x.DType().IsFloat():
		f, err := ctx.AsFloat32(x)
		if err != nil {
			return nil, err
		}
		for i, v := range f {
			out[i] = float64(v)
		}
	case x.DType().IsInt():
		v := x.Int64() // read in place when it is int64
		if v == nil {
			var err error
			if v, err = ctx.Int64Values(x); err != nil {
				return nil, err
			}
		}
		for i, e := range v {
			out[i] = float64(e)
		}
	case x.DType() == tensor.Bool:
		for i, b := range x.Bool() {
			if b {
				out[i] = 1
			}
		}
	default:
		return nil, fmt.Errorf("%w: reduction of %v", errs.ErrType, x.DType())
	}
	return out, nil
}
