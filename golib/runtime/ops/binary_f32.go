package ops

import "github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"

// Float32 Add/Sub/Mul/Div run through these loops instead of a per-element
// function call: residual adds and scalings on the decode path are
// memory-bound only when the loop body is this plain.

type f32Kind int

const (
	f32Add f32Kind = iota + 1
	f32Sub
	f32Mul
	f32Div
)

var f32Kinds = map[string]f32Kind{"Add": f32Add, "Sub": f32Sub, "Mul": f32Mul, "Div": f32Div}

// binaryF32 computes out = a (op) b over a broadcast with plain loops.
func binaryF32(k f32Kind, a []float32, as tensor.Shape, b []float32, bs tensor.Shape, out []float32, os tensor.Shape) error {
	return bcastRows(as, bs, os, func(o, ia, ib, sa, sb, n int) {
		dst := out[o : o+n]
		switch {
		case sa == 1 && sb == 1:
			vecVec(k, dst, a[ia:ia+n], b[ib:ib+n])
		case sa == 1:
			vecScalar(k, dst, a[ia:ia+n], b[ib])
		case sb == 1:
			scalarVec(k, dst, a[ia], b[ib:ib+n])
		default:
			vecScalar(k, dst, a[ia:ia+1], b[ib])
			for i := range dst {
				dst[i] = dst[0]
			}
		}
	})
}

// binaryHalf is binaryF32 for float16 or bfloat16 operands of one type:
// both widened (exactly) into ctx's scratch, the float32 loops, the result
// rounded once into out, as binaryCompute computes them, without its call
// per element.
func binaryHalf(ctx *Context, k f32Kind, a, b, out *tensor.Tensor) error {
	x, y, err := convertBoth(ctx.AsFloat32, a, b)
	if err != nil {
		return err
	}
	dst := f32Result(ctx, out)
	if err := binaryF32(k, x, a.Shape(), y, b.Shape(), dst, out.Shape()); err != nil {
		return err
	}
	return storeF32Result(out, dst)
}

func vecVec(k f32Kind, dst, x, y []float32) {
	x, y = x[:len(dst)], y[:len(dst)]
	switch k {
	case f32Add:
		for i := range dst {
			dst[i] = x[i] + y[i]
		}
	case f32Sub:
		for i := range dst {
			dst[i] = x[i] - y[i]
		}
	case f32Mul:
		for i := range dst {
			dst[i] = x[i] * y[i]
		}
	case f32Div:
		for i := range dst {
			dst[i] = x[i] / y[i]
		}
	}
}

func vecScalar(k f32Kind, dst, x []float32, y float32) {
	x = x[:len(dst)]
	switch k {
	case f32Add:
		for i := range dst {
			dst[i] = x[i] + y
		}
	case f32Sub:
		for i := range dst {
			dst[i] = x[i] - y
		}
	case f32Mul:
		for i := range dst {
			dst[i] = x[i] * y
		}
	case f32Div:
		for i := range dst {
			dst[i] = x[i] / y
		}
	}
}

func scalarVec(k f32Kind, dst []float32, x float32, y []float32) {
	y = y[:len(dst)]
	switch k {
	case f32Add:
		for i := range dst {
			dst[i] = x + y[i]
		}
	case f32Sub:
		for i := range dst {
			dst[i] = x - y[i]
		}
	case f32Mul:
		for i := range dst {
			dst[i] = x * y[i]
		}
	case f32Div:
		for i := range dst {
			dst[i] = x / y[i]
		}
	}
}
