package mha

import (
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// TestErf32 bounds the scalar erf against math.Erf over [-6, 6] in steps
// of 2^-12: at most 2 ulp (1 measured), exact at 0 and saturated to ±1.
func TestErf32(t *testing.T) {
	for x := float32(-6); x <= 6; x += 1.0 / 4096 {
		got, want := erf32(x), float32(math.Erf(float64(x)))
		if d := math.Abs(float64(got) - float64(want)); d > 2*ulp32(want) {
			t.Fatalf("erf32(%v) = %v, want %v (%.1f ulp)", x, got, want, d/ulp32(want))
		}
	}
	for _, c := range []struct{ x, want float32 }{{0, 0}, {10, 1}, {-10, -1}, {float32(math.Inf(1)), 1}, {float32(math.Inf(-1)), -1}} {
		if got := erf32(c.x); got != c.want {
			t.Fatalf("erf32(%v) = %v, want %v", c.x, got, c.want)
		}
	}
}

func ulp32(v float32) float64 {
	a := float32(math.Abs(float64(v)))
	return float64(math.Nextafter32(a, float32(math.Inf(1))) - a)
}

// TestGeluPaths checks Gelu and GeluTanh on every instruction-set path
// against their float64 definitions (within 4e-7 relative plus 1e-7
// absolute near the zero of the negative tail), over both signs, the
// saturated ends, zeros, infinities and NaN, with lengths that leave
// vector tails.
func TestGeluPaths(t *testing.T) {
	defer gemm.SetPath("auto")
	inf := float32(math.Inf(1))
	x0 := []float32{0, float32(math.Copysign(0, -1)), 1e-8, -1e-8, 0.5, -0.5, 0.927, -0.928, 1, -1, 3.25, -3.25,
		5, -5, 10, -10, 50, -50, 1e30, inf}
	for k := range 97 {
		x0 = append(x0, float32(k)*0.125-6)
	}
	exact := func(x float64) float64 { return 0.5 * x * (1 + math.Erf(x/math.Sqrt2)) }
	tanhForm := func(x float64) float64 {
		return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
	}
	for _, path := range gemm.Paths() {
		gemm.SetPath(path)
		for _, f := range []struct {
			name string
			run  func(dst, src []float32)
			ref  func(float64) float64
		}{{"Gelu", Gelu, exact}, {"GeluTanh", GeluTanh, tanhForm}} {
			for _, n := range []int{len(x0), 15, 7, 1, 0} {
				got := make([]float32, n+1)
				got[n] = 42 // past len(src): untouched
				f.run(got, x0[:n])
				for i, x := range x0[:n] {
					w := f.ref(float64(x))
					if math.IsInf(float64(x), 1) {
						if !math.IsInf(float64(got[i]), 1) {
							t.Fatalf("%s %s(%v) = %v, want +Inf", path, f.name, x, got[i])
						}
						continue
					}
					if d := math.Abs(float64(got[i]) - w); d > 4e-7*math.Abs(w)+1e-7 {
						t.Fatalf("%s %s(%v) = %v, want %v", path, f.name, x, got[i], w)
					}
				}
				if got[n] != 42 {
					t.Fatalf("%s %s: wrote past the source length", path, f.name)
				}
			}
			nan := make([]float32, 17) // NaN in vector lanes and in the tail
			nan[0], nan[5], nan[16] = float32(math.NaN()), float32(math.NaN()), float32(math.NaN())
			nan[1] = 1
			out := make([]float32, len(nan))
			f.run(out, nan)
			for _, i := range []int{0, 5, 16} {
				if !math.IsNaN(float64(out[i])) {
					t.Fatalf("%s %s(NaN) at %d = %v, want NaN", path, f.name, i, out[i])
				}
			}
			if w := f.ref(1); math.Abs(float64(out[1])-w) > 4e-7 {
				t.Fatalf("%s %s(1) next to NaN = %v, want %v", path, f.name, out[1], w)
			}
		}
	}
}

// BenchmarkGelu times Gelu and GeluTanh on a decode step's MLP row
// (512 values) against the float64 math.Erf formula they replace.
func BenchmarkGelu(b *testing.B) {
	src := make([]float32, 512)
	for i := range src {
		src[i] = float32(i-256) / 50
	}
	dst := make([]float32, len(src))
	b.Run("erf", func(b *testing.B) {
		for b.Loop() {
			Gelu(dst, src)
		}
	})
	b.Run("tanh", func(b *testing.B) {
		for b.Loop() {
			GeluTanh(dst, src)
		}
	})
	b.Run("math.Erf", func(b *testing.B) {
		for b.Loop() {
			for i, x := range src {
				dst[i] = float32(0.5 * float64(x) * (1 + math.Erf(float64(x)/math.Sqrt2)))
			}
		}
	})
}
