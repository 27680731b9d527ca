//go:build linux

package cpu

import (
	"syscall"
	"unsafe"
)

// madvHugepage is MADV_HUGEPAGE (not exported by package syscall).
const madvHugepage = 14

// probeBuffer maps n float32 of anonymous memory and asks for transparent
// huge pages. A failed mapping is an error, not a fall back to the Go heap,
// where a size the machine cannot hold would end the process.
func probeBuffer(n int) ([]float32, func(), error) {
	mem, err := syscall.Mmap(-1, 0, n*4, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	_ = syscall.Madvise(mem, madvHugepage) // a hint: without it the probe still works
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(mem))), n), func() { _ = syscall.Munmap(mem) }, nil
}
