//go:build goexperiment.simd && amd64

package cpu

import "unsafe"

// Declarations of bandwidth_amd64.s, the read loops of the bandwidth probe.

//go:noescape
func readSumAVX2(p *float32, n int) float32

//go:noescape
func readSumAVX512(p *float32, n int) float32

// readSum8 sums buf with the ymm read loop (the AVX2 path's probe), the
// portable loop for the tail.
func readSum8(buf []float32) float32 {
	n := len(buf) &^ 63
	var s float32
	if n > 0 {
		s = readSumAVX2(unsafe.SliceData(buf), n)
	}
	return s + goReadSum(buf[n:])
}

// readSum16 sums buf with the zmm read loop (the AVX-512 path's probe).
func readSum16(buf []float32) float32 {
	n := len(buf) &^ 127
	var s float32
	if n > 0 {
		s = readSumAVX512(unsafe.SliceData(buf), n)
	}
	return s + goReadSum(buf[n:])
}
