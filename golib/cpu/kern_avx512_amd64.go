//go:build goexperiment.simd && amd64

package cpu

import "unsafe"

// Declarations of kern_avx512_amd64.s (see there for the contracts).

//go:noescape
func dots4asm(s *float32, ldS int, q *float32, k *float32, rb int, nt int, pfd int)

//go:noescape
func dots4wasm(s *float32, ldS int, q *float32, k *float32, nt int, pfd int)

//go:noescape
func axpy4wasm(acc *float32, rb int, p *float32, ldP int, v *float32, n int, alpha *[4]float32, pfd int, pfk int)

//go:noescape
func axpy4asm(acc *float32, rb int, p *float32, ldP int, v *float32, n int, alpha *[4]float32, pfd int)

//go:noescape
func expSubasm(s *float32, n int, m float32) float32

//go:noescape
func cvtF16asm(dst *float32, src *uint16, n int, pfd int)

//go:noescape
func cvtBF16asm(dst *float32, src *uint16, n int, pfd int)

//go:noescape
func dots1asm(s *float32, q *float32, k *float32, rb int, nt int, pfd int)

//go:noescape
func dots1wasm(s *float32, q *float32, k *float32, nt int, pfd int)

//go:noescape
func axpy1wasm(acc *float32, rb int, p *float32, v *float32, n int, alpha float32, pfd int)

//go:noescape
func axpy1asm(acc *float32, rb int, p *float32, v *float32, n int, alpha float32, pfd int)

// dots4x16 computes the scores of four rows with the assembly 4x4 register
// block (each K vector feeds four FMAs, each q vector four), or for head dim
// 128 with dots4wasm (half of q in registers, two tokens per step); the
// tokens those leave over and head dims that are not a multiple of 16 use
// the archsimd loops. dots4wasm against dots4asm, interleaved A/B, fp32 GQA
// 32/8, one thread: L3-resident contexts (256-4k tokens) 12-16% faster,
// 32k tokens unchanged.
func dots4x16(s, q, k []float32, d, pf int) {
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
	if d == 128 {
		n4 = n &^ 1
		if n4 > 0 {
			dots4wasm(unsafe.SliceData(s), n*4, unsafe.SliceData(q), unsafe.SliceData(k), n4, pf*d*4)
		}
	} else if n4 > 0 {
		dots4asm(unsafe.SliceData(s), n*4, unsafe.SliceData(q), unsafe.SliceData(k), d*4, n4, pf*d*4)
	}
	for r := n4; r < n; r++ {
		for j := 0; j < 4; j++ {
			dots16sim(s[j*n+r:j*n+r+1], q[j*d:(j+1)*d], k[r*d:(r+1)*d], d)
		}
	}
}

// axpy4x16 accumulates four rows with the assembly 4x64 register block
// when the head dim is a multiple of 64; other multiples of 16 take the
// AVX2 assembly (axpy4AVX2: 2.5-6x faster than the archsimd loop at head
// dims 32, 96 and 160, 1.3-1.5x at 48, 80 and 112, fp32 GQA 8/2, 4k
// tokens, one thread, Zen 4), the rest the archsimd loops.
func axpy4x16(acc, p, v []float32, alpha *[4]float32, pf int) {
	d, n := len(acc)/4, len(p)/4
	if n == 0 || d == 0 {
		return
	}
	_, _ = p[4*n-1], v[n*d-1]
	if d&63 != 0 {
		if d&15 == 0 {
			axpy4AVX2(acc, p, v, alpha, pf)
			return
		}
		axpy4x16sim(acc, p, v, alpha)
		return
	}
	if d&127 == 0 {
		axpy4wasm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), n*4, unsafe.SliceData(v), n, alpha, pf*d*4, 0)
		return
	}
	axpy4asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), n*4, unsafe.SliceData(v), n, alpha, pf*d*4)
}

