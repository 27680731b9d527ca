//go:build linux

package cache

import (
	"sync"
	"syscall"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/hugepage"
)

// mappings remembers the whole mmap region behind each buffer handed out by
// osAlloc, keyed by the buffer's first byte, so osFree can unmap it.
var mappings sync.Map // uintptr -> []byte

// osAlloc returns n zeroed bytes outside the Go heap for buffers of at least
// one huge page: a 2 MiB-aligned anonymous mapping advised for transparent
// huge pages. Decode attention streams the cache, and with 4 KiB pages the
// TLB misses cost about a third of the achievable read bandwidth. Smaller
// buffers return (nil, nil): use the Go heap. A failed mapping is an error
// (the Go heap would not do better with that much).
func osAlloc(n int) ([]byte, error) {
	if n < hugepage.Size {
		return nil, nil
	}
	size := (n + hugepage.Size - 1) &^ (hugepage.Size - 1)
	region, err := syscall.Mmap(-1, 0, size+hugepage.Size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	off := int(-uintptr(unsafe.Pointer(&region[0])) & (hugepage.Size - 1))
	b := region[off : off+size : off+size]
	hugepage.Advise(b) // best effort: without THP the pages are simply 4 KiB
	mappings.Store(uintptr(unsafe.Pointer(&b[0])), region)
	return b[:n:n], nil
}

// osFree unmaps a buffer that came from osAlloc and reports whether it did.
func osFree(b []byte) bool {
	if cap(b) == 0 {
		return false
	}
	key := uintptr(unsafe.Pointer(unsafe.SliceData(b)))
	region, ok := mappings.LoadAndDelete(key)
	if !ok {
		return false
	}
	_ = syscall.Munmap(region.([]byte))
	return true
}
