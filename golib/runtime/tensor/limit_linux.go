//go:build linux

package tensor

import "syscall"

// defaultMaxBytes is the physical memory size: a single tensor larger than
// that cannot be allocated anyway.
func defaultMaxBytes() int64 {
	var si syscall.Sysinfo_t
	if err := syscall.Sysinfo(&si); err != nil || si.Totalram == 0 {
		return 1 << 40
	}
	total := int64(si.Totalram) * int64(si.Unit)
	if total <= 0 {
		return 1 << 40
	}
	return total
}
