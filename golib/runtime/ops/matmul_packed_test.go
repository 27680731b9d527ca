package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// runWithConstB runs op with input 1 marked as a constant (an initializer),
// the case that packs B once for short products.
func runWithConstB(t *testing.T, op string, attrs Attributes, inputs ...*tensor.Tensor) []float32 {
	t.Helper()
	f, err := Lookup("", op, 13)
	if err != nil {
		t.Fatal(err)
	}
	if attrs == nil {
		attrs = Attributes{}
	}
	n := &Node{OpType: op, Opset: 13, Attrs: attrs, NumInputs: len(inputs), NumOutputs: 1,
		InputPresent: make([]bool, len(inputs)), OutputPresent: []bool{true}, Constants: make([]*tensor.Tensor, len(inputs))}
	for i := range inputs {
		n.InputPresent[i] = true
	}
	n.Constants[1] = inputs[1]
	k, err := f(n)
	if err != nil {
		t.Fatal(err)
	}
	var got []float32
	for range 2 { // the second run reuses the pack
		ctx := NewContext(inputs, n.OutputPresent, 2, nil)
		if err := k.Compute(ctx); err != nil {
			t.Fatal(err)
		}
		if got, err = tensor.AsFloat32(ctx.Output(0)); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// TestMatMulConstBPacked checks MatMul with a constant float32 B (packed
// for at most four rows, streamed otherwise) against the naive product.
func TestMatMulConstBPacked(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, k := range []int{1, 3, 17, 129} {
		for _, n := range []int{1, 17, 33, 1376} {
			for _, as := range []tensor.Shape{{k}, {1, k}, {3, k}, {2, 2, k}, {5, k}} {
				t.Run(fmt.Sprintf("a%v_n%d", as, n), func(t *testing.T) {
					a, b := randT(r, as), randT(r, tensor.Shape{k, n})
					want := naiveMatMul(t, a, b)
					got := runWithConstB(t, "MatMul", nil, a, b)
					for i := range want {
						if got[i] != want[i] {
							t.Fatalf("out[%d] = %v, want %v", i, got[i], want[i])
						}
					}
				})
			}
		}
	}
}

// TestGemmConstBPacked checks Gemm with a constant B, both layouts, and a
// bias, against the same Gemm without the constant marked.
func TestGemmConstBPacked(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for _, tb := range []int64{0, 1} {
		for _, ta := range []int64{0, 1} {
			for _, m := range []int{1, 3, 6} {
				k, n := 17, 45
				as, bs := tensor.Shape{m, k}, tensor.Shape{k, n}
				if ta != 0 {
					as = tensor.Shape{k, m}
				}
				if tb != 0 {
					bs = tensor.Shape{n, k}
				}
				a, b, c := randT(r, as), randT(r, bs), randT(r, tensor.Shape{n})
				attrs := Attributes{
					"transA": {Name: "transA", Type: AttrInt, I: ta},
					"transB": {Name: "transB", Type: AttrInt, I: tb},
					"alpha":  {Name: "alpha", Type: AttrFloat, F: 0.5},
					"beta":   {Name: "beta", Type: AttrFloat, F: 2},
				}
				outs, err := call("Gemm", 13, attrs, 1, a, b, c)
				if err != nil {
					t.Fatal(err)
				}
				want := outs[0].Float32()
				got := runWithConstB(t, "Gemm", attrs, a, b, c)
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("transA=%d transB=%d m=%d: out[%d] = %v, want %v", ta, tb, m, i, got[i], want[i])
					}
				}
			}
		}
	}
}

// toHalf returns x converted to dt (float16 or bfloat16).
func toHalf(t *testing.T, x *tensor.Tensor, dt tensor.DType) *tensor.Tensor {
	t.Helper()
	h, err := tensor.New(dt, x.Shape())
	if err != nil {
		t.Fatal(err)
	}
	if err := tensor.FromFloat32(h, x.Float32()); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestMatMulConstHalfBPacked checks MatMul and Gemm with a constant
// float16/bfloat16 B (packed in its encoding: the decode rows widen each
// sliver, longer products each k-block) against the same op with B not
// marked constant (streamed as stored).
func TestMatMulConstHalfBPacked(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, dt := range []tensor.DType{tensor.Float16, tensor.BFloat16} {
		for _, k := range []int{1, 17, 300} {
			for _, n := range []int{1, 33, 530} {
				for _, as := range []tensor.Shape{{1, k}, {4, k}, {2, 3, k}, {70, k}} {
					t.Run(fmt.Sprintf("%v_a%v_n%d", dt, as, n), func(t *testing.T) {
						a, b := toHalf(t, randT(r, as), dt), toHalf(t, randT(r, tensor.Shape{k, n}), dt)
						outs, err := call("MatMul", 13, nil, 1, a, b)
						if err != nil {
							t.Fatal(err)
						}
						want, err := tensor.AsFloat32(outs[0])
						if err != nil {
							t.Fatal(err)
						}
						got := runWithConstB(t, "MatMul", nil, a, b)
						tol := 1e-2
						if dt == tensor.BFloat16 {
							tol = 1e-1
						}
						for i := range want {
							if d := math.Abs(float64(got[i] - want[i])); d > tol*(1+math.Abs(float64(want[i]))) {
								t.Fatalf("out[%d] = %v, want %v", i, got[i], want[i])
							}
						}
					})
				}
			}
		}
	}
}
