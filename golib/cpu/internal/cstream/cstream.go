//go:build cgo

// Package cstream is a plain C streaming-read loop, the reference the
// bandwidth probe's tests compare cpu.StreamRead with. It is imported by
// tests only.
package cstream

/*
#cgo CFLAGS: -O3
#include <stddef.h>
#include <stdint.h>

// olkv_stream_sum sums n 64-bit words: a plain loop the compiler vectorizes
// with the baseline ISA (integer adds are associative).
static uint64_t olkv_stream_sum(const uint64_t *p, size_t n) {
	uint64_t s = 0;
	for (size_t i = 0; i < n; i++) s += p[i];
	return s;
}

// olkv_stream_sum_avx2 is the same loop compiled for AVX2 (32-byte loads).
__attribute__((target("avx2")))
static uint64_t olkv_stream_sum_avx2(const uint64_t *p, size_t n) {
	uint64_t s = 0;
	for (size_t i = 0; i < n; i++) s += p[i];
	return s;
}
*/
import "C"

import (
	"time"
	"unsafe"
)

// Available reports whether the C loop is built (cgo enabled).
const Available = true

// Sum reads buf once with the C loop and returns the sum of its 64-bit
// words and the time the loop took. With avx2 the loop compiled for AVX2
// runs (the caller checks that the CPU has it), else the one compiled for
// the baseline ISA (SSE2 on amd64).
func Sum(buf []uint64, avx2 bool) (uint64, time.Duration) {
	if len(buf) == 0 {
		return 0, 0
	}
	p, n := (*C.uint64_t)(unsafe.Pointer(unsafe.SliceData(buf))), C.size_t(len(buf))
	start := time.Now()
	var s C.uint64_t
	if avx2 {
		s = C.olkv_stream_sum_avx2(p, n)
	} else {
		s = C.olkv_stream_sum(p, n)
	}
	return uint64(s), time.Since(start)
}
