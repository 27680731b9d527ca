package mha

import (
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// TestTanh checks Tanh on every instruction-set path against math.Tanh:
// at most 4 ulp over [-10, 10] in steps of 2^-12 and at the split, tiny
// values exact, signed zeros, infinities to +-1 and NaN kept, in vector
// lanes and in the tails, nothing written past len(src), and in place.
func TestTanh(t *testing.T) {
	defer gemm.SetPath("auto")
	var xs []float32
	for x := float32(-10); x <= 10; x += 1.0 / 4096 {
		xs = append(xs, x)
	}
	s := float32(tanhSplit)
	xs = append(xs, s, -s, math.Nextafter32(s, 0), -math.Nextafter32(s, 0), 1e-20, -1e-20, 1e-38, 3e-4, 20, -20, 1e30, -1e30)
	inf, nan := float32(math.Inf(1)), float32(math.NaN())
	negZero := float32(math.Copysign(0, -1))
	for _, path := range gemm.Paths() {
		gemm.SetPath(path)
		worst := 0.0
		for _, n := range []int{len(xs), 17, 16, 15, 8, 7, 1, 0} {
			got := make([]float32, n+1)
			got[n] = 42
			Tanh(got, xs[:n])
			for i, x := range xs[:n] {
				w := float32(math.Tanh(float64(x)))
				d := math.Abs(float64(got[i])-float64(w)) / ulp32(w)
				worst = max(worst, d)
				if d > 4 {
					t.Fatalf("%s: tanh(%v) = %v, want %v (%.1f ulp)", path, x, got[i], w, d)
				}
			}
			if got[n] != 42 {
				t.Fatalf("%s: wrote past the source length", path)
			}
		}
		sp := make([]float32, 0, 40)
		for range 8 { // specials in vector lanes and in the tail
			sp = append(sp, 0, negZero, inf, -inf, nan)
		}
		out := append([]float32(nil), sp...)
		Tanh(out, out) // in place
		for i, x := range sp {
			g := out[i]
			switch {
			case x != x:
				if g == g {
					t.Fatalf("%s: tanh(NaN) = %v", path, g)
				}
			case math.IsInf(float64(x), 0):
				if g != float32(math.Copysign(1, float64(x))) {
					t.Fatalf("%s: tanh(%v) = %v", path, x, g)
				}
			case g != 0 || math.Signbit(float64(g)) != math.Signbit(float64(x)):
				t.Fatalf("%s: tanh(%v) = %v (sign kept)", path, x, g)
			}
		}
		t.Logf("%s: worst %.2f ulp", path, worst)
	}
}