// axpy4x16k is axpy4x16 that also prefetches the rows of next (the next
// K block, rows as long as V's) while its second pass over the V block
// runs from L2. Beyond the L3 the V phase otherwise leaves the memory idle
// for that pass. Interleaved A/B, one thread, GQA 32/8, 16k-32k tokens:
// the score+accumulation loops alone went from 23.5 to 25.2 GB/s of K+V,
// the whole kernel 2-6% faster.
func axpy4x16k(acc, p, v []float32, alpha *[4]float32, pf int, next []float32) {
	d, n := len(acc)/4, len(p)/4
	if n == 0 || d == 0 || d&127 != 0 || len(next) < n*d {
		axpy4x16(acc, p, v, alpha, pf)
		return
	}
	_, _ = p[4*n-1], v[n*d-1]
	// A byte distance only (never turned back into a pointer): prefetches
	// cannot fault, and next holds the n rows they touch.
	pfk := int(uintptr(unsafe.Pointer(unsafe.SliceData(next))) - uintptr(unsafe.Pointer(unsafe.SliceData(v))))
	axpy4wasm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), n*4, unsafe.SliceData(v), n, alpha, pf*d*4, pfk)
}

// expSubx16 is expSub16 with the runs of 16 in assembly (the archsimd loop
// spills its constants). A tail of fewer than 16 scores goes through the
// same assembly on a padded copy (padding m: exp(0), no subnormal work)
// instead of the scalar expf, which takes about 15 ns per score: every row
// of a short context or of a block's end has such a tail.
func expSubx16(s []float32, m float32) float32 { return expSubRuns(s, m, 16) }

// expSubRuns runs the assembly exp kernel (over multiples of lanes scores:
// 16, expSubasm, or 8, expSubavx2) on the whole runs of s and on a copy of
// the tail padded with m, whose exp(0) lanes are dropped. The kernels are
// called directly: through a function value the tail copy would escape to
// the heap (one allocation per row with a tail).
func expSubRuns(s []float32, m float32, lanes int) float32 {
	n := len(s) &^ (lanes - 1)
	kernel := func(p *float32, n int, m float32) float32 {
		if lanes == 16 {
			return expSubasm(p, n, m)
		}
		return expSubavx2(p, n, m)
	}
	var sum float32
	if n > 0 {
		sum = kernel(unsafe.SliceData(s), n, m)
	}
	if r := len(s) - n; r > 0 {
		var t [16]float32
		copy(t[:], s[n:])
		for i := r; i < lanes; i++ {
			t[i] = m
		}
		kernel(&t[0], lanes, m)
		for i, e := range t[:r] {
			s[n+i] = e
			sum += e
		}
	}
	return sum
}

// cvtF16x16 widens halves with VCVTPH2PS (AVX-512F) in runs of 64 and the
// archsimd loop for the tail. The source is prefetched about two K/V blocks
// ahead (a block's rows are contiguous).
func cvtF16x16(dst []float32, src []uint16) {
	n := len(src)
	_ = dst[:n]
	n64 := n &^ 63
	if n64 > 0 {
		cvtF16asm(unsafe.SliceData(dst), unsafe.SliceData(src), n64, 2*n64*2)
	}
	cvtF16x16sim(dst[n64:n], src[n64:])
}

// cvtBF16x16 widens bfloat16 in runs of 64 with VPMOVZXWD+VPSLLD.
func cvtBF16x16(dst []float32, src []uint16) {
	n := len(src)
	_ = dst[:n]
	n64 := n &^ 63
	if n64 > 0 {
		cvtBF16asm(unsafe.SliceData(dst), unsafe.SliceData(src), n64, 2*n64*2)
	}
	cvtBF16x16sim(dst[n64:n], src[n64:])
}

// avx2Wide1 reports whether the single-row loops of head dim d go to the
// AVX2 path's unrolled row-streaming loops (wideLoops): at 64 and 256 they
// beat this path's dots1asm/axpy1asm, fp32 MHA 32/32 at 16k-32k tokens,
// call by call on a Zen 4: 1.30-1.35x (64) and 2.0x (256) on one thread,
// 1.06-1.38x on two; at 128 this path's own wide loops are 1.08-1.10x
// faster, so it keeps them.
func avx2Wide1(d int) bool { return d == 64 || d == 256 }

