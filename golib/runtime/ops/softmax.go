package ops

import (
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/mha"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Softmax", 1, 12, newSoftmax(false, 1))
	Register("", "Softmax", 13, 0, newSoftmax(true, -1))
	Register("", "LogSoftmax", 13, 0, newLogSoftmax)
}

// newSoftmax: opset 13+ normalizes along one axis; older opsets coerce the
// input to 2D at axis and normalize each row of the flattened tail.
func newSoftmax(single bool, defAxis int64) Factory {
	return func(n *Node) (Kernel, error) {
		axis, err := n.Attrs.Int("axis", defAxis)
		if err != nil {
			return nil, err
		}
		return KernelFunc(func(ctx *Context) error {
			return softmaxCompute(ctx, axis, single, false)
		}), nil
	}
}

func newLogSoftmax(n *Node) (Kernel, error) {
	axis, err := n.Attrs.Int("axis", -1)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error { return softmaxCompute(ctx, axis, true, true) }), nil
}

func softmaxCompute(ctx *Context, axis64 int64, single, logOut bool) error {
	x, err := ctx.RequireInput(0)
	if err != nil {
		return err
	}
	if err := requireFloat(x); err != nil {
		return err
	}
	sh := x.Shape()
	if len(sh) == 0 {
		sh = tensor.Shape{1}
	}
	axis, err := tensor.NormAxis(int(axis64), len(sh))
	if err != nil {
		return err
	}
	outer, dim, inner := 1, 1, 1
	for i, d := range sh {
		switch {
		case i < axis:
			outer *= d
		case i == axis || !single:
			dim *= d
		default:
			inner *= d
		}
	}
	out, err := ctx.NewOutputUninit(0, x.DType(), x.Shape())
	if err != nil {
		return err
	}
	if out.Len() == 0 {
		// no elements, though outer * inner may be huge (2^30 x 2^30 x 0)
		return nil
	}
	if x.DType() == tensor.Float64 {
		// float64 is computed in float64, as the other float64 kernels
		// (binaryCompute, unaryComputeBulk) do: through float32 it would
		// lose precision and overflow beyond float32's range.
		src, dst := x.Float64(), out.Float64()
		if n := outer * inner; ctx.Serial(n, 64) {
			softmaxRows64(src, dst, 0, n, inner, dim, logOut)
			return nil
		}
		return ctx.ParallelFor(outer*inner, 64, func(lo, hi int) {
			softmaxRows64(src, dst, lo, hi, inner, dim, logOut)
		})
	}
	src, err := ctx.AsFloat32(x)
	if err != nil {
		return err
	}
	dst := f32Result(ctx, out)
	if n := outer * inner; ctx.Serial(n, 64) {
		softmaxRows(src, dst, 0, n, inner, dim, logOut) // no closure: one thread allocates nothing here
	} else if err := ctx.ParallelFor(n, 64, func(lo, hi int) {
		softmaxRows(src, dst, lo, hi, inner, dim, logOut)
	}); err != nil {
		return err
	}
	return storeF32Result(out, dst)
}

// softmaxRows normalizes rows lo..hi of dim elements, inner apart.
func softmaxRows(src, dst []float32, lo, hi, inner, dim int, logOut bool) {
	for r := lo; r < hi; r++ {
		o, i := r/inner, r%inner
		base := o*dim*inner + i
		softmaxRow(src, dst, base, inner, dim, logOut)
	}
}

// softmaxRow normalizes dim elements starting at base with the given stride.
// A contiguous row (stride 1) takes the attention kernel's vector
// exponential (mha.ExpSub, about 2 ulp, as expf).
func softmaxRow(src, dst []float32, base, stride, dim int, logOut bool) {
	m := float32(math.Inf(-1))
	for k := 0; k < dim; k++ {
		m = max(m, src[base+k*stride])
	}
	if stride == 1 && !logOut && m == m {
		row := dst[base : base+dim]
		copy(row, src[base:base+dim])
		inv := float32(1 / mha.ExpSub(row, m))
		for k := range row {
			row[k] *= inv
		}
		return
	}
	var sum float64
	for k := 0; k < dim; k++ {
		j := base + k*stride
		e := expf(src[j] - m)
		dst[j] = e
		sum += float64(e)
	}
	if logOut {
		ls := float32(math.Log(sum))
		for k := 0; k < dim; k++ {
			j := base + k*stride
			dst[j] = src[j] - m - ls
		}
		return
	}
	inv := float32(1 / sum)
	for k := 0; k < dim; k++ {
		dst[base+k*stride] *= inv
	}
}

// softmaxRows64 is softmaxRows for float64 tensors, computed in float64
// (as onnx.reference: exp(x - max) divided by their sum, or
// x - max - log(sum) for LogSoftmax).
func softmaxRows64(src, dst []float64, lo, hi, inner, dim int, logOut bool) {
	for r := lo; r < hi; r++ {
		o, i := r/inner, r%inner
		softmaxRow64(src, dst, o*dim*inner+i, inner, dim, logOut)
	}
}

// softmaxRow64 normalizes dim float64 elements starting at base with the
// given stride.
func softmaxRow64(src, dst []float64, base, stride, dim int, logOut bool) {
	m := math.Inf(-1)
	for k := 0; k < dim; k++ {
		m = max(m, src[base+k*stride])
	}
	var sum float64
	for k := 0; k < dim; k++ {
		j := base + k*stride
		e := math.Exp(src[j] - m)
		dst[j] = e
		sum += e
	}
	if logOut {
		ls := math.Log(sum)
		for k := 0; k < dim; k++ {
			j := base + k*stride
			dst[j] = src[j] - m - ls
		}
		return
	}
	for k := 0; k < dim; k++ {
		dst[base+k*stride] /= sum
	}
}
