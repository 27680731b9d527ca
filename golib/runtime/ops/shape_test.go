package ops

import (
	"errors"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestShapeOps(t *testing.T) {
	x := ft(tensor.Shape{2, 3}, 1, 2, 3, 4, 5, 6)
	x3 := ft(tensor.Shape{2, 1, 3}, 1, 2, 3, 4, 5, 6)
	i64 := tensor.Int64
	runCases(t, []opCase{
		{name: "reshape with 0 and -1", op: "Reshape", opset: 14, in: []*tensor.Tensor{x3, it(tensor.Shape{2}, 0, -1)}, shape: tensor.Shape{2, 3}, want: "[1 2 3 4 5 6]"},
		{name: "reshape allowzero", op: "Reshape", opset: 14, attrs: attrs(intA("allowzero", 1)), in: []*tensor.Tensor{ft(tensor.Shape{0, 3}), it(tensor.Shape{2}, 3, 0)}, shape: tensor.Shape{3, 0}, want: "[]"},
		{name: "flatten", op: "Flatten", opset: 13, attrs: attrs(intA("axis", 2)), in: []*tensor.Tensor{x3}, shape: tensor.Shape{2, 3}, want: "[1 2 3 4 5 6]"},
		{name: "unsqueeze input axes", op: "Unsqueeze", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{2}, 0, -1)}, shape: tensor.Shape{1, 2, 3, 1}, want: "[1 2 3 4 5 6]"},
		{name: "unsqueeze attr axes", op: "Unsqueeze", opset: 11, attrs: attrs(ints("axes", 1)), in: []*tensor.Tensor{x}, shape: tensor.Shape{2, 1, 3}, want: "[1 2 3 4 5 6]"},
		{name: "squeeze all ones", op: "Squeeze", opset: 13, in: []*tensor.Tensor{x3}, shape: tensor.Shape{2, 3}, want: "[1 2 3 4 5 6]"},
		{name: "squeeze axis", op: "Squeeze", opset: 13, in: []*tensor.Tensor{x3, it(tensor.Shape{1}, 1)}, shape: tensor.Shape{2, 3}, want: "[1 2 3 4 5 6]"},
		{name: "shape", op: "Shape", opset: 15, in: []*tensor.Tensor{x3}, shape: tensor.Shape{3}, want: "[2 1 3]", dtype: i64},
		{name: "shape start end", op: "Shape", opset: 15, attrs: attrs(intA("start", -2), intA("end", 10)), in: []*tensor.Tensor{x3}, shape: tensor.Shape{2}, want: "[1 3]", dtype: i64},
		{name: "identity", op: "Identity", opset: 16, in: []*tensor.Tensor{x}, shape: tensor.Shape{2, 3}, want: "[1 2 3 4 5 6]"},
		{name: "transpose default", op: "Transpose", opset: 13, in: []*tensor.Tensor{x}, shape: tensor.Shape{3, 2}, want: "[1 4 2 5 3 6]"},
		{name: "transpose perm", op: "Transpose", opset: 13, attrs: attrs(ints("perm", 1, 0, 2)), in: []*tensor.Tensor{x3}, shape: tensor.Shape{1, 2, 3}, want: "[1 2 3 4 5 6]"},
		{name: "transpose 3D", op: "Transpose", opset: 13, attrs: attrs(ints("perm", 2, 0, 1)), in: []*tensor.Tensor{x3}, shape: tensor.Shape{3, 2, 1}, want: "[1 4 2 5 3 6]"},
		{name: "concat axis 1", op: "Concat", opset: 13, attrs: attrs(intA("axis", 1)), in: []*tensor.Tensor{x, ft(tensor.Shape{2, 1}, 7, 8)}, shape: tensor.Shape{2, 4}, want: "[1 2 3 7 4 5 6 8]"},
		{name: "concat empty past", op: "Concat", opset: 13, attrs: attrs(intA("axis", -2)), in: []*tensor.Tensor{ft(tensor.Shape{1, 0, 2}), ft(tensor.Shape{1, 1, 2}, 1, 2)}, shape: tensor.Shape{1, 1, 2}, want: "[1 2]"},
		{name: "split sizes input", op: "Split", opset: 13, attrs: attrs(intA("axis", 1)), in: []*tensor.Tensor{x, it(tensor.Shape{2}, 1, 2)}, nOut: 2, outIdx: 1, shape: tensor.Shape{2, 2}, want: "[2 3 5 6]"},
		{name: "split equal", op: "Split", opset: 18, attrs: attrs(intA("axis", 0), intA("num_outputs", 2)), in: []*tensor.Tensor{x}, nOut: 2, outIdx: 1, shape: tensor.Shape{1, 3}, want: "[4 5 6]"},
		{name: "split uneven", op: "Split", opset: 18, attrs: attrs(intA("axis", 1), intA("num_outputs", 2)), in: []*tensor.Tensor{x}, nOut: 2, outIdx: 1, shape: tensor.Shape{2, 1}, want: "[3 6]"},
		{name: "split attr", op: "Split", opset: 11, attrs: attrs(intA("axis", 1), ints("split", 2, 1)), in: []*tensor.Tensor{x}, nOut: 2, shape: tensor.Shape{2, 2}, want: "[1 2 4 5]"},
	})
	if _, err := call("Reshape", 14, nil, 1, x, it(tensor.Shape{1}, 4)); !errors.Is(err, errs.ErrShape) {
		t.Errorf("Reshape to the wrong size: %v", err)
	}
	if _, err := call("Squeeze", 13, nil, 1, x, it(tensor.Shape{1}, 0)); !errors.Is(err, errs.ErrShape) {
		t.Errorf("Squeeze of a dimension > 1: %v", err)
	}
	if _, err := call("Transpose", 13, attrs(ints("perm", 0, 0)), 1, x); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("Transpose with a bad perm: %v", err)
	}
	outs, err := call("Reshape", 14, nil, 1, x, it(tensor.Shape{1}, 6))
	if err != nil || &outs[0].Bytes()[0] != &x.Bytes()[0] {
		t.Error("Reshape must alias its input")
	}
}

