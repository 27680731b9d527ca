package ops

import (
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestTransposeViewsAndCopies: Transpose matches a naive transpose for
// permutations that move data and for those that move only axes of size 1
// (then the output is a view of the input's bytes).
func TestTransposeViewsAndCopies(t *testing.T) {
	cases := []struct {
		shape tensor.Shape
		perm  []int64
		view  bool
	}{
		{tensor.Shape{1, 1, 4, 3}, []int64{0, 2, 1, 3}, true}, // decode step: [B, S=1, H, D] -> [B, H, S, D]
		{tensor.Shape{2, 1, 3}, []int64{1, 0, 2}, true},
		{tensor.Shape{1, 4, 1, 3}, []int64{0, 2, 1, 3}, true},
		{tensor.Shape{1, 1}, []int64{1, 0}, true},
		{tensor.Shape{1, 2, 4, 3}, []int64{0, 2, 1, 3}, false},
		{tensor.Shape{2, 3}, []int64{1, 0}, false},
		{tensor.Shape{2, 1, 3}, []int64{2, 1, 0}, false},
		{tensor.Shape{2, 0, 3}, []int64{2, 1, 0}, false},
	}
	for _, c := range cases {
		n := c.shape.Size()
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i)
		}
		x := ft(c.shape, v...)
		outs, err := call("Transpose", 13, attrs(ints("perm", c.perm...)), 1, x)
		if err != nil {
			t.Fatalf("%v %v: %v", c.shape, c.perm, err)
		}
		y := outs[0]
		want := make(tensor.Shape, len(c.perm))
		for i, a := range c.perm {
			want[i] = c.shape[a]
		}
		if !y.Shape().Equal(want) {
			t.Fatalf("%v %v: shape %v, want %v", c.shape, c.perm, y.Shape(), want)
		}
		inSt := c.shape.Strides()
		outSt := want.Strides()
		for o := 0; o < n; o++ {
			src, rem := 0, o
			for i := range want {
				src += (rem / outSt[i]) * inSt[c.perm[i]]
				rem %= outSt[i]
			}
			if y.Float32()[o] != v[src] {
				t.Errorf("%v %v: [%d] = %v, want %v", c.shape, c.perm, o, y.Float32()[o], v[src])
				break
			}
		}
		if n > 0 {
			if shared := unsafe.SliceData(y.Bytes()) == unsafe.SliceData(x.Bytes()); shared != c.view {
				t.Errorf("%v %v: output shares the input = %v, want %v", c.shape, c.perm, shared, c.view)
			}
		}
	}
}
