package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// The index ops of mixture-of-experts routing as exporters write it:
// NonZero (which tokens chose an expert), OneHot (the expert mask) and
// ScatterElements.

func init() {
	Register("", "NonZero", 9, 0, requireInputs(1, newNonZero))
	Register("", "OneHot", 9, 0, requireInputs(3, newOneHot))
	Register("", "ScatterElements", 11, 0, requireInputs(3, newScatterElements))
}

// nonZeroTypes are the element types NonZero reads.
var nonZeroTypes = append(typeSet{tensor.Bool}, numericTypes...)

// newNonZero: the int64 coordinates [rank, n] of the n nonzero elements of
// x, in row-major order (NaN is nonzero, -0 is zero); a scalar reads as
// one element of rank 1, as onnxruntime.
func newNonZero(n *Node) (Kernel, error) {
	if err := n.checkTypes(nonZeroTypes, 0); err != nil {
		return nil, err
	}
	desc := n.Describe()
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		nz, err := nonZeroMask(ctx, desc, x)
		if err != nil {
			return err
		}
		cnt := 0
		for _, b := range nz {
			if b {
				cnt++
			}
		}
		sh := x.Shape()
		rank := max(len(sh), 1)
		out, err := ctx.NewOutputUninit(0, tensor.Int64, tensor.Shape{rank, cnt})
		if err != nil {
			return err
		}
		if cnt == 0 {
			return nil
		}
		dims := sh
		if len(dims) == 0 {
			dims = tensor.Shape{1}
		}
		coord := ctx.Ints(rank)
		for j := range coord {
			coord[j] = 0
		}
		dst := out.Int64()
		c := 0
		for _, b := range nz {
			if b {
				for j, v := range coord {
					dst[j*cnt+c] = int64(v)
				}
				c++
			}
			for j := rank - 1; j >= 0; j-- { // next row-major coordinate
				coord[j]++
				if coord[j] < dims[j] {
					break
				}
				coord[j] = 0
			}
		}
		return nil
	}), nil
}

// nonZeroMask returns, per element of x, whether it is nonzero.
func nonZeroMask(ctx *Context, desc string, x *tensor.Tensor) ([]bool, error) {
	if x.DType() == tensor.Bool {
		return x.Bool(), nil
	}
	k, err := keysOf(ctx, desc, x) // (exact: -0 is zero, NaN nonzero)
	if err != nil {
		return nil, err
	}
	nz := ctx.Bools(x.Len())
	for j, v := range k.f {
		nz[j] = v != 0
	}
	for j, v := range k.i {
		nz[j] = v != 0
	}
	return nz, nil
}

// indexValues returns t's values as int64 (into scratch): integers as they
// are, floating-point values truncated toward zero, as OneHot reads its
// indices and depth.
func indexValues(ctx *Context, desc, what string, t *tensor.Tensor) ([]int64, error) {
	if dt := t.DType(); !dt.IsInt() && !dt.IsFloat() {
		return nil, fmt.Errorf("%w: %s %s of %v", errs.ErrType, desc, what, dt)
	}
	k, err := keysOf(ctx, desc, t)
	if err != nil || t.DType().IsInt() {
		return k.i, err
	}
	out := ctx.Int64s(len(k.f))
	for j, v := range k.f {
		if math.IsNaN(v) || v >= math.MaxInt64 || v < math.MinInt64 {
			return nil, fmt.Errorf("%w: %s %s value %v", errs.ErrInvalidArgument, desc, what, v)
		}
		out[j] = int64(v)
	}
	return out, nil
}

