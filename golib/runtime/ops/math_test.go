package ops

import (
	"errors"
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestSoftmaxAndReductions(t *testing.T) {
	x := ft(tensor.Shape{2, 2}, 0, 0, 1, 3)
	x3 := ft(tensor.Shape{2, 2, 2}, 1, 2, 3, 4, 5, 6, 7, 8)
	runCases(t, []opCase{
		{name: "softmax last axis", op: "Softmax", opset: 13, in: []*tensor.Tensor{x}, shape: tensor.Shape{2, 2}, want: "[0.5 0.5 0.1192 0.8808]"},
		{name: "softmax axis 0", op: "Softmax", opset: 13, attrs: attrs(intA("axis", 0)), in: []*tensor.Tensor{x}, shape: tensor.Shape{2, 2}, want: "[0.2689 0.04743 0.7311 0.9526]"},
	})
	// Softmax-11 over the flattened tail of axis 0: all four values at once.
	outs, err := call("Softmax", 11, attrs(intA("axis", 0)), 1, x)
	if err != nil || values(outs[0]) != "[0.04032 0.04032 0.1096 0.8098]" {
		t.Errorf("Softmax-11 axis 0: %v %s", err, values(outs[0]))
	}
	runCases(t, []opCase{
		{name: "reducemean axes input", op: "ReduceMean", opset: 18, in: []*tensor.Tensor{x3, it(tensor.Shape{1}, -1)}, shape: tensor.Shape{2, 2, 1}, want: "[1.5 3.5 5.5 7.5]"},
		{name: "reducemean attr no keepdims", op: "ReduceMean", opset: 13, attrs: attrs(ints("axes", 0, 2), intA("keepdims", 0)), in: []*tensor.Tensor{x3}, shape: tensor.Shape{2}, want: "[3.5 5.5]"},
		{name: "reducesum all", op: "ReduceSum", opset: 13, in: []*tensor.Tensor{x3}, shape: tensor.Shape{1, 1, 1}, want: "[36]"},
		{name: "reducesum noop", op: "ReduceSum", opset: 13, attrs: attrs(intA("noop_with_empty_axes", 1)), in: []*tensor.Tensor{x}, shape: tensor.Shape{2, 2}, want: "[0 0 1 3]"},
		{name: "reducesum int", op: "ReduceSum", opset: 13, in: []*tensor.Tensor{it(tensor.Shape{2, 2}, 1, 2, 3, 4), it(tensor.Shape{1}, 0)}, shape: tensor.Shape{1, 2}, want: "[4 6]"},
		{name: "reducesum opset 11 attr", op: "ReduceSum", opset: 11, attrs: attrs(ints("axes", 1)), in: []*tensor.Tensor{x}, shape: tensor.Shape{2, 1}, want: "[0 4]"},
	})
	if _, err := call("ReduceSum", 13, nil, 1, x, it(tensor.Shape{1}, 5)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("ReduceSum axis out of range: %v", err)
	}
}

func TestNormalizations(t *testing.T) {
	x := ft(tensor.Shape{2, 4}, 1, 2, 3, 4, -1, 1, -1, 1)
	scale := ft(tensor.Shape{4}, 1, 1, 2, 2)
	bias := ft(tensor.Shape{4}, 0, 0, 0, 1)
	// row 0: mean 2.5, var 1.25; row 1: mean 0, var 1 (eps 0 for round numbers)
	noEps := attrs(fltA("epsilon", 0))
	runCases(t, []opCase{
		{name: "layernorm", op: "LayerNormalization", opset: 17, attrs: noEps, in: []*tensor.Tensor{x, scale, bias}, shape: tensor.Shape{2, 4},
			want: "[-1.342 -0.4472 0.8944 3.683 -1 1 -2 3]"},
		{name: "layernorm mean output", op: "LayerNormalization", opset: 17, attrs: noEps, in: []*tensor.Tensor{x, scale}, shape: tensor.Shape{2, 1},
			want: "[2.5 0]", nOut: 3, outIdx: 1},
		{name: "layernorm invstd output", op: "LayerNormalization", opset: 17, attrs: noEps, in: []*tensor.Tensor{x, scale}, shape: tensor.Shape{2, 1},
			want: "[0.8944 1]", nOut: 3, outIdx: 2},
		// rms of row 0 = sqrt(30/4) = 2.7386
		{name: "rmsnorm", op: "RMSNormalization", opset: 23, attrs: noEps, in: []*tensor.Tensor{x, scale}, shape: tensor.Shape{2, 4},
			want: "[0.3651 0.7303 2.191 2.921 -1 1 -2 2]"},
		{name: "simplified layernorm", op: "SimplifiedLayerNormalization", opset: 1, attrs: noEps, in: []*tensor.Tensor{x, scale}, shape: tensor.Shape{2, 4},
			want: "[0.3651 0.7303 2.191 2.921 -1 1 -2 2]"},
		{name: "rmsnorm fp16", op: "RMSNormalization", opset: 23, attrs: noEps, in: []*tensor.Tensor{f16(x), f16(scale)}, shape: tensor.Shape{2, 4},
			want: "[0.3652 0.7305 2.191 2.922 -1 1 -2 2]"},
		{name: "layernorm over two axes", op: "LayerNormalization", opset: 17, attrs: attrs(fltA("epsilon", 0), intA("axis", 0)),
			in: []*tensor.Tensor{ft(tensor.Shape{2, 2}, 1, 1, 3, 3), ft(tensor.Shape{2, 2}, 1, 1, 1, 1)}, shape: tensor.Shape{2, 2}, want: "[-1 -1 1 1]"},
	})
	if _, err := call("LayerNormalization", 17, nil, 1, x, ft(tensor.Shape{3}, 1, 2, 3)); !errors.Is(err, errs.ErrShape) {
		t.Errorf("scale of the wrong size: %v", err)
	}
}

func TestRotaryEmbedding(t *testing.T) {
	// One head of size 4, two tokens; position 0 is the identity rotation,
	// position 1 rotates by 90 degrees (cos 0, sin 1).
	cos := ft(tensor.Shape{2, 2}, 1, 1, 0, 0)
	sin := ft(tensor.Shape{2, 2}, 0, 0, 1, 1)
	x4 := ft(tensor.Shape{1, 1, 2, 4}, 1, 2, 3, 4, 1, 2, 3, 4) // [B, H, S, D]
	pos := it(tensor.Shape{1, 2}, 0, 1)
	runCases(t, []opCase{
		// half split: (x1, x2) = (x[:2], x[2:]) -> (-x2, x1) at 90 degrees
		{name: "4D half", op: "RotaryEmbedding", opset: 23, in: []*tensor.Tensor{x4, cos, sin, pos}, shape: tensor.Shape{1, 1, 2, 4},
			want: "[1 2 3 4 -3 -4 1 2]"},
		{name: "4D interleaved", op: "RotaryEmbedding", opset: 23, attrs: attrs(intA("interleaved", 1)), in: []*tensor.Tensor{x4, cos, sin, pos},
			shape: tensor.Shape{1, 1, 2, 4}, want: "[1 2 3 4 -2 1 -4 3]"},
		{name: "3D two heads, partial rotation", op: "RotaryEmbedding", opset: 23, attrs: attrs(intA("num_heads", 2), intA("rotary_embedding_dim", 2)),
			in:    []*tensor.Tensor{ft(tensor.Shape{1, 1, 4}, 1, 2, 3, 4), ft(tensor.Shape{2, 1}, 1, 0), ft(tensor.Shape{2, 1}, 0, 1), it(tensor.Shape{1, 1}, 1)},
			shape: tensor.Shape{1, 1, 4}, want: "[-2 1 -4 3]"},
		{name: "caches without position ids", op: "RotaryEmbedding", opset: 23,
			in: []*tensor.Tensor{x4, ft(tensor.Shape{1, 2, 2}, 1, 1, 0, 0), ft(tensor.Shape{1, 2, 2}, 0, 0, 1, 1)}, shape: tensor.Shape{1, 1, 2, 4},
			want: "[1 2 3 4 -3 -4 1 2]"},
	})
	outs, err := callDomain("com.microsoft", "RotaryEmbedding", 1, nil, 1, x4, it(tensor.Shape{1}, 0), cos, sin)
	if err != nil || values(outs[0]) != "[1 2 3 4 -3 -4 1 2]" {
		t.Errorf("com.microsoft with a position offset: %v %s", err, values(outs[0]))
	}
	if _, err := call("RotaryEmbedding", 23, nil, 1, x4, cos, sin, it(tensor.Shape{1, 2}, 0, 7)); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Errorf("position outside the cache: %v", err)
	}
}

