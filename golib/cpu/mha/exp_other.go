//go:build !(goexperiment.simd && amd64)

package mha

// pickExp: this build has only the portable exponential.
func pickExp() expFunc { return expSubGo }

// pickNonFinite: this build has only the portable check.
func pickNonFinite() func([]float32) bool { return nonFiniteGo }

// Sigmoid sets dst[i] = 1/(1+e^-src[i]); this build has only the portable
// loop (see the SIMD build's Sigmoid).
func Sigmoid(dst, src []float32) { sigmoidGo(dst, src) }