// newOneHot: out has indices' shape with a new axis of depth elements at
// axis, holding values[1] (on) where the position equals the index and
// values[0] (off) elsewhere; negative indices count from depth, indices
// outside [-depth, depth) give a row of off values.
func newOneHot(n *Node) (Kernel, error) {
	axis, err := n.Attrs.Int("axis", -1)
	if err != nil {
		return nil, err
	}
	if err := n.checkTypes(numericTypes, 0, 1); err != nil {
		return nil, err
	}
	desc := n.Describe()
	return KernelFunc(func(ctx *Context) error {
		it, dt, vt, err := threeInputs(ctx)
		if err != nil {
			return err
		}
		if dt.Len() != 1 || dt.Rank() > 1 {
			return fmt.Errorf("%w: %s depth must be one value, got shape %v", errs.ErrInvalidArgument, desc, dt.Shape())
		}
		if vt.Len() != 2 || vt.Rank() != 1 {
			return fmt.Errorf("%w: %s values must be [off, on], got shape %v", errs.ErrInvalidArgument, desc, vt.Shape())
		}
		dv, err := indexValues(ctx, desc, "depth", dt)
		if err != nil {
			return err
		}
		depth := dv[0]
		if depth < 1 || depth > tensor.MaxElements {
			return fmt.Errorf("%w: %s depth %d", errs.ErrInvalidArgument, desc, depth)
		}
		is := it.Shape()
		ax := int(axis)
		if ax < -len(is)-1 || ax > len(is) {
			return fmt.Errorf("%w: %s axis %d for indices of rank %d", errs.ErrInvalidArgument, desc, axis, len(is))
		}
		if ax < 0 {
			ax += len(is) + 1
		}
		idx, err := indexValues(ctx, desc, "indices", it)
		if err != nil {
			return err
		}
		outShape := ctx.ScratchShape(len(is) + 1)
		copy(outShape, is[:ax])
		outShape[ax] = int(depth)
		copy(outShape[ax+1:], is[ax:])
		out, err := ctx.NewOutputUninit(0, vt.DType(), outShape)
		if err != nil {
			return err
		}
		if out.Len() == 0 {
			return nil
		}
		es := vt.DType().Size()
		vb, dst := vt.Bytes(), out.Bytes()
		off, on := vb[:es], vb[es:2*es]
		for j := 0; j < len(dst); j += es {
			copy(dst[j:j+es], off)
		}
		inner := tensor.Shape(is[ax:]).Size()
		d := int(depth)
		for j, v := range idx {
			if v < 0 {
				v += depth
			}
			if v < 0 || v >= depth {
				continue
			}
			o, i := j/inner, j%inner
			p := ((o*d+int(v))*inner + i) * es
			copy(dst[p:p+es], on)
		}
		return nil
	}), nil
}

// newScatterElements copies data and writes each element of updates at
// the position of its own coordinates with the one along axis replaced by
// its index (negative ones count from the end; out-of-range ones are an
// error), or combines it there with reduction add, mul (opset 16+), max or
// min (opset 18+), in the row-major order of updates.
func newScatterElements(n *Node) (Kernel, error) {
	axis, err := n.Attrs.Int("axis", 0)
	if err != nil {
		return nil, err
	}
	red, err := n.Attrs.String("reduction", "none")
	if err != nil {
		return nil, err
	}
	ok := red == "none"
	switch {
	case n.Opset >= 18:
		ok = ok || red == "add" || red == "mul" || red == "max" || red == "min"
	case n.Opset >= 16:
		ok = ok || red == "add" || red == "mul"
	}
	if !ok {
		return nil, fmt.Errorf("%w: %s reduction=%q", errs.ErrInvalidModel, n.Describe(), red)
	}
	if dt := n.InputType(1); dt != tensor.Undefined && dt != tensor.Int64 && dt != tensor.Int32 {
		return nil, fmt.Errorf("%w: %s indices of %v; they are int32 or int64", errs.ErrInvalidModel, n.Describe(), dt)
	}
	if red != "none" {
		if err := n.checkTypes(scatterReduceTypes, 0, 2); err != nil {
			return nil, err
		}
	}
	desc := n.Describe()
	return KernelFunc(func(ctx *Context) error {
		data, it, upd, err := threeInputs(ctx)
		if err != nil {
			return err
		}
		if it.DType() != tensor.Int64 && it.DType() != tensor.Int32 {
			return fmt.Errorf("%w: %s indices of %v", errs.ErrType, desc, it.DType())
		}
		if upd.DType() != data.DType() {
			return fmt.Errorf("%w: %s updates %v, data %v", errs.ErrType, desc, upd.DType(), data.DType())
		}
		ds, is := data.Shape(), it.Shape()
		if !upd.Shape().Equal(is) {
			return fmt.Errorf("%w: %s updates %v, indices %v: they must have one shape", errs.ErrShape, desc, upd.Shape(), is)
		}
		if len(is) != len(ds) || len(ds) == 0 {
			return fmt.Errorf("%w: %s indices of rank %d, data of rank %d", errs.ErrShape, desc, len(is), len(ds))
		}
		ax, err := tensor.NormAxis(int(axis), len(ds))
		if err != nil {
			return fmt.Errorf("%s: %w", desc, err)
		}
		for j := range is {
			if j != ax && is[j] > ds[j] {
				return fmt.Errorf("%w: %s indices %v past data %v on axis %d", errs.ErrShape, desc, is, ds, j)
			}
		}
		out, err := ctx.NewOutputUninit(0, data.DType(), ds)
		if err != nil {
			return err
		}
		copy(out.Bytes(), data.Bytes())
		idx, err := ctx.Int64Values(it)
		if err != nil {
			return err
		}
		if len(idx) == 0 {
			return nil
		}
		offs := ctx.Ints(len(idx))
		if err := elementOffsets(desc, offs, idx, is, ds, ax, ctx.Ints(len(is))); err != nil {
			return err
		}
		if red == "none" {
			es := data.DType().Size()
			dst, src := out.Bytes(), upd.Bytes()
			for u, off := range offs {
				copy(dst[off*es:(off+1)*es], src[u*es:(u+1)*es])
			}
			return nil
		}
		return scatterReduce("ScatterElements", out, upd, offs, 1, red)
	}), nil
}
