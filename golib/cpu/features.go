package cpu

import (
	"runtime"
	"strings"

	"github.com/klauspost/cpuid/v2"
)

// Features describes the CPU as seen by the kernel dispatcher.
type Features struct {
	Brand      string
	Vendor     string
	LogicalCPU int
	Flags      []string // the SIMD features the kernels care about, present ones only
	L1D, L2    int      // data cache sizes in bytes (-1 when unknown)
	L3         int
}

// kernelFlags are the cpuid features relevant to our kernels, in report order.
var kernelFlags = []cpuid.FeatureID{
	cpuid.SSE4, cpuid.AVX, cpuid.AVX2, cpuid.FMA3, cpuid.F16C,
	cpuid.AVX512F, cpuid.AVX512DQ, cpuid.AVX512BW, cpuid.AVX512VL,
	cpuid.AVX512BF16, cpuid.AVX512FP16, cpuid.AVX512VNNI, cpuid.AMXBF16,
}

// DetectFeatures reads the CPU's features once through cpuid.
func DetectFeatures() Features {
	f := Features{
		Brand:      strings.TrimSpace(cpuid.CPU.BrandName),
		Vendor:     cpuid.CPU.VendorString,
		LogicalCPU: runtime.NumCPU(),
		L1D:        cpuid.CPU.Cache.L1D,
		L2:         cpuid.CPU.Cache.L2,
		L3:         cpuid.CPU.Cache.L3,
	}
	for _, id := range kernelFlags {
		if cpuid.CPU.Supports(id) {
			f.Flags = append(f.Flags, id.String())
		}
	}
	return f
}
