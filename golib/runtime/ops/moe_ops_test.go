package ops

import (
	"errors"
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestTopKCases(t *testing.T) {
	x := ft(tensor.Shape{2, 4}, 1, 3, 3, 2, 0, -1, 5, 5)
	nan := float32(math.NaN())
	xn := ft(tensor.Shape{5}, 1, nan, 3, float32(math.Inf(1)), 2)
	k := func(v int64) *tensor.Tensor { return it(tensor.Shape{1}, v) }
	h := f16t(tensor.Shape{4}, 0.5, 2, -1, 2)
	var cases []opCase
	add := func(name string, opset int, a Attributes, in []*tensor.Tensor, shape tensor.Shape, vals, idx string) {
		cases = append(cases,
			opCase{name: name + "/values", op: "TopK", opset: opset, attrs: a, in: in, shape: shape, want: vals, nOut: 2},
			opCase{name: name + "/indices", op: "TopK", opset: opset, attrs: a, in: in, shape: shape, want: idx, nOut: 2, outIdx: 1, dtype: tensor.Int64})
	}
	add("largest ties lower index first", 11, nil, []*tensor.Tensor{x, k(2)}, tensor.Shape{2, 2}, "[3 3 5 5]", "[1 2 2 3]")
	add("smallest", 11, attrs(intA("largest", 0)), []*tensor.Tensor{x, k(3)}, tensor.Shape{2, 3}, "[1 2 3 -1 0 5]", "[0 3 1 1 0 2]")
	add("axis 0 negative", 11, attrs(intA("axis", -2)), []*tensor.Tensor{x, k(1)}, tensor.Shape{1, 4}, "[1 3 5 5]", "[0 0 1 1]")
	add("K=0", 11, nil, []*tensor.Tensor{x, k(0)}, tensor.Shape{2, 0}, "[]", "[]")
	add("K=dim unsorted", 11, attrs(intA("sorted", 0)), []*tensor.Tensor{x, k(4)}, tensor.Shape{2, 4}, "[3 3 2 1 5 5 0 -1]", "[1 2 3 0 2 3 0 1]")
	add("NaN above all, largest", 11, nil, []*tensor.Tensor{xn, k(3)}, tensor.Shape{3}, "[NaN +Inf 3]", "[1 3 2]")
	add("NaN last, smallest", 11, attrs(intA("largest", 0)), []*tensor.Tensor{xn, k(5)}, tensor.Shape{5}, "[1 2 3 +Inf NaN]", "[0 4 2 3 1]")
	add("opset 1 attribute k", 1, attrs(intA("k", 1)), []*tensor.Tensor{x}, tensor.Shape{2, 1}, "[3 5]", "[1 2]")
	add("opset 10 input K", 10, nil, []*tensor.Tensor{x, k(1)}, tensor.Shape{2, 1}, "[3 5]", "[1 2]")
	add("int64", 11, nil, []*tensor.Tensor{it(tensor.Shape{3}, 1<<62+1, 1<<62, 1<<62+1), k(2)}, tensor.Shape{2}, "[4611686018427387905 4611686018427387905]", "[0 2]")
	add("int32", 11, attrs(intA("largest", 0)), []*tensor.Tensor{i32t(tensor.Shape{3}, 7, -2, 5), k(2)}, tensor.Shape{2}, "[-2 5]", "[1 2]")
	add("float16", 11, nil, []*tensor.Tensor{h, k(2)}, tensor.Shape{2}, "[2 2]", "[1 3]")
	add("empty outer", 11, nil, []*tensor.Tensor{ft(tensor.Shape{0, 3}), k(2)}, tensor.Shape{0, 2}, "[]", "[]")
	big := make([]float32, 40)
	for i := range big {
		big[i] = float32(i % 7)
	}
	add("K>16 sort path", 11, nil, []*tensor.Tensor{ft(tensor.Shape{40}, big...), k(18)}, tensor.Shape{18},
		"[6 6 6 6 6 5 5 5 5 5 4 4 4 4 4 4 3 3]", "[6 13 20 27 34 5 12 19 26 33 4 11 18 25 32 39 3 10]")
	runCases(t, cases)
}

func f16t(shape tensor.Shape, v ...float32) *tensor.Tensor {
	x, err := tensor.New(tensor.Float16, shape)
	if err != nil || tensor.FromFloat32(x, v) != nil {
		return nil
	}
	return x
}

func TestArgMaxMinCases(t *testing.T) {
	x := ft(tensor.Shape{2, 3}, 1, 4, 4, 7, 0, 7)
	runCases(t, []opCase{
		{name: "argmax axis1", op: "ArgMax", opset: 13, attrs: attrs(intA("axis", 1)), in: []*tensor.Tensor{x}, shape: tensor.Shape{2, 1}, want: "[1 0]", dtype: tensor.Int64},
		{name: "argmax last", op: "ArgMax", opset: 13, attrs: attrs(intA("axis", -1), intA("select_last_index", 1), intA("keepdims", 0)), in: []*tensor.Tensor{x}, shape: tensor.Shape{2}, want: "[2 2]", dtype: tensor.Int64},
		{name: "argmin axis0", op: "ArgMin", opset: 11, attrs: attrs(intA("keepdims", 0)), in: []*tensor.Tensor{x}, shape: tensor.Shape{3}, want: "[0 1 0]", dtype: tensor.Int64},
		{name: "argmin int64", op: "ArgMin", opset: 13, attrs: attrs(intA("axis", 0)), in: []*tensor.Tensor{it(tensor.Shape{3}, 5, -9, -9)}, shape: tensor.Shape{1}, want: "[1]", dtype: tensor.Int64},
		{name: "argmax empty outer", op: "ArgMax", opset: 13, attrs: attrs(intA("axis", 1)), in: []*tensor.Tensor{ft(tensor.Shape{0, 3})}, shape: tensor.Shape{0, 1}, want: "[]", dtype: tensor.Int64},
	})
}

func TestNonZeroCases(t *testing.T) {
	runCases(t, []opCase{
		{name: "2d", op: "NonZero", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{2, 3}, 0, 1, 0, float32(math.NaN()), 0, -2)}, shape: tensor.Shape{2, 3}, want: "[0 1 1 1 0 2]", dtype: tensor.Int64},
		{name: "bool", op: "NonZero", opset: 9, in: []*tensor.Tensor{bt(tensor.Shape{4}, false, true, true, false)}, shape: tensor.Shape{1, 2}, want: "[1 2]", dtype: tensor.Int64},
		{name: "int64 3d", op: "NonZero", opset: 13, in: []*tensor.Tensor{it(tensor.Shape{2, 1, 2}, 0, 0, 0, 3)}, shape: tensor.Shape{3, 1}, want: "[1 0 1]", dtype: tensor.Int64},
		{name: "none", op: "NonZero", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{2, 2}, 0, 0, 0, 0)}, shape: tensor.Shape{2, 0}, want: "[]", dtype: tensor.Int64},
		{name: "empty", op: "NonZero", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{0, 5})}, shape: tensor.Shape{2, 0}, want: "[]", dtype: tensor.Int64},
		{name: "scalar", op: "NonZero", opset: 13, in: []*tensor.Tensor{ft(tensor.Shape{}, 3)}, shape: tensor.Shape{1, 1}, want: "[0]", dtype: tensor.Int64},
		{name: "float16", op: "NonZero", opset: 13, in: []*tensor.Tensor{f16t(tensor.Shape{3}, 0, 0.5, 0)}, shape: tensor.Shape{1, 1}, want: "[1]", dtype: tensor.Int64},
	})
}

