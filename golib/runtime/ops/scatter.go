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
// last axis of indices with updates (reduction "none" only; exporters use
// it for in-place KV-cache updates).
func newScatterND(n *Node) (Kernel, error) {
	red, err := n.Attrs.String("reduction", "none")
	if err != nil {
		return nil, err
	}
	if red != "none" {
		return nil, fmt.Errorf("%w: ScatterND reduction=%q", errs.ErrNotImplemented, red)
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
		if upd.DType() != data.DType() || !upd.Shape().Equal(wantUpd) {
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
		for u := 0; u < nUpd; u++ {
			off := 0
			for j := 0; j < k; j++ {
				v, err := normIndex("ScatterND", idx[u*k+j], int64(ds[j]))
				if err != nil {
					return err
				}
				off += int(v) * strides[j]
			}
			copy(dst[off*es:off*es+slice], src[u*slice:(u+1)*slice])
		}
		return nil
	}), nil
}