// TestFloat64SoftmaxGelu checks that float64 Softmax, LogSoftmax and Gelu
// compute in float64 (they went through float32: values beyond its range
// became NaN or inf and in-range ones lost about 1e-7): the results are
// onnx.reference's, exact or within a few ulps of float64.
func TestFloat64SoftmaxGelu(t *testing.T) {
	f64 := func(shape tensor.Shape, v ...float64) *tensor.Tensor {
		x, err := tensor.FromSlice(shape, v)
		if err != nil {
			t.Fatal(err)
		}
		return x
	}
	// many rows (with two threads: the parallel path), values that
	// float32 cannot tell apart
	big := make([]float64, 2*130)
	for i := range big {
		big[i] = 1 + float64(i%2)*1e-12 + float64(i/2)*1e-3
	}
	bigWant := make([]float64, len(big))
	for r := 0; r < len(big); r += 2 {
		e := math.Exp(big[r] - big[r+1])
		bigWant[r], bigWant[r+1] = e/(e+1), 1/(e+1)
	}
	cases := []struct {
		name  string
		op    string
		opset int
		attrs Attributes
		x     *tensor.Tensor
		want  []float64
	}{
		{name: "softmax beyond float32", op: "Softmax", opset: 13, x: f64(tensor.Shape{2}, 1e300, 0), want: []float64{1, 0}},
		{name: "softmax close values", op: "Softmax", opset: 13, x: f64(tensor.Shape{4}, 1e-3, 2e-3, 1, 1+1e-12),
			want: []float64{0.1345509239182698, 0.1346855421400808, 0.365381766970642, 0.36538176697100744}},
		{name: "softmax axis 0 (strided)", op: "Softmax", opset: 13, attrs: attrs(intA("axis", 0)), x: f64(tensor.Shape{2, 2}, 1e300, 0, 0, 0),
			want: []float64{1, 0.5, 0, 0.5}},
		{name: "softmax-11 flattened tail", op: "Softmax", opset: 11, attrs: attrs(intA("axis", 0)), x: f64(tensor.Shape{2, 2}, 1e300, 0, 0, 0),
			want: []float64{1, 0, 0, 0}},
		{name: "softmax many rows", op: "Softmax", opset: 13, x: f64(tensor.Shape{130, 2}, big...), want: bigWant},
		{name: "softmax rank 0", op: "Softmax", opset: 13, x: f64(tensor.Shape{}, 1e300), want: []float64{1}},
		{name: "logsoftmax beyond float32", op: "LogSoftmax", opset: 13, x: f64(tensor.Shape{2}, 1e40, 0), want: []float64{0, -1e40}},
		{name: "logsoftmax", op: "LogSoftmax", opset: 13, x: f64(tensor.Shape{3}, 0.1, 0.2, 0.3),
			want: []float64{-1.201942848229244, -1.101942848229244, -1.001942848229244}},
		// 3 * Phi(3) = 2.9959503059051097
		{name: "gelu exact", op: "Gelu", opset: 20, x: f64(tensor.Shape{4}, 0.5, 3, 1e39, -1e39),
			want: []float64{0.34573123063700656, 2.9959503059051097, 1e39, 0}},
		{name: "gelu tanh", op: "Gelu", opset: 20, attrs: attrs(strA("approximate", "tanh")), x: f64(tensor.Shape{3}, 0.5, 3, 1e39),
			want: []float64{0.34571400982514394, 2.996362607918227, 1e39}},
	}
	for _, c := range cases {
		outs, err := call(c.op, c.opset, c.attrs, 1, c.x)
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		y := outs[0]
		if y.DType() != tensor.Float64 || !y.Shape().Equal(c.x.Shape()) {
			t.Errorf("%s: %v %v, want float64 %v", c.name, y.DType(), y.Shape(), c.x.Shape())
			continue
		}
		for i, g := range y.Float64() {
			if w := c.want[i]; g != w && math.Abs(g-w) > 4e-16*math.Abs(w) {
				t.Errorf("%s: element %d is %v, want %v", c.name, i, g, w)
			}
		}
	}
	outs, err := callDomain("com.microsoft", "FastGelu", 1, nil, 1, f64(tensor.Shape{2}, 3, 1e39))
	if err != nil || outs[0].Float64()[0] != 2.996362607918227 || outs[0].Float64()[1] != 1e39 {
		t.Errorf("float64 FastGelu: %v %v", err, outs)
	}
	// the float32 kernels are unchanged
	outs, err = call("Softmax", 13, nil, 1, ft(tensor.Shape{2}, 1e30, 0))
	if err != nil || values(outs[0]) != "[1 0]" {
		t.Errorf("float32 Softmax: %v %s", err, values(outs[0]))
	}
}

