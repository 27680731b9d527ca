package ops

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	// GatherND 11 has no batch_dims; 12 adds it and 13 only widens the
	// types (bfloat16), so one kernel serves both ranges.
	Register("", "GatherND", 11, 11, newGatherND)
	Register("", "GatherND", 12, 0, newGatherND)
}

// newGatherND: for data of rank r and indices of shape [..., k], each index
// tuple of length k (after the batch_dims leading dimensions shared by data
// and indices) selects a slice data[b..., i0, ..., ik-1, :] of the
// remaining r-batch_dims-k dimensions. The output has shape
// indices.shape[:-1] + data.shape[batch_dims+k:]. Negative indices count
// from the end; out-of-range ones are an error. Any element type: slices
// are copied as bytes.
func newGatherND(n *Node) (Kernel, error) {
	bd, err := n.Attrs.Int("batch_dims", 0)
	if err != nil {
		return nil, err
	}
	if n.Opset < 12 && n.Attrs.Has("batch_dims") {
		return nil, fmt.Errorf("%w: %s has no batch_dims attribute before opset 12", errs.ErrInvalidArgument, n.Describe())
	}
	if bd < 0 {
		return nil, fmt.Errorf("%w: %s: batch_dims %d must be >= 0", errs.ErrInvalidArgument, n.Describe(), bd)
	}
	return KernelFunc(func(ctx *Context) error { return gatherNDCompute(ctx, int(bd)) }), nil
}

func gatherNDCompute(ctx *Context, bd int) error {
	x, it, err := twoInputs(ctx)
	if err != nil {
		return err
	}
	if it.DType() != tensor.Int64 && it.DType() != tensor.Int32 {
		return fmt.Errorf("%w: GatherND indices must be int64 or int32, got %v", errs.ErrType, it.DType())
	}
	ds, is := x.Shape(), it.Shape()
	if len(ds) < 1 || len(is) < 1 {
		return fmt.Errorf("%w: GatherND data %v and indices %v must have rank >= 1", errs.ErrShape, ds, is)
	}
	if bd >= len(ds) || bd >= len(is) {
		return fmt.Errorf("%w: GatherND batch_dims %d must be less than the ranks of data %v and indices %v", errs.ErrShape, bd, ds, is)
	}
	if !tensor.Shape(ds[:bd]).Equal(is[:bd]) {
		return fmt.Errorf("%w: GatherND leading batch_dims=%d dimensions differ: data %v, indices %v", errs.ErrShape, bd, ds, is)
	}
	k := is[len(is)-1]
	if k < 1 || k > len(ds)-bd {
		return fmt.Errorf("%w: GatherND indices last dimension %d must be in 1..%d (data %v, batch_dims %d)", errs.ErrShape, k, len(ds)-bd, ds, bd)
	}
	outShape := append(is[:len(is)-1:len(is)-1].Clone(), ds[bd+k:]...)
	out, err := ctx.NewOutputUninit(0, x.DType(), outShape)
	if err != nil {
		return err
	}
	idx, err := tensor.Int64Values(it)
	if err != nil {
		return err
	}
	es := x.DType().Size()
	slice := tensor.Shape(ds[bd+k:]).Size() * es // bytes per gathered slice
	batches := tensor.Shape(ds[:bd]).Size()
	batchBytes := tensor.Shape(ds[bd:]).Size() * es
	tuples := tensor.Shape(is[bd : len(is)-1]).Size() // per batch
	// strides (in slices) of the k indexed dimensions
	strides := make([]int, k)
	st := 1
	for j := k - 1; j >= 0; j-- {
		strides[j] = st
		st *= ds[bd+j]
	}
	src, dst := x.Bytes(), out.Bytes()
	for b := 0; b < batches; b++ {
		for t := 0; t < tuples; t++ {
			tup := idx[(b*tuples+t)*k : (b*tuples+t+1)*k]
			off := 0
			for j, v := range tup {
				nv, err := normIndex("GatherND", v, int64(ds[bd+j]))
				if err != nil {
					return err
				}
				off += int(nv) * strides[j]
			}
			s := b*batchBytes + off*slice
			d := (b*tuples + t) * slice
			copy(dst[d:d+slice], src[s:s+slice])
		}
	}
	return nil
}
