package ops

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func f16(x *tensor.Tensor) *tensor.Tensor {
	out, _ := tensor.New(tensor.Float16, x.Shape())
	_ = tensor.FromFloat32(out, x.Float32())
	return out
}

func TestBinaryOps(t *testing.T) {
	a := ft(tensor.Shape{2, 3}, 1, 2, 3, 4, 5, 6)
	row := ft(tensor.Shape{3}, 10, 20, 30)
	col := ft(tensor.Shape{2, 1}, 2, 4)
	runCases(t, []opCase{
		{name: "add same shape", op: "Add", opset: 14, in: []*tensor.Tensor{a, a}, shape: tensor.Shape{2, 3}, want: "[2 4 6 8 10 12]"},
		{name: "add row broadcast", op: "Add", opset: 14, in: []*tensor.Tensor{a, row}, shape: tensor.Shape{2, 3}, want: "[11 22 33 14 25 36]"},
		{name: "sub column broadcast", op: "Sub", opset: 14, in: []*tensor.Tensor{a, col}, shape: tensor.Shape{2, 3}, want: "[-1 0 1 0 1 2]"},
		{name: "mul scalar", op: "Mul", opset: 14, in: []*tensor.Tensor{tensor.Scalar(float32(3)), a}, shape: tensor.Shape{2, 3}, want: "[3 6 9 12 15 18]"},
		{name: "div both broadcast", op: "Div", opset: 14, in: []*tensor.Tensor{col, row}, shape: tensor.Shape{2, 3}, want: "[0.2 0.1 0.06667 0.4 0.2 0.1333]"},
		{name: "pow square", op: "Pow", opset: 15, in: []*tensor.Tensor{a, tensor.Scalar(float32(2))}, shape: tensor.Shape{2, 3}, want: "[1 4 9 16 25 36]"},
		{name: "pow int exponent", op: "Pow", opset: 15, in: []*tensor.Tensor{a, tensor.Scalar(int64(3))}, shape: tensor.Shape{2, 3}, want: "[1 8 27 64 125 216]"},
		{name: "add int64", op: "Add", opset: 14, in: []*tensor.Tensor{it(tensor.Shape{2}, 1, 2), tensor.Scalar(int64(5))}, shape: tensor.Shape{2}, want: "[6 7]"},
		{name: "div int64 truncates", op: "Div", opset: 14, in: []*tensor.Tensor{it(tensor.Shape{2}, 7, -7), tensor.Scalar(int64(2))}, shape: tensor.Shape{2}, want: "[3 -3]"},
		{name: "add fp16", op: "Add", opset: 14, in: []*tensor.Tensor{f16(a), f16(row)}, shape: tensor.Shape{2, 3}, want: "[11 22 33 14 25 36]"},
		{name: "equal", op: "Equal", opset: 13, in: []*tensor.Tensor{it(tensor.Shape{3}, 1, 2, 3), tensor.Scalar(int64(2))}, shape: tensor.Shape{3}, want: "[false true false]", dtype: tensor.Bool},
		{name: "equal float broadcast", op: "Equal", opset: 13, in: []*tensor.Tensor{col, ft(tensor.Shape{2}, 2, 4)}, shape: tensor.Shape{2, 2}, want: "[true false false true]", dtype: tensor.Bool},
		{name: "empty broadcast", op: "Add", opset: 14, in: []*tensor.Tensor{ft(tensor.Shape{0, 3}), row}, shape: tensor.Shape{0, 3}, want: "[]"},
	})
	bad := []struct {
		name string
		in   []*tensor.Tensor
		err  error
	}{
		{"shape mismatch", []*tensor.Tensor{a, ft(tensor.Shape{2}, 1, 2)}, errs.ErrShape},
		{"type mismatch", []*tensor.Tensor{a, it(tensor.Shape{3}, 1, 2, 3)}, errs.ErrType},
		{"int division by zero", []*tensor.Tensor{it(tensor.Shape{1}, 1), it(tensor.Shape{1}, 0)}, errs.ErrInvalidArgument},
		{"missing input", []*tensor.Tensor{a, nil}, errs.ErrMissingInput},
	}
	for _, c := range bad {
		if _, err := call("Div", 14, nil, 1, c.in...); !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
}

func TestUnaryOps(t *testing.T) {
	x := ft(tensor.Shape{4}, -2, -0.5, 0.5, 4)
	pos := ft(tensor.Shape{3}, 0.25, 1, 4)
	runCases(t, []opCase{
		{name: "sqrt", op: "Sqrt", opset: 13, in: []*tensor.Tensor{pos}, shape: tensor.Shape{3}, want: "[0.5 1 2]"},
		{name: "reciprocal", op: "Reciprocal", opset: 13, in: []*tensor.Tensor{pos}, shape: tensor.Shape{3}, want: "[4 1 0.25]"},
		{name: "neg", op: "Neg", opset: 13, in: []*tensor.Tensor{x}, shape: tensor.Shape{4}, want: "[2 0.5 -0.5 -4]"},
		{name: "neg int", op: "Neg", opset: 13, in: []*tensor.Tensor{it(tensor.Shape{2}, 3, -4)}, shape: tensor.Shape{2}, want: "[-3 4]"},
		{name: "exp", op: "Exp", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{2}, 0, 1)}, shape: tensor.Shape{2}, want: "[1 2.718]"},
		{name: "sigmoid", op: "Sigmoid", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{3}, -100, 0, 2)}, shape: tensor.Shape{3}, want: "[0 0.5 0.8808]"},
		{name: "tanh", op: "Tanh", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{2}, 0, 1)}, shape: tensor.Shape{2}, want: "[0 0.7616]"},
		{name: "erf", op: "Erf", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{2}, 0, 1)}, shape: tensor.Shape{2}, want: "[0 0.8427]"},
		{name: "gelu exact", op: "Gelu", opset: 20, in: []*tensor.Tensor{ft(tensor.Shape{3}, -1, 0, 1)}, shape: tensor.Shape{3}, want: "[-0.1587 0 0.8413]"},
		{name: "gelu tanh", op: "Gelu", opset: 20, attrs: attrs(strA("approximate", "tanh")), in: []*tensor.Tensor{ft(tensor.Shape{2}, -1, 1)}, shape: tensor.Shape{2}, want: "[-0.1588 0.8412]"},
		{name: "sigmoid fp16", op: "Sigmoid", opset: 13, in: []*tensor.Tensor{f16(ft(tensor.Shape{1}, 0))}, shape: tensor.Shape{1}, want: "[0.5]"},
	})
	if _, err := call("Sqrt", 13, nil, 1, it(tensor.Shape{1}, 4)); !errors.Is(err, errs.ErrType) {
		t.Errorf("Sqrt of int64: %v", err)
	}
	if _, err := call("Gelu", 20, attrs(strA("approximate", "cubic")), 1, x); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("Gelu approximate=cubic: %v", err)
	}
}