// dots16 is the single-row score loop: assembly for head dims that are a
// multiple of 16 (four tokens per step, prefetching K; 64 and 256 the AVX2
// path's, see avx2Wide1), archsimd otherwise.
func dots16(s, q, k []float32, d, pf int) {
	n := len(s)
	if n == 0 {
		return
	}
	_, _ = q[d-1], k[n*d-1]
	if avx2Wide1(d) {
		dotsAVX2(s, q, k, d, pf)
		return
	}
	if d&15 != 0 || n < 4 {
		dots16sim(s, q, k, d)
		return
	}
	n4 := n &^ 3
	if d == 128 {
		dots1wasm(unsafe.SliceData(s), unsafe.SliceData(q), unsafe.SliceData(k), n4, pf*d*4)
	} else {
		dots1asm(unsafe.SliceData(s), unsafe.SliceData(q), unsafe.SliceData(k), d*4, n4, pf*d*4)
	}
	if n4 < n {
		dots16sim(s[n4:], q, k[n4*d:], d)
	}
}

// axpy16 is the single-row accumulation: assembly for head dims that are a
// multiple of 64 (prefetching V; 64 and 256 the AVX2 path's wide loops,
// see avx2Wide1), the AVX2 assembly for other multiples of
// 32 (1.1x faster than archsimd at 96 and 160; at 48 and 112 it is not),
// archsimd otherwise.
func axpy16(acc, p, v []float32, alpha float32, pf int) {
	d, n := len(acc), len(p)
	if n == 0 || d == 0 {
		return
	}
	_ = v[n*d-1]
	if avx2Wide1(d) {
		axpyAVX2(acc, p, v, alpha, pf)
		return
	}
	if d&63 != 0 {
		if d&31 == 0 {
			axpyAVX2(acc, p, v, alpha, pf)
			return
		}
		axpy16sim(acc, p, v, alpha)
		return
	}
	if d&127 == 0 {
		axpy1wasm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), unsafe.SliceData(v), n, alpha, pf*d*4)
		return
	}
	axpy1asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), unsafe.SliceData(v), n, alpha, pf*d*4)
}

// Declarations of kern_avx512_h_amd64.s: the fused fp16/bf16 loops.

//go:generate sh -c "python3 asmgen_half.py > kern_avx512_h_amd64.s"

//go:noescape
func dots4f16asm(s *float32, ldS int, q *float32, k *uint16, krb int, nt int, pfd int)

//go:noescape
func dots4bf16asm(s *float32, ldS int, q *float32, k *uint16, krb int, nt int, pfd int)

//go:noescape
func axpy4f16asm(acc *float32, rb int, p *float32, ldP int, v *uint16, n int, alpha *[4]float32, pfd int)

//go:noescape
func axpy4bf16asm(acc *float32, rb int, p *float32, ldP int, v *uint16, n int, alpha *[4]float32, pfd int)

//go:noescape
func axpy4wf16asm(acc *float32, rb int, p *float32, ldP int, v *uint16, n int, alpha *[4]float32, pfd int)

//go:noescape
func axpy4wbf16asm(acc *float32, rb int, p *float32, ldP int, v *uint16, n int, alpha *[4]float32, pfd int)

//go:noescape
func dots1f16asm(s *float32, q *float32, k *uint16, krb int, nt int, pfd int)

//go:noescape
func dots1bf16asm(s *float32, q *float32, k *uint16, krb int, nt int, pfd int)

//go:noescape
func axpy1f16asm(acc *float32, rb int, p *float32, v *uint16, n int, alpha float32, pfd int)

//go:noescape
func axpy1bf16asm(acc *float32, rb int, p *float32, v *uint16, n int, alpha float32, pfd int)

