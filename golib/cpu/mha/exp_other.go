//go:build !(goexperiment.simd && amd64)

package mha

// pickExp: this build has only the portable exponential.
func pickExp() expFunc { return expSubGo }

// pickStream: this build has only the portable streaming loops.
func pickStream() *streamKernels { return &goStreamKernels }

// Sigmoid sets dst[i] = 1/(1+e^-src[i]); this build has only the portable
// loop (see the SIMD build's Sigmoid).
func Sigmoid(dst, src []float32) { sigmoidGo(dst, src) }
