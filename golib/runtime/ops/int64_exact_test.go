package ops

import (
	"errors"
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Integer values that float64 cannot tell apart: p53+1 rounds to p53.
const (
	p52   = int64(1) << 52
	p53   = int64(1) << 53
	p62   = int64(1) << 62
	i64lo = int64(math.MinInt64)
	i64hi = int64(math.MaxInt64)
)

func i64s(v ...int64) *tensor.Tensor { return it(tensor.Shape{len(v)}, v...) }

func i32s(v ...int32) *tensor.Tensor {
	t, err := tensor.FromSlice(tensor.Shape{len(v)}, v)
	if err != nil {
		return nil
	}
	return t
}

func rangeIn(s, l, d int64) []*tensor.Tensor {
	return []*tensor.Tensor{tensor.Scalar(s), tensor.Scalar(l), tensor.Scalar(d)}
}

func rangeIn32(s, l, d int32) []*tensor.Tensor {
	return []*tensor.Tensor{tensor.Scalar(s), tensor.Scalar(l), tensor.Scalar(d)}
}

// TestRangeIntExact covers integer Range where limit-start overflows int64
// or the count is beyond float64's exact integers (2^53).
func TestRangeIntExact(t *testing.T) {
	cases := []opCase{
		{name: "start min, step 2^62", in: rangeIn(i64lo, 0, p62), shape: tensor.Shape{2}, want: "[-9223372036854775808 -4611686018427387904]"},
		{name: "limit 2^53+1, step 2^52", in: rangeIn(0, p53+1, p52), shape: tensor.Shape{3}, want: "[0 4503599627370496 9007199254740992]"},
		{name: "limit 2^53 exact multiple", in: rangeIn(0, p53, p52), shape: tensor.Shape{2}, want: "[0 4503599627370496]"},
		{name: "full span, step max", in: rangeIn(i64lo, i64hi, i64hi), shape: tensor.Shape{3}, want: "[-9223372036854775808 -1 9223372036854775806]"},
		{name: "negative step 2^62", in: rangeIn(i64hi, i64lo, -p62), shape: tensor.Shape{4}, want: "[9223372036854775807 4611686018427387903 -1 -4611686018427387905]"},
		{name: "negative step min", in: rangeIn(i64hi, i64lo, i64lo), shape: tensor.Shape{2}, want: "[9223372036854775807 -1]"},
		{name: "negative step exact multiple", in: rangeIn(p53, 0, -p52), shape: tensor.Shape{2}, want: "[9007199254740992 4503599627370496]"},
		{name: "negative step past 2^53", in: rangeIn(p53+1, 0, -p52), shape: tensor.Shape{3}, want: "[9007199254740993 4503599627370497 1]"},
		{name: "wrong direction", in: rangeIn(i64lo, i64hi, -1), shape: tensor.Shape{0}, want: "[]"},
		{name: "wrong direction down", in: rangeIn(i64hi, i64lo, 1), shape: tensor.Shape{0}, want: "[]"},
		{name: "single step", in: rangeIn(i64hi-1, i64hi, i64hi), shape: tensor.Shape{1}, want: "[9223372036854775806]"},
		{name: "int32 full span", in: rangeIn32(math.MinInt32, math.MaxInt32, 1<<30), shape: tensor.Shape{4}, want: "[-2147483648 -1073741824 0 1073741824]"},
		{name: "int32 negative step min", in: rangeIn32(math.MaxInt32, math.MinInt32, math.MinInt32), shape: tensor.Shape{2}, want: "[2147483647 -1]"},
	}
	for i := range cases {
		cases[i].op, cases[i].opset = "Range", 11
	}
	runCases(t, cases)

	for _, c := range []struct {
		name    string
		in      []*tensor.Tensor
		wantErr error
	}{
		{"2^64-1 elements", rangeIn(i64lo, i64hi, 1), errs.ErrLimit},
		{"2^64-1 elements down", rangeIn(i64hi, i64lo, -1), errs.ErrLimit},
		{"2^32 elements", rangeIn(i64lo, i64hi, 1<<32), errs.ErrLimit},
		{"2^31+1 elements", rangeIn(0, maxRangeElements+1, 1), errs.ErrLimit},
		{"int32 2^32-1 elements", rangeIn32(math.MinInt32, math.MaxInt32, 1), errs.ErrLimit},
		{"delta 0", rangeIn(i64lo, i64hi, 0), errs.ErrInvalidArgument},
	} {
		if _, err := call("Range", 11, nil, 1, c.in...); !errors.Is(err, c.wantErr) {
			t.Errorf("Range %s: got %v, want %v", c.name, err, c.wantErr)
		}
	}
}

// TestRangeCount checks rangeCount against the count's definition at the
// int64 limits.
func TestRangeCount(t *testing.T) {
	for _, c := range []struct {
		s, l, d int64
		want    uint64
	}{
		{0, 10, 3, 4},
		{0, 9, 3, 3},
		{10, 0, -3, 4},
		{9, 0, -3, 3},
		{0, 0, 1, 0},
		{i64lo, i64hi, 1, math.MaxUint64},
		{i64hi, i64lo, -1, math.MaxUint64},
		{i64lo, i64hi, i64hi, 3},
		{i64hi, i64lo, i64lo, 2},
		{i64lo, 0, p62, 2},
		{0, p53 + 1, p52, 3},
	} {
		if got := rangeCount(c.s, c.l, c.d); got != c.want {
			t.Errorf("rangeCount(%d, %d, %d) = %d, want %d", c.s, c.l, c.d, got, c.want)
		}
	}
}

// TestClipIntExact covers integer Clip beyond 2^53 and at the int64 limits.
func TestClipIntExact(t *testing.T) {
	x := i64s(i64hi, i64lo, p53+1, p53, -p53-1)
	lo, hi := tensor.Scalar(i64lo), tensor.Scalar(i64hi)
	cases := []opCase{
		{name: "no bounds", in: []*tensor.Tensor{x}, want: "[9223372036854775807 -9223372036854775808 9007199254740993 9007199254740992 -9007199254740993]"},
		{name: "int64 limits", in: []*tensor.Tensor{x, lo, hi}, want: "[9223372036854775807 -9223372036854775808 9007199254740993 9007199254740992 -9007199254740993]"},
		{name: "min only at int64 min", in: []*tensor.Tensor{x, lo}, want: "[9223372036854775807 -9223372036854775808 9007199254740993 9007199254740992 -9007199254740993]"},
		{name: "max only at int64 max", in: []*tensor.Tensor{x, nil, hi}, want: "[9223372036854775807 -9223372036854775808 9007199254740993 9007199254740992 -9007199254740993]"},
		{name: "min 2^53+1", in: []*tensor.Tensor{x, tensor.Scalar(p53 + 1), hi}, want: "[9223372036854775807 9007199254740993 9007199254740993 9007199254740993 9007199254740993]"},
		{name: "max 2^53", in: []*tensor.Tensor{x, nil, tensor.Scalar(p53)}, want: "[9007199254740992 -9223372036854775808 9007199254740992 9007199254740992 -9007199254740993]"},
		{name: "both int64 max", in: []*tensor.Tensor{x, hi, hi}, want: "[9223372036854775807 9223372036854775807 9223372036854775807 9223372036854775807 9223372036854775807]"},
		{name: "both int64 min", in: []*tensor.Tensor{x, lo, lo}, want: "[-9223372036854775808 -9223372036854775808 -9223372036854775808 -9223372036854775808 -9223372036854775808]"},
		{name: "max int64 max-1", in: []*tensor.Tensor{x, nil, tensor.Scalar(i64hi - 1)}, want: "[9223372036854775806 -9223372036854775808 9007199254740993 9007199254740992 -9007199254740993]"},
		{name: "min -2^53-2", in: []*tensor.Tensor{i64s(-p53-3, -p53-1), tensor.Scalar(-p53 - 2)}, want: "[-9007199254740994 -9007199254740993]"},
		{name: "int32 no bounds", in: []*tensor.Tensor{i32s(math.MaxInt32, math.MinInt32, 0)}, want: "[2147483647 -2147483648 0]"},
		{name: "int32 bounds", in: []*tensor.Tensor{i32s(math.MaxInt32, math.MinInt32, 0), tensor.Scalar(int32(-1)), tensor.Scalar(int32(1))}, want: "[1 -1 0]"},
	}
	for i := range cases {
		cases[i].op, cases[i].opset, cases[i].shape = "Clip", 13, cases[i].in[0].Shape()
	}
	runCases(t, cases)
}

// TestReduceIntExact covers integer ReduceMax/ReduceMin/ReduceSum beyond
// 2^53 and at the int64 limits.
func TestReduceIntExact(t *testing.T) {
	m := it(tensor.Shape{2, 2}, i64hi, i64hi-1, i64lo+1, i64lo)
	axis1 := it(tensor.Shape{1}, 1)
	noKeep := attrs(intA("keepdims", 0))
	cases := []opCase{
		{name: "max 2^53+1, 2^53", op: "ReduceMax", attrs: noKeep, in: []*tensor.Tensor{i64s(p53+1, p53)}, shape: tensor.Shape{}, want: "[9007199254740993]"},
		{name: "max 2^53, 2^53+1", op: "ReduceMax", attrs: noKeep, in: []*tensor.Tensor{i64s(p53, p53+1)}, shape: tensor.Shape{}, want: "[9007199254740993]"},
		{name: "min 2^53+1, 2^53+2", op: "ReduceMin", attrs: noKeep, in: []*tensor.Tensor{i64s(p53+2, p53+1)}, shape: tensor.Shape{}, want: "[9007199254740993]"},
		{name: "min negative", op: "ReduceMin", attrs: noKeep, in: []*tensor.Tensor{i64s(-p53, -p53-1)}, shape: tensor.Shape{}, want: "[-9007199254740993]"},
		{name: "max negative", op: "ReduceMax", attrs: noKeep, in: []*tensor.Tensor{i64s(-p53-3, -p53-1)}, shape: tensor.Shape{}, want: "[-9007199254740993]"},
		{name: "max int64 max-1", op: "ReduceMax", attrs: noKeep, in: []*tensor.Tensor{i64s(i64hi-1, i64lo)}, shape: tensor.Shape{}, want: "[9223372036854775806]"},
		{name: "min int64 min+1", op: "ReduceMin", attrs: noKeep, in: []*tensor.Tensor{i64s(i64lo+1, i64hi)}, shape: tensor.Shape{}, want: "[-9223372036854775807]"},
		{name: "max rows", op: "ReduceMax", in: []*tensor.Tensor{m, axis1}, shape: tensor.Shape{2, 1}, want: "[9223372036854775807 -9223372036854775807]"},
		{name: "min rows", op: "ReduceMin", in: []*tensor.Tensor{m, axis1}, shape: tensor.Shape{2, 1}, want: "[9223372036854775806 -9223372036854775808]"},
		{name: "min columns", op: "ReduceMin", in: []*tensor.Tensor{m, it(tensor.Shape{1}, 0)}, shape: tensor.Shape{1, 2}, want: "[-9223372036854775807 -9223372036854775808]"},
		{name: "sum 2^53+1", op: "ReduceSum", attrs: noKeep, in: []*tensor.Tensor{i64s(p53, 1)}, shape: tensor.Shape{}, want: "[9007199254740993]"},
		{name: "sum through int64 max", op: "ReduceSum", attrs: noKeep, in: []*tensor.Tensor{i64s(i64hi, 1, -2)}, shape: tensor.Shape{}, want: "[9223372036854775806]"},
		{name: "sum rows", op: "ReduceSum", in: []*tensor.Tensor{it(tensor.Shape{2, 2}, p53, 3, -p53, -3), axis1}, shape: tensor.Shape{2, 1}, want: "[9007199254740995 -9007199254740995]"},
		{name: "int32 max min", op: "ReduceMax", attrs: noKeep, in: []*tensor.Tensor{i32s(math.MinInt32, math.MaxInt32-1)}, shape: tensor.Shape{}, want: "[2147483646]"},
		{name: "int32 sum", op: "ReduceSum", attrs: noKeep, in: []*tensor.Tensor{i32s(math.MaxInt32, 1, -2)}, shape: tensor.Shape{}, want: "[2147483646]"},
		{name: "int64 max empty", op: "ReduceMax", in: []*tensor.Tensor{emptyT(tensor.Int64, tensor.Shape{2, 0}), axis1}, shape: tensor.Shape{2, 1}, want: "[-9223372036854775808 -9223372036854775808]"},
		{name: "uint32 min empty", op: "ReduceMin", in: []*tensor.Tensor{emptyT(tensor.Uint32, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[4294967295]"},
		// ReduceMean of integers: truncated toward zero (onnxruntime's
		// results), with sums that would overflow int64 kept exact
		{name: "mean 1 2", op: "ReduceMean", attrs: noKeep, in: []*tensor.Tensor{i64s(1, 2)}, shape: tensor.Shape{}, want: "[1]"},
		{name: "mean -1 -2", op: "ReduceMean", attrs: noKeep, in: []*tensor.Tensor{i64s(-1, -2)}, shape: tensor.Shape{}, want: "[-1]"},
		{name: "mean -3 -2 -2", op: "ReduceMean", attrs: noKeep, in: []*tensor.Tensor{i64s(-3, -2, -2)}, shape: tensor.Shape{}, want: "[-2]"},
		{name: "mean 3 x 2^62", op: "ReduceMean", attrs: noKeep, in: []*tensor.Tensor{i64s(1<<62, 1<<62, 1<<62)}, shape: tensor.Shape{}, want: "[4611686018427387904]"},
		{name: "mean int64 max", op: "ReduceMean", attrs: noKeep, in: []*tensor.Tensor{i64s(i64hi, i64hi, i64hi-3)}, shape: tensor.Shape{}, want: "[9223372036854775806]"},
		{name: "mean int64 min", op: "ReduceMean", attrs: noKeep, in: []*tensor.Tensor{i64s(i64lo, i64lo)}, shape: tensor.Shape{}, want: "[-9223372036854775808]"},
		{name: "mean 2^53+1", op: "ReduceMean", attrs: noKeep, in: []*tensor.Tensor{i64s(p53+1, p53+1)}, shape: tensor.Shape{}, want: "[9007199254740993]"},
		{name: "mean rows", op: "ReduceMean", in: []*tensor.Tensor{m, axis1}, shape: tensor.Shape{2, 1}, want: "[9223372036854775806 -9223372036854775807]"},
		{name: "mean int32", op: "ReduceMean", attrs: noKeep, in: []*tensor.Tensor{i32s(math.MaxInt32, math.MaxInt32, 1)}, shape: tensor.Shape{}, want: "[1431655765]"},
		{name: "mean empty", op: "ReduceMean", in: []*tensor.Tensor{emptyT(tensor.Int64, tensor.Shape{2, 0}), axis1}, shape: tensor.Shape{2, 1}, want: "[0 0]"},
	}
	for i := range cases {
		cases[i].opset = 18
	}
	runCases(t, cases)
}

// TestCumSumIntExact covers integer CumSum beyond 2^53 and at the int64
// limits, inclusive, exclusive and reversed.
func TestCumSumIntExact(t *testing.T) {
	ax0, ax1 := tensor.Scalar(int64(0)), tensor.Scalar(int64(1))
	excl, rev := intA("exclusive", 1), intA("reverse", 1)
	cases := []opCase{
		{name: "inclusive", in: []*tensor.Tensor{i64s(p53, 1, 1), ax0}, want: "[9007199254740992 9007199254740993 9007199254740994]"},
		{name: "exclusive", attrs: attrs(excl), in: []*tensor.Tensor{i64s(p53+1, 1, 1), ax0}, want: "[0 9007199254740993 9007199254740994]"},
		{name: "reverse", attrs: attrs(rev), in: []*tensor.Tensor{i64s(1, 1, p53), ax0}, want: "[9007199254740994 9007199254740993 9007199254740992]"},
		{name: "exclusive reverse", attrs: attrs(excl, rev), in: []*tensor.Tensor{i64s(1, 1, p53+1), ax0}, want: "[9007199254740994 9007199254740993 0]"},
		{name: "int64 max", in: []*tensor.Tensor{i64s(i64hi, -1, -1), ax0}, want: "[9223372036854775807 9223372036854775806 9223372036854775805]"},
		{name: "int64 min reverse", attrs: attrs(rev), in: []*tensor.Tensor{i64s(1, i64lo+1, 0), ax0}, want: "[-9223372036854775806 -9223372036854775807 0]"},
		{name: "through int64 max", in: []*tensor.Tensor{i64s(i64hi, 1, -2), ax0}, want: "[9223372036854775807 -9223372036854775808 9223372036854775806]"},
		{name: "axis 1 negative", in: []*tensor.Tensor{it(tensor.Shape{2, 2}, -p53-1, -1, p53+1, 2), ax1}, want: "[-9007199254740993 -9007199254740994 9007199254740993 9007199254740995]"},
		{name: "axis 0 exclusive reverse", attrs: attrs(excl, rev), in: []*tensor.Tensor{it(tensor.Shape{2, 2}, -p53-1, -1, p53+1, 2), ax0}, want: "[9007199254740993 2 0 0]"},
		{name: "int32", in: []*tensor.Tensor{i32s(math.MaxInt32, -1, -1), ax0}, want: "[2147483647 2147483646 2147483645]"},
	}
	for i := range cases {
		cases[i].op, cases[i].opset, cases[i].shape = "CumSum", 14, cases[i].in[0].Shape()
	}
	runCases(t, cases)
}

// TestTriluExtremeK covers Trilu with k at and near the int64 limits, and
// k just inside and outside the matrix.
func TestTriluExtremeK(t *testing.T) {
	x := it(tensor.Shape{3, 4}, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11)
	const all = "[0 1 2 3 4 5 6 7 8 9 10 11]"
	const none = "[0 0 0 0 0 0 0 0 0 0 0 0]"
	upper, lower := attrs(intA("upper", 1)), attrs(intA("upper", 0))
	k := func(v int64) []*tensor.Tensor { return []*tensor.Tensor{x, tensor.Scalar(v)} }
	cases := []opCase{
		{name: "lower k=max", attrs: lower, in: k(i64hi), want: all},
		{name: "lower k=max-1", attrs: lower, in: k(i64hi - 1), want: all},
		{name: "upper k=max", attrs: upper, in: k(i64hi), want: none},
		{name: "upper k=max-1", attrs: upper, in: k(i64hi - 1), want: none},
		{name: "upper k=-max", attrs: upper, in: k(-i64hi), want: all},
		{name: "lower k=-max", attrs: lower, in: k(-i64hi), want: none},
		{name: "upper k=min", attrs: upper, in: k(i64lo), want: all},
		{name: "lower k=min", attrs: lower, in: k(i64lo), want: none},
		{name: "upper k=cols", attrs: upper, in: k(4), want: none},
		{name: "upper k=cols-1", attrs: upper, in: k(3), want: "[0 0 0 3 0 0 0 0 0 0 0 0]"},
		{name: "upper k=-(rows-1)", attrs: upper, in: k(-2), want: all},
		{name: "lower k=-rows", attrs: lower, in: k(-3), want: none},
		{name: "lower k=-(rows-1)", attrs: lower, in: k(-2), want: "[0 0 0 0 0 0 0 0 8 0 0 0]"},
		{name: "lower k=cols-1", attrs: lower, in: k(3), want: all},
		{name: "lower k=rows+cols", attrs: lower, in: k(7), want: all},
		{name: "upper k=-(rows+cols)", attrs: upper, in: k(-7), want: all},
	}
	for i := range cases {
		cases[i].op, cases[i].opset, cases[i].shape = "Trilu", 14, x.Shape()
	}
	runCases(t, cases)
}
