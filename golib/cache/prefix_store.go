package cache

import (
	"fmt"
	"slices"
	"sync"
)

// PrefixStore shares the K/V blocks of prompt prefixes across requests. A
// full block of a batch-1 paged state is registered under a chained hash of
// the token ids up to its end (its parent block's key and its own tokens),
// one block per layer; a later state whose prompt starts with the same
// tokens attaches those blocks by reference (read-only: a write into a
// shared block copies it) and runs only the rest of its prompt.
// Registered blocks nobody else references are evicted least recently used
// when an append finds the arena's budget exhausted, and whenever the
// registered blocks' bytes exceed the store's cap (SetMaxBytes).
//
// PrefixStore is safe for concurrent use. Lock order: a cache's lock is
// never taken while the store's is held.
type PrefixStore struct {
	mu       sync.Mutex
	entries  map[uint64]*prefixEntry
	clock    uint64
	stats    PrefixStats
	maxBytes int64 // cap on the registered blocks' bytes (0: none)
}

// prefixEntry is one registered block of every layer.
type prefixEntry struct {
	parent uint64
	tokens []int64  // the block's token ids (checked on lookup: no hash collision is trusted)
	blocks []*block // per layer
	pools  []*blockPool
	used   uint64 // LRU clock
	bytes  int64  // the blocks' bytes, all layers
}

// PrefixStats are a store's figures.
type PrefixStats struct {
	Lookups      int64 // Attach calls
	Hits         int64 // Attach calls that attached at least one block
	TokensReused int64 // tokens attached instead of recomputed
	BytesSaved   int64 // K/V bytes attached instead of recomputed (all layers)
	Entries      int64 // registered blocks (one per layer each)
	Evicted      int64 // entries evicted under budget pressure or over the cap
	Bytes        int64 // bytes of the registered blocks (all layers; shared ones too)
	MaxBytes     int64 // the cap on Bytes (0: none)
}

// NewPrefixStore returns an empty store.
func NewPrefixStore() *PrefixStore { return &PrefixStore{entries: map[uint64]*prefixEntry{}} }

// prefixSeed keys a store's chains by the caches' geometry, so states of
// other block sizes or storage types never match.
func prefixSeed(caches []*KVCache) uint64 {
	h := uint64(14695981039346656037)
	for _, c := range caches {
		for _, v := range []int{c.cfg.BlockSize, int(c.cfg.Elem), c.cfg.KVHeads, c.cfg.HeadDimK, c.cfg.HeadDimV} {
			h = (h ^ uint64(v)) * 1099511628211
		}
	}
	return h
}

// chainKey is the key of a block: FNV-1a over the parent key and the
// block's token ids.
func chainKey(parent uint64, toks []int64) uint64 {
	h := (uint64(14695981039346656037) ^ parent) * 1099511628211
	for _, t := range toks {
		u := uint64(t)
		for range 8 {
			h = (h ^ (u & 0xff)) * 1099511628211
			u >>= 8
		}
	}
	return h
}

// checkLayers verifies that caches are paged, batch 1 (for Register) and of
// one block size.
func checkLayers(caches []*KVCache) (int, error) {
	if len(caches) == 0 {
		return 0, fmt.Errorf("%w: prefix sharing needs at least one layer cache", ErrInvalidArgument)
	}
	bs := caches[0].cfg.BlockSize
	for _, c := range caches {
		if c == nil || c.pg == nil || c.cfg.BlockSize != bs {
			return 0, fmt.Errorf("%w: prefix sharing needs paged caches of one block size", ErrInvalidArgument)
		}
	}
	return bs, nil
}

// Register records the full blocks of sequence 0 of every layer cache that
// hold tokens (the token ids of positions 0..len(tokens)-1). Blocks already
// registered are only marked used; nothing is copied. Sequences with an
// evicted window start are not registered.
func (s *PrefixStore) Register(caches []*KVCache, tokens []int64) error {
	bs, err := checkLayers(caches)
	if err != nil {
		return err
	}
	n := len(tokens) / bs
	if n == 0 {
		return nil
	}
	layers := make([][]*block, len(caches))
	for l, c := range caches {
		blks, err := c.retainPrefix(n)
		if err != nil {
			for i, done := range layers[:l] {
				caches[i].pg.pool.release(done)
			}
			return err
		}
		layers[l] = blks
	}
	var unused []*block
	s.mu.Lock()
	key := prefixSeed(caches)
	var path []*prefixEntry
	for i := range n {
		toks := tokens[i*bs : (i+1)*bs]
		parent := key
		key = chainKey(parent, toks)
		e := s.entries[key]
		if e != nil && (e.parent != parent || !slices.Equal(e.tokens, toks)) {
			break // a hash collision: this chain is not shared from here on
		}
		if e == nil {
			e = &prefixEntry{parent: parent, tokens: slices.Clone(toks)}
			for l, c := range caches {
				e.blocks = append(e.blocks, layers[l][i])
				e.pools = append(e.pools, c.pg.pool)
				e.bytes += int64(c.pg.pool.blockBytes)
				layers[l][i] = nil // the entry keeps this reference
			}
			s.entries[key] = e
			s.stats.Entries++
			s.stats.Bytes += e.bytes
		}
		path = append(path, e)
	}
	s.touchLocked(path)
	s.mu.Unlock()
	for l := range layers {
		for _, b := range layers[l] {
			if b != nil {
				unused = append(unused, b)
			}
		}
		caches[l].pg.pool.release(unused)
		unused = unused[:0]
	}
	s.trim()
	return nil
}

