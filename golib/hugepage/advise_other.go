//go:build !linux

package hugepage

// Advise does nothing where the kernel has no madvise for transparent huge
// pages; it reports false.
func Advise(b []byte) bool { return false }
