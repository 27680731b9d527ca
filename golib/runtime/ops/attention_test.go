package ops

import (
	"errors"
	"math"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// seq returns a float32 tensor of shape filled with start, start+step, ...
func seq(shape tensor.Shape, start, step float32) *tensor.Tensor {
	v := make([]float32, shape.Size())
	for i := range v {
		v[i] = start + float32(i)*step
	}
	return ft(shape, v...)
}

// With Q = 0 every score is 0, so each query row averages the values it may
// attend: the causal frontier, the past and GQA become visible in Y.
func TestAttentionUniformScores(t *testing.T) {
	const b, hq, hkv, s, p, d = 1, 4, 2, 2, 3, 2
	q := ft(tensor.Shape{b, hq, s, d}, make([]float32, b*hq*s*d)...)
	k := seq(tensor.Shape{b, hkv, s, d}, 1, 1)
	v := seq(tensor.Shape{b, hkv, s, d}, 100, 1)
	pk := seq(tensor.Shape{b, hkv, p, d}, -1, -1)
	pv := seq(tensor.Shape{b, hkv, p, d}, 0, 1)
	for _, dt := range []tensor.DType{tensor.Float32, tensor.Float16, tensor.BFloat16} {
		in := []*tensor.Tensor{q, k, v, nil, pk, pv}
		if dt != tensor.Float32 {
			for i, x := range in {
				if x != nil {
					in[i] = convertT(x, dt)
				}
			}
		}
		outs, err := call("Attention", 23, attrs(intA("is_causal", 1), intA("qk_matmul_output_mode", 3)), 4, in...)
		if err != nil {
			t.Fatalf("%v: %v", dt, err)
		}
		y, _ := tensor.AsFloat32(outs[0])
		pres, _ := tensor.AsFloat32(outs[2])
		probs, _ := tensor.AsFloat32(outs[3])
		if outs[0].DType() != dt || !outs[1].Shape().Equal(tensor.Shape{b, hkv, p + s, d}) {
			t.Fatalf("%v: Y %v, present_key %v", dt, outs[0].DType(), outs[1].Shape())
		}
		for h := range hq {
			kv := h / (hq / hkv)
			for i := range s {
				n := p + i + 1 // causal, aligned to the end of the cache
				for c := range d {
					var want float64
					for j := range n {
						want += float64(pres[((kv*(p+s))+j)*d+c])
					}
					want /= float64(n)
					got := float64(y[((h*s)+i)*d+c])
					if math.Abs(got-want) > 0.01*math.Abs(want)+1e-3 {
						t.Fatalf("%v: Y[h%d,i%d,%d] = %v, want %v", dt, h, i, c, got, want)
					}
				}
				row := probs[(h*s+i)*(p+s) : (h*s+i+1)*(p+s)]
				if row[n-1] == 0 || (n < p+s && row[n] != 0) {
					t.Fatalf("%v: probabilities row h%d i%d = %v", dt, h, i, row)
				}
			}
		}
	}
}

// The pooled float16 conversion must agree with the codec on every value.
func TestAttentionF16Conversion(t *testing.T) {
	all := make([]uint16, 1<<16)
	for i := range all {
		all[i] = uint16(i)
	}
	src, err := tensor.FromSlice(tensor.Shape{len(all)}, *(*[]tensor.Float16Bits)(unsafe.Pointer(&all)))
	if err != nil {
		t.Fatal(err)
	}
	ar := &f32Arena{threads: 2}
	defer ar.release()
	got := ar.f32(src)
	for i, h := range all {
		want := codec.F16ToF32(h)
		if math.Float32bits(got[i]) != math.Float32bits(want) && !(want != want && got[i] != got[i]) {
			t.Fatalf("%#04x: got %v want %v", h, got[i], want)
		}
	}
}

func TestAttention3DAndMasks(t *testing.T) {
	// 3D, 2 query heads over 1 KV head, bool mask hiding key 0 from row 0.
	q := ft(tensor.Shape{1, 2, 4}, make([]float32, 8)...)
	k := seq(tensor.Shape{1, 2, 2}, 0, 1)
	v := ft(tensor.Shape{1, 2, 2}, 1, 2, 3, 4)
	mask := bt(tensor.Shape{2, 2}, false, true, true, true)
	a := attrs(intA("q_num_heads", 2), intA("kv_num_heads", 1))
	outs, err := call("Attention", 23, a, 1, q, k, v, mask)
	if err != nil {
		t.Fatal(err)
	}
	// Row 0 sees only key 1 (V = [3 4]); row 1 averages both keys.
	if got := values(outs[0]); got != "[3 4 3 4 2 3 2 3]" {
		t.Fatalf("Y = %s", got)
	}
	// A float mask of -inf on a whole row gives a zero row, not NaN.
	fm := ft(tensor.Shape{1, 1, 2, 2}, float32(math.Inf(-1)), float32(math.Inf(-1)), 0, 0)
	outs, err = call("Attention", 23, a, 1, q, k, v, fm)
	if err != nil {
		t.Fatal(err)
	}
	if got := values(outs[0]); got != "[0 0 0 0 2 3 2 3]" {
		t.Fatalf("fully masked: Y = %s", got)
	}
}

func TestAttentionNonpad(t *testing.T) {
	q := ft(tensor.Shape{2, 1, 1, 2}, make([]float32, 4)...)
	k := seq(tensor.Shape{2, 1, 3, 2}, 0, 1)
	v := seq(tensor.Shape{2, 1, 3, 2}, 0, 1)
	np, _ := tensor.FromSlice(tensor.Shape{2}, []int64{1, 3})
	outs, err := call("Attention", 24, nil, 1, q, k, v, nil, nil, nil, np)
	if err != nil {
		t.Fatal(err)
	}
	// Batch 0 sees key 0 only (V [0 1]); batch 1 averages its three keys.
	if got := values(outs[0]); got != "[0 1 8 9]" {
		t.Fatalf("Y = %s", got)
	}
}

func TestAttentionSlidingWindow(t *testing.T) {
	// Q = 0: each row averages the values in its window of keys.
	q := ft(tensor.Shape{1, 1, 4, 1}, 0, 0, 0, 0)
	k := ft(tensor.Shape{1, 1, 4, 1}, 0, 0, 0, 0)
	v := ft(tensor.Shape{1, 1, 4, 1}, 1, 2, 4, 8)
	outs, err := call("Attention", 25, attrs(intA("left_window_size", 1), intA("is_causal", 1)), 1, q, k, v)
	if err != nil {
		t.Fatal(err)
	}
	if got := values(outs[0]); got != "[1 1.5 3 6]" {
		t.Fatalf("Y = %s", got)
	}
	outs, err = call("Attention", 26, attrs(intA("left_window_size", 0), intA("right_window_size", 1),
		intA("qk_matmul_output_mode", 2)), 4, q, k, v)
	if err != nil {
		t.Fatal(err)
	}
	if got := values(outs[0]); got != "[1.5 3 6 8]" {
		t.Fatalf("Y = %s", got)
	}
	if got := values(outs[3]); got != "[0 0 -Inf -Inf -Inf 0 0 -Inf -Inf -Inf 0 0 -Inf -Inf -Inf 0]" {
		t.Fatalf("qk = %s", got)
	}
	if _, err := call("Attention", 25, attrs(intA("left_window_size", -2)), 1, q, k, v); !errors.Is(err, errs.ErrInvalidArgument) {
		t.Fatalf("bad window: %v", err)
	}
}

func TestAttentionErrors(t *testing.T) {
	q := ft(tensor.Shape{1, 1, 2, 2}, 0, 0, 0, 0)
	cases := []struct {
		name  string
		attrs Attributes
		in    []*tensor.Tensor
		want  error
	}{
		{"rank mismatch", nil, []*tensor.Tensor{q, ft(tensor.Shape{1, 2, 2}, 0, 0, 0, 0), q}, errs.ErrShape},
		{"past key alone", nil, []*tensor.Tensor{q, q, q, nil, q}, errs.ErrShape},
		{"3D without heads", nil, []*tensor.Tensor{ft(tensor.Shape{1, 1, 2}, 0, 0), ft(tensor.Shape{1, 1, 2}, 0, 0), ft(tensor.Shape{1, 1, 2}, 0, 0)}, errs.ErrShape},
		{"integer Q", nil, []*tensor.Tensor{it(tensor.Shape{1, 1, 1, 1}, 1), q, q}, errs.ErrType},
		{"mixed types", nil, []*tensor.Tensor{q, f16(q), q}, errs.ErrType},
		{"bad mode", attrs(intA("qk_matmul_output_mode", 5)), []*tensor.Tensor{q, q, q}, errs.ErrInvalidArgument},
		{"bad softmax precision", attrs(intA("softmax_precision", 6)), []*tensor.Tensor{q, q, q}, errs.ErrInvalidArgument},
		{"missing V", nil, []*tensor.Tensor{q, q}, errs.ErrMissingInput},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := call("Attention", 24, c.attrs, 4, c.in...); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}
	if _, err := Lookup("", "Attention", 22); err == nil {
		t.Fatal("Attention must not resolve for opset 22")
	}
}