func TestIndexingOps(t *testing.T) {
	x := ft(tensor.Shape{3, 4}, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
	runCases(t, []opCase{
		{name: "slice rows", op: "Slice", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{1}, 1), it(tensor.Shape{1}, 3)}, shape: tensor.Shape{2, 4}, want: "[4 5 6 7 8 9 10 11]"},
		{name: "slice axes steps", op: "Slice", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{1}, 0), it(tensor.Shape{1}, 100), it(tensor.Shape{1}, -1), it(tensor.Shape{1}, 2)},
			shape: tensor.Shape{3, 2}, want: "[0 2 4 6 8 10]"},
		{name: "slice negative step", op: "Slice", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{2}, -1, -1), it(tensor.Shape{2}, -9223372036854775807, -9223372036854775807), it(tensor.Shape{2}, 0, 1), it(tensor.Shape{2}, -2, -3)},
			shape: tensor.Shape{2, 2}, want: "[11 8 3 0]"},
		{name: "slice empty", op: "Slice", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{1}, 2), it(tensor.Shape{1}, 1)}, shape: tensor.Shape{0, 4}, want: "[]"},
		{name: "gather rows", op: "Gather", opset: 13, in: []*tensor.Tensor{x, it(tensor.Shape{1, 2}, 2, -3)}, shape: tensor.Shape{1, 2, 4}, want: "[8 9 10 11 0 1 2 3]"},
		{name: "gather axis 1 scalar", op: "Gather", opset: 13, attrs: attrs(intA("axis", 1)), in: []*tensor.Tensor{x, tensor.Scalar(int64(1))}, shape: tensor.Shape{3}, want: "[1 5 9]"},
		{name: "gather int32 indices", op: "Gather", opset: 13, in: []*tensor.Tensor{it(tensor.Shape{3}, 5, 6, 7), func() *tensor.Tensor { v, _ := tensor.FromSlice(tensor.Shape{2}, []int32{2, 0}); return v }()}, shape: tensor.Shape{2}, want: "[7 5]"},
		{name: "expand", op: "Expand", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{2, 1}, 1, 2), it(tensor.Shape{3}, 2, 1, 3)}, shape: tensor.Shape{2, 2, 3}, want: "[1 1 1 2 2 2 1 1 1 2 2 2]"},
		{name: "where", op: "Where", opset: 16, in: []*tensor.Tensor{bt(tensor.Shape{2, 1}, true, false), ft(tensor.Shape{2}, 1, 2), tensor.Scalar(float32(-1))}, shape: tensor.Shape{2, 2}, want: "[1 2 -1 -1]", dtype: tensor.Float32},
		{name: "trilu upper", op: "Trilu", opset: 14, in: []*tensor.Tensor{x}, shape: tensor.Shape{3, 4}, want: "[0 1 2 3 0 5 6 7 0 0 10 11]"},
		{name: "trilu lower k=-1", op: "Trilu", opset: 14, attrs: attrs(intA("upper", 0)), in: []*tensor.Tensor{x, tensor.Scalar(int64(-1))}, shape: tensor.Shape{3, 4}, want: "[0 0 0 0 4 0 0 0 8 9 0 0]"},
		{name: "trilu upper k=1 bool", op: "Trilu", opset: 14, in: []*tensor.Tensor{bt(tensor.Shape{2, 2}, true, true, true, true), tensor.Scalar(int64(1))}, shape: tensor.Shape{2, 2}, want: "[false true false false]"},
	})
	bad := []struct {
		name string
		op   string
		in   []*tensor.Tensor
		err  error
	}{
		{"gather out of range", "Gather", []*tensor.Tensor{x, it(tensor.Shape{1}, 3)}, errs.ErrInvalidArgument},
		{"slice step 0", "Slice", []*tensor.Tensor{x, it(tensor.Shape{1}, 0), it(tensor.Shape{1}, 1), it(tensor.Shape{1}, 0), it(tensor.Shape{1}, 0)}, errs.ErrInvalidArgument},
		{"expand incompatible", "Expand", []*tensor.Tensor{x, it(tensor.Shape{1}, 3)}, errs.ErrShape},
		{"where non-bool", "Where", []*tensor.Tensor{x, x, x}, errs.ErrType},
	}
	for _, c := range bad {
		if _, err := call(c.op, 16, nil, 1, c.in...); !errors.Is(err, c.err) {
			t.Errorf("%s: %v, want %v", c.name, err, c.err)
		}
	}
}

