package runtime

import (
	"fmt"
	"sort"
	"sync"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

// CacheMap holds the KVCache values of one request's state by name. Caches
// are persistent: they survive Context.ClearValues and are closed only by
// RemoveCache's caller, by replacement, or by Context.ResetState.
//
// A CacheMap is shared, not copied, by every subgraph and function context
// of a run: a cache mutated inside an If branch is the parent's cache, and
// the mutation is visible to the parent as soon as the branch returns. It is
// safe for concurrent use.
type CacheMap struct {
	mu     sync.Mutex
	caches map[string]*cache.KVCache
}

func newCacheMap() *CacheMap { return &CacheMap{caches: map[string]*cache.KVCache{}} }

// Has reports whether a cache is stored under name.
func (m *CacheMap) Has(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.caches[name]
	return ok
}

// Get returns the cache stored under name, or an error wrapping
// errs.ErrNotFound. The map keeps ownership.
func (m *CacheMap) Get(name string) (*cache.KVCache, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.caches[name]
	if !ok {
		return nil, fmt.Errorf("%w: no cache named %q", errs.ErrNotFound, name)
	}
	return c, nil
}

// Put stores c under name and takes ownership of it. A different cache
// already stored under that name is closed (its memory goes back to its
// arena); putting the same handle again is a no-op.
func (m *CacheMap) Put(name string, c *cache.KVCache) error {
	if c == nil {
		return fmt.Errorf("%w: nil cache for %q", errs.ErrInvalidArgument, name)
	}
	m.mu.Lock()
	old := m.caches[name]
	m.caches[name] = c
	m.mu.Unlock()
	if old != nil && old != c {
		old.Close()
	}
	return nil
}

// Remove takes the cache stored under name out of the map and hands its
// ownership to the caller (who must Close it); ok is false if none.
func (m *CacheMap) Remove(name string) (c *cache.KVCache, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok = m.caches[name]
	delete(m.caches, name)
	return c, ok
}

// Names returns the stored cache names, sorted.
func (m *CacheMap) Names() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.caches))
	for k := range m.caches {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// closeAll closes and forgets every cache.
func (m *CacheMap) closeAll() {
	m.mu.Lock()
	all := m.caches
	m.caches = map[string]*cache.KVCache{}
	m.mu.Unlock()
	for _, c := range all {
		c.Close()
	}
}
