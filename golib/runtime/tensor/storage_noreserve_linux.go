//go:build linux

package tensor

import "syscall"

// mapNoReserve keeps the zero regions out of the kernel's commit
// accounting: they are never written.
const mapNoReserve = syscall.MAP_NORESERVE