func TestConstantOps(t *testing.T) {
	runCases(t, []opCase{
		{name: "constant of shape default", op: "ConstantOfShape", opset: 20, in: []*tensor.Tensor{it(tensor.Shape{2}, 2, 2)}, shape: tensor.Shape{2, 2}, want: "[0 0 0 0]", dtype: tensor.Float32},
		{name: "constant of shape value", op: "ConstantOfShape", opset: 20, attrs: Attributes{"value": {Name: "value", Type: AttrTensor, T: it(tensor.Shape{1}, 7)}},
			in: []*tensor.Tensor{it(tensor.Shape{1}, 3)}, shape: tensor.Shape{3}, want: "[7 7 7]", dtype: tensor.Int64},
		{name: "range int", op: "Range", opset: 11, in: []*tensor.Tensor{tensor.Scalar(int64(1)), tensor.Scalar(int64(10)), tensor.Scalar(int64(3))}, shape: tensor.Shape{3}, want: "[1 4 7]"},
		{name: "range float down", op: "Range", opset: 11, in: []*tensor.Tensor{tensor.Scalar(float32(1)), tensor.Scalar(float32(0)), tensor.Scalar(float32(-0.25))}, shape: tensor.Shape{4}, want: "[1 0.75 0.5 0.25]"},
		{name: "range empty", op: "Range", opset: 11, in: []*tensor.Tensor{tensor.Scalar(int64(5)), tensor.Scalar(int64(1)), tensor.Scalar(int64(1))}, shape: tensor.Shape{0}, want: "[]"},
	})
	for _, c := range []struct {
		attrs Attributes
		want  string
	}{
		{attrs(fltA("value_float", 2.5)), "[2.5]"},
		{attrs(ints("value_ints", 1, 2)), "[1 2]"},
		{Attributes{"value": {Name: "value", Type: AttrTensor, T: ft(tensor.Shape{2}, 3, 4)}}, "[3 4]"},
	} {
		outs, err := call("Constant", 21, c.attrs, 1)
		if err != nil || values(outs[0]) != c.want {
			t.Errorf("Constant %v: %v %s", c.attrs, err, values(outs[0]))
		}
	}
	if _, err := call("Range", 11, nil, 1, tensor.Scalar(int64(0)), tensor.Scalar(int64(1)), tensor.Scalar(int64(0))); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("Range with delta 0: %v", err)
	}
	if _, err := call("Range", 11, nil, 1, tensor.Scalar(float32(0)), tensor.Scalar(float32(1e30)), tensor.Scalar(float32(1e-30))); !errors.Is(err, errs.ErrLimit) {
		t.Errorf("Range of 1e60 elements: %v", err)
	}
	if _, err := call("Constant", 21, attrs(strA("value_string", "x")), 1); !errors.Is(err, errs.ErrNotImplemented) {
		t.Errorf("Constant string: %v", err)
	}
}

