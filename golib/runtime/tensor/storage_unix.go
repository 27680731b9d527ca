//go:build unix

package tensor

import (
	"fmt"
	"os"
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

// MapFileSupported reports whether MapFile maps files on this platform.
const MapFileSupported = true

// fileMaps are the files MapFile mapped: their address ranges, so that
// Evict knows a tensor's storage is a file's pages (which the system can
// read again) and not memory the program wrote.
var fileMaps struct {
	mu     sync.Mutex
	ranges [][2]uintptr
}

// MapFile maps the whole regular file at path into memory, private and
// copy-on-write: reading it costs only the pages read, which the system
// can drop and read again from the file under memory pressure (they are
// the page cache's), and a write changes the program's copy only. Tensors
// made from its bytes (FromBytes) alias the file. It stays mapped until
// UnmapFile, which the caller calls once nothing reads it (model.Model.Unmap
// releases the tensors that alias it first); the file must not be
// truncated meanwhile. An empty file maps to an empty slice.
func MapFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	size := st.Size()
	if size == 0 {
		return []byte{}, nil
	}
	if size != int64(int(size)) {
		return nil, fmt.Errorf("%s: %d bytes do not fit the address space", path, size)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mapping %s: %w", path, err)
	}
	lo, hi := span(b)
	fileMaps.mu.Lock()
	fileMaps.ranges = append(fileMaps.ranges, [2]uintptr{lo, hi})
	fileMaps.mu.Unlock()
	return b, nil
}

// UnmapFile unmaps b, a mapping MapFile returned that nothing aliases any
// more (a load that failed or kept no tensor over it).
func UnmapFile(b []byte) {
	if len(b) == 0 {
		return
	}
	start, _ := span(b)
	fileMaps.mu.Lock()
	for i, r := range fileMaps.ranges {
		if r[0] == start {
			fileMaps.ranges = append(fileMaps.ranges[:i], fileMaps.ranges[i+1:]...)
			break
		}
	}
	fileMaps.mu.Unlock()
	_ = syscall.Munmap(b)
}

// EvictFilePages drops the pages wholly inside b from the process's
// resident set where b lies in a MapFile mapping: they are read from the
// file again if read (a private page written before is lost, which no
// caller does to a file-backed constant). Other memory is left alone.
func EvictFilePages(b []byte) {
	if len(b) == 0 {
		return
	}
	if !inFileMap(b) {
		return
	}
	lo, hi := span(b)
	page := uintptr(os.Getpagesize())
	start, end := (lo+page-1)&^(page-1), hi&^(page-1)
	if end <= start {
		return
	}
	_, _, _ = syscall.Syscall(syscall.SYS_MADVISE, start, end-start, syscall.MADV_DONTNEED)
}

// inFileMap reports whether the non-empty b lies in a MapFile mapping.
func inFileMap(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	lo, hi := span(b)
	fileMaps.mu.Lock()
	defer fileMaps.mu.Unlock()
	for _, r := range fileMaps.ranges {
		if lo >= r[0] && hi <= r[1] {
			return true
		}
	}
	return false
}
