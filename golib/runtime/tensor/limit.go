package tensor

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/sysmem"
	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

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

// memCheckMin is the size from which MakeBytes checks a fresh buffer
// against the memory the system can still give (sysmem.FreshMin: reading
// the system's figures costs tens of microseconds, nothing next to filling
// that much).
const memCheckMin = sysmem.FreshMin

// availableMemory is sysmem.Available (a variable for tests).
var availableMemory = sysmem.Available

// MakeBytes returns nb fresh zero bytes on the Go heap, 8-byte aligned (so
// every typed view is aligned). Under the per-tensor limit a buffer can
// still be more than the system has left (other processes, a container's
// limit, ulimit -v, several large tensors alive at once), and the Go heap's
// out-of-memory ends the process: a buffer of at least 64 MiB larger than
// sysmem.Available (after the Go heap gave back what dropped tensors held,
// sysmem.Room) is refused with an error wrapping errs.ErrMemory instead.
func MakeBytes(nb int) ([]byte, error) {
	if nb <= 0 {
		return []byte{}, nil
	}
	if nb >= memCheckMin {
		if avail := sysmem.Room(int64(nb), availableMemory); avail > 0 && int64(nb) > avail {
			return nil, fmt.Errorf("%w: a buffer of %s is more than the %s the system can still give this process",
				errs.ErrMemory, units.Bytes(int64(nb)), units.Bytes(avail))
		}
	}
	words := make([]uint64, (nb+7)/8)
	return unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), nb), nil
}
