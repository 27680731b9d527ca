package cache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// pagedGeometries cross block boundaries with small blocks: capacities of
// several blocks, appends longer than a block.
var pagedGeometries = []Config{
	{Batch: 1, KVHeads: 1, HeadDimK: 4, Capacity: 70, Elem: Float32, BlockSize: 16},
	{Batch: 3, KVHeads: 2, HeadDimK: 8, HeadDimV: 5, Capacity: 100, Elem: Float32, BlockSize: 16},
	{Batch: 2, KVHeads: 4, HeadDimK: 16, Capacity: 90, Elem: Float16, BlockSize: 32},
	{Batch: 4, KVHeads: 2, HeadDimK: 6, HeadDimV: 10, Capacity: 80, Elem: BFloat16, BlockSize: 16},
}

// selectModel keeps the model's sequences idx.
func (m *model) selectSeqs(idx []int) *model {
	cfg := m.cfg
	cfg.Batch = len(idx)
	out := newModel(cfg)
	for p, i := range idx {
		out.k[p], out.v[p] = m.k[i], m.v[i]
		out.winStart[p] = m.winStart[i]
	}
	return out.clone()
}

// TestPagedRandomOperations drives a contiguous and a paged cache and the
// model through the same random sequences of every operation (randomOps)
// and compares both with the model after every step; the paged cache's
// blocks all go back to the pool at the end.
func TestPagedRandomOperations(t *testing.T) {
	for gi, cfg := range pagedGeometries {
		for seed := range uint64(12) {
			r := rand.New(rand.NewPCG(seed, uint64(gi)+100))
			randomOps(t, cfg, []Layout{Contiguous, Paged}, r, 80, fmt.Sprintf("cfg %d seed %d", gi, seed))
		}
	}
}

// appendRagged appends counts[b] of the n tokens of sequence b (all n when
// counts is nil).
func (m *model) appendRagged(k, v []float32, n int, counts []int) {
	cfg := m.cfg
	for b := range cfg.Batch {
		cnt := n
		if counts != nil {
			cnt = counts[b]
		}
		for h := range cfg.KVHeads {
			u := b*cfg.KVHeads + h
			for t := range cnt {
				o := u*n + t
				m.k[b][h] = append(m.k[b][h], slices.Clone(k[o*cfg.HeadDimK:(o+1)*cfg.HeadDimK]))
				m.v[b][h] = append(m.v[b][h], slices.Clone(v[o*cfg.HeadDimV:(o+1)*cfg.HeadDimV]))
			}
		}
	}
}

func pagedCfg(batch, bs, capacity int) Config {
	return Config{Batch: batch, KVHeads: 2, HeadDimK: 8, Capacity: capacity, Elem: Float32, Layout: Paged, BlockSize: bs}
}

func fill(t *testing.T, r *rand.Rand, c *KVCache, n int) {
	t.Helper()
	k, v := randKV(r, c.Config(), n)
	mustOK(t, c.Append(asBytes(k), asBytes(v), Float32, n, nil))
}

// TestPagedForkCopyOnWrite: a fork copies nothing and commits no memory; the
// first write into the shared partially filled last block copies exactly
// that block's valid rows, full blocks are never copied, and the parent is
// unchanged.
func TestPagedForkCopyOnWrite(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, L := range []int{64, 70, 100} {
		a, _ := NewArena(0)
		c := mustNew(t, a, pagedCfg(1, 32, 256))
		fill(t, r, c, L)
		m := newModel(c.Config())
		mk, mv := exportF32(t, c)
		committed := a.Stats().Allocated
		c.ResetCounters()
		f, err := c.Fork()
		mustOK(t, err)
		if got := c.Counters().CopyBytes; got != 0 {
			t.Fatalf("L=%d: fork copied %d bytes", L, got)
		}
		if got := a.Stats().Allocated; got != committed {
			t.Fatalf("L=%d: fork committed %d more bytes", L, got-committed)
		}
		if in := f.Info(); in.BlocksShared != in.BlocksUsed {
			t.Fatalf("L=%d: fork shares %d of %d blocks", L, in.BlocksShared, in.BlocksUsed)
		}
		fill(t, r, f, 1)
		row := int64(2 * (8 + 8) * 4) // KVHeads*(rowK+rowV)
		want := int64(L%32) * row     // the valid rows of the partial block
		if got := f.Counters().CopyBytes; got != want {
			t.Fatalf("L=%d: first write into the fork copied %d bytes, want %d", L, got, want)
		}
		fill(t, r, f, 40)
		if got := f.Counters().CopyBytes; got != want {
			t.Fatalf("L=%d: later writes copied %d bytes, want still %d", L, got, want)
		}
		k, v := exportF32(t, c)
		if !slices.Equal(k, mk) || !slices.Equal(v, mv) {
			t.Fatalf("L=%d: the parent changed after writes into its fork", L)
		}
		_ = m
		f.Close()
		c.Close()
		if st := a.Stats(); st.Allocated != 0 {
			t.Fatalf("L=%d: %d bytes allocated after close", L, st.Allocated)
		}
	}
}

