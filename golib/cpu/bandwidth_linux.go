//go:build linux

package cpu

import (
	"syscall"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/hugepage"
)

// probeBuffer maps n float32 of anonymous memory and asks for transparent
// huge pages (hugepage.Advise). A failed mapping is an error, not a fall
// back to the Go heap, where a size the machine cannot hold would end the
// process.
func probeBuffer(n int) ([]float32, func(), error) {
	mem, err := syscall.Mmap(-1, 0, n*4, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, nil, err
	}
	hugepage.Advise(mem) // a hint: without it the probe still works
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(mem))), n), func() { _ = syscall.Munmap(mem) }, nil
}