func TestOneHotCases(t *testing.T) {
	vals := ft(tensor.Shape{2}, 0, 1)
	depth := it(tensor.Shape{}, 3)
	runCases(t, []opCase{
		{name: "last axis", op: "OneHot", opset: 11, in: []*tensor.Tensor{it(tensor.Shape{3}, 0, 2, 1), depth, vals}, shape: tensor.Shape{3, 3}, want: "[1 0 0 0 0 1 0 1 0]", dtype: tensor.Float32},
		{name: "negative wraps, out of range off", op: "OneHot", opset: 11, in: []*tensor.Tensor{it(tensor.Shape{3}, -1, 3, -4), depth, vals}, shape: tensor.Shape{3, 3}, want: "[0 0 1 0 0 0 0 0 0]", dtype: tensor.Float32},
		{name: "axis 0", op: "OneHot", opset: 11, attrs: attrs(intA("axis", 0)), in: []*tensor.Tensor{it(tensor.Shape{2}, 0, 2), depth, vals}, shape: tensor.Shape{3, 2}, want: "[1 0 0 0 0 1]", dtype: tensor.Float32},
		{name: "axis -2 of 2d", op: "OneHot", opset: 11, attrs: attrs(intA("axis", -2)), in: []*tensor.Tensor{it(tensor.Shape{1, 2}, 1, 0), it(tensor.Shape{1}, 2), it(tensor.Shape{2}, 5, 9)}, shape: tensor.Shape{1, 2, 2}, want: "[5 9 9 5]", dtype: tensor.Int64},
		{name: "float indices and depth", op: "OneHot", opset: 9, in: []*tensor.Tensor{ft(tensor.Shape{2}, 1.7, 0), ft(tensor.Shape{1}, 2.5), vals}, shape: tensor.Shape{2, 2}, want: "[0 1 1 0]", dtype: tensor.Float32},
		{name: "empty indices", op: "OneHot", opset: 11, in: []*tensor.Tensor{it(tensor.Shape{0}), depth, vals}, shape: tensor.Shape{0, 3}, want: "[]", dtype: tensor.Float32},
	})
}

