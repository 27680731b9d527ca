//go:build linux

package hugepage

import (
	"syscall"
	"unsafe"
)

// madvHugepage is MADV_HUGEPAGE (not exported by package syscall).
const madvHugepage = 14

// Advise asks the kernel to back the whole 2 MiB-aligned huge pages inside
// b with transparent huge pages (MADV_HUGEPAGE). Call it before b's pages
// are first written: then the page faults that write them allocate huge
// pages; pages already in memory are only merged later, in the background.
// Memory of the Go heap may be advised: it stays the Go heap's. It is a
// hint: without transparent huge pages in the kernel, or for a b too small
// to hold one aligned huge page, nothing changes. It reports whether the
// kernel accepted the advice.
func Advise(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	off, n := span(uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b)))
	if n == 0 {
		return false
	}
	return syscall.Madvise(b[off:off+n], madvHugepage) == nil
}
