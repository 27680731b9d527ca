//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"math/rand/v2"
	"simd/archsimd"
	"testing"
)

// TestExpSubAsm checks the assembly exp loop against the archsimd one
// (same algorithm and constants) on lengths around the vector width,
// including inputs below the clamp.
func TestExpSubAsm(t *testing.T) {
	if x := archsimd.X86; !x.AVX512() || !x.FMA() {
		t.Skip("no AVX-512")
	}
	rng := rand.New(rand.NewPCG(1, 3))
	for _, n := range []int{1, 15, 16, 17, 128, 131} {
		a := make([]float32, n)
		for i := range a {
			a[i] = float32(rng.NormFloat64() * 30)
		}
		a[0] = -200
		b := append([]float32(nil), a...)
		sa := expSub16(a, 3)
		sb := expSubx16(b, 3)
		for i := range a {
			if d := math.Abs(float64(a[i] - b[i])); d > 1e-6*math.Abs(float64(a[i])) {
				t.Fatalf("n=%d element %d: asm %v, archsimd %v", n, i, b[i], a[i])
			}
		}
		if d := math.Abs(float64(sa - sb)); d > 1e-5*math.Abs(float64(sa)) {
			t.Fatalf("n=%d sum: asm %v, archsimd %v", n, sb, sa)
		}
	}
}
