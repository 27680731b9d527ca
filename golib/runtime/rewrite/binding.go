package rewrite

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
)

// Binding is what a run on a generation state gives the rewritten
// kernels: the state's caches and the step's logical geometry. The runtime
// implements it; a run is single-threaded with respect to its Binding.
type Binding interface {
	// Cache returns the cache of rewritten layer slot with room for n more
	// tokens per sequence (a growable state enlarges it; a fixed one
	// returns the cache as is and Append reports the capacity error).
	// geom (kv_heads, head_dim_k, head_dim_v) creates the cache of a layer
	// whose graph declares no geometry, on its first run; zeros: the cache
	// must exist.
	Cache(layer, n int, geom [3]int) (*cache.KVCache, error)
	// PastLength is the logical number of positions before this run's new
	// tokens (the sequence axis of the past a tensor-path run would get).
	PastLength() int
	// Batch is the state's number of sequences.
	Batch() int
	// ExportWanted reports whether the caller asked for the presents of
	// layer slot (they are exported from the cache only then).
	ExportWanted(layer int) bool
	// Memo is a map that lives for one run (verdicts shared by layers,
	// such as a mask's structure).
	Memo() map[any]any
}

// BindingScope is implemented by the runtime's per-run scope of a run on a
// generation state.
type BindingScope interface {
	CacheBinding() Binding
}

// bindingOf returns the run's binding, or an error outside a state run.
func bindingOf(ctx *ops.Context) (Binding, error) {
	if s, ok := ctx.Scope().(BindingScope); ok {
		if b := s.CacheBinding(); b != nil {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%w: a rewritten cache node ran outside a generation-state run", errs.ErrInvalidArgument)
}

func init() {
	ops.Register(Domain, opAttention, Version, 0, newCacheAttention)
	ops.Register(Domain, opShape, Version, 0, newCacheShape)
	ops.Register(Domain, opGQA, Version, 0, newCacheGQA)
}