// exportF32 exports c as float32 present tensors.
func exportF32(t *testing.T, c *KVCache) (k, v []float32) {
	t.Helper()
	cfg := c.Config()
	L := c.MaxLen()
	kb := make([]byte, cfg.Batch*cfg.KVHeads*L*cfg.HeadDimK*4)
	vb := make([]byte, cfg.Batch*cfg.KVHeads*L*cfg.HeadDimV*4)
	mustOK(t, c.Export(kb, vb, Float32, L))
	return slices.Clone(asF32(kb)), slices.Clone(asF32(vb))
}

// TestPagedReorderCopyBound: a beam step at 4k with 4 beams (reorder with
// repeats, then one token appended per beam) copies at most one block per
// beam; the reorder itself copies nothing.
func TestPagedReorderCopyBound(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, bs := range []int{16, 32, 64, 128} {
		a, _ := NewArena(0)
		c := mustNew(t, a, pagedCfg(4, bs, 4200))
		fill(t, r, c, 4096+5)
		blockB := int64(bs * 2 * (8 + 8) * 4)
		for step, idx := range [][]int{{0, 0, 1, 1}, {3, 3, 3, 3}, {1, 0, 3, 2}, {2, 2, 0, 1}} {
			c.ResetCounters()
			mustOK(t, c.Reorder(idx))
			if got := c.Counters().CopyBytes; got != 0 {
				t.Fatalf("bs %d step %d: reorder copied %d bytes", bs, step, got)
			}
			fill(t, r, c, 1)
			if got := c.Counters().CopyBytes; got > 4*blockB {
				t.Fatalf("bs %d step %d: beam step copied %d bytes, more than 4 blocks (%d)", bs, step, got, 4*blockB)
			}
		}
		c.Close()
		if st := a.Stats(); st.Allocated != 0 {
			t.Fatalf("bs %d: %d bytes allocated after close", bs, st.Allocated)
		}
	}
}

// TestPagedCommitsOnDemand: creation commits nothing; memory grows by whole
// blocks; 16 forks sharing a prefix commit about one sequence's bytes; evict
// and truncate give whole blocks back.
func TestPagedCommitsOnDemand(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	a, _ := NewArena(0)
	c := mustNew(t, a, pagedCfg(1, 64, 1<<16))
	if got := a.Stats().Allocated; got != 0 {
		t.Fatalf("creation committed %d bytes", got)
	}
	used := func() int64 { return a.BlockPools()[0].Used }
	fill(t, r, c, 4096)
	if got := used(); got != 64 {
		t.Fatalf("4096 tokens take %d blocks, want 64", got)
	}
	slab := int64(a.BlockPools()[0].SlabBlocks * a.BlockPools()[0].BlockBytes)
	if got := a.Stats().Allocated; got != (64+int64(a.BlockPools()[0].SlabBlocks)-1)/int64(a.BlockPools()[0].SlabBlocks)*slab {
		t.Fatalf("4096 tokens commit %d bytes, not whole slabs of %d", got, slab)
	}
	var forks []*KVCache
	for range 16 {
		f, err := c.Fork()
		mustOK(t, err)
		forks = append(forks, f)
	}
	if got := used(); got != 64 {
		t.Fatalf("16 forks sharing 4096 tokens use %d blocks, want 64", got)
	}
	for _, f := range forks {
		fill(t, r, f, 1) // 4096 is a block multiple: one private block each
	}
	if got := used(); got != 64+16 {
		t.Fatalf("16 forks with one token each use %d blocks, want 80", got)
	}
	for _, f := range forks {
		f.Close()
	}
	mustOK(t, c.Evict(1000))
	if got := used(); got != 16 { // positions 3096..4095 lie in blocks 48..63
		t.Fatalf("a window of 1000 tokens keeps %d blocks, want 16", got)
	}
	mustOK(t, c.Truncate([]int{4096 - 500}))
	if got := used(); got != 16-7 {
		t.Fatalf("truncate kept %d blocks, want 9", got)
	}
}

