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

// TestDots4HalfAsmBitIdentical checks that the fp16/bf16 four-row score
// loops (their K rows read side by side) accumulate in the float32 loop's
// order: their scores are bit-identical to dots4asm on the widened rows,
// head dims 32-256, 4 to 64 tokens.
func TestDots4HalfAsmBitIdentical(t *testing.T) {
	if x := archsimd.X86; !x.AVX512() || !x.FMA() {
		t.Skip("no AVX-512")
	}
	rng := rand.New(rand.NewPCG(23, 24))
	for _, bf := range []bool{false, true} {
		for _, d := range []int{32, 64, 128, 160, 256} {
			for _, n := range []int{4, 8, 12, 64} {
				q := randVec(rng, 4*d, 1)
				kf, kh := randHalfVec(rng, n*d, bf)
				want, got := make([]float32, 4*n), make([]float32, 4*n)
				dots4asm(&want[0], n*4, &q[0], &kf[0], d*4, n, 64*d*4)
				if bf {
					dots4bf16asm(&got[0], n*4, &q[0], &kh[0], d*2, n, 64*d*2)
				} else {
					dots4f16asm(&got[0], n*4, &q[0], &kh[0], d*2, n, 64*d*2)
				}
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("bf=%v d=%d n=%d: s[%d] = %v, float32 loop %v", bf, d, n, i, got[i], want[i])
					}
				}
			}
		}
	}
}