func TestCast(t *testing.T) {
	x := ft(tensor.Shape{4}, -1.7, 0, 2.5, 300)
	cases := []struct {
		to   tensor.DType
		want string
	}{
		{tensor.Int64, "[-1 0 2 300]"},
		{tensor.Int8, "[-1 0 2 44]"}, // out of range wraps like numpy/onnxruntime
		{tensor.Uint8, "[255 0 2 44]"},
		{tensor.Bool, "[true false true true]"},
		{tensor.Float16, "[-1.7 0 2.5 300]"},
		{tensor.BFloat16, "[-1.703 0 2.5 300]"},
		{tensor.Float64, "[-1.7 0 2.5 300]"},
	}
	for _, c := range cases {
		outs, err := call("Cast", 21, attrs(intA("to", int64(c.to))), 1, x)
		if err != nil {
			t.Fatal(err)
		}
		if outs[0].DType() != c.to || values(outs[0]) != c.want {
			t.Errorf("Cast to %v: %v %s, want %s", c.to, outs[0].DType(), values(outs[0]), c.want)
		}
	}
	outs, err := call("Cast", 21, attrs(intA("to", int64(tensor.Float32))), 1, bt(tensor.Shape{2}, true, false))
	if err != nil || values(outs[0]) != "[1 0]" {
		t.Errorf("Cast bool to float: %v %v", err, values(outs[0]))
	}
	if _, err := call("Cast", 21, attrs(intA("to", 8)), 1, x); !errors.Is(err, errs.ErrNotImplemented) {
		t.Errorf("Cast to string: %v", err)
	}
}
