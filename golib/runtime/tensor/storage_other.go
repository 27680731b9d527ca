//go:build !unix

package tensor

import "errors"

// zeroBytes has no read-only zero mapping to offer here: ReleaseStorage
// keeps every tensor's storage.
func zeroBytes(n int) []byte { return nil }

// MapFileSupported reports whether MapFile maps files on this platform.
const MapFileSupported = false

// MapFile is not available on this platform: callers read the file
// instead.
func MapFile(path string) ([]byte, error) {
	return nil, errors.New("file mapping is not implemented on this platform")
}

// UnmapFile does nothing here (MapFile maps nothing).
func UnmapFile(b []byte) {}

// EvictFilePages does nothing here (MapFile maps nothing).
func EvictFilePages(b []byte) {}

func inFileMap(b []byte) bool { return false }
