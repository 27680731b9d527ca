//go:build goexperiment.simd && amd64

package gemm

// fmaPeakAVX2 runs n iterations of twelve independent ymm FMAs: the AVX2
// FMA throughput of one core (192 flops an iteration), which
// BenchmarkFMAPeak measures as the ceiling of the AVX2 kernels.
//
//go:noescape
func fmaPeakAVX2(n int)
