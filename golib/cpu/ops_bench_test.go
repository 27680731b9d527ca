package cpu

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkOps times the inner loops of every path on one L1-resident
// block (32 tokens, head_dim 128): compute cost without memory stalls.
func BenchmarkOps(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const n, d = 32, 128
	q := randVec(rng, d, 1)
	kv := randVec(rng, n*d, 1)
	s := make([]float32, n)
	acc := make([]float32, d)
	for _, k := range kernelVariants {
		b.Run(k.name+"/dots", func(b *testing.B) {
			for b.Loop() {
				k.dots(s, q, kv, d, 0)
			}
		})
		b.Run(k.name+"/axpy", func(b *testing.B) {
			for b.Loop() {
				k.axpy(acc, s, kv, 0.5, 0)
			}
		})
		s4 := make([]float32, 4*n)
		q4 := randVec(rng, 4*d, 1)
		acc4 := make([]float32, 4*d)
		b.Run(k.name+"/dots4", func(b *testing.B) {
			for b.Loop() {
				k.dots4(s4, q4, kv, d, 0)
			}
		})
		b.Run(k.name+"/axpy4", func(b *testing.B) {
			al := [4]float32{1, 0.5, 1, 1}
			for b.Loop() {
				k.axpy4(acc4, s4, kv, &al, 0)
			}
		})
		b.Run(k.name+"/exp", func(b *testing.B) {
			for b.Loop() {
				k.expSub(s, 1)
			}
		})
		b.Run(k.name+"/cvtf16", func(b *testing.B) {
			src := make([]uint16, n*d)
			for b.Loop() {
				k.cvtF16(kv, src)
			}
		})
	}
}
