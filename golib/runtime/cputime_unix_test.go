//go:build unix

package runtime

import (
	"syscall"
	"time"
)

// processCPUTime returns the CPU time (user and system) the process has
// used so far, or false when it cannot be read. Benchmarks on a machine
// shared with other work report it next to wall time: a process waiting
// for a core accrues none.
func processCPUTime() (time.Duration, bool) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, false
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), true
}
