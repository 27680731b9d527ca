package ops

import (
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestParallelKernelsMatchSerial runs the kernels that split work across
// goroutines on inputs big enough to split, and compares with one thread
// (and, under -race, checks that the workers write disjoint data).
func TestParallelKernelsMatchSerial(t *testing.T) {
	x, _ := tensor.New(tensor.Float32, tensor.Shape{512, 96})
	for i := range x.Float32() {
		x.Float32()[i] = float32(math.Sin(float64(i)))
	}
	scale, _ := tensor.New(tensor.Float32, tensor.Shape{96})
	for i := range scale.Float32() {
		scale.Float32()[i] = 1 + float32(i)/96
	}
	cases := []struct {
		op    string
		opset int
		in    []*tensor.Tensor
	}{
		{"Softmax", 13, []*tensor.Tensor{x}},
		{"Sigmoid", 13, []*tensor.Tensor{x}},
		{"RMSNormalization", 23, []*tensor.Tensor{x, scale}},
		{"LayerNormalization", 17, []*tensor.Tensor{x, scale}},
	}
	for _, c := range cases {
		f, err := Lookup("", c.op, c.opset)
		if err != nil {
			t.Fatal(err)
		}
		var res [2][]float32
		for k, threads := range []int{1, 4} {
			n := &Node{OpType: c.op, Opset: c.opset, Attrs: Attributes{}, NumInputs: len(c.in), NumOutputs: 1}
			kern, err := f(n)
			if err != nil {
				t.Fatal(err)
			}
			ctx := NewContext(c.in, []bool{true}, threads, nil)
			if err := kern.Compute(ctx); err != nil {
				t.Fatal(err)
			}
			res[k] = ctx.Output(0).Float32()
		}
		for i := range res[0] {
			if res[0][i] != res[1][i] {
				t.Errorf("%s: element %d differs: %v (1 thread) vs %v (4 threads)", c.op, i, res[0][i], res[1][i])
				break
			}
		}
	}
}
