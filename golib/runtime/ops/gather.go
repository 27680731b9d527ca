package ops

import (
	"unsafe"

	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func init() {
	Register("", "Gather", 1, 0, newGather)
	Register("", "Expand", 8, 0, newExpand)
	Register("", "Where", 9, 0, newWhere)
}

// newGather: out = data indexed by indices along axis; negative indices
// count from the end, out-of-range ones are an error.
func newGather(n *Node) (Kernel, error) {
	axis, err := n.Attrs.Int("axis", 0)
	if err != nil {
		return nil, err
	}
	return KernelFunc(func(ctx *Context) error {
		x, it, err := twoInputs(ctx)
		if err != nil {
			return err
		}
		ax, err := tensor.NormAxis(int(axis), x.Rank())
		if err != nil {
			return err
		}
		idx, err := ctx.Int64Values(it) // normalized in place below
		if err != nil {
			return err
		}
		sh := x.Shape()
		dim := int64(sh[ax])
		outShape := ctx.ScratchShape(len(sh) - 1 + it.Rank())
		copy(outShape, sh[:ax])
		copy(outShape[ax:], it.Shape())
		copy(outShape[ax+it.Rank():], sh[ax+1:])
		out, err := ctx.NewOutputUninit(0, x.DType(), outShape)
		if err != nil {
			return err
		}
		es := x.DType().Size()
		outer := tensor.Shape(sh[:ax]).Size()
		inner := tensor.Shape(sh[ax+1:]).Size() * es
		src, dst := x.Bytes(), out.Bytes()
		for k, v := range idx {
			if idx[k], err = normIndex("Gather", v, dim); err != nil {
				return err
			}
		}
		ni := len(idx)
		if out.Len() == 0 {
			return nil // outer may be huge when nothing is copied
		}
		for o := 0; o < outer; o++ {
			for k, v := range idx {
				s := (o*int(dim) + int(v)) * inner
				d := (o*ni + k) * inner
				copy(dst[d:d+inner], src[s:s+inner])
			}
		}
		return nil
	}), nil
}

// normIndex maps an index into [0, dim), counting negative ones from the
// end; one outside [-dim, dim) is an error naming op.
func normIndex(op string, v, dim int64) (int64, error) {
	if v < -dim || v >= dim {
		return 0, fmt.Errorf("%w: %s index %d out of range for dimension %d", errs.ErrInvalidArgument, op, v, dim)
	}
	if v < 0 {
		v += dim
	}
	return v, nil
}

func newExpand(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		x, err := ctx.RequireInput(0)
		if err != nil {
			return err
		}
		dims, err := shapeInput(ctx, 1)
		if err != nil {
			return err
		}
		target := ctx.ScratchShape(len(dims))
		for i, d := range dims {
			if d < 0 || d > tensor.MaxElements {
				return fmt.Errorf("%w: Expand dimension %d", errs.ErrInvalidArgument, d)
			}
			target[i] = int(d)
		}
		outShape, err := ctx.BroadcastShapes(x.Shape(), target)
		if err != nil {
			return err
		}
		out, err := ctx.NewOutputUninit(0, x.DType(), outShape)
		if err != nil {
			return err
		}
		return broadcastInto(out, x)
	}), nil
}

// broadcastInto fills out with x broadcast to out's shape, row by row
// (broadcast dimensions have stride 0), without an index per element.
func broadcastInto(out, x *tensor.Tensor) error {
	var buf [stackRank]int
	st := buf[:0]
	if r := out.Rank(); r <= stackRank {
		st = buf[:r]
	} else {
		st = make([]int, r)
	}
	st, err := tensor.BroadcastStridesTo(st, x.Shape(), out.Shape())
	if err != nil {
		return err
	}
	es := x.DType().Size()
	src, dst := x.Bytes(), out.Bytes()
	walkStrided(out.Shape(), 0, st, func(o, i, s, n int) {
		stridedCopy(dst, src, o, i, s, n, es)
	})
	return nil
}

func newWhere(n *Node) (Kernel, error) {
	return KernelFunc(func(ctx *Context) error {
		c, x, y, err := threeInputs(ctx)
		if err != nil {
			return err
		}
		if c.DType() != tensor.Bool || x.DType() != y.DType() {
			return fmt.Errorf("%w: Where(%v, %v, %v)", errs.ErrType, c.DType(), x.DType(), y.DType())
		}
		outShape, err := ctx.BroadcastShapes(c.Shape(), x.Shape(), y.Shape())
		if err != nil {
			return err
		}
		out, err := ctx.NewOutputUninit(0, x.DType(), outShape)
		if err != nil {
			return err
		}
		if whereFlat(c, x, y, out) {
			return nil
		}
		n := out.Len()
		ci, xi, yi := ctx.Ints(n), ctx.Ints(n), ctx.Ints(n)
		for _, p := range []struct {
			s   tensor.Shape
			idx []int
		}{{c.Shape(), ci}, {x.Shape(), xi}, {y.Shape(), yi}} {
			if err := tensor.BroadcastIndex(p.s, outShape, p.idx); err != nil {
				return err
			}
		}
		cond := c.Bool()
		sel := xi
		for i := range sel {
			if !cond[ci[i]] {
				sel[i] = -1 - yi[i] // negative: take from y
			}
		}
		es := x.DType().Size()
		xb, yb, dst := x.Bytes(), y.Bytes(), out.Bytes()
		for i, j := range sel {
			if j >= 0 {
				copy(dst[i*es:(i+1)*es], xb[j*es:(j+1)*es])
			} else {
				j = -1 - j
				copy(dst[i*es:(i+1)*es], yb[j*es:(j+1)*es])
			}
		}
		return nil
	}), nil
}

// whereFlat is Where's path when every operand has out's size or a single
// element (the masks of exported decoders): an operand with out's element
// count that broadcasts to out has out's layout, so each one is read with a
// stride of 1 or 0, without index lists or a copy call per element. It
// reports whether it applied.
func whereFlat(c, x, y, out *tensor.Tensor) bool {
	n := out.Len()
	stride := func(t *tensor.Tensor) (int, bool) {
		switch t.Len() {
		case n:
			return 1, true
		case 1:
			return 0, true
		}
		return 0, false
	}
	sc, ok1 := stride(c)
	sx, ok2 := stride(x)
	sy, ok3 := stride(y)
	if !ok1 || !ok2 || !ok3 || n == 0 {
		return false
	}
	cond := c.Bool()
	switch x.DType().Size() {
	case 1:
		whereCopy(out.Bytes(), x.Bytes(), y.Bytes(), cond, sc, sx, sy)
	case 2:
		whereCopy(elems[uint16](out), elems[uint16](x), elems[uint16](y), cond, sc, sx, sy)
	case 4:
		whereCopy(elems[uint32](out), elems[uint32](x), elems[uint32](y), cond, sc, sx, sy)
	case 8:
		whereCopy(elems[uint64](out), elems[uint64](x), elems[uint64](y), cond, sc, sx, sy)
	default:
		return false
	}
	return true
}

// elems views t's bytes as elements of T's size (tensor buffers are
// aligned to their element size).
func elems[T uint16 | uint32 | uint64](t *tensor.Tensor) []T {
	b := t.Bytes()
	var z T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/int(unsafe.Sizeof(z)))
}

func whereCopy[T any](dst, xs, ys []T, cond []bool, sc, sx, sy int) {
	for i := range dst {
		if cond[i*sc] {
			dst[i] = xs[i*sx]
		} else {
			dst[i] = ys[i*sy]
		}
	}
}
