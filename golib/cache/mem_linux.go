//go:build linux

package cache

import (
	"sync"
	"syscall"
	"unsafe"
)

// hugePage is the transparent-huge-page size on x86-64 and arm64 Linux.
const hugePage = 2 << 20

// madvHugepage is MADV_HUGEPAGE (not exported by package syscall).
const madvHugepage = 14

// mappings remembers the whole mmap region behind each buffer handed out by
// osAlloc, keyed by the buffer's first byte, so osFree can unmap it.
var mappings sync.Map // uintptr -> []byte

// osAlloc returns n zeroed bytes outside the Go heap for buffers of at least
// one huge page: a 2 MiB-aligned anonymous mapping advised for transparent
// huge pages. Decode attention streams the cache, and with 4 KiB pages the
// TLB misses cost about a third of the achievable read bandwidth. Smaller
// buffers, or a failed mapping, return ok == false (use the Go heap).
func osAlloc(n int) (b []byte, ok bool) {
	if n < hugePage {
		return nil, false
	}
	size := (n + hugePage - 1) &^ (hugePage - 1)
	region, err := syscall.Mmap(-1, 0, size+hugePage, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, false
	}
	off := int(-uintptr(unsafe.Pointer(&region[0])) & (hugePage - 1))
	b = region[off : off+size : off+size]
	_ = syscall.Madvise(b, madvHugepage) // best effort: without THP the pages are simply 4 KiB
	mappings.Store(uintptr(unsafe.Pointer(&b[0])), region)
	return b[:n:n], true
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
