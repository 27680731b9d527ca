package ops

import "github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"

// Kernels that compute float16/bfloat16 (and float64) in float32 write into
// f32Result's slice and end with storeF32Result; a float32 output is
// written in place, with no scratch and no conversion pass.

// f32Result returns out's float32 elements when out is float32, otherwise a
// slice of out.Len() elements from ctx's scratch (a nil ctx: a fresh one)
// for storeF32Result to convert.
func f32Result(ctx *Context, out *tensor.Tensor) []float32 {
	if d := out.Float32(); d != nil {
		return d
	}
	return ctx.Float32s(out.Len())
}

// storeF32Result converts dst, from f32Result(out), into out; nothing is
// left to do when out is float32.
func storeF32Result(out *tensor.Tensor, dst []float32) error {
	if out.DType() == tensor.Float32 {
		return nil
	}
	return tensor.FromFloat32(out, dst)
}
