//go:build !(goexperiment.simd && amd64)

package mha

// Gelu sets dst[i] = 0.5*src[i]*(erf(src[i]/sqrt 2) + 1); this build has
// only the portable loop (see gelu.go).
func Gelu(dst, src []float32) { geluGo(dst, src) }

// GeluTanh sets dst[i] to the tanh approximation of GELU of src[i]; this
// build has only the portable loop (see gelu.go).
func GeluTanh(dst, src []float32) { geluTanhGo(dst, src) }
