package ops

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestWhereFlatAndGeneral: Where over operands of the output's size or a
// single element (the flat path) and over other broadcasts (the general
// path) matches a naive broadcast reference, for 1-, 2-, 4- and 8-byte
// elements.
func TestWhereFlatAndGeneral(t *testing.T) {
	shapes := []struct{ c, x, y tensor.Shape }{
		{tensor.Shape{2, 3}, tensor.Shape{2, 3}, tensor.Shape{2, 3}},
		{tensor.Shape{1, 1, 2, 3}, tensor.Shape{}, tensor.Shape{1, 1, 2, 3}},
		{tensor.Shape{2, 3}, tensor.Shape{1}, tensor.Shape{}},
		{tensor.Shape{}, tensor.Shape{2, 3}, tensor.Shape{2, 3}},
		{tensor.Shape{1, 3}, tensor.Shape{2, 1}, tensor.Shape{}},  // general
		{tensor.Shape{2, 3}, tensor.Shape{3}, tensor.Shape{2, 1}}, // general
		{tensor.Shape{0, 3}, tensor.Shape{}, tensor.Shape{3}},
	}
	for _, dt := range []tensor.DType{tensor.Bool, tensor.Float16, tensor.Float32, tensor.Int64} {
		for _, s := range shapes {
			out, err := tensor.BroadcastShapes(s.c, s.x, s.y)
			if err != nil {
				t.Fatal(err)
			}
			cond, _ := tensor.New(tensor.Bool, s.c)
			for i := range cond.Bool() {
				cond.Bool()[i] = i%3 != 1
			}
			x, _ := tensor.New(dt, s.x)
			y, _ := tensor.New(dt, s.y)
			es := dt.Size()
			for i := range x.Bytes() {
				x.Bytes()[i] = byte(1 + i%7)
			}
			for i := range y.Bytes() {
				y.Bytes()[i] = byte(100 + i%5)
			}
			outs, err := call("Where", 16, nil, 1, cond, x, y)
			if err != nil {
				t.Fatalf("%v %v: %v", dt, s, err)
			}
			n := out.Size()
			ci, xi, yi := make([]int, n), make([]int, n), make([]int, n)
			_ = tensor.BroadcastIndex(s.c, out, ci)
			_ = tensor.BroadcastIndex(s.x, out, xi)
			_ = tensor.BroadcastIndex(s.y, out, yi)
			got := outs[0].Bytes()
			for i := 0; i < n; i++ {
				want := y.Bytes()[yi[i]*es : (yi[i]+1)*es]
				if cond.Bool()[ci[i]] {
					want = x.Bytes()[xi[i]*es : (xi[i]+1)*es]
				}
				if string(got[i*es:(i+1)*es]) != string(want) {
					t.Errorf("Where %v %v: element %d = %v, want %v", dt, s, i, got[i*es:(i+1)*es], want)
					break
				}
			}
		}
	}
}
