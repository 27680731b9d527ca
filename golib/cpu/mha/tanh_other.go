//go:build !(goexperiment.simd && amd64)

package mha

// Tanh sets dst[i] = tanh(src[i]) for i < len(src) (len(dst) >= len(src));
// this build has only the portable loop (see tanh.go for the error).
func Tanh(dst, src []float32) { tanhGo(dst, src) }
