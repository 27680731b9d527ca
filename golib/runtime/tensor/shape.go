package tensor

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

// MaxElements bounds the element count of one tensor (2^40), so that a
// hostile shape fails with errs.ErrLimit instead of an enormous allocation.
const MaxElements = 1 << 40

// Shape is a tensor shape; a nil or empty Shape is a scalar.
type Shape []int

// NumElements returns the product of the dimensions (1 for a scalar). It
// fails for a negative dimension or a product above MaxElements. A shape
// with a zero dimension has no elements wherever the zero is, so it is
// never over the limit, however large its other dimensions.
func (s Shape) NumElements() (int, error) {
	zero := false
	for _, d := range s {
		if d < 0 {
			return 0, fmt.Errorf("%w: negative dimension in shape %v", errs.ErrShape, s)
		}
		zero = zero || d == 0
	}
	if zero {
		return 0, nil
	}
	n := 1
	for _, d := range s {
		if d > MaxElements/n {
			return 0, fmt.Errorf("%w: shape %v has more than %d elements", errs.ErrLimit, s, MaxElements)
		}
		n *= d
	}
	return n, nil
}

// Size returns the element count of a shape already known to be valid
// (for example the shape of an existing tensor).
func (s Shape) Size() int {
	n := 1
	for _, d := range s {
		n *= d
	}
	return n
}

// Rank returns the number of dimensions.
func (s Shape) Rank() int { return len(s) }

// Clone returns a copy that does not alias s.
func (s Shape) Clone() Shape {
	if s == nil {
		return Shape{}
	}
	return append(Shape{}, s...)
}

// Equal reports whether two shapes have the same dimensions.
func (s Shape) Equal(o Shape) bool {
	if len(s) != len(o) {
		return false
	}
	for i := range s {
		if s[i] != o[i] {
			return false
		}
	}
	return true
}

// Strides returns the row-major element strides of s.
func (s Shape) Strides() []int {
	st := make([]int, len(s))
	acc := 1
	for i := len(s) - 1; i >= 0; i-- {
		st[i] = acc
		acc *= s[i]
	}
	return st
}

// String formats the shape like numpy: (2, 3).
func (s Shape) String() string {
	parts := make([]string, len(s))
	for i, d := range s {
		parts[i] = strconv.Itoa(d)
	}
	if len(s) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// NormAxis maps a possibly negative axis into [0, rank) and fails when it is
// out of range.
func NormAxis(axis, rank int) (int, error) {
	if axis < -rank || axis >= rank {
		return 0, fmt.Errorf("%w: axis %d out of range for rank %d", errs.ErrInvalidArgument, axis, rank)
	}
	if axis < 0 {
		axis += rank
	}
	return axis, nil
}

// BroadcastShapes returns the numpy broadcast of the given shapes: shapes
// are right-aligned and each dimension must be equal or 1.
func BroadcastShapes(shapes ...Shape) (Shape, error) {
	rank := 0
	for _, s := range shapes {
		rank = max(rank, len(s))
	}
	return BroadcastShapesTo(make(Shape, rank), shapes...)
}

// BroadcastShapesTo is BroadcastShapes writing into out, whose length must
// be the largest rank of shapes (kernels pass scratch memory).
func BroadcastShapesTo(out Shape, shapes ...Shape) (Shape, error) {
	rank := len(out)
	for i := range out {
		out[i] = 1
	}
	for _, s := range shapes {
		off := rank - len(s)
		if off < 0 {
			return nil, fmt.Errorf("%w: broadcast of rank %d into rank %d", errs.ErrInvalidArgument, len(s), rank)
		}
		for i, d := range s {
			o := out[off+i]
			switch {
			case d == o || d == 1:
			case o == 1:
				out[off+i] = d
			default:
				// a copy, so shapes does not escape (callers' variadic
				// arrays stay on their stacks)
				return nil, fmt.Errorf("%w: cannot broadcast shapes %v", errs.ErrShape, append([]Shape(nil), shapes...))
			}
		}
	}
	if _, err := out.NumElements(); err != nil {
		return nil, err
	}
	return out, nil
}

// BroadcastStrides returns, for a source shape broadcast to dst, the element
// stride of the source along each of dst's dimensions (0 where the source is
// broadcast). It fails when src does not broadcast to dst.
func BroadcastStrides(src, dst Shape) ([]int, error) {
	return BroadcastStridesTo(make([]int, len(dst)), src, dst)
}

// BroadcastStridesTo is BroadcastStrides writing into st, which must have
// len(dst) zeroed elements.
func BroadcastStridesTo(st []int, src, dst Shape) ([]int, error) {
	if len(src) > len(dst) || len(st) != len(dst) {
		return nil, fmt.Errorf("%w: cannot broadcast %v to %v", errs.ErrShape, src, dst)
	}
	off := len(dst) - len(src)
	acc := 1
	for i := len(src) - 1; i >= 0; i-- {
		switch {
		case src[i] == dst[off+i]:
			if src[i] != 1 {
				st[off+i] = acc
			}
		case src[i] == 1:
		default:
			return nil, fmt.Errorf("%w: cannot broadcast %v to %v", errs.ErrShape, src, dst)
		}
		acc *= src[i]
	}
	return st, nil
}

// BroadcastIndex fills idx[i] with the flat source offset of each element of
// dst, for a source of shape src broadcast to dst. It is the slow, general
// path; kernels use it when no fast path applies. len(idx) must be dst's size.
func BroadcastIndex(src, dst Shape, idx []int) error {
	var sbuf [8]int
	st := sbuf[:0]
	if len(dst) <= len(sbuf) {
		st = sbuf[:len(dst)]
	} else {
		st = make([]int, len(dst))
	}
	st, err := BroadcastStridesTo(st, src, dst)
	if err != nil {
		return err
	}
	n := dst.Size()
	if len(idx) != n {
		return fmt.Errorf("%w: index buffer of %d for %d elements", errs.ErrInvalidArgument, len(idx), n)
	}
	if n == 0 {
		return nil
	}
	rank := len(dst)
	if rank == 0 {
		idx[0] = 0
		return nil
	}
	var buf [8]int // the counters, on the stack for the usual ranks
	ctr := buf[:0]
	if rank <= len(buf) {
		ctr = buf[:rank]
	} else {
		ctr = make([]int, rank)
	}
	off := 0
	inner := dst[rank-1]
	sInner := st[rank-1]
	for i := 0; i < n; i += inner {
		for j := 0; j < inner; j++ {
			idx[i+j] = off + j*sInner
		}
		// advance the counter over the outer dimensions
		for d := rank - 2; d >= 0; d-- {
			ctr[d]++
			off += st[d]
			if ctr[d] < dst[d] {
				break
			}
			off -= st[d] * ctr[d]
			ctr[d] = 0
		}
	}
	return nil
}

// checkedMul multiplies two non-negative ints and reports overflow.
func checkedMul(a, b int) (int, bool) {
	if a == 0 || b == 0 {
		return 0, true
	}
	if a > math.MaxInt/b {
		return 0, false
	}
	return a * b, true
}
