package ops

import (
	"fmt"
	"math"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Constant", 1, 0, newConstant)
	Register("", "ConstantOfShape", 9, 0, newConstantOfShape)
	Register("", "Range", 11, 0, newRange)
}

// newConstant decodes the value once; every run outputs the same tensor
// (kernels never write their inputs, so sharing it is safe).
func newConstant(n *Node) (Kernel, error) {
	var v *tensor.Tensor
	var err error
	switch {
	case n.Attrs.Has("value"):
		v, err = n.Attrs.Tensor("value")
	case n.Attrs.Has("value_float"):
		var f float32
		f, err = n.Attrs.Float("value_float", 0)
		v = tensor.Scalar(f)
	case n.Attrs.Has("value_int"):
		var i int64
		i, err = n.Attrs.Int("value_int", 0)
		v = tensor.Scalar(i)
	case n.Attrs.Has("value_floats"):
		var fs []float32
		fs, _, err = n.Attrs.Floats("value_floats")
		if err == nil {
			v, err = tensor.FromSlice(tensor.Shape{len(fs)}, append([]float32{}, fs...))
		}
	case n.Attrs.Has("value_ints"):
		var is []int64
		is, _, err = n.Attrs.Ints("value_ints")
		if err == nil {
			v, err = tensor.FromSlice(tensor.Shape{len(is)}, append([]int64{}, is...))
		}
	case n.Attrs.Has("sparse_value") || n.Attrs.Has("value_string") || n.Attrs.Has("value_strings"):
		return nil, fmt.Errorf("%w: Constant with a sparse or string value", errs.ErrNotImplemented)
	default:
		return nil, fmt.Errorf("%w: Constant needs one value attribute (value, value_float(s), value_int(s), ...)", errs.ErrInvalidModel)
	}
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, fmt.Errorf("%w: Constant value is empty", errs.ErrInvalidModel)
	}
	return KernelFunc(func(ctx *Context) error { return ctx.SetOutput(0, v) }), nil
}

func newConstantOfShape(n *Node) (Kernel, error) {
	val, err := n.Attrs.Tensor("value")
	if err != nil {
		return nil, err
	}
	if val == nil {
		val = tensor.Scalar(float32(0))
	}
	if val.Len() != 1 {
		return nil, fmt.Errorf("%w: ConstantOfShape value must have one element", errs.ErrInvalidModel)
	}
	return KernelFunc(func(ctx *Context) error {
		dims, err := shapeInput(ctx, 0)
		if err != nil {
			return err
		}
		shape := make(tensor.Shape, len(dims))
		for i, d := range dims {
			if d < 0 || d > tensor.MaxElements {
				return fmt.Errorf("%w: ConstantOfShape dimension %d", errs.ErrInvalidArgument, d)
			}
			shape[i] = int(d)
		}
		out, err := ctx.NewOutput(0, val.DType(), shape)
		if err != nil {
			return err
		}
		fillRepeat(out.Bytes(), val.Bytes())
		return nil
	}), nil
}

// fillRepeat fills dst with copies of the element pattern p.
func fillRepeat(dst, p []byte) {
	if len(dst) == 0 || len(p) == 0 {
		return
	}
	allZero := true
	for _, b := range p {
		allZero = allZero && b == 0
	}
	if allZero {
		return // buffers from NewOutput are already zero
	}
	n := copy(dst, p)
	for n < len(dst) {
		n += copy(dst[n:], dst[:n])
	}
}

// maxRangeElements bounds Range's output so a hostile delta cannot request
// an enormous tensor.
const maxRangeElements = 1 << 31

func newRange(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		st, lt, dt, err := threeInputs(ctx)
		if err != nil {
			return err
		}
		if st.Len() != 1 || lt.Len() != 1 || dt.Len() != 1 {
			return fmt.Errorf("%w: Range inputs must be scalars", errs.ErrShape)
		}
		if st.DType().IsInt() {
			s, err := int64OrBoolValues(st)
			if err != nil {
				return err
			}
			l, err := int64OrBoolValues(lt)
			if err != nil {
				return err
			}
			d, err := int64OrBoolValues(dt)
			if err != nil {
				return err
			}
			if d[0] == 0 {
				return fmt.Errorf("%w: Range delta is 0", errs.ErrInvalidArgument)
			}
			cnt := rangeCount(s[0], l[0], d[0])
			if cnt > maxRangeElements {
				return fmt.Errorf("%w: Range(%d, %d, %d) has %d elements", errs.ErrLimit, s[0], l[0], d[0], cnt)
			}
			shape := ctx.ScratchShape(1) // a literal shape would escape to the heap
			shape[0] = int(cnt)
			out, err := ctx.NewOutput(0, st.DType(), shape) // checks the size limit
			if err != nil {
				return err
			}
			if out.DType() == tensor.Int64 {
				fillRange(out.Int64(), s[0], d[0])
				return nil
			}
			v := make([]int64, cnt)
			fillRange(v, s[0], d[0])
			return storeInt64(out, v)
		}
		var s, l, d float64
		for i, t := range []*tensor.Tensor{st, lt, dt} {
			f, err := ctx.AsFloat32(t)
			if err != nil {
				return err
			}
			x := float64(f[0])
			if t.DType() == tensor.Float64 {
				x = t.Float64()[0]
			}
			switch i {
			case 0:
				s = x
			case 1:
				l = x
			case 2:
				d = x
			}
		}
		if d == 0 || math.IsNaN(d) {
			return fmt.Errorf("%w: Range delta is %v", errs.ErrInvalidArgument, d)
		}
		c := math.Ceil((l - s) / d)
		if math.IsNaN(c) || c > maxRangeElements {
			return fmt.Errorf("%w: Range of %v elements", errs.ErrLimit, c)
		}
		cnt := int(max(c, 0))
		out, err := ctx.NewOutput(0, st.DType(), tensor.Shape{cnt}) // checks the size limit
		if err != nil {
			return err
		}
		v := make([]float64, cnt)
		for i := range v {
			v[i] = s + float64(i)*d
		}
		return storeFloat64(out, v)
	}), nil
}

// rangeCount is the number of elements of the integer Range(start, limit,
// delta), max(ceil((limit-start)/delta), 0), computed exactly: the distance
// |limit-start| (below 2^64) and |delta| are taken as uint64, so neither
// limit-start overflowing int64 nor a float64 rounding counts above 2^53
// can change it. delta must not be 0.
func rangeCount(start, limit, delta int64) uint64 {
	var dist, step uint64
	switch {
	case delta > 0 && limit > start:
		dist, step = uint64(limit)-uint64(start), uint64(delta)
	case delta < 0 && limit < start:
		dist, step = uint64(start)-uint64(limit), -uint64(delta)
	default:
		return 0
	}
	n := dist / step
	if dist%step != 0 {
		n++
	}
	return n
}

// fillRange writes start, start+delta, ... into v. With len(v) from
// rangeCount every element lies between start and limit, so it fits int64;
// the products and sums are taken modulo 2^64 (uint64, which wraps by
// definition), whose result is then that exact value even where
// int64(i)*delta alone would not fit.
func fillRange(v []int64, start, delta int64) {
	for i := range v {
		v[i] = int64(uint64(start) + uint64(i)*uint64(delta))
	}
}