// half16Ops are the AVX-512 loops over 16-bit rows straight from storage.
// They take head dims that are multiples of 64, and pass other multiples of
// 32 to the AVX2 loops (halfAVX2: 2.7-3.3x faster than widening into
// scratch blocks at head dims 32, 96 and 160, fp16 GQA 8/2, 4k tokens, one
// thread, Zen 4); the kernel widens other shapes into scratch blocks.
var half16Ops = halfOps{
	ok: func(dk, dv int) bool { return dk&31 == 0 && dv&31 == 0 },
	dots: func(s, q []float32, k []uint16, d, pf int, bf bool) {
		if d&63 != 0 {
			halfAVX2.dots(s, q, k, d, pf, bf)
			return
		}
		n := len(s)
		_, _ = q[d-1], k[n*d-1]
		n4 := n &^ 3
		if n4 > 0 {
			if bf {
				dots1bf16asm(unsafe.SliceData(s), unsafe.SliceData(q), unsafe.SliceData(k), d*2, n4, pf*d*2)
			} else {
				dots1f16asm(unsafe.SliceData(s), unsafe.SliceData(q), unsafe.SliceData(k), d*2, n4, pf*d*2)
			}
		}
		for t := n4; t < n; t++ {
			s[t] = dotHalf(q, k[t*d:(t+1)*d], bf)
		}
	},
	dots4: func(s, q []float32, k []uint16, d, pf int, bf bool) {
		if d&63 != 0 {
			halfAVX2.dots4(s, q, k, d, pf, bf)
			return
		}
		n := len(s) / 4
		_, _, _ = s[4*n-1], q[4*d-1], k[n*d-1]
		n4 := n &^ 3
		if n4 > 0 {
			if bf {
				dots4bf16asm(unsafe.SliceData(s), n*4, unsafe.SliceData(q), unsafe.SliceData(k), d*2, n4, pf*d*2)
			} else {
				dots4f16asm(unsafe.SliceData(s), n*4, unsafe.SliceData(q), unsafe.SliceData(k), d*2, n4, pf*d*2)
			}
		}
		for t := n4; t < n; t++ {
			for r := 0; r < 4; r++ {
				s[r*n+t] = dotHalf(q[r*d:(r+1)*d], k[t*d:(t+1)*d], bf)
			}
		}
	},
	axpy: func(acc, p []float32, v []uint16, alpha float32, pf int, bf bool) {
		d, n := len(acc), len(p)
		if d&63 != 0 {
			halfAVX2.axpy(acc, p, v, alpha, pf, bf)
			return
		}
		_ = v[n*d-1]
		if bf {
			axpy1bf16asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), unsafe.SliceData(v), n, alpha, pf*d*2)
		} else {
			axpy1f16asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), unsafe.SliceData(v), n, alpha, pf*d*2)
		}
	},
	axpy4: func(acc, p []float32, v []uint16, alpha *[4]float32, pf int, bf bool) {
		d, n := len(acc)/4, len(p)/4
		if d&63 != 0 {
			halfAVX2.axpy4(acc, p, v, alpha, pf, bf)
			return
		}
		_, _ = p[4*n-1], v[n*d-1]
		switch {
		case d&127 == 0 && bf && !cpuT.Load().v4Rows512:
			axpy4wbf16asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), n*4, unsafe.SliceData(v), n, alpha, pf*d*2)
		case d&127 == 0 && !cpuT.Load().v4Rows512:
			axpy4wf16asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), n*4, unsafe.SliceData(v), n, alpha, pf*d*2)
		case bf:
			axpy4bf16asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), n*4, unsafe.SliceData(v), n, alpha, pf*d*2)
		default:
			axpy4f16asm(unsafe.SliceData(acc), d*4, unsafe.SliceData(p), n*4, unsafe.SliceData(v), n, alpha, pf*d*2)
		}
	},
}

// dotHalf is the scalar dot of a float32 row with a 16-bit row (tails).
func dotHalf(q []float32, k []uint16, bf bool) float32 {
	var sum float32
	for i, h := range k {
		if bf {
			sum += q[i] * bf16f(h)
		} else {
			sum += q[i] * goF16(h)
		}
	}
	return sum
}