func TestScatterElementsCases(t *testing.T) {
	d := ft(tensor.Shape{2, 3}, 1, 2, 3, 4, 5, 6)
	u := ft(tensor.Shape{2, 2}, 10, 20, 30, 40)
	runCases(t, []opCase{
		{name: "axis 1", op: "ScatterElements", opset: 13, attrs: attrs(intA("axis", 1)), in: []*tensor.Tensor{d, it(tensor.Shape{2, 2}, 2, 0, -1, 1), u}, shape: tensor.Shape{2, 3}, want: "[20 2 10 4 40 30]"},
		{name: "axis 0 int32 indices", op: "ScatterElements", opset: 11, in: []*tensor.Tensor{d, i32t(tensor.Shape{1, 2}, 1, 0), ft(tensor.Shape{1, 2}, 7, 8)}, shape: tensor.Shape{2, 3}, want: "[1 8 3 7 5 6]"},
		{name: "duplicates none: last wins", op: "ScatterElements", opset: 13, attrs: attrs(intA("axis", 1)), in: []*tensor.Tensor{d, it(tensor.Shape{1, 2}, 0, 0), ft(tensor.Shape{1, 2}, 7, 8)}, shape: tensor.Shape{2, 3}, want: "[8 2 3 4 5 6]"},
		{name: "duplicates add", op: "ScatterElements", opset: 16, attrs: attrs(intA("axis", 1), strA("reduction", "add")), in: []*tensor.Tensor{d, it(tensor.Shape{1, 2}, 0, 0), ft(tensor.Shape{1, 2}, 7, 8)}, shape: tensor.Shape{2, 3}, want: "[16 2 3 4 5 6]"},
		{name: "duplicates mul", op: "ScatterElements", opset: 16, attrs: attrs(intA("axis", 1), strA("reduction", "mul")), in: []*tensor.Tensor{d, it(tensor.Shape{1, 2}, 1, 1), ft(tensor.Shape{1, 2}, 7, 8)}, shape: tensor.Shape{2, 3}, want: "[1 112 3 4 5 6]"},
		{name: "duplicates max", op: "ScatterElements", opset: 18, attrs: attrs(intA("axis", 1), strA("reduction", "max")), in: []*tensor.Tensor{d, it(tensor.Shape{1, 2}, 2, 2), ft(tensor.Shape{1, 2}, -7, 2)}, shape: tensor.Shape{2, 3}, want: "[1 2 3 4 5 6]"},
		{name: "duplicates min int64", op: "ScatterElements", opset: 18, attrs: attrs(intA("axis", 0), strA("reduction", "min")), in: []*tensor.Tensor{it(tensor.Shape{2}, 5, 6), it(tensor.Shape{3}, 1, 1, 1), it(tensor.Shape{3}, 9, 4, 8)}, shape: tensor.Shape{2}, want: "[5 4]"},
		{name: "float16 add", op: "ScatterElements", opset: 18, attrs: attrs(strA("reduction", "add")), in: []*tensor.Tensor{f16t(tensor.Shape{2}, 1, 2), it(tensor.Shape{2}, -1, -1), f16t(tensor.Shape{2}, 0.5, 0.25)}, shape: tensor.Shape{2}, want: "[1 2.75]"},
		{name: "empty indices", op: "ScatterElements", opset: 13, in: []*tensor.Tensor{d, it(tensor.Shape{0, 3}), ft(tensor.Shape{0, 3})}, shape: tensor.Shape{2, 3}, want: "[1 2 3 4 5 6]"},
	})
}

