package cache

import (
	"fmt"
	"sync"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/sysmem"
	"github.com/onnx-light-kv/onnx-light-kv/golib/units"
)

// Arena is the persistent, session-owned memory that caches live in. It
// outlives single invocations, enforces a byte budget and exposes its
// accounting. Freed buffers are kept for reuse (pooled) by a cache of the
// same byte size, within bounds: the pool never holds more than the peak of
// allocated bytes (beyond that, buffers of other sizes than the one just
// freed are given back), and it is emptied before an allocation is refused
// for lack of machine memory. The budget, Trim and Close give pooled memory
// back too. So caches of ever-changing sizes, created and closed one at a
// time, hold at most about twice the largest one, not every size seen.
//
// Arena is safe for concurrent use.
type Arena struct {
	mu        sync.Mutex
	budget    int64 // 0: unlimited
	allocated int64 // bytes handed out to caches and not yet freed
	pooled    int64 // bytes of freed buffers kept for reuse
	peak      int64 // high-water mark of allocated
	live      int64 // bytes of valid (written, not truncated) K/V data, reported by caches
	allocs    int64 // number of successful allocations
	free      map[int][][]byte
	closed    bool                   // no more pooling: freed buffers go straight back to the OS
	pools     map[poolKey]*blockPool // the paged layout's block pools, by geometry
	reclaimer func() bool            // frees unreferenced shared memory (a prefix store), see SetReclaimer
}

// SetReclaimer installs f, called (without the arena's lock) when a paged
// append finds the budget exhausted: f frees one unit of memory nobody
// references (PrefixStore.EvictOne) and reports whether it did; the append
// retries until it fits or f frees nothing. nil removes it.
func (a *Arena) SetReclaimer(f func() bool) {
	a.mu.Lock()
	a.reclaimer = f
	a.mu.Unlock()
}

// reclaim runs the reclaimer, if any.
func (a *Arena) reclaim() bool {
	a.mu.Lock()
	f := a.reclaimer
	a.mu.Unlock()
	return f != nil && f()
}

// ArenaStats is a snapshot of an arena's accounting.
type ArenaStats struct {
	Budget        int64 // 0 means unlimited
	Allocated     int64 // bytes owned by caches
	Pooled        int64 // freed bytes kept for reuse
	Committed     int64 // Allocated + Pooled: memory the arena holds
	Peak          int64 // high-water mark of Allocated
	Live          int64 // bytes of valid K/V data across all caches
	Allocations   int64 // successful allocations so far
	Fragmentation float64
}

// machineFits is sysmem.Fits: whether fresh memory of n bytes fits what the
// machine can still give (a variable so that tests can stand in a small
// machine).
var machineFits = sysmem.Fits

// alignment of every buffer handed out (one cache line; AVX-512 friendly).
const alignment = 64

// NewArena returns an arena with the given byte budget (0 = unlimited).
func NewArena(budget int64) (*Arena, error) {
	if budget < 0 {
		return nil, fmt.Errorf("%w: negative arena budget %d", ErrInvalidArgument, budget)
	}
	return &Arena{budget: budget, free: map[int][][]byte{}}, nil
}

// SetBudget changes the budget. Lowering it below what is allocated is
// refused (ErrInvalidArgument): it would make existing caches invalid.
func (a *Arena) SetBudget(budget int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if budget < 0 || (budget > 0 && budget < a.allocated) {
		return fmt.Errorf("%w: budget %s is below the %s already allocated", ErrInvalidArgument,
			units.Bytes(budget), units.Bytes(a.allocated))
	}
	a.budget = budget
	if budget > 0 {
		a.trimLocked(a.budget-a.allocated, -1)
	}
	return nil
}

// alloc returns a zeroed buffer of exactly n bytes, 64-byte aligned, or a
// *BudgetError. Several buffers can be reserved atomically with allocMany.
func (a *Arena) alloc(n int) ([]byte, error) {
	bufs, err := a.allocMany(n, 1)
	if err != nil {
		return nil, err
	}
	return bufs[0], nil
}