// TestPagedBudgetExhaustion: an append that needs more blocks than the
// budget holds — in a plain cache, in a fork sharing a partial block, after
// a reorder — fails with a *BudgetError and leaves every cache
// byte-identical, with the same lengths and counters of live bytes.
func TestPagedBudgetExhaustion(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	probe, _ := NewArena(0)
	p := probe.blockPool(16, 2, 8*4, 8*4)
	a, _ := NewArena(int64(p.slabBytes)) // one slab
	c := mustNew(t, a, pagedCfg(2, 16, 8192))
	fill(t, r, c, 40) // 3 blocks per sequence: 6 taken
	f, err := c.Fork()
	mustOK(t, err)
	snap := func() [][]float32 {
		ck, cv := exportF32(t, c)
		fk, fv := exportF32(t, f)
		return [][]float32{ck, cv, fk, fv}
	}
	before, lens, live := snap(), c.Lengths(), a.Stats().Live
	check := func(what string, err error) {
		t.Helper()
		var be *BudgetError
		if !errors.As(err, &be) {
			t.Fatalf("%s: err=%v, want a *BudgetError", what, err)
		}
		after := snap()
		for i := range before {
			if !slices.Equal(before[i], after[i]) {
				t.Fatalf("%s: cache contents changed", what)
			}
		}
		if !slices.Equal(c.Lengths(), lens) || !slices.Equal(f.Lengths(), lens) || a.Stats().Live != live {
			t.Fatalf("%s: lengths or live bytes changed", what)
		}
	}
	big := p.slots * 16 // a slab's worth of tokens per sequence
	k, v := randKV(r, c.Config(), big)
	check("append", c.Append(asBytes(k), asBytes(v), Float32, big, nil))
	check("fork append", f.Append(asBytes(k), asBytes(v), Float32, big, nil))
	mustOK(t, f.Reorder([]int{1, 1}))
	before, lens = snap(), f.Lengths()
	check("reorder append", f.Append(asBytes(k), asBytes(v), Float32, big, nil))
	// within the budget it works again
	k, v = randKV(r, c.Config(), 8)
	mustOK(t, f.Append(asBytes(k), asBytes(v), Float32, 8, nil))
}

// TestPagedConcurrentSharing forks, reorders, appends, reads and closes many
// caches that share blocks from several goroutines (run it with -race);
// every reference count returns to zero and the pool is empty at the end.
func TestPagedConcurrentSharing(t *testing.T) {
	a, _ := NewArena(0)
	root, err := New(a, pagedCfg(2, 16, 4096))
	mustOK(t, err)
	fill(t, rand.New(rand.NewPCG(9, 9)), root, 37)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for g := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 10))
			var mine []*KVCache
			for range 40 {
				src := root
				if len(mine) > 0 && r.IntN(2) == 0 {
					src = mine[r.IntN(len(mine))]
				}
				f, err := src.Fork()
				if err != nil {
					errs <- err
					return
				}
				mine = append(mine, f)
				k, v := randKV(r, f.Config(), 1+r.IntN(20))
				if err := f.Append(asBytes(k), asBytes(v), Float32, len(k)/(2*2*8), nil); err != nil {
					errs <- err
					return
				}
				if err := f.Reorder([]int{r.IntN(2), r.IntN(2)}); err != nil {
					errs <- err
					return
				}
				view, err := src.BeginRead()
				if err == nil {
					var segs []Segment
					for b := range view.Batch() {
						segs = view.AppendSegments(segs[:0], b, 1, view.WindowStart(b), view.SeqLen(b))
						for _, s := range segs {
							_ = s.K[len(s.K)-1] + s.V[0]
						}
					}
					src.EndRead()
				}
				if len(mine) > 4 {
					i := r.IntN(len(mine))
					mine[i].Close()
					mine = append(mine[:i], mine[i+1:]...)
				}
			}
			for _, c := range mine {
				c.Close()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	root.Close()
	if st := a.Stats(); st.Allocated != 0 || st.Live != 0 {
		t.Fatalf("after close allocated=%d live=%d", st.Allocated, st.Live)
	}
	for _, p := range a.BlockPools() {
		if p.Used != 0 || p.Shared != 0 {
			t.Fatalf("pool not empty: %+v", p)
		}
	}
}

