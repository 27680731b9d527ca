//go:build !linux

package tensor

// defaultMaxBytes is 1 TiB where the physical memory size is not queried.
func defaultMaxBytes() int64 { return 1 << 40 }
