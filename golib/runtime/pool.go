package runtime

import (
	"math/bits"
	"sync"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/hugepage"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// A decode step allocates the same tensors run after run (and, in a growing
// decode loop, tensors one token larger than the previous run's). Fresh Go
// allocations of that size are cleared by the allocator, fault in new pages
// when the heap grows, and drive the GC; the bufferPool instead keeps each
// state's released buffers and hands them out again.
//
// Buffers are grouped in size classes of eight steps per power of two, so a
// buffer serves requests up to 12.5% smaller than its capacity: a present
// tensor that grows by one token per step keeps its buffer for many steps.
// A free buffer unused for poolMaxIdleRuns runs is dropped (the GC frees
// it), so the pool follows the working set when shapes change.
//
// Ownership: the executor knows every reference a run's values hold on a
// buffer (memTracker); a buffer goes back to the pool when the last value
// referencing it is released, never earlier. Buffers still referenced by the
// returned outputs are leased to the caller until State.Release; leases the
// caller never settles are forgotten after poolMaxLeaseRuns runs, and the GC
// frees those buffers once the caller drops the tensors.

const (
	// poolMaxIdleRuns is how many runs a free buffer may go unused.
	poolMaxIdleRuns = 2
	// poolMaxLeaseRuns is how many runs an output lease is remembered.
	poolMaxLeaseRuns = 4
	// poolMinClass is the smallest class size in bytes.
	poolMinClass = 64
	// poolReach is how many classes above its own a request may take a
	// free buffer from, and how many classes ahead a buffer for a growing
	// tensor is sized (see Alloc).
	poolReach = 2
)

// hugePoolBuffers: new pool buffers of at least hugepage.HeapMin (the
// presents of a long context and the tensors derived from the past, which a
// decode step streams whole) are advised for transparent huge pages
// (hugepage.Advise) before they are first written (a variable so that
// BenchmarkDecoderHugePool can compare).
var hugePoolBuffers = true

// poolBuf is one pooled buffer.
type poolBuf struct {
	data  []byte // full capacity of the class
	class int
	idle  uint64 // run at which it was last put back
	dirty bool   // handed out before: contents unspecified
	// ent is the run's tracking entry while a run's values reference the
	// buffer (read and written by the executor under the state's run
	// lock).
	ent *memEntry
	// own is the entry ent points to when the buffer is tracked (the
	// memTracker's entries of pooled buffers live in their buffers).
	own memEntry
}

// lease is a buffer referenced by outputs a caller holds.
type lease struct {
	buf  *poolBuf
	refs int
	run  uint64
}

// bufferPool is a State's pool. Its methods are safe for concurrent use
// (a caller may release outputs while another run of the state starts).
type bufferPool struct {
	mu     sync.Mutex
	free   [][]*poolBuf // by size class
	leases map[*tensor.Tensor]*lease
	run    uint64
	closed bool
	// issued lists the buffers handed out during the current run, in
	// order (read by the executor, under the state's run lock): a list,
	// not a map, since a run issues a buffer per pooled output and looks
	// up only the few outputs that are not the last one issued.
	issued []*poolBuf
	// last is the buffer issued last: a node's output is looked up right
	// after its kernel allocated it, so lookup checks it before the list.
	last *poolBuf
	// lo and hi bound the addresses of the issued buffers, so a pointer
	// outside them (a feed, an initializer) skips the scan in lookup.
	lo, hi uintptr

	stats PoolStats
}

// PoolStats are a state's buffer-pool counters (cumulative, except
// FreeBytes).
type PoolStats struct {
	// Reused and Allocated count buffers handed out from the free lists and
	// freshly allocated.
	Reused, Allocated int64
	// AllocatedBytes is the capacity of the freshly allocated buffers.
	AllocatedBytes int64
	// Recycled counts buffers returned to the pool; Dropped counts free
	// buffers discarded after going unused.
	Recycled, Dropped int64
	// FreeBytes is the capacity of the buffers now waiting for reuse.
	FreeBytes int64
}

func newBufferPool() *bufferPool {
	return &bufferPool{leases: map[*tensor.Tensor]*lease{}, lo: ^uintptr(0)}
}

// sizeClass returns the class index and capacity for n bytes (n > 0).
func sizeClass(n int) (class, size int) {
	if n <= poolMinClass {
		return 0, poolMinClass
	}
	e := bits.Len(uint(n - 1)) // 2^(e-1) < n <= 2^e, e >= 7
	step := 1 << (e - 4)       // eight steps from 2^(e-1) to 2^e
	k := (n - 1 - 1<<(e-1)) / step
	return 1 + (e-7)*8 + k, 1<<(e-1) + (k+1)*step
}

// classSize returns the capacity of class c (the inverse of sizeClass).
func classSize(c int) int {
	if c == 0 {
		return poolMinClass
	}
	e, k := (c-1)/8+7, (c-1)%8
	return 1<<(e-1) + (k+1)<<(e-4)
}

// beginRun starts a run: it forgets old leases and drops idle buffers.
func (p *bufferPool) beginRun() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.run++
	clear(p.issued)
	p.issued = p.issued[:0]
	p.last = nil
	p.lo, p.hi = ^uintptr(0), 0
	for t, l := range p.leases {
		if p.run-l.run > poolMaxLeaseRuns {
			delete(p.leases, t)
		}
	}
	// A free list is a stack whose buffers were put back in run order
	// (putLocked appends, Alloc pops the newest), so its idle runs never
	// decrease from the bottom up: the expired buffers are a prefix, and a
	// list whose oldest buffer holds is passed at once.
	for c, list := range p.free {
		k := 0
		for k < len(list) && p.run-list[k].idle > poolMaxIdleRuns {
			p.stats.Dropped++
			p.stats.FreeBytes -= int64(len(list[k].data))
			k++
		}
		if k == 0 {
			continue
		}
		n := copy(list, list[k:])
		clear(list[n:])
		p.free[c] = list[:n]
	}
}

