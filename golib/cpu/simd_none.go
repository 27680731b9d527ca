//go:build !(goexperiment.simd && amd64)

package cpu

// registerSIMD has nothing to register in builds without simd/archsimd.
func registerSIMD() {}
