package cache

import (
	"errors"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// TestPrefixStoreShareAndEvict: blocks registered by one state's layers are
// attached by reference to another state with the same prompt (same rows,
// nothing copied, only whole blocks, a differing token stops the match);
// under budget pressure unreferenced entries are evicted LRU; after close
// the pool is empty.
func TestPrefixStoreShareAndEvict(t *testing.T) {
	r := rand.New(rand.NewPCG(21, 22))
	a, _ := NewArena(0)
	cfg := pagedCfg(1, 16, 4096)
	layers := func() []*KVCache { return []*KVCache{mustNew(t, a, cfg), mustNew(t, a, cfg)} }
	src := layers()
	for _, c := range src {
		fill(t, r, c, 70) // 4 full blocks + 6 tokens
	}
	tokens := make([]int64, 70)
	for i := range tokens {
		tokens[i] = int64(r.IntN(1000))
	}
	s := NewPrefixStore()
	mustOK(t, s.Register(src, tokens))
	mustOK(t, s.Register(src, tokens)) // idempotent
	if st := s.Stats(); st.Entries != 4 {
		t.Fatalf("registered %d entries, want 4", st.Entries)
	}
	dst := layers()
	n, err := s.Attach(dst, tokens, len(tokens)-1)
	mustOK(t, err)
	if n != 64 {
		t.Fatalf("attached %d tokens, want 64", n)
	}
	for l := range src {
		want := src[l].Info()
		got := dst[l].Info()
		if got.Lengths[0] != 64 || got.BlocksShared != 4 || dst[l].Counters().CopyBytes != 0 {
			t.Fatalf("layer %d after attach: %+v", l, got)
		}
		mustOK(t, src[l].Truncate([]int{64}))
		k0, v0 := exportF32(t, src[l])
		k1, v1 := exportF32(t, dst[l])
		if !slices.Equal(k0, k1) || !slices.Equal(v0, v1) {
			t.Fatalf("layer %d: attached rows differ (%v)", l, want.Lengths)
		}
	}
	other := slices.Clone(tokens)
	other[40]++ // third block differs: two blocks match
	third := layers()
	if n, err := s.Attach(third, other, 1000); err != nil || n != 32 {
		t.Fatalf("attach of a prompt differing in block 2: n=%d err=%v, want 32", n, err)
	}
	if _, err := s.Attach(third, other, 1000); err == nil {
		t.Fatal("attach to a non-empty state accepted")
	}
	// evict: entries referenced by a cache are kept
	for _, c := range append(append(src, dst...), third...) {
		c.Close()
	}
	if st := s.Stats(); st.Hits != 2 || st.TokensReused != 96 {
		t.Fatalf("stats %+v", st)
	}
	evicted := 0
	for s.EvictOne() {
		evicted++
	}
	if evicted != 4 {
		t.Fatalf("evicted %d entries, want 4", evicted)
	}
	if st := a.Stats(); st.Allocated != 0 {
		t.Fatalf("%d bytes allocated after eviction", st.Allocated)
	}
}

// TestPrefixStoreReclaimUnderBudget: an append that does not fit evicts
// unreferenced prefix blocks and then succeeds.
func TestPrefixStoreReclaimUnderBudget(t *testing.T) {
	r := rand.New(rand.NewPCG(23, 24))
	probe, _ := NewArena(0)
	p := probe.blockPool(16, 2, 8*4, 8*4)
	a, _ := NewArena(int64(p.slabBytes)) // one slab
	s := NewPrefixStore()
	a.SetReclaimer(s.EvictOne)
	cfg := pagedCfg(1, 16, 1<<16)
	c := mustNew(t, a, cfg)
	fill(t, r, c, p.slots*16) // the whole slab
	tokens := make([]int64, p.slots*16)
	mustOK(t, s.Register([]*KVCache{c}, tokens))
	c.Close() // the store alone holds the slab now
	d := mustNew(t, a, cfg)
	k, v := randKV(r, cfg, 16)
	err := d.Append(asBytes(k), asBytes(v), Float32, 16, nil)
	if err != nil {
		t.Fatalf("append under budget pressure with evictable prefixes: %v", err)
	}
	if st := s.Stats(); st.Evicted == 0 {
		t.Fatalf("nothing evicted: %+v", st)
	}
	// nothing left to evict: a BudgetError
	k, v = randKV(r, cfg, p.slots*16)
	var be *BudgetError
	if err := d.Append(asBytes(k), asBytes(v), Float32, p.slots*16, nil); !errors.As(err, &be) {
		t.Fatalf("err=%v, want a *BudgetError", err)
	}
}

// TestPrefixStoreCap: registering the blocks of ever new prompts keeps the
// store within its byte cap (it grew with every distinct prompt until a
// budget ran out, and the default arena has none), evicting the least
// recently used blocks; blocks a live cache still shares stay, and a
// lowered cap evicts at once.
func TestPrefixStoreCap(t *testing.T) {
	r := rand.New(rand.NewPCG(25, 26))
	a, _ := NewArena(0)
	cfg := pagedCfg(1, 16, 4096)
	s := NewPrefixStore()
	entry := int64(2 * 16 * (8 + 8) * 4) // two KV heads, 16 tokens of K and V rows of 8 float32
	s.SetMaxBytes(10 * entry)
	live := mustNew(t, a, cfg)
	fill(t, r, live, 48) // three blocks, kept referenced by this cache
	first := make([]int64, 48)
	mustOK(t, s.Register([]*KVCache{live}, first))
	for i := 1; i <= 40; i++ {
		c := mustNew(t, a, cfg)
		fill(t, r, c, 32)
		tokens := []int64{int64(i)} // a new prompt each time (its first token differs)
		tokens = append(tokens, make([]int64, 31)...)
		mustOK(t, s.Register([]*KVCache{c}, tokens))
		c.Close()
		if st := s.Stats(); st.Bytes > 10*entry || st.Bytes != st.Entries*entry {
			t.Fatalf("after %d prompts: %+v (entry %d bytes, cap %d)", i, st, entry, 10*entry)
		}
	}
	st := s.Stats()
	if st.Evicted == 0 || st.MaxBytes != 10*entry {
		t.Fatalf("stats %+v", st)
	}
	d := mustNew(t, a, cfg)
	if n, err := s.Attach([]*KVCache{d}, first, 1000); err != nil || n != 48 {
		t.Fatalf("the live cache's prefix: attached %d, %v; want all 48 tokens (never evicted while shared)", n, err)
	}
	d.Close()
	s.SetMaxBytes(entry) // lower: evicts down to what live caches share (3 entries)
	if st := s.Stats(); st.Entries != 3 {
		t.Fatalf("after lowering the cap: %+v, want the 3 shared entries left", st)
	}
	live.Close()
	s.Close()
}

// TestPrefixStoreConcurrent registers, attaches, appends to and closes
// states sharing prefixes from several goroutines while others evict (run
// with -race); at the end, after Close, the pool is empty.
func TestPrefixStoreConcurrent(t *testing.T) {
	a, _ := NewArena(0)
	s := NewPrefixStore()
	cfg := pagedCfg(1, 16, 1024)
	tokens := make([]int64, 100)
	for i := range tokens {
		tokens[i] = int64(i % 7)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 31))
			for range 30 {
				c, err := New(a, cfg)
				if err != nil {
					errs <- err
					return
				}
				if n, err := s.Attach([]*KVCache{c}, tokens, 99); err != nil {
					errs <- err
				} else {
					k, v := randKV(r, cfg, 100-n)
					if err := c.Append(asBytes(k), asBytes(v), Float32, 100-n, nil); err != nil {
						errs <- err
					}
					if err := s.Register([]*KVCache{c}, tokens); err != nil {
						errs <- err
					}
				}
				if r.IntN(3) == 0 {
					s.EvictOne()
				}
				c.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s.Close()
	if st := a.Stats(); st.Allocated != 0 || st.Live != 0 {
		t.Fatalf("after close allocated=%d live=%d", st.Allocated, st.Live)
	}
}
