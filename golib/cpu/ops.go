package cpu

// kernelOps are the inner loops of the streaming kernel for one instruction
// set. Every variant has identical semantics; the portable Go twin
// (goOps) is always available and is the one the SIMD variants are tested
// against, together with ReferenceAttention.
type kernelOps struct {
	name string
	// dots sets s[t] = dot(q, k[t*d:(t+1)*d]) for t < len(s).
	dots func(s, q, k []float32, d, pf int)
	// maxOf returns the largest element of s (len(s) > 0), or NaN when an
	// element is not finite (NaN or ±Inf): such a row leaves the float32
	// path and is recomputed exactly (see "Non-finite values" in the
	// package doc).
	maxOf func(s []float32) float32
	// max4, when set, is maxOf of four score rows (ld elements apart, n
	// each) in one call: m[r] is row r's largest score, or NaN when one of
	// its scores is not finite. unitState.block takes a four-row group's
	// maxima so where no softcap or mask changes the scores first; nil:
	// maxOf per row.
	max4 func(s []float32, ld, n int, m *[4]float32)
	// readSum returns the sum of s in an unspecified order: the bandwidth
	// probe's streaming read (plain loads, several accumulators).
	readSum func(s []float32) float32
	// expSub sets s[t] = exp(s[t]-m) and returns the sum of the results.
	expSub func(s []float32, m float32) float32
	// tanhCap sets s[t] = c*tanh(s[t]); a NaN or infinite s[t] must give
	// NaN (an overflowed dot product says nothing about the true score's
	// sign) so that maxOf sees it.
	tanhCap func(s []float32, c float32)
	// scale sets dst[i] = src[i]*f (len(dst) >= len(src)): query scaling
	// and output normalization, a fixed cost of every call.
	scale func(dst, src []float32, f float32)
	// axpy sets acc = alpha*acc + sum_t p[t]*v[t*d:(t+1)*d], d = len(acc).
	axpy func(acc, p, v []float32, alpha float32, pf int)
	// dots4 is dots for four query rows at once (q holds 4 rows of d, row
	// r's n scores go to s[r*n:(r+1)*n]): every K row loaded feeds four
	// dot products.
	dots4 func(s, q, k []float32, d, pf int)
	// axpy4 is axpy for four rows at once: acc holds 4 rows of d = len(acc)/4,
	// p holds 4 rows of n = len(p)/4 weights, alpha one factor per row.
	axpy4 func(acc, p, v []float32, alpha *[4]float32, pf int)
	// axpy4k, when set, is axpy4 that may also prefetch the rows of next
	// (the next K block, rows of len(acc)/4 elements) while it works on v
	// from cache; nil: callers use axpy4.
	axpy4k func(acc, p, v []float32, alpha *[4]float32, pf int, next []float32)
	// The pf arguments are how many rows past k or v the loops may prefetch
	// (0: none): rows read straight from the cache's storage are streamed
	// ahead, rows widened into a scratch block are not.
	//
	// cvtF16 and cvtBF16 widen IEEE half / bfloat16 bits to float32
	// (len(dst) == len(src)).
	cvtF16  func(dst []float32, src []uint16)
	cvtBF16 func(dst []float32, src []uint16)
	// half, when set, reads fp16/bf16 rows straight from storage for the
	// head dims half.ok accepts (no widened scratch block).
	half *halfOps
	// quant, when set, are the loops over quantized (sealed) rows; nil:
	// the portable twin's (goQuantOps).
	quant *quantOps
}

// halfOps are the score and accumulation loops over 16-bit K/V rows (bf:
// bfloat16, else IEEE half), same contracts as kernelOps' float32 ones.
type halfOps struct {
	ok    func(dk, dv int) bool
	dots  func(s, q []float32, k []uint16, d, pf int, bf bool)
	dots4 func(s, q []float32, k []uint16, d, pf int, bf bool)
	axpy  func(acc, p []float32, v []uint16, alpha float32, pf int, bf bool)
	axpy4 func(acc, p []float32, v []uint16, alpha *[4]float32, pf int, bf bool)
}
