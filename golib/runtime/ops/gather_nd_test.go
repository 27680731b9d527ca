package ops

import (
	"errors"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestGatherNDCases(t *testing.T) {
	f4 := ft(tensor.Shape{2, 2}, 0, 1, 2, 3)
	f8 := ft(tensor.Shape{2, 2, 2}, 0, 1, 2, 3, 4, 5, 6, 7)
	runCases(t, []opCase{
		// the examples of the ONNX operator text
		{name: "ex1", op: "GatherND", opset: 13, in: []*tensor.Tensor{f4, it(tensor.Shape{2, 2}, 0, 0, 1, 1)}, shape: tensor.Shape{2}, want: "[0 3]"},
		{name: "ex2", op: "GatherND", opset: 13, in: []*tensor.Tensor{f4, it(tensor.Shape{2, 1}, 1, 0)}, shape: tensor.Shape{2, 2}, want: "[2 3 0 1]"},
		{name: "ex3", op: "GatherND", opset: 13, in: []*tensor.Tensor{f8, it(tensor.Shape{2, 2}, 0, 1, 1, 0)}, shape: tensor.Shape{2, 2}, want: "[2 3 4 5]"},
		{name: "ex4", op: "GatherND", opset: 13, in: []*tensor.Tensor{f8, it(tensor.Shape{2, 1, 2}, 0, 1, 1, 0)}, shape: tensor.Shape{2, 1, 2}, want: "[2 3 4 5]"},
		{name: "ex5-batch", op: "GatherND", opset: 12, attrs: attrs(intA("batch_dims", 1)), in: []*tensor.Tensor{f8, it(tensor.Shape{2, 1}, 1, 0)}, shape: tensor.Shape{2, 2}, want: "[2 3 4 5]"},
		{name: "negative", op: "GatherND", opset: 11, in: []*tensor.Tensor{f4, it(tensor.Shape{2, 2}, -1, -2, -2, -1)}, shape: tensor.Shape{2}, want: "[2 1]"},
		{name: "int32-indices", op: "GatherND", opset: 13, in: []*tensor.Tensor{f4, i32t(tensor.Shape{1, 2}, 1, 1)}, shape: tensor.Shape{1}, want: "[3]"},
		{name: "empty-indices", op: "GatherND", opset: 13, in: []*tensor.Tensor{f4, it(tensor.Shape{0, 2})}, shape: tensor.Shape{0}, want: "[]"},
		{name: "int64-data", op: "GatherND", opset: 13, in: []*tensor.Tensor{it(tensor.Shape{3}, 7, 8, 9), it(tensor.Shape{2, 1}, 2, -3)}, shape: tensor.Shape{2}, want: "[9 7]"},
	})
}

func i32t(shape tensor.Shape, v ...int32) *tensor.Tensor {
	t, err := tensor.FromSlice(shape, v)
	if err != nil {
		return nil
	}
	return t
}

// gatherNDNaive is the operator text's loop, element by element.
func gatherNDNaive(data []float32, ds []int, idx []int64, is []int, bd int) []float32 {
	k := is[len(is)-1]
	inner := 1
	for _, d := range ds[bd+k:] {
		inner *= d
	}
	strides := make([]int, len(ds))
	s := 1
	for j := len(ds) - 1; j >= 0; j-- {
		strides[j] = s
		s *= ds[j]
	}
	tuples := 1
	for _, d := range is[:len(is)-1] {
		tuples *= d
	}
	perBatch := tuples
	for _, d := range is[:bd] {
		perBatch /= d
	}
	var out []float32
	for t := 0; t < tuples; t++ {
		b := t / perBatch
		off := 0
		// batch coordinates: b in row-major order over ds[:bd]
		rem := b
		for j := bd - 1; j >= 0; j-- {
			off += (rem % ds[j]) * strides[j]
			rem /= ds[j]
		}
		for j := 0; j < k; j++ {
			v := int(idx[t*k+j])
			if v < 0 {
				v += ds[bd+j]
			}
			off += v * strides[bd+j]
		}
		out = append(out, data[off:off+inner]...)
	}
	return out
}

func TestGatherNDRandomAgainstNaive(t *testing.T) {
	rng := rand.New(rand.NewSource(3))
	for _, c := range []struct {
		ds, is []int
		bd     int
	}{
		{[]int{5}, []int{3, 1}, 0},
		{[]int{4, 3, 2}, []int{2, 2, 3}, 0},
		{[]int{4, 3, 2}, []int{6, 1}, 0},
		{[]int{2, 3, 4}, []int{2, 5, 2}, 1},
		{[]int{2, 3, 4, 5}, []int{2, 3, 2, 1}, 2},
		{[]int{2, 3, 4, 5}, []int{2, 3, 2}, 2},
		{[]int{3, 1, 4}, []int{3, 7, 1}, 1},
	} {
		n := 1
		for _, d := range c.ds {
			n *= d
		}
		data := make([]float32, n)
		for i := range data {
			data[i] = float32(i)
		}
		k := c.is[len(c.is)-1]
		ni := 1
		for _, d := range c.is {
			ni *= d
		}
		idx := make([]int64, ni)
		for i := range idx {
			dim := c.ds[c.bd+i%k]
			idx[i] = int64(rng.Intn(2*dim) - dim) // negative ones too
		}
		outs, err := call("GatherND", 13, attrs(intA("batch_dims", int64(c.bd))), 1, ft(tensor.Shape(c.ds), data...), it(tensor.Shape(c.is), idx...))
		if err != nil {
			t.Fatalf("%v %v: %v", c.ds, c.is, err)
		}
		want := gatherNDNaive(data, c.ds, idx, c.is, c.bd)
		got := outs[0].Float32()
		if len(got) != len(want) {
			t.Fatalf("%v %v: %d values, want %d", c.ds, c.is, len(got), len(want))
		}
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%v %v bd=%d: element %d = %v, want %v", c.ds, c.is, c.bd, i, got[i], want[i])
			}
		}
	}
}

func TestGatherNDErrors(t *testing.T) {
	f8 := ft(tensor.Shape{2, 2, 2}, 0, 1, 2, 3, 4, 5, 6, 7)
	for _, c := range []struct {
		name  string
		opset int
		bd    int64
		idx   *tensor.Tensor
		want  error
	}{
		{"out-of-range", 13, 0, it(tensor.Shape{1, 2}, 0, 2), errs.ErrInvalidArgument},
		{"too-negative", 13, 0, it(tensor.Shape{1, 1}, -3), errs.ErrInvalidArgument},
		{"tuple-too-long", 13, 0, it(tensor.Shape{1, 4}, 0, 0, 0, 0), errs.ErrShape},
		{"batch-too-large", 13, 3, it(tensor.Shape{2, 2, 1}, 0, 0, 0, 0), errs.ErrShape},
		{"batch-mismatch", 13, 1, it(tensor.Shape{3, 1}, 0, 0, 0), errs.ErrShape},
		{"float-indices", 13, 0, ft(tensor.Shape{1, 1}, 0), errs.ErrType},
	} {
		var at Attributes
		if c.bd != 0 {
			at = attrs(intA("batch_dims", c.bd))
		}
		_, err := call("GatherND", c.opset, at, 1, f8, c.idx)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
	if _, err := call("GatherND", 11, attrs(intA("batch_dims", 1)), 1, f8, it(tensor.Shape{2, 1}, 0, 0)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("opset 11 batch_dims: got %v", err)
	}
}
