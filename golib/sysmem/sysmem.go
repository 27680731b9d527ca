// Package sysmem tells how much memory a new allocation can still get
// before the process fails: the Go heap's out-of-memory is fatal (it cannot
// be recovered into an error), and memory the system cannot back gets the
// process killed while its pages are touched. Allocators of large buffers
// (KV-cache arenas, weight packs, the runtime's tensors, the bandwidth
// probe) compare their request with Available first and return an error
// instead.
package sysmem

import (
	"runtime/debug"
	"sync/atomic"
	"time"
)

// Available returns the bytes a new allocation can get, in bytes: the
// smallest of what the operating system, the process's control group and
// its address-space limit leave; 0 when none of them is known (then only
// the caller's own limits apply).
func Available() int64 {
	v := available()
	last.Store(v)
	lastAt.Store(time.Now().UnixNano())
	return v
}

// FreshMin is the request size from which Fits reads the system's figures
// anew; below it a reading at most MaxAge old serves.
const FreshMin = 64 << 20

// MaxAge is how old a reading Fits uses for requests under FreshMin.
const MaxAge = 100 * time.Millisecond

var last, lastAt atomic.Int64

// Fits reports whether a new allocation of n bytes fits in what the system
// can still give (Available; an unknown figure fits anything) and returns
// that figure. Requests of at least FreshMin bytes read the figures anew;
// smaller ones use a reading at most MaxAge old, so frequent small
// allocations (a cache's blocks) neither pay for reading several files nor
// allocate. It is safe for concurrent use.
func Fits(n int64) (bool, int64) {
	avail := last.Load()
	if n >= FreshMin || time.Now().UnixNano()-lastAt.Load() > int64(MaxAge) {
		avail = Available()
	}
	return avail <= 0 || n <= avail, avail
}

// Room returns read() (the bytes a new allocation can get: Available, or a
// test's stand-in) and, where that is known and below need, the same read
// again after Reclaim: memory a dropped buffer held stays with the Go heap
// (reusable by it, not counted as available by the system) until the heap
// hands it back, so a request refused without this step could fit. The
// reclaim is a full garbage collection; only refusals pay for it.
func Room(need int64, read func() int64) int64 {
	avail := read()
	if avail > 0 && need > avail {
		Reclaim()
		avail = read()
	}
	return avail
}

// Reclaim runs a garbage collection and hands the Go heap's free memory
// back to the system (debug.FreeOSMemory); the next Fits reads the
// figures anew.
func Reclaim() {
	debug.FreeOSMemory()
	lastAt.Store(0)
}

// minKnown returns the smallest of the positive values, 0 when none is.
func minKnown(vals ...int64) int64 {
	var m int64
	for _, v := range vals {
		if v > 0 && (m == 0 || v < m) {
			m = v
		}
	}
	return m
}