// SetMaxBytes caps the registered blocks' bytes at n (0: no cap), evicting
// least recently used blocks that no cache references until they fit.
// Blocks live caches share stay: the cap bounds what the store alone keeps.
func (s *PrefixStore) SetMaxBytes(n int64) {
	s.mu.Lock()
	s.maxBytes = max(n, 0)
	s.stats.MaxBytes = s.maxBytes
	s.mu.Unlock()
	s.trim()
}

// trim evicts until the registered blocks fit the cap or nothing more can
// be evicted.
func (s *PrefixStore) trim() {
	for {
		s.mu.Lock()
		over := s.maxBytes > 0 && s.stats.Bytes > s.maxBytes
		s.mu.Unlock()
		if !over || !s.EvictOne() {
			return
		}
	}
}

// touchLocked marks a chain used, its root last: eviction takes the
// least recently used entries first, so a chain loses its tail before its
// head and no registered block is left unreachable.
func (s *PrefixStore) touchLocked(path []*prefixEntry) {
	for i := len(path) - 1; i >= 0; i-- {
		s.clock++
		path[i].used = s.clock
	}
}

// Attach gives every sequence of the empty layer caches the longest
// registered prefix of tokens, in whole blocks and at most maxTokens
// tokens, by reference, and returns the tokens it covers (0: nothing
// attached, the caches unchanged).
func (s *PrefixStore) Attach(caches []*KVCache, tokens []int64, maxTokens int) (int, error) {
	bs, err := checkLayers(caches)
	if err != nil {
		return 0, err
	}
	for _, c := range caches {
		if c.MaxLen() != 0 {
			return 0, fmt.Errorf("%w: a prefix attaches only to an empty state", ErrInvalidArgument)
		}
	}
	s.mu.Lock()
	s.stats.Lookups++
	key := prefixSeed(caches)
	var path []*prefixEntry
	for i := 0; (i+1)*bs <= min(len(tokens), maxTokens); i++ {
		toks := tokens[i*bs : (i+1)*bs]
		parent := key
		key = chainKey(parent, toks)
		e := s.entries[key]
		if e == nil || e.parent != parent || !slices.Equal(e.tokens, toks) {
			break
		}
		path = append(path, e)
	}
	if len(path) == 0 {
		s.mu.Unlock()
		return 0, nil
	}
	layers := make([][]*block, len(caches))
	for l := range caches {
		for _, e := range path {
			layers[l] = append(layers[l], e.blocks[l])
		}
		caches[l].pg.pool.retain(layers[l]) // held while attaching, so eviction cannot free them
	}
	s.touchLocked(path)
	s.mu.Unlock()
	defer func() {
		for l, c := range caches {
			c.pg.pool.release(layers[l])
		}
	}()
	for l, c := range caches {
		if err := c.attachPrefix(layers[l]); err != nil {
			for _, done := range caches[:l] {
				_ = done.Reset()
			}
			return 0, err
		}
	}
	n := len(path) * bs
	s.mu.Lock()
	s.stats.Hits++
	s.stats.TokensReused += int64(n)
	for _, c := range caches {
		s.stats.BytesSaved += int64(n) * int64(c.cfg.Batch) * int64(c.cfg.KVHeads) * int64(c.rowK+c.rowV)
	}
	s.mu.Unlock()
	return n, nil
}

// EvictOne drops the least recently used registered block that no cache
// references and reports whether it dropped one.
func (s *PrefixStore) EvictOne() bool {
	s.mu.Lock()
	var victim *prefixEntry
	var vkey uint64
	for k, e := range s.entries {
		if victim != nil && e.used >= victim.used {
			continue
		}
		free := true
		for l, b := range e.blocks {
			if e.pools[l].refsOf(b) != 1 {
				free = false
				break
			}
		}
		if free {
			victim, vkey = e, k
		}
	}
	if victim != nil {
		delete(s.entries, vkey)
		s.stats.Entries--
		s.stats.Evicted++
		s.stats.Bytes -= victim.bytes
	}
	s.mu.Unlock()
	if victim == nil {
		return false
	}
	for l, b := range victim.blocks {
		victim.pools[l].release([]*block{b})
	}
	return true
}

// Stats returns the store's figures.
func (s *PrefixStore) Stats() PrefixStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Close releases every registered block.
func (s *PrefixStore) Close() {
	s.mu.Lock()
	entries := s.entries
	s.entries = map[uint64]*prefixEntry{}
	s.stats.Entries, s.stats.Bytes = 0, 0
	s.mu.Unlock()
	for _, e := range entries {
		for l, b := range e.blocks {
			e.pools[l].release([]*block{b})
		}
	}
}
