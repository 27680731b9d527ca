package ops

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// halfValues returns n float32 values with specials mixed in (NaN,
// infinities, signed zeros, float16 subnormals and overflowing magnitudes).
func halfValues(r *rand.Rand, n int, scale float32) []float32 {
	special := []float32{0, float32(math.Copysign(0, -1)), float32(math.NaN()), float32(math.Inf(1)),
		float32(math.Inf(-1)), 6e-8, -3e-5, 65504, -60000, 1e-4, 300, -17}
	v := make([]float32, n)
	for i := range v {
		v[i] = (r.Float32()*2 - 1) * scale
		if r.IntN(13) == 0 {
			v[i] = special[r.IntN(len(special))]
		}
	}
	return v
}

// halfT is a tensor of a float dtype dt (float32, float16 or bfloat16)
// holding v, rounded to dt.
func halfT(t *testing.T, dt tensor.DType, shape tensor.Shape, v []float32) *tensor.Tensor {
	t.Helper()
	out, err := tensor.New(dt, shape)
	if err != nil {
		t.Fatal(err)
	}
	if err := tensor.FromFloat32(out, v); err != nil {
		t.Fatal(err)
	}
	return out
}

// sameBits reports the first element where two 16-bit tensors differ, -1 if
// none (every NaN matches every NaN).
func sameBits(got, want *tensor.Tensor) int {
	g, w := tensor.Bits16(got.Float16()), tensor.Bits16(want.Float16())
	if got.DType() == tensor.BFloat16 {
		g, w = tensor.Bits16(got.BFloat16()), tensor.Bits16(want.BFloat16())
	}
	gf, wf := make([]float32, len(g)), make([]float32, len(w))
	_ = tensor.ToFloat32(got, gf)
	_ = tensor.ToFloat32(want, wf)
	for i := range w {
		if g[i] != w[i] && !(gf[i] != gf[i] && wf[i] != wf[i]) {
			return i
		}
	}
	return -1
}

// TestBinaryHalf checks the float16 and bfloat16 Add, Sub, Mul and Div
// against the generic element-by-element path (binaryCompute with the op's
// float32 function), bit for bit, over broadcast shapes and special values.
func TestBinaryHalf(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	shapes := [][2]tensor.Shape{
		{{16, 64}, {16, 64}},
		{{1, 16, 64}, {64}},
		{{1, 16, 128}, {1, 16, 1}},
		{{4, 1, 8}, {1, 5, 8}},
		{{}, {3, 7}},
		{{2, 3, 1}, {}},
		{{0, 4}, {4}},
		{{1, 1, 33}, {1, 1, 33}},
	}
	for _, dt := range []tensor.DType{tensor.Float16, tensor.BFloat16} {
		for _, name := range []string{"Add", "Sub", "Mul", "Div"} {
			for _, s := range shapes {
				t.Run(dt.String()+"/"+name+"/"+s[0].String()+"x"+s[1].String(), func(t *testing.T) {
					a := halfT(t, dt, s[0], halfValues(r, s[0].Size(), 4))
					b := halfT(t, dt, s[1], halfValues(r, s[1].Size(), 3))
					outs, err := call(name, 14, nil, 1, a, b)
					if err != nil {
						t.Fatal(err)
					}
					want, err := tensor.New(dt, outs[0].Shape())
					if err != nil {
						t.Fatal(err)
					}
					if err := binaryCompute(nil, binaryOps[name], a, b, want); err != nil {
						t.Fatal(err)
					}
					if os, err := tensor.BroadcastShapes(s[0], s[1]); err != nil || !os.Equal(outs[0].Shape()) {
						t.Fatalf("shape %v, want %v (%v)", outs[0].Shape(), os, err)
					}
					if i := sameBits(outs[0], want); i >= 0 {
						t.Fatalf("element %d differs: %v vs %v", i, values(outs[0]), values(want))
					}
				})
			}
		}
	}
}

// TestUnaryHalfBulk checks the float16 and bfloat16 Sigmoid: the float32
// kernel's values on the widened input, rounded once, and within one
// 16-bit rounding step of the scalar sigmoid.
func TestUnaryHalfBulk(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	for _, dt := range []tensor.DType{tensor.Float16, tensor.BFloat16} {
		for _, n := range []int{0, 1, 15, 16, 17, 1024, 2049} {
			t.Run(dt.String()+"/"+tensor.Shape{n}.String(), func(t *testing.T) {
				v := halfValues(r, n, 12)
				x := halfT(t, dt, tensor.Shape{n}, v)
				outs, err := call("Sigmoid", 13, nil, 1, x)
				if err != nil {
					t.Fatal(err)
				}
				wide := make([]float32, n)
				if err := tensor.ToFloat32(x, wide); err != nil {
					t.Fatal(err)
				}
				ref := make([]float32, n)
				sigmoidSlice(ref, wide)
				want := halfT(t, dt, tensor.Shape{n}, ref)
				if i := sameBits(outs[0], want); i >= 0 {
					t.Fatalf("element %d (x=%v) differs from the rounded float32 kernel", i, wide[i])
				}
				got := make([]float32, n)
				_ = tensor.ToFloat32(outs[0], got)
				step := float64(1.0 / 1024)
				if dt == tensor.BFloat16 {
					step = 1.0 / 128
				}
				for i, w := range wide {
					s := float64(sigmoidf(w))
					if math.IsNaN(s) != math.IsNaN(float64(got[i])) || math.Abs(float64(got[i])-s) > step*math.Max(s, 1.0/16) {
						t.Fatalf("element %d: sigmoid(%v) = %v, scalar %v", i, w, got[i], s)
					}
				}
			})
		}
	}
}
