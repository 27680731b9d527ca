package ops

import (
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
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
// error too is kept and returned again).
func (p *Packs) get(key packKey, build func() (any, error)) (any, error) {
	if p == nil {
		return build()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if e, ok := p.m[key]; ok {
		return e.v, e.err
	}
	v, err := build()
	p.m[key] = packEntry{v, err}
	return v, err
}
