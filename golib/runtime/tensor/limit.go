package tensor

import "sync/atomic"

// maxBytes bounds the size of one tensor allocation. A model can ask for a
// tensor far larger than the machine (ConstantOfShape of a huge shape, say);
// Go cannot recover from running out of memory, so such a request must fail
// with errs.ErrLimit before it reaches the allocator.
var maxBytes atomic.Int64

func init() {
	maxBytes.Store(defaultMaxBytes())
}

// MaxBytes returns the current per-tensor allocation limit in bytes.
func MaxBytes() int64 { return maxBytes.Load() }

// SetMaxBytes changes the per-tensor allocation limit (n <= 0 restores the
// default: the machine's physical memory where it is known, else 1 TiB) and
// returns the previous limit.
func SetMaxBytes(n int64) int64 {
	if n <= 0 {
		n = defaultMaxBytes()
	}
	return maxBytes.Swap(n)
}