func TestMoEOpsRefuseMalformed(t *testing.T) {
	x := ft(tensor.Shape{2, 3}, 1, 2, 3, 4, 5, 6)
	cases := []struct {
		name  string
		op    string
		opset int
		attrs Attributes
		in    []*tensor.Tensor
		nOut  int
		want  error
	}{
		{"TopK K past the axis", "TopK", 11, nil, []*tensor.Tensor{x, it(tensor.Shape{1}, 4)}, 2, errs.ErrInvalidArgument},
		{"TopK negative K", "TopK", 11, nil, []*tensor.Tensor{x, it(tensor.Shape{1}, -1)}, 2, errs.ErrInvalidArgument},
		{"TopK two K values", "TopK", 11, nil, []*tensor.Tensor{x, it(tensor.Shape{2}, 1, 1)}, 2, errs.ErrInvalidArgument},
		{"TopK int32 K", "TopK", 11, nil, []*tensor.Tensor{x, i32t(tensor.Shape{1}, 1)}, 2, errs.ErrInvalidArgument},
		{"TopK axis past the rank", "TopK", 11, attrs(intA("axis", 2)), []*tensor.Tensor{x, it(tensor.Shape{1}, 1)}, 2, errs.ErrInvalidArgument},
		{"TopK-1 without k", "TopK", 1, nil, []*tensor.Tensor{x}, 2, errs.ErrInvalidModel},
		{"TopK-10 without K", "TopK", 10, nil, []*tensor.Tensor{x}, 2, errs.ErrInvalidModel},
		{"TopK of bool", "TopK", 11, nil, []*tensor.Tensor{bt(tensor.Shape{2}, true, false), it(tensor.Shape{1}, 1)}, 2, errs.ErrType},
		{"OneHot depth 0", "OneHot", 11, nil, []*tensor.Tensor{it(tensor.Shape{1}, 0), it(tensor.Shape{}, 0), ft(tensor.Shape{2}, 0, 1)}, 1, errs.ErrInvalidArgument},
		{"OneHot three values", "OneHot", 11, nil, []*tensor.Tensor{it(tensor.Shape{1}, 0), it(tensor.Shape{}, 2), ft(tensor.Shape{3}, 0, 1, 2)}, 1, errs.ErrInvalidArgument},
		{"OneHot axis past the rank", "OneHot", 11, attrs(intA("axis", 2)), []*tensor.Tensor{it(tensor.Shape{1}, 0), it(tensor.Shape{}, 2), ft(tensor.Shape{2}, 0, 1)}, 1, errs.ErrInvalidArgument},
		{"ScatterElements index out of range", "ScatterElements", 13, nil, []*tensor.Tensor{x, it(tensor.Shape{1, 1}, 2), ft(tensor.Shape{1, 1}, 0)}, 1, errs.ErrInvalidArgument},
		{"ScatterElements negative index out of range", "ScatterElements", 13, attrs(intA("axis", 1)), []*tensor.Tensor{x, it(tensor.Shape{1, 1}, -4), ft(tensor.Shape{1, 1}, 0)}, 1, errs.ErrInvalidArgument},
		{"ScatterElements updates of another type", "ScatterElements", 13, nil, []*tensor.Tensor{x, it(tensor.Shape{1, 1}, 0), it(tensor.Shape{1, 1}, 0)}, 1, errs.ErrType},
		{"ScatterElements updates of another shape", "ScatterElements", 13, nil, []*tensor.Tensor{x, it(tensor.Shape{1, 1}, 0), ft(tensor.Shape{1}, 0)}, 1, errs.ErrShape},
		{"ScatterElements indices past data", "ScatterElements", 13, nil, []*tensor.Tensor{x, it(tensor.Shape{1, 4}, 0, 0, 0, 0), ft(tensor.Shape{1, 4}, 0, 0, 0, 0)}, 1, errs.ErrShape},
		{"ScatterElements-13 reduction", "ScatterElements", 13, attrs(strA("reduction", "add")), []*tensor.Tensor{x, it(tensor.Shape{1, 1}, 0), ft(tensor.Shape{1, 1}, 0)}, 1, errs.ErrInvalidModel},
		{"ScatterElements-16 max", "ScatterElements", 16, attrs(strA("reduction", "max")), []*tensor.Tensor{x, it(tensor.Shape{1, 1}, 0), ft(tensor.Shape{1, 1}, 0)}, 1, errs.ErrInvalidModel},
		{"ScatterElements bad reduction", "ScatterElements", 18, attrs(strA("reduction", "sub")), []*tensor.Tensor{x, it(tensor.Shape{1, 1}, 0), ft(tensor.Shape{1, 1}, 0)}, 1, errs.ErrInvalidModel},
		{"ArgMax axis past the rank", "ArgMax", 13, attrs(intA("axis", 3)), []*tensor.Tensor{x}, 1, errs.ErrInvalidArgument},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := call(c.op, c.opset, c.attrs, c.nOut, c.in...); !errors.Is(err, c.want) {
				t.Errorf("got %v, want %v", err, c.want)
			}
		})
	}
}

