package ops

import (
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func emptyT(dt tensor.DType, shape tensor.Shape) *tensor.Tensor {
	t, err := tensor.New(dt, shape)
	if err != nil {
		return nil
	}
	return t
}

// TestReduceMaxMinEmptyAndBool covers ReduceMax/ReduceMin over empty sets
// (the type's lowest/highest value, -inf/+inf, false/true), ReduceMean and
// ReduceSum over empty sets (0, as onnxruntime's) and bool inputs.
func TestReduceMaxMinEmptyAndBool(t *testing.T) {
	b := bt(tensor.Shape{2, 3}, true, false, false, false, false, false)
	axis1 := it(tensor.Shape{1}, 1)
	runCases(t, []opCase{
		{name: "max bool rows", op: "ReduceMax", opset: 20, in: []*tensor.Tensor{b, axis1}, shape: tensor.Shape{2, 1}, want: "[true false]"},
		{name: "min bool rows", op: "ReduceMin", opset: 20, in: []*tensor.Tensor{b, axis1}, shape: tensor.Shape{2, 1}, want: "[false false]"},
		{name: "min bool all", op: "ReduceMin", opset: 20, attrs: attrs(intA("keepdims", 0)), in: []*tensor.Tensor{bt(tensor.Shape{2}, true, true)}, shape: tensor.Shape{}, want: "[true]"},
		{name: "max empty float", op: "ReduceMax", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Float32, tensor.Shape{2, 0, 4}), axis1}, shape: tensor.Shape{2, 1, 4}, want: "[-Inf -Inf -Inf -Inf -Inf -Inf -Inf -Inf]"},
		{name: "min empty float", op: "ReduceMin", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Float32, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[+Inf]"},
		{name: "max empty bool", op: "ReduceMax", opset: 20, in: []*tensor.Tensor{emptyT(tensor.Bool, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[false]"},
		{name: "min empty bool", op: "ReduceMin", opset: 20, in: []*tensor.Tensor{emptyT(tensor.Bool, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[true]"},
		{name: "max empty int8", op: "ReduceMax", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Int8, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[-128]"},
		{name: "min empty uint8", op: "ReduceMin", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Uint8, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[255]"},
		{name: "max empty int64", op: "ReduceMax", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Int64, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[-9223372036854775808]"},
		{name: "min empty int64", op: "ReduceMin", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Int64, tensor.Shape{1, 0}), axis1}, shape: tensor.Shape{1, 1}, want: "[9223372036854775807]"},
		{name: "mean empty float", op: "ReduceMean", opset: 18, in: []*tensor.Tensor{emptyT(tensor.Float32, tensor.Shape{2, 0, 3}), axis1}, shape: tensor.Shape{2, 1, 3}, want: "[0 0 0 0 0 0]"},
		{name: "mean empty float16 all", op: "ReduceMean", opset: 13, attrs: attrs(intA("keepdims", 0)), in: []*tensor.Tensor{emptyT(tensor.Float16, tensor.Shape{0, 4})}, shape: tensor.Shape{}, want: "[0]"},
		{name: "sum empty float", op: "ReduceSum", opset: 13, in: []*tensor.Tensor{emptyT(tensor.Float32, tensor.Shape{2, 0}), axis1}, shape: tensor.Shape{2, 1}, want: "[0 0]"},
		{name: "min empty int32", op: "ReduceMin", opset: 13, attrs: attrs(intA("keepdims", 0)), in: []*tensor.Tensor{emptyT(tensor.Int32, tensor.Shape{0})}, shape: tensor.Shape{}, want: "[2147483647]"},
	})
	if _, err := call("ReduceSum", 13, nil, 1, b); err == nil {
		t.Errorf("ReduceSum of bool: no error")
	}
}

// TestNarrowIntTypes covers int16, uint16 and uint32 in arithmetic (which
// wraps like numpy), comparison, Cast and reductions.
func TestNarrowIntTypes(t *testing.T) {
	i16, _ := tensor.FromSlice(tensor.Shape{3}, []int16{32767, -5, 7})
	one16, _ := tensor.FromSlice(tensor.Shape{1}, []int16{1})
	u16, _ := tensor.FromSlice(tensor.Shape{2}, []uint16{65535, 3})
	u32, _ := tensor.FromSlice(tensor.Shape{2}, []uint32{4294967295, 10})
	two32, _ := tensor.FromSlice(tensor.Shape{1}, []uint32{2})
	boolT, f32 := tensor.Bool, tensor.Float32
	runCases(t, []opCase{
		{name: "int16 add wraps", op: "Add", opset: 14, in: []*tensor.Tensor{i16, one16}, shape: tensor.Shape{3}, want: "[-32768 -4 8]"},
		{name: "uint16 mul wraps", op: "Mul", opset: 14, in: []*tensor.Tensor{u16, u16}, shape: tensor.Shape{2}, want: "[1 9]"},
		{name: "uint32 div", op: "Div", opset: 14, in: []*tensor.Tensor{u32, two32}, shape: tensor.Shape{2}, want: "[2147483647 5]"},
		{name: "uint32 greater", op: "Greater", opset: 13, in: []*tensor.Tensor{u32, two32}, shape: tensor.Shape{2}, want: "[true true]", dtype: boolT},
		{name: "int16 max", op: "Max", opset: 13, in: []*tensor.Tensor{i16, one16}, shape: tensor.Shape{3}, want: "[32767 1 7]"},
		{name: "int16 reducemin", op: "ReduceMin", opset: 18, attrs: attrs(intA("keepdims", 0)), in: []*tensor.Tensor{i16}, shape: tensor.Shape{}, want: "[-5]"},
		{name: "uint32 to float", op: "Cast", opset: 13, attrs: attrs(intA("to", 1)), in: []*tensor.Tensor{u32}, shape: tensor.Shape{2}, want: "[4.295e+09 10]", dtype: f32},
		{name: "float to uint16", op: "Cast", opset: 13, attrs: attrs(intA("to", 4)), in: []*tensor.Tensor{ft(tensor.Shape{2}, 3.7, 65535)}, shape: tensor.Shape{2}, want: "[3 65535]", dtype: tensor.Uint16},
		{name: "int64 to int16 wraps", op: "Cast", opset: 13, attrs: attrs(intA("to", 5)), in: []*tensor.Tensor{it(tensor.Shape{2}, 32768, -1)}, shape: tensor.Shape{2}, want: "[-32768 -1]", dtype: tensor.Int16},
	})
}

// TestReduceSumMeanF32 compares ReduceSum and ReduceMean of float32 inputs
// with a naive reference (a float64 sum in index order, divided by the
// count, rounded to float32: the kernel's definition) over shapes and axes
// that take the trailing-axes path (RMSNorm's ReduceMean over the last
// axis) and the general one, bit for bit.
func TestReduceSumMeanF32(t *testing.T) {
	cases := []struct {
		shape tensor.Shape
		axes  []int64
	}{
		{tensor.Shape{1, 1, 64}, []int64{-1}},
		{tensor.Shape{2, 3, 5}, []int64{2}},
		{tensor.Shape{2, 3, 5}, []int64{1, 2}},
		{tensor.Shape{2, 3, 5}, nil},
		{tensor.Shape{2, 3, 5}, []int64{0}},
		{tensor.Shape{2, 3, 5}, []int64{1}},
		{tensor.Shape{2, 3, 5}, []int64{0, 2}},
		{tensor.Shape{4, 0, 3}, []int64{2}},
		{tensor.Shape{7}, []int64{0}},
	}
	for _, c := range cases {
		n := c.shape.Size()
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(i%7)*0.37 - 1.1 + float32(i)*1e-3
		}
		x := ft(c.shape, v...)
		red := make([]bool, len(c.shape))
		for _, a := range c.axes {
			red[(int(a)+len(c.shape))%len(c.shape)] = true
		}
		if c.axes == nil {
			for i := range red {
				red[i] = true
			}
		}
		for _, op := range []string{"ReduceSum", "ReduceMean"} {
			for _, keep := range []int64{0, 1} {
				var outShape, keepShape tensor.Shape
				for i, d := range c.shape {
					if red[i] {
						keepShape = append(keepShape, 1)
						if keep == 1 {
							outShape = append(outShape, 1)
						}
					} else {
						keepShape = append(keepShape, d)
						outShape = append(outShape, d)
					}
				}
				acc := make([]float64, keepShape.Size())
				idx := make([]int, n)
				if err := tensor.BroadcastIndex(keepShape, c.shape, idx); err != nil {
					t.Fatal(err)
				}
				for i, e := range v {
					acc[idx[i]] += float64(e)
				}
				want := make([]float32, len(acc))
				for i, a := range acc {
					if op == "ReduceMean" && len(acc) > 0 {
						a /= float64(n / len(acc))
					}
					want[i] = float32(a)
				}
				ins := []*tensor.Tensor{x}
				if c.axes != nil {
					ins = append(ins, it(tensor.Shape{len(c.axes)}, c.axes...))
				}
				outs, err := call(op, 18, attrs(intA("keepdims", keep)), 1, ins...)
				if err != nil {
					t.Fatalf("%s %v axes %v: %v", op, c.shape, c.axes, err)
				}
				got := outs[0]
				if !got.Shape().Equal(outShape) {
					t.Errorf("%s %v axes %v keepdims %d: shape %v, want %v", op, c.shape, c.axes, keep, got.Shape(), outShape)
					continue
				}
				for i, w := range want {
					if g := got.Float32()[i]; math.Float32bits(g) != math.Float32bits(w) && !(w != w && g != g) {
						t.Errorf("%s %v axes %v: [%d] = %v, want %v", op, c.shape, c.axes, i, g, w)
						break
					}
				}
			}
		}
	}
}