// TestFloatOnlyOpsRefuseIntegers: ops ONNX defines for float types only
// refuse an integer input with ErrType (Softmax, LogSoftmax and the norms
// ran integer arithmetic and returned numbers: Softmax([1, 2]) = [0, 0]).
func TestFloatOnlyOpsRefuseIntegers(t *testing.T) {
	x := i32t(tensor.Shape{2, 2}, 1, 2, 3, 4)
	scale := i32t(tensor.Shape{2}, 1, 1)
	cases := []struct {
		domain, op string
		opset      int
		in         []*tensor.Tensor
	}{
		{"", "Softmax", 13, []*tensor.Tensor{x}},
		{"", "LogSoftmax", 13, []*tensor.Tensor{x}},
		{"", "LayerNormalization", 17, []*tensor.Tensor{x, scale}},
		{"", "RMSNormalization", 23, []*tensor.Tensor{x, scale}},
		{"com.microsoft", "SimplifiedLayerNormalization", 1, []*tensor.Tensor{x, scale}},
		{"com.microsoft", "SkipLayerNormalization", 1, []*tensor.Tensor{x, x, scale}},
		{"", "IsNaN", 20, []*tensor.Tensor{x}},
	}
	for _, c := range cases {
		if _, err := callDomain(c.domain, c.op, c.opset, nil, 1, c.in...); !errors.Is(err, errs.ErrType) {
			t.Errorf("%s on int32: err %v, want ErrType", c.op, err)
		}
	}
}