// TestMoEOpsDeclaredTypes: a declared input type a kernel does not compute
// fails at session creation (the factory), not at run time.
func TestMoEOpsDeclaredTypes(t *testing.T) {
	for _, c := range []struct {
		op    string
		opset int
		types []tensor.DType
		want  error
	}{
		{"TopK", 11, []tensor.DType{tensor.Bool, tensor.Int64}, errs.ErrNotImplemented},
		{"TopK", 11, []tensor.DType{tensor.Float32, tensor.Int32}, errs.ErrInvalidModel},
		{"ArgMax", 13, []tensor.DType{tensor.Bool}, errs.ErrNotImplemented},
		{"OneHot", 11, []tensor.DType{tensor.Bool, tensor.Int64, tensor.Float32}, errs.ErrNotImplemented},
		{"ScatterElements", 13, []tensor.DType{tensor.Float32, tensor.Float32, tensor.Float32}, errs.ErrInvalidModel},
		{"ScatterElements", 18, []tensor.DType{tensor.Bool, tensor.Int64, tensor.Bool}, errs.ErrNotImplemented},
	} {
		f, err := Lookup("", c.op, c.opset)
		if err != nil {
			t.Fatal(err)
		}
		n := &Node{OpType: c.op, Opset: c.opset, Attrs: Attributes{}, NumInputs: len(c.types), NumOutputs: 1,
			InputPresent: make([]bool, len(c.types)), OutputPresent: []bool{true}, InputTypes: c.types}
		for i := range n.InputPresent {
			n.InputPresent[i] = true
		}
		if c.op == "ScatterElements" && c.opset == 18 {
			n.Attrs = attrs(strA("reduction", "add"))
		}
		if _, err := f(n); !errors.Is(err, c.want) {
			t.Errorf("%s %v: got %v, want %v", c.op, c.types, err, c.want)
		}
	}
}
