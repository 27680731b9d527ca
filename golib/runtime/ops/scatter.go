package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "ScatterND", 11, 0, newScatterND)
}

// newScatterND copies data and overwrites the slices addressed by the
// last axis of indices with updates (exporters use it for in-place KV-cache
// updates), or combines them with reduction add, mul, max or min, in update
// order.
func newScatterND(n *Node) (Kernel, error) {
	red, err := n.Attrs.String("reduction", "none")
	if err != nil {
		return nil, err
	}
	switch red {
	case "none", "add", "mul", "max", "min":
	default:
		return nil, fmt.Errorf("%w: ScatterND reduction=%q", errs.ErrInvalidArgument, red)
	}
	return KernelFunc(func(ctx *Context) error {
		data, it, upd, err := threeInputs(ctx)
		if err != nil {
			return err
		}
		idx, err := tensor.Int64Values(it)
		if err != nil {
			return err
		}
		ds, is := data.Shape(), it.Shape()
		if it.Rank() < 1 {
			return fmt.Errorf("%w: ScatterND indices must have rank >= 1", errs.ErrShape)
		}
		k := is[len(is)-1]
		if k > len(ds) {
			return fmt.Errorf("%w: ScatterND index depth %d for data rank %d", errs.ErrShape, k, len(ds))
		}
		wantUpd := append(is[:len(is)-1:len(is)-1].Clone(), ds[k:]...)
		if upd.DType() != data.DType() {
			return fmt.Errorf("%w: ScatterND updates %v, data %v", errs.ErrType, upd.DType(), data.DType())
		}
		if !upd.Shape().Equal(wantUpd) {
			return fmt.Errorf("%w: ScatterND updates %v %v, want %v %v", errs.ErrShape, upd.DType(), upd.Shape(), data.DType(), wantUpd)
		}
		out, err := ctx.NewOutput(0, data.DType(), ds)
		if err != nil {
			return err
		}
		copy(out.Bytes(), data.Bytes())
		es := data.DType().Size()
		slice := tensor.Shape(ds[k:]).Size() * es
		strides := ds.Strides()
		dst, src := out.Bytes(), upd.Bytes()
		nUpd := tensor.Shape(is[:len(is)-1]).Size()
		offs := make([]int, nUpd)
		for u := range offs {
			off := 0
			for j := 0; j < k; j++ {
				v, err := normIndex("ScatterND", idx[u*k+j], int64(ds[j]))
				if err != nil {
					return err
				}
				off += int(v) * strides[j]
			}
			offs[u] = off
		}
		if red == "none" {
			for u, off := range offs {
				copy(dst[off*es:off*es+slice], src[u*slice:(u+1)*slice])
			}
			return nil
		}
		return scatterReduce("ScatterND", out, upd, offs, slice/es, red)
	}), nil
}

// scatterReduceTypes are the element types scatterReduce computes.
var scatterReduceTypes = typeSet{tensor.Float32, tensor.Float16, tensor.BFloat16, tensor.Float64,
	tensor.Int64, tensor.Int32, tensor.Int8, tensor.Uint8}

// scatterReduce combines upd's slices of n elements into out at the element
// offsets offs with reduction red (add, mul, max, min); float16/bfloat16
// compute in float32. op names the op in errors.
func scatterReduce(op string, out, upd *tensor.Tensor, offs []int, n int, red string) error {
	switch out.DType() {
	case tensor.Float32:
		scatterCombine(out.Float32(), upd.Float32(), offs, n, red)
	case tensor.Float64:
		scatterCombine(out.Float64(), upd.Float64(), offs, n, red)
	case tensor.Int64:
		scatterCombine(out.Int64(), upd.Int64(), offs, n, red)
	case tensor.Int32:
		scatterCombine(out.Int32(), upd.Int32(), offs, n, red)
	case tensor.Int8:
		scatterCombine(out.Int8(), upd.Int8(), offs, n, red)
	case tensor.Uint8:
		scatterCombine(out.Uint8(), upd.Uint8(), offs, n, red)
	case tensor.Float16, tensor.BFloat16:
		o, err := tensor.AsFloat32(out)
		if err != nil {
			return err
		}
		u, err := tensor.AsFloat32(upd)
		if err != nil {
			return err
		}
		scatterCombine(o, u, offs, n, red)
		return tensor.FromFloat32(out, o)
	default:
		return fmt.Errorf("%w: %s reduction=%q of %v", errs.ErrType, op, red, out.DType())
	}
	return nil
}

func scatterCombine[T int64 | int32 | int8 | uint8 | float32 | float64](dst, src []T, offs []int, n int, red string) {
	for u, off := range offs {
		d, s := dst[off:off+n], src[u*n:(u+1)*n]
		switch red {
		case "add":
			for i, v := range s {
				d[i] += v
			}
		case "mul":
			for i, v := range s {
				d[i] *= v
			}
		case "max": // onnxruntime's *a = *a > b ? *a : b (NaN and -0 included)
			for i, v := range s {
				if !(d[i] > v) {
					d[i] = v
				}
			}
		case "min":
			for i, v := range s {
				if !(d[i] < v) {
					d[i] = v
				}
			}
		}
	}
}
