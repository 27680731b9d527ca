package tensor

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

// TestNumElementsZeroDims checks that a shape with a zero dimension has no
// elements, and is never over MaxElements, wherever the zero is (the
// running product tripped the limit before a late 0).
func TestNumElementsZeroDims(t *testing.T) {
	cases := []struct {
		shape Shape
		n     int
		err   error
	}{
		{Shape{}, 1, nil},
		{Shape{2, 3, 4}, 24, nil},
		{Shape{0, 1 << 30, 1 << 30}, 0, nil},
		{Shape{1 << 30, 1 << 30, 0}, 0, nil},
		{Shape{1 << 21, 1 << 21, 0}, 0, nil},
		{Shape{1 << 30, 0, 1 << 30}, 0, nil},
		{Shape{1 << 40, 1 << 40, 1 << 40, 0}, 0, nil}, // the product would wrap
		{Shape{1 << 20, 1 << 20}, 1 << 40, nil},       // the limit itself
		{Shape{1 << 20, 1<<20 + 1}, 0, errs.ErrLimit},
		{Shape{1 << 21, 1 << 21}, 0, errs.ErrLimit},
		{Shape{1 << 62, 4}, 0, errs.ErrLimit},
		{Shape{0, -1}, 0, errs.ErrShape},
		{Shape{-1, 0}, 0, errs.ErrShape},
	}
	for _, c := range cases {
		n, err := c.shape.NumElements()
		if !errors.Is(err, c.err) || (c.err == nil && n != c.n) {
			t.Errorf("%v.NumElements() = %d, %v; want %d, %v", c.shape, n, err, c.n, c.err)
		}
	}
	// the allocation and broadcast checks share it
	for _, s := range []Shape{{1 << 30, 1 << 30, 0}, {1 << 21, 1 << 21, 0}} {
		x, err := New(Float32, s)
		if err != nil || x.Len() != 0 || !x.Shape().Equal(s) {
			t.Errorf("New(float32, %v): %v", s, err)
		}
		if b, err := BroadcastShapes(Shape{1, 1, 0}, s); err != nil || !b.Equal(s) {
			t.Errorf("BroadcastShapes to %v: %v %v", s, b, err)
		}
		if e, err := New(Float32, Shape{0}); err != nil {
			t.Error(err)
		} else if r, err := e.Reshaped(s); err != nil || !r.Shape().Equal(s) {
			t.Errorf("Reshaped to %v: %v", s, err)
		}
	}
}