// TestSelectValidation: bad indices change nothing.
func TestSelectValidation(t *testing.T) {
	for _, lay := range []Layout{Contiguous, Paged} {
		a, _ := NewArena(0)
		cfg := pagedCfg(3, 16, 64)
		cfg.Layout = lay
		c := mustNew(t, a, cfg)
		fill(t, rand.New(rand.NewPCG(1, 1)), c, 20)
		for _, idx := range [][]int{{}, {0, 0}, {3}, {-1}, {0, 1, 2, 0}} {
			if err := c.Select(idx); err == nil {
				t.Fatalf("%v: select %v accepted", lay, idx)
			}
		}
		if c.Config().Batch != 3 {
			t.Fatalf("%v: batch changed", lay)
		}
		mustOK(t, c.Select([]int{2, 0}))
		if got := c.Info(); got.Batch != 2 || len(got.Lengths) != 2 {
			t.Fatalf("%v: after select %+v", lay, got)
		}
	}
}

// TestPagedAdopt: adopting a paged cache moves its page tables (no byte
// copied, blocks still shared with a fork of the source); the result
// exports as the two caches did; everything goes back to the pool.
func TestPagedAdopt(t *testing.T) {
	r := rand.New(rand.NewPCG(41, 42))
	a, _ := NewArena(0)
	c := mustNew(t, a, pagedCfg(2, 16, 256))
	src := mustNew(t, a, pagedCfg(1, 16, 256))
	fill(t, r, c, 20)
	fill(t, r, src, 37)
	f, err := src.Fork()
	mustOK(t, err)
	ck, cv := exportF32(t, c)
	sk, sv := exportF32(t, src)
	mustOK(t, c.Adopt(src))
	if !src.Closed() || c.Config().Batch != 3 || c.Counters().CopyBytes != 0 {
		t.Fatalf("after adopt: src closed %v, batch %d, copied %d", src.Closed(), c.Config().Batch, c.Counters().CopyBytes)
	}
	if got := c.Lengths(); !slices.Equal(got, []int{20, 20, 37}) {
		t.Fatalf("lengths %v", got)
	}
	k, v := exportF32(t, c)
	L := 37
	for b := range 3 {
		for h := range 2 {
			for p := range L {
				var wk, wv []float32
				if b < 2 && p < 20 {
					o := ((b*2+h)*20 + p) * 8
					wk, wv = ck[o:o+8], cv[o:o+8]
				} else if b == 2 {
					o := (h*37 + p) * 8
					wk, wv = sk[o:o+8], sv[o:o+8]
				} else {
					wk, wv = make([]float32, 8), make([]float32, 8)
				}
				o := ((b*2+h)*L + p) * 8
				if !slices.Equal(k[o:o+8], wk) || !slices.Equal(v[o:o+8], wv) {
					t.Fatalf("b %d h %d p %d differs", b, h, p)
				}
			}
		}
	}
	fill(t, r, c, 1) // writes into the block shared with the fork: copy-on-write
	if fk, _ := exportF32(t, f); !slices.Equal(fk, sk) {
		t.Fatal("the fork changed after a write into the adopting cache")
	}
	f.Close()
	c.Close()
	if st := a.Stats(); st.Allocated != 0 || st.Live != 0 {
		t.Fatalf("after close allocated=%d live=%d", st.Allocated, st.Live)
	}
}
