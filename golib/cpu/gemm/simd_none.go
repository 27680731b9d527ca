//go:build !(goexperiment.simd && amd64)

package gemm

// simdKernels: this build has no SIMD variants.
func simdKernels() []*kernels { return nil }