// allocMany reserves count buffers of n bytes each, all or nothing.
func (a *Arena) allocMany(n, count int) ([][]byte, error) {
	if n < 0 || count < 0 {
		return nil, fmt.Errorf("%w: negative allocation", ErrInvalidArgument)
	}
	total := int64(n) * int64(count)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.budget > 0 && a.allocated+total > a.budget {
		return nil, &BudgetError{Requested: total, Committed: a.allocated, Budget: a.budget}
	}
	// Fresh memory must fit what the machine has available: a request it
	// cannot hold would otherwise end the process (the Go heap's
	// out-of-memory is fatal) or get it killed while the pages are touched.
	if fresh := int64(n) * int64(max(count-len(a.free[n]), 0)); fresh > 0 {
		ok, avail := machineFits(fresh)
		if !ok && a.pooled > int64(n)*int64(len(a.free[n])) {
			// the pool's other sizes are memory nobody uses: give them back first
			a.trimLocked(0, n)
			ok, avail = machineFits(fresh)
		}
		if !ok {
			// memory that dropped buffers (tensors, other arenas' trims) left in
			// the Go heap counts once the heap hands it back
			sysmem.Reclaim()
			ok, avail = machineFits(fresh)
		}
		if !ok {
			return nil, &BudgetError{Requested: total, Committed: a.allocated, Budget: a.allocated + avail, Machine: true}
		}
	}
	out := make([][]byte, count)
	for i := range out {
		if list := a.free[n]; len(list) > 0 {
			b := list[len(list)-1]
			a.free[n] = list[:len(list)-1]
			a.pooled -= int64(n)
			clear(b)
			out[i] = b
			continue
		}
		b, err := alignedBytes(n)
		if err != nil && a.pooled > 0 {
			a.trimLocked(0, n) // the other sizes' memory, then one more try
			b, err = alignedBytes(n)
		}
		if err != nil {
			for _, done := range out[:i] {
				a.free[n] = append(a.free[n], done) // back to the pool: all or nothing
				a.pooled += int64(n)
			}
			return nil, fmt.Errorf("%w: cannot map %s: %v", ErrBudget, units.Bytes(int64(n)), err)
		}
		out[i] = b
	}
	a.allocated += total
	a.allocs += int64(count)
	if a.allocated > a.peak {
		a.peak = a.allocated
	}
	// keep what the arena holds within the budget
	if a.budget > 0 {
		a.trimLocked(a.budget-a.allocated, -1)
	}
	return out, nil
}

// release returns buffers to the pool.
func (a *Arena) release(bufs ...[]byte) {
	a.mu.Lock()
	defer a.mu.Unlock()
	last := -1
	for _, b := range bufs {
		if b == nil {
			continue
		}
		last = len(b)
		a.allocated -= int64(last)
		a.free[last] = append(a.free[last], b)
		a.pooled += int64(last)
	}
	keep := a.peak // (buffers of one size never exceed the peak: see Arena)
	if a.budget > 0 {
		keep = min(keep, a.budget-a.allocated)
	}
	if a.closed {
		keep = 0
	}
	// the size just freed is the likeliest to be asked for again: it goes last
	a.trimLocked(keep, last)
	if a.pooled > keep && last >= 0 && (a.closed || a.budget > 0) {
		a.trimLocked(keep, -1)
	}
}

// Close gives pooled memory back and stops pooling: buffers of caches that
// are still open are freed when those caches close. The arena itself stays
// usable (a later allocation simply is not pooled).
func (a *Arena) Close() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	a.trimLocked(0, -1)
}

// addLive adjusts the live-bytes figure (called by caches on append,
// truncate, reset and close).
func (a *Arena) addLive(n int64) {
	a.mu.Lock()
	a.live += n
	a.mu.Unlock()
}

// Trim gives every pooled buffer back to the Go heap.
func (a *Arena) Trim() {
	a.mu.Lock()
	a.trimLocked(0, -1)
	a.mu.Unlock()
}

// trimLocked drops pooled buffers until at most keep bytes are pooled,
// sparing buffers of byte size spare (-1: none).
func (a *Arena) trimLocked(keep int64, spare int) {
	if keep < 0 {
		keep = 0
	}
	for size, list := range a.free {
		if size == spare {
			continue
		}
		for len(list) > 0 && a.pooled > keep {
			osFree(list[len(list)-1])
			list[len(list)-1] = nil
			list = list[:len(list)-1]
			a.pooled -= int64(size)
		}
		if len(list) == 0 {
			delete(a.free, size)
		} else {
			a.free[size] = list
		}
	}
}

// Stats returns a snapshot of the accounting. Fragmentation is the share of
// allocated bytes that hold no valid data (reserved capacity not yet used).
func (a *Arena) Stats() ArenaStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	s := ArenaStats{
		Budget: a.budget, Allocated: a.allocated, Pooled: a.pooled,
		Committed: a.allocated + a.pooled, Peak: a.peak, Live: a.live, Allocations: a.allocs,
	}
	if a.allocated > 0 {
		// shared paged blocks count once in allocated but once per
		// sequence in live: fragmentation never goes below zero
		s.Fragmentation = max(0, 1-float64(a.live)/float64(a.allocated))
	}
	return s
}

// alignedBytes returns a zeroed n-byte slice whose first byte is 64-byte
// aligned (backed by a slightly larger allocation).
func alignedBytes(n int) ([]byte, error) {
	if n == 0 {
		return []byte{}, nil
	}
	if b, err := osAlloc(n); b != nil {
		prefault(b)
		return b, nil
	} else if err != nil {
		return nil, err
	}
	raw := make([]byte, n+alignment)
	prefault(raw)
	off := int(uintptr(alignment)-uintptr(unsafe.Pointer(&raw[0]))%alignment) % alignment
	return raw[off : off+n : off+n], nil
}

// pageSize is the stride used to pre-fault new buffers.
const pageSize = 4096

// prefault touches every page of b now: the memory is committed when the
// cache is created, and the decode loop never pays first-touch page faults.
func prefault(b []byte) {
	for i := 0; i < len(b); i += pageSize {
		b[i] = 0
	}
}
