//go:build goexperiment.simd && amd64

package gemm

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestPanelQuantRowKernels checks the one-row quantized products of every
// SIMD kernel set against the AVX2 one (the same NaN and infinities, finite
// values within float32 rounding) and against the portable
// dequantize-then-multiply: 4 and 8 bits, 0-33 rows, NaN, infinite and tiny
// scales and zeros.
func TestPanelQuantRowKernels(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	s, z := edgeScalesZeros(r, 16)
	withPath(t, func(t *testing.T) {
		ks := active()
		if ks.name == "go" {
			return
		}
		for _, nibbles := range []bool{false, true} {
			for _, rows := range []int{0, 1, 2, 5, 16, 33} {
				rb := packNR
				if nibbles {
					rb = packNR / 2
				}
				src := make([]byte, rows*rb)
				for i := range src {
					src[i] = byte(r.Uint32())
				}
				a := randSlice(r, rows)
				var want, got, deq [packNR]float32
				for i := range want {
					want[i] = float32(r.NormFloat64())
				}
				got, deq = want, want
				panelQuantRowAVX2(nibbles, a, src, &s, &z, &want)
				ks.panelQuantRow(nibbles, a, src, &s, &z, &got)
				w := make([]float32, rows*packNR)
				dequantGo(nibbles, w, src, &s, &z)
				for c := range deq {
					for i := 0; i < rows; i++ {
						deq[c] += a[i] * w[i*packNR+c]
					}
				}
				for c := range want {
					g, w := float64(got[c]), float64(want[c])
					same := g == w || (math.IsNaN(g) && math.IsNaN(w)) || math.Abs(g-w) <= 1e-5*(1+math.Abs(w))
					if !same {
						t.Fatalf("%s nibbles %v rows %d column %d: %v, AVX2 loop %v", ks.name, nibbles, rows, c, got[c], want[c])
					}
					finite := !math.IsNaN(float64(deq[c])) && !math.IsInf(float64(deq[c]), 0) && s[c] < 1e30
					if d := float64(got[c] - deq[c]); finite && math.Abs(d) > 1e-3*(1+math.Abs(float64(deq[c]))) {
						t.Fatalf("%s nibbles %v rows %d column %d: %v, dequantized product %v", ks.name, nibbles, rows, c, got[c], deq[c])
					}
				}
			}
		}
	})
}
