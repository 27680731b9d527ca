package ops

import (
	"fmt"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
	"github.com/onnx-light-kv/onnx-light-kv/golib/sysmem"
)

// Packs shares what kernel factories derive from constant inputs when a
// session is built (the packed weights of MatMul, Gemm, their fusions and
// MatMulNBits) between the plans of one session: the tensor path's plan
// and the cache path's plan read the same initializers, and each held its
// own copy of every packed weight before. Keys are the constant tensors
// themselves (by identity) plus what else decides the result, so a
// constant folded anew in one plan gets a pack of its own. Safe for
// concurrent use; a nil *Packs shares nothing.
type Packs struct {
	mu sync.Mutex
	m  map[packKey]packEntry
	// bytes is the memory of the packs built so far.
	bytes int64
}

// packKey identifies a derived value: up to three constant tensors, the
// kind of derivation and its integer parameters.
type packKey struct {
	a, b, c *tensor.Tensor
	kind    string
	ints    [4]int
}

type packEntry struct {
	v   any
	err error
}

// NewPacks returns an empty Packs.
func NewPacks() *Packs { return &Packs{m: map[packKey]packEntry{}} }

// Len returns the number of values built so far.
func (p *Packs) Len() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.m)
}

// get returns the value built for key, building it the first time (its
// error too is kept and returned again). size is the memory the value will
// take: a build the machine has no memory for fails with a
// *cache.BudgetError (checkMemory) instead of running.
func (p *Packs) get(key packKey, size int64, build func() (any, error)) (any, error) {
	var done int64
	if p != nil {
		p.mu.Lock()
		defer p.mu.Unlock()
		if e, ok := p.m[key]; ok {
			return e.v, e.err
		}
		done = p.bytes
	}
	if err := checkMemory(size, done); err != nil {
		return nil, err // not kept: memory may be freed before another try
	}
	v, err := build()
	if p != nil {
		p.m[key] = packEntry{v, err}
		if err == nil {
			p.bytes += size
		}
	}
	return v, err
}

// availableMemory is sysmem.Available (a variable for tests).
var availableMemory = sysmem.Available

// packReserve is the memory a pack leaves to the rest of the process and
// the system: a pack that would take the machine below it is refused.
const packReserve = 64 << 20

// checkMemory refuses a pack of size bytes, with done bytes of packs
// already built, when the machine has less available memory than that plus
// packReserve (where the system says: Linux's MemAvailable): a session
// whose weights cannot be packed fails with a clear error instead of
// being killed by the system half way through.
func checkMemory(size, done int64) error {
	avail := sysmem.Room(size+packReserve, availableMemory)
	if avail <= 0 || size+packReserve <= avail {
		return nil
	}
	return fmt.Errorf("packing a weight: %w", &cache.BudgetError{Requested: size, Committed: done,
		Budget: done + max(avail-packReserve, 0), Machine: true})
}
