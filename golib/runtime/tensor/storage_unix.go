//go:build unix

package tensor

import (
	"sync"
	"syscall"
)

// zeroRegions are read-only anonymous mappings that released tensors point
// into (see ReleaseStorage): pages nobody writes cost address space only,
// and every released tensor of a process shares them. A region is never
// unmapped (tensors may point into it for as long as the process lives);
// a larger one is mapped when a tensor needs more bytes than the largest.
var zeroRegions struct {
	mu      sync.Mutex
	largest []byte
}

// zeroBytes returns n read-only bytes that read as zero and occupy no
// memory, or nil when the mapping fails.
func zeroBytes(n int) []byte {
	zeroRegions.mu.Lock()
	defer zeroRegions.mu.Unlock()
	if n > len(zeroRegions.largest) {
		size := max(n, 2*len(zeroRegions.largest), 1<<30)
		b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ, syscall.MAP_PRIVATE|syscall.MAP_ANON|mapNoReserve)
		if err != nil {
			return nil
		}
		zeroRegions.largest = b
	}
	return zeroRegions.largest[:n:n]
}
