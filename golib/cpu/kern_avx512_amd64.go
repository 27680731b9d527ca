//go:build goexperiment.simd && amd64

package cpu

import "unsafe"

// Declarations of kern_avx512_amd64.s (see there for the contracts).

//go:noescape
func dots4asm(s *float32, ldS int, q *float32, k *float32, rb int, nt int, pfd int)

//go:noescape
func axpy4asm(acc *float32, rb int, p *float32, ldP int, v *float32, n int, alpha *[4]float32, pfd int)

// prefetchTokens is how far ahead (in rows) the assembly loops prefetch K
// and V: two blocks (into L2), so the next blocks stream in while this one is
// computed.
var prefetchTokens = 64

// dots4x16 computes the scores of four rows with the assembly 4x4 register
// block (each K vector feeds four FMAs, each q vector four); the last n%4
// tokens and head dims that are not a multiple of 16 use the archsimd loops.
func dots4x16(s, q, k []float32, d int) {
	n := len(s) / 4
	if n == 0 {
		return
	}
	_, _, _ = s[4*n-1], q[4*d-1], k[n*d-1]
	if d&15 != 0 {
		dots4x16sim(s, q, k, d)
		return
	}
	n4 := n &^ 3
	if n4 > 0 {
		dots4asm(unsafe.SliceData(s), n*4, unsafe.SliceData(q), unsafe.SliceData(k), d*4, n4, prefetchTokens*d*4)
	}
	for r := n4; r < n; r++ {
		for j := 0; j < 4; j++ {
			dots16(s[j*n+r:j*n+r+1], q[j*d:(j+1)*d], k[r*d:(r+1)*d], d)
		}
	}
}

// axpy4x16 accumulates four rows with the assembly 4x64 register block
// when the head dim is a multiple of 64, else with the archsimd loops.
func axpy4x16(acc, p, v []float32, alpha *[4]float32) {
	d, n := len(acc)/4, len(p)/4
	if n == 0 || d == 0 {
		return
	}
	_, _ = p[4*n-1], v[n*d-1]
	if d&63 != 0 {
		axpy4x16sim(acc, p, v, alpha)
		return
	}
	axpy4asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), n*4, unsafe.SliceData(v), n, alpha, prefetchTokens*d*4)
}