// TestZeroElementShapesUnderLimit checks that tensors with no elements are
// never over the element limit, wherever their 0 is (a running product
// rejected (2^30, 2^30, 0) and accepted (0, 2^30, 2^30)), and that Tile
// refuses a product of dimensions that would wrap around.
func TestZeroElementShapesUnderLimit(t *testing.T) {
	const g = 1 << 30
	empty := func(s tensor.Shape) *tensor.Tensor {
		x, err := tensor.New(tensor.Float32, s)
		if err != nil {
			t.Fatalf("New(%v): %v", s, err)
		}
		return x
	}
	runCases(t, []opCase{
		{name: "softmax, zero last", op: "Softmax", opset: 13, in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "softmax, zero first", op: "Softmax", opset: 13, in: []*tensor.Tensor{empty(tensor.Shape{0, g, g})}, shape: tensor.Shape{0, g, g}, want: "[]"},
		{name: "transpose to zero last", op: "Transpose", opset: 13, in: []*tensor.Tensor{empty(tensor.Shape{0, g, g})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "reshape to zero last", op: "Reshape", opset: 14, attrs: attrs(intA("allowzero", 1)),
			in: []*tensor.Tensor{empty(tensor.Shape{0}), it(tensor.Shape{3}, g, g, 0)}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "reshape copying a zero", op: "Reshape", opset: 14,
			in: []*tensor.Tensor{empty(tensor.Shape{1, 1, 0}), it(tensor.Shape{3}, 1<<21, 1<<21, 0)}, shape: tensor.Shape{1 << 21, 1 << 21, 0}, want: "[]"},
		{name: "add broadcast", op: "Add", opset: 14, in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0}), ft(tensor.Shape{1}, 1)}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "tile of an empty tensor", op: "Tile", opset: 13, in: []*tensor.Tensor{empty(tensor.Shape{g, 0}), it(tensor.Shape{2}, 4, 3)}, shape: tensor.Shape{4 * g, 0}, want: "[]"},
		// kernels looping over the rows of an empty tensor: 2^60 of them
		{name: "softmax over an empty axis", op: "Softmax", opset: 13, attrs: attrs(intA("axis", 0)), in: []*tensor.Tensor{empty(tensor.Shape{0, g, g})}, shape: tensor.Shape{0, g, g}, want: "[]"},
		{name: "softmax-11 of an empty tail", op: "Softmax", opset: 11, in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "logsoftmax", op: "LogSoftmax", opset: 13, in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "layernorm", op: "LayerNormalization", opset: 17, in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0}), empty(tensor.Shape{0})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "rmsnorm", op: "RMSNormalization", opset: 23, in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0}), empty(tensor.Shape{0})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "cumsum", op: "CumSum", opset: 14, in: []*tensor.Tensor{empty(tensor.Shape{g, 0, g}), it(tensor.Shape{}, 1)}, shape: tensor.Shape{g, 0, g}, want: "[]"},
		{name: "concat", op: "Concat", opset: 13, attrs: attrs(intA("axis", 2)), in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0}), empty(tensor.Shape{g, g, 0})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "split", op: "Split", opset: 18, attrs: attrs(intA("axis", 2), intA("num_outputs", 1)), in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "gather", op: "Gather", opset: 13, attrs: attrs(intA("axis", 2)), in: []*tensor.Tensor{empty(tensor.Shape{g, g, 0}), it(tensor.Shape{0})}, shape: tensor.Shape{g, g, 0}, want: "[]"},
		{name: "matmul batch", op: "MatMul", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{2, 0}), empty(tensor.Shape{g, 0, 0})}, shape: tensor.Shape{g, 2, 0}, want: "[]"},
		{name: "flatten of an empty tail", op: "Flatten", opset: 13, attrs: attrs(intA("axis", 2)), in: []*tensor.Tensor{empty(tensor.Shape{g, 4, 0})}, shape: tensor.Shape{4 * g, 0}, want: "[]"},
	})
	// still over the limit with elements
	if _, err := call("Reshape", 14, nil, 1, ft(tensor.Shape{1}, 1), it(tensor.Shape{3}, g, g, 1)); !errors.Is(err, errs.ErrLimit) {
		t.Errorf("Reshape to (2^30, 2^30, 1): %v", err)
	}
	if _, err := call("Tile", 13, nil, 1, empty(tensor.Shape{0, 1 << 40}), it(tensor.Shape{2}, 1, 1<<40)); !errors.Is(err, errs.ErrLimit) {
		t.Errorf("Tile to a dimension of 2^80: %v", err)
	}
	// Flatten's leading product of (2^30, 2^30, 2^30, 0) would wrap around
	if _, err := call("Flatten", 13, attrs(intA("axis", 3)), 1, empty(tensor.Shape{g, g, g, 0})); !errors.Is(err, errs.ErrLimit) {
		t.Errorf("Flatten to a dimension of 2^90: %v", err)
	}
}
