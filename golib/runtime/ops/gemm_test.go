package ops

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestGemm(t *testing.T) {
	a := ft(tensor.Shape{2, 3}, 1, 2, 3, 4, 5, 6)
	aT := ft(tensor.Shape{3, 2}, 1, 4, 2, 5, 3, 6)
	b := ft(tensor.Shape{3, 2}, 1, 0, 0, 1, 1, 1)
	bT := ft(tensor.Shape{2, 3}, 1, 0, 1, 0, 1, 1)
	// A*B = [[4 5] [10 11]]
	runCases(t, []opCase{
		{name: "plain", op: "Gemm", opset: 13, in: []*tensor.Tensor{a, b}, shape: tensor.Shape{2, 2}, want: "[4 5 10 11]"},
		{name: "transA transB", op: "Gemm", opset: 13, attrs: attrs(intA("transA", 1), intA("transB", 1)),
			in: []*tensor.Tensor{aT, bT}, shape: tensor.Shape{2, 2}, want: "[4 5 10 11]"},
		{name: "alpha beta C row", op: "Gemm", opset: 13, attrs: attrs(fltA("alpha", 2), fltA("beta", 0.5)),
			in: []*tensor.Tensor{a, b, ft(tensor.Shape{2}, 10, 20)}, shape: tensor.Shape{2, 2}, want: "[13 20 25 32]"},
		{name: "C scalar", op: "Gemm", opset: 11, in: []*tensor.Tensor{a, b, ft(tensor.Shape{}, 1)},
			shape: tensor.Shape{2, 2}, want: "[5 6 11 12]"},
		{name: "C column", op: "Gemm", opset: 13, in: []*tensor.Tensor{a, b, ft(tensor.Shape{2, 1}, 1, 2)},
			shape: tensor.Shape{2, 2}, want: "[5 6 12 13]"},
		{name: "beta 0 ignores C", op: "Gemm", opset: 13, attrs: attrs(fltA("beta", 0)),
			in: []*tensor.Tensor{a, b, ft(tensor.Shape{1}, 100)}, shape: tensor.Shape{2, 2}, want: "[4 5 10 11]"},
		{name: "fp16", op: "Gemm", opset: 13, in: []*tensor.Tensor{f16(a), f16(b)}, shape: tensor.Shape{2, 2}, want: "[4 5 10 11]"},
	})
}

func TestGemmErrors(t *testing.T) {
	a := ft(tensor.Shape{2, 3}, 1, 2, 3, 4, 5, 6)
	cases := []struct {
		name string
		in   []*tensor.Tensor
		want error
	}{
		{"inner mismatch", []*tensor.Tensor{a, a}, errs.ErrShape},
		{"rank 3", []*tensor.Tensor{ft(tensor.Shape{1, 2, 3}, 1, 2, 3, 4, 5, 6), a}, errs.ErrShape},
		{"C not broadcastable", []*tensor.Tensor{a, ft(tensor.Shape{3, 1}, 1, 2, 3), ft(tensor.Shape{3}, 1, 2, 3)}, errs.ErrShape},
		{"ints", []*tensor.Tensor{it(tensor.Shape{1, 1}, 1), it(tensor.Shape{1, 1}, 1)}, errs.ErrType},
		{"mixed types", []*tensor.Tensor{a, f16(ft(tensor.Shape{3, 1}, 1, 2, 3))}, errs.ErrType},
	}
	for _, c := range cases {
		if _, err := call("Gemm", 13, nil, 1, c.in...); !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
	}
}
