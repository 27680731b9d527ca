//go:build !linux

package cache

// osAlloc is only implemented on Linux (huge-page mappings); elsewhere every
// buffer comes from the Go heap.
func osAlloc(n int) ([]byte, error) { return nil, nil }

// osFree reports that b did not come from osAlloc.
func osFree(b []byte) bool { return false }