// Alloc implements ops.Allocator: a free buffer of n's class (or of one of
// the poolReach classes above it, wasting at most about a third), or a new
// one.
//
// In a decode loop, the presents and everything derived from the past grow
// by one token per run, so a tensor's request moves up one class every few
// runs and would find its class empty each time: a miss for which a free
// buffer of a class just below exists (the same tensor's buffer from the
// last runs, most likely) is taken as growth, and the new buffer is sized
// poolReach classes ahead, so it serves the next classes too (or, when
// the system cannot give that much, of n's own class). A new buffer the
// system cannot give is an error wrapping errs.ErrMemory (tensor.MakeBytes).
func (p *bufferPool) Alloc(n int) ([]byte, bool, error) {
	if n == 0 {
		return []byte{}, true, nil
	}
	class, _ := sizeClass(n)
	p.mu.Lock()
	var b *poolBuf
	for c := class; c <= class+poolReach && c < len(p.free); c++ {
		if list := p.free[c]; len(list) > 0 {
			b = list[len(list)-1]
			list[len(list)-1] = nil
			p.free[c] = list[:len(list)-1]
			p.stats.Reused++
			p.stats.FreeBytes -= int64(len(b.data))
			break
		}
	}
	if b == nil {
		c := class
		for d := 1; d <= poolReach; d++ {
			if class-d >= 0 && class-d < len(p.free) && len(p.free[class-d]) > 0 {
				c = class + poolReach // growing
				break
			}
		}
		p.mu.Unlock()
		data, err := tensor.MakeBytes(classSize(c)) // class sizes are multiples of 8
		if err != nil && c != class {
			c = class // the room to grow is optional
			data, err = tensor.MakeBytes(classSize(c))
		}
		if err != nil {
			return nil, false, err
		}
		b = &poolBuf{data: data, class: c}
		if hugePoolBuffers && len(data) >= hugepage.HeapMin {
			hugepage.Advise(b.data)
		}
		p.mu.Lock()
		p.stats.Allocated++
		p.stats.AllocatedBytes += int64(len(data))
	}
	zeroed := !b.dirty
	b.dirty = true
	p.issued = append(p.issued, b)
	p.last = b
	base := uintptr(unsafe.Pointer(&b.data[0]))
	p.lo, p.hi = min(p.lo, base), max(p.hi, base+uintptr(len(b.data)))
	p.mu.Unlock()
	return b.data[:n:n], zeroed, nil
}

// put returns a buffer nobody references any more.
func (p *bufferPool) put(b *poolBuf) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.putLocked(b)
}

func (p *bufferPool) putLocked(b *poolBuf) {
	if p.closed {
		return
	}
	b.idle = p.run
	for b.class >= len(p.free) {
		p.free = append(p.free, nil)
	}
	p.free[b.class] = append(p.free[b.class], b)
	p.stats.Recycled++
	p.stats.FreeBytes += int64(len(b.data))
}

// lookup returns the buffer handed out during this run that holds the
// bytes at ptr (the first byte, or any byte for a view with an offset).
// issued, last, lo and hi are written only by beginRun and Alloc and read only
// here, all on the run path under the state's run lock, so lookup (called
// for every node output) takes no pool lock.
func (p *bufferPool) lookup(ptr *byte) *poolBuf {
	if b := p.last; b != nil && ptr == &b.data[0] {
		return b
	}
	a := uintptr(unsafe.Pointer(ptr))
	if a < p.lo || a >= p.hi {
		return nil
	}
	for i := len(p.issued) - 1; i >= 0; i-- { // the newest first: a multi-output node's other outputs
		b := p.issued[i]
		if lo := uintptr(unsafe.Pointer(&b.data[0])); a >= lo && a < lo+uintptr(len(b.data)) {
			return b // buffers are disjoint: the first byte of one is inside no other
		}
	}
	return nil
}

// lend records that the caller holds refs output tensors on b.
func (p *bufferPool) lend(b *poolBuf, ts []*tensor.Tensor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := &lease{buf: b, run: p.run}
	for _, t := range ts {
		if _, dup := p.leases[t]; !dup {
			p.leases[t] = l
			l.refs++
		}
	}
}

// release ends the caller's hold on output tensors; a buffer whose last
// leased output is released returns to the pool. Unknown tensors (not from
// this pool, already released, or forgotten) are ignored.
func (p *bufferPool) release(ts []*tensor.Tensor) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, t := range ts {
		l, ok := p.leases[t]
		if !ok {
			continue
		}
		delete(p.leases, t)
		if l.refs--; l.refs == 0 {
			p.putLocked(l.buf)
		}
	}
}

// trim drops every free buffer (the GC frees them).
func (p *bufferPool) trim() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stats.Dropped += int64(p.countFree())
	for c := range p.free {
		clear(p.free[c])
		p.free[c] = p.free[c][:0]
	}
	p.stats.FreeBytes = 0
}

func (p *bufferPool) countFree() int {
	n := 0
	for _, list := range p.free {
		n += len(list)
	}
	return n
}

func (p *bufferPool) leased(t *tensor.Tensor) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.leases[t]
	return ok
}

// close drops every free buffer and lease; later puts are ignored.
func (p *bufferPool) close() {
	p.trim()
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	clear(p.leases)
}

func (p *bufferPool) snapshot() PoolStats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}
