// Package runtime runs ONNX graphs: the RuntimeContext value stores, the
// ExecutionPlan built once per graph, and the RuntimeSession that users
// create once per model and Run repeatedly. Model loading lives in
// runtime/model, tensors in runtime/tensor and op kernels in runtime/ops.
package runtime

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Sequence is an ONNX sequence value: an ordered list of tensors.
type Sequence []*tensor.Tensor

// MapKey is the key of an ONNX map value (integer or string keys).
type MapKey struct {
	Int int64
	Str string
}

// Map is an ONNX map value.
type Map map[MapKey]*tensor.Tensor

// Context is the RuntimeContext of one request: the value stores of the
// current invocation (tensors, sequences, maps, known shapes) and the
// request's persistent state (declared persistent values and the CacheMap).
//
// A child context (NewChild), used for subgraphs and functions, has its own
// stores but reads through to its parent's values without copying them, and
// shares the parent's CacheMap. Values a child stores are invisible to the
// parent. A Context is used by one Run at a time.
type Context struct {
	parent     *Context
	tensors    map[string]*tensor.Tensor
	sequences  map[string]Sequence
	maps       map[string]Map
	shapes     map[string]tensor.Shape
	caches     *CacheMap
	persistent map[string]bool
	// inits are the graph's initializers, read through without copying.
	inits map[string]*tensor.Tensor
}

// NewContext returns an empty root context with its own CacheMap.
func NewContext() *Context {
	return &Context{
		tensors:    map[string]*tensor.Tensor{},
		sequences:  map[string]Sequence{},
		maps:       map[string]Map{},
		shapes:     map[string]tensor.Shape{},
		caches:     newCacheMap(),
		persistent: map[string]bool{},
	}
}

// NewChild returns a context for a subgraph or function call that sees c's
// values and caches without copying them.
func (c *Context) NewChild() *Context {
	return &Context{
		parent:     c,
		tensors:    map[string]*tensor.Tensor{},
		sequences:  map[string]Sequence{},
		maps:       map[string]Map{},
		shapes:     map[string]tensor.Shape{},
		caches:     c.caches,
		persistent: map[string]bool{},
	}
}

// Parent returns the parent context, or nil for a root.
func (c *Context) Parent() *Context { return c.parent }

// DeclarePersistent marks a value name as request state: ClearValues keeps
// it, ResetState drops it.
func (c *Context) DeclarePersistent(name string) { c.persistent[name] = true }

// SetInitializers makes a graph's initializers visible from c (and its
// children) without copying them into the store.
func (c *Context) SetInitializers(inits map[string]*tensor.Tensor) { c.inits = inits }

// PutTensor stores a tensor value.
func (c *Context) PutTensor(name string, t *tensor.Tensor) { c.tensors[name] = t }

// Tensor looks a tensor up in c, then in its ancestors.
func (c *Context) Tensor(name string) (*tensor.Tensor, bool) {
	for x := c; x != nil; x = x.parent {
		if t, ok := x.tensors[name]; ok {
			return t, true
		}
		if t, ok := x.inits[name]; ok {
			return t, true
		}
	}
	return nil, false
}

// HasTensor reports whether a tensor named name is visible from c.
func (c *Context) HasTensor(name string) bool { _, ok := c.Tensor(name); return ok }

// RemoveTensor drops a tensor from c's own store (not from ancestors).
func (c *Context) RemoveTensor(name string) { delete(c.tensors, name) }

// PutSequence stores a sequence value.
func (c *Context) PutSequence(name string, s Sequence) { c.sequences[name] = s }

// Sequence looks a sequence up in c, then in its ancestors.
func (c *Context) Sequence(name string) (Sequence, bool) {
	for x := c; x != nil; x = x.parent {
		if s, ok := x.sequences[name]; ok {
			return s, true
		}
	}
	return nil, false
}

// PutMap stores a map value.
func (c *Context) PutMap(name string, m Map) { c.maps[name] = m }

// Map looks a map up in c, then in its ancestors.
func (c *Context) Map(name string) (Map, bool) {
	for x := c; x != nil; x = x.parent {
		if m, ok := x.maps[name]; ok {
			return m, true
		}
	}
	return nil, false
}

// PutShape records a known shape for a value name.
func (c *Context) PutShape(name string, s tensor.Shape) { c.shapes[name] = s.Clone() }

// Shape returns a recorded shape, looking through ancestors.
func (c *Context) Shape(name string) (tensor.Shape, bool) {
	for x := c; x != nil; x = x.parent {
		if s, ok := x.shapes[name]; ok {
			return s, true
		}
	}
	return nil, false
}

// Value is the type-aware lookup: it returns the value named name from the
// store of the given kind (a *tensor.Tensor, Sequence, Map or
// *cache.KVCache), looking through ancestors.
func (c *Context) Value(name string, kind ValueKind) (any, bool) {
	switch kind {
	case ValueTensor:
		return c.Tensor(name)
	case ValueSequence:
		return c.Sequence(name)
	case ValueMap:
		return c.Map(name)
	case ValueCache:
		kv, err := c.caches.Get(name)
		return kv, err == nil
	}
	return nil, false
}

// Caches returns the CacheMap shared by c and all its relatives.
func (c *Context) Caches() *CacheMap { return c.caches }

// HasCache reports whether a cache named name exists.
func (c *Context) HasCache(name string) bool { return c.caches.Has(name) }

// GetCache returns the cache named name (errs.ErrNotFound if none).
func (c *Context) GetCache(name string) (*cache.KVCache, error) { return c.caches.Get(name) }

// PutCache stores a cache and takes ownership (see CacheMap.Put).
func (c *Context) PutCache(name string, kv *cache.KVCache) error { return c.caches.Put(name, kv) }

// RemoveCache takes a cache out and hands ownership to the caller.
func (c *Context) RemoveCache(name string) (*cache.KVCache, bool) { return c.caches.Remove(name) }

// ClearValues starts a new invocation: it drops every value of c's own
// stores except declared persistent ones, and keeps all caches.
func (c *Context) ClearValues() {
	for k := range c.tensors {
		if !c.persistent[k] {
			delete(c.tensors, k)
		}
	}
	for k := range c.sequences {
		if !c.persistent[k] {
			delete(c.sequences, k)
		}
	}
	for k := range c.maps {
		if !c.persistent[k] {
			delete(c.maps, k)
		}
	}
	clear(c.shapes)
}

// ResetState drops every value, persistent ones included, and closes every
// cache. Only a root context may reset the shared state.
func (c *Context) ResetState() error {
	if c.parent != nil {
		return fmt.Errorf("%w: ResetState on a subgraph context", errs.ErrInvalidArgument)
	}
	clear(c.tensors)
	clear(c.sequences)
	clear(c.maps)
	clear(c.shapes)
	c.caches.closeAll()
	return nil
}
