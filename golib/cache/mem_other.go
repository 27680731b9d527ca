//go:build !linux

package cache

// osAlloc is only implemented on Linux (huge-page mappings); elsewhere every
// buffer comes from the Go heap.
func osAlloc(n int) ([]byte, error) { return nil, nil }

// AvailableMemory returns the memory available for new allocations; it is
// unknown here (0), so only an arena's budget limits it.
func AvailableMemory() int64 { return 0 }

// osFree reports that b did not come from osAlloc.
func osFree(b []byte) bool { return false }
