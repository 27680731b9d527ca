//go:build goexperiment.simd && amd64

package codec

import "github.com/klauspost/cpuid/v2"

// vector8 reports whether the AVX2+F16C slice conversions can run here.
var vector8 = cpuid.CPU.Supports(cpuid.AVX, cpuid.AVX2, cpuid.F16C)

//go:noescape
func decodeF16x8(dst *float32, src *uint16, n int)

//go:noescape
func encodeF16x8(dst *uint16, src *float32, n int)

//go:noescape
func decodeBF16x8(dst *float32, src *uint16, n int)

//go:noescape
func encodeBF16x8(dst *uint16, src *float32, n int)

// The vector prefixes: each converts the leading multiple of eight values
// of src into dst (len(dst) >= len(src)) and returns how many it did.

func decodeF16Vec(dst []float32, src []uint16) int {
	n := len(src) / 8
	if !vector8 || n == 0 {
		return 0
	}
	decodeF16x8(&dst[:8*n][0], &src[0], n)
	return 8 * n
}

func encodeF16Vec(dst []uint16, src []float32) int {
	n := len(src) / 8
	if !vector8 || n == 0 {
		return 0
	}
	encodeF16x8(&dst[:8*n][0], &src[0], n)
	return 8 * n
}

func decodeBF16Vec(dst []float32, src []uint16) int {
	n := len(src) / 8
	if !vector8 || n == 0 {
		return 0
	}
	decodeBF16x8(&dst[:8*n][0], &src[0], n)
	return 8 * n
}

func encodeBF16Vec(dst []uint16, src []float32) int {
	n := len(src) / 8
	if !vector8 || n == 0 {
		return 0
	}
	encodeBF16x8(&dst[:8*n][0], &src[0], n)
	return 8 * n
}
