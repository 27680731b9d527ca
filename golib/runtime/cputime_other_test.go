//go:build !unix

package runtime

import "time"

// processCPUTime is not available on this system.
func processCPUTime() (time.Duration, bool) { return 0, false }
