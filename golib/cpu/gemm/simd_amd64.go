//go:build goexperiment.simd && amd64

package gemm

import (
	"simd/archsimd"

	"github.com/klauspost/cpuid/v2"
)

// Every function of this package that runs 256- or 512-bit archsimd code calls
// archsimd.ClearAVXUpperBits (VZEROUPPER) when its vectors are done, before
// scalar float code and before returning: Go compiles scalar float32 math,
// and some moves and spills, to legacy SSE instructions, and the compiler
// does not clear the upper halves itself. Measured on a 2-core AMD EPYC
// Zen 3 VM, each switch from dirty 256-bit state to legacy SSE cost about
// 120 ns: a 64-element dot product took 136 ns without the clear and 14 ns
// with it.

// simdKernels returns the archsimd variants this CPU can run, slowest first.
// cpuid decides; archsimd's own check guards against a disagreement (for
// instance an OS that does not save the AVX-512 state).
func simdKernels() []*kernels {
	var ks []*kernels
	if cpuid.CPU.Supports(cpuid.AVX2, cpuid.FMA3) && archsimd.X86.AVX2() && archsimd.X86.FMA() {
		if cpuid.CPU.Supports(cpuid.F16C) {
			avx2Kernels.panelHalf = panelHalfAVX2
		}
		ks = append(ks, &avx2Kernels)
	}
	if cpuid.CPU.Supports(cpuid.AVX512F, cpuid.AVX512DQ, cpuid.AVX512BW, cpuid.AVX512VL) && archsimd.X86.AVX512() {
		if cpuid.CPU.Supports(cpuid.F16C) {
			// The ymm 16-bit panel kernel: widening in registers beat
			// widening into L1 plus the zmm panel kernel by ~10x
			// (BenchmarkPanelHalf on an AMD Zen 4).
			avx512Kernels.panelHalf = panelHalfAVX2
		}
		if v := cpuid.CPU.VendorID; v == cpuid.AMD || v == cpuid.Hygon {
			// The one-row decode panel: on an AMD Zen 4 the ymm loop
			// streamed the packed weights 1.19x (one thread) and 1.35x
			// (two) as fast as the zmm one (BenchmarkDecodeStepPacked
			// m1); from four rows up the zmm panel stays ahead.
			avx512Kernels.panelRow = panelRowAVX2
		}
		ks = append(ks, &avx512Kernels)
	}
	return ks
}
