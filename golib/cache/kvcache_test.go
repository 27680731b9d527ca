package cache

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// model is the obviously-correct reference of a cache: per sequence, per
// head, a list of rows.
type model struct {
	cfg      Config
	k, v     [][][][]float32 // [b][h][pos][d]
	winStart []int
}

func newModel(cfg Config) *model {
	m := &model{cfg: cfg, winStart: make([]int, cfg.Batch)}
	m.k = make([][][][]float32, cfg.Batch)
	m.v = make([][][][]float32, cfg.Batch)
	for b := range cfg.Batch {
		m.k[b] = make([][][]float32, cfg.KVHeads)
		m.v[b] = make([][][]float32, cfg.KVHeads)
	}
	return m
}

func (m *model) clone() *model {
	c := newModel(m.cfg)
	copy(c.winStart, m.winStart)
	for b := range m.k {
		for h := range m.k[b] {
			c.k[b][h] = slices.Clone(m.k[b][h])
			c.v[b][h] = slices.Clone(m.v[b][h])
		}
	}
	return c
}

func (m *model) lens() []int {
	out := make([]int, m.cfg.Batch)
	for b := range out {
		out[b] = len(m.k[b][0])
	}
	return out
}

// randKV returns k and v float32 tensors for n tokens, values exactly
// representable in bf16 and fp16 so every dtype round-trips bit-exactly.
func randKV(r *rand.Rand, cfg Config, n int) (k, v []float32) {
	if cfg.HeadDimV == 0 {
		cfg.HeadDimV = cfg.HeadDimK
	}
	k = make([]float32, cfg.Batch*cfg.KVHeads*n*cfg.HeadDimK)
	v = make([]float32, cfg.Batch*cfg.KVHeads*n*cfg.HeadDimV)
	for i := range k {
		k[i] = float32(r.IntN(256)-128) / 16
	}
	for i := range v {
		v[i] = float32(r.IntN(256)-128) / 16
	}
	return k, v
}

func (m *model) append(k, v []float32, n int) {
	cfg := m.cfg
	for b := range cfg.Batch {
		for h := range cfg.KVHeads {
			u := b*cfg.KVHeads + h
			for t := range n {
				o := (u*n + t)
				m.k[b][h] = append(m.k[b][h], slices.Clone(k[o*cfg.HeadDimK:(o+1)*cfg.HeadDimK]))
				m.v[b][h] = append(m.v[b][h], slices.Clone(v[o*cfg.HeadDimV:(o+1)*cfg.HeadDimV]))
			}
		}
	}
}

// check compares an export of c with the model.
func (m *model) check(t *testing.T, c *KVCache) {
	t.Helper()
	cfg := m.cfg
	if got, want := c.Lengths(), m.lens(); !slices.Equal(got, want) {
		t.Fatalf("lengths %v, want %v", got, want)
	}
	L := c.MaxLen()
	kb := make([]byte, cfg.Batch*cfg.KVHeads*L*cfg.HeadDimK*4)
	vb := make([]byte, cfg.Batch*cfg.KVHeads*L*cfg.HeadDimV*4)
	if err := c.Export(kb, vb, Float32, L); err != nil {
		t.Fatal(err)
	}
	k, v := asF32(kb), asF32(vb)
	for b := range cfg.Batch {
		for h := range cfg.KVHeads {
			u := b*cfg.KVHeads + h
			for p := range L {
				for d := range cfg.HeadDimK {
					want := float32(0)
					if p >= m.winStart[b] && p < len(m.k[b][h]) {
						want = m.k[b][h][p][d]
					}
					if got := k[(u*L+p)*cfg.HeadDimK+d]; got != want {
						t.Fatalf("k[%d,%d,%d,%d]=%v want %v", b, h, p, d, got, want)
					}
				}
				for d := range cfg.HeadDimV {
					want := float32(0)
					if p >= m.winStart[b] && p < len(m.v[b][h]) {
						want = m.v[b][h][p][d]
					}
					if got := v[(u*L+p)*cfg.HeadDimV+d]; got != want {
						t.Fatalf("v[%d,%d,%d,%d]=%v want %v", b, h, p, d, got, want)
					}
				}
			}
		}
	}
}

func mustNew(t *testing.T, a *Arena, cfg Config) *KVCache {
	t.Helper()
	c, err := New(a, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

var geometries = []Config{
	{Batch: 1, KVHeads: 1, HeadDimK: 4, Capacity: 8, Elem: Float32},
	{Batch: 3, KVHeads: 2, HeadDimK: 8, HeadDimV: 5, Capacity: 40, Elem: Float32},
	{Batch: 2, KVHeads: 4, HeadDimK: 16, Capacity: 33, Elem: Float16},
	{Batch: 4, KVHeads: 2, HeadDimK: 6, HeadDimV: 10, Capacity: 20, Elem: BFloat16},
}

// TestRandomOperations drives a cache and the model through the same random
// sequences of operations and compares them after every step.
func TestRandomOperations(t *testing.T) {
	for gi, cfg := range geometries {
		for seed := range uint64(6) {
			randomOps(t, cfg, []Layout{Contiguous}, rand.New(rand.NewPCG(seed, uint64(gi))), 60, fmt.Sprintf("cfg %d seed %d", gi, seed))
		}
	}
}

// randomOps applies steps random operations drawn from r (append, sometimes
// ragged; truncate; reorder with repeats; checkpoint and rollback; evict
// with windows that are not block multiples; fork with a write into the
// fork; select; reset) to one fresh cache of cfg per layout and to the
// model, and compares every cache with the model after every step; at the
// end the arena holds nothing (every block back in its pool). label names
// the run in failures. TestRandomOperations, TestPagedRandomOperations and
// FuzzCacheOps share it.
func randomOps(t *testing.T, cfg Config, layouts []Layout, r *rand.Rand, steps int, label string) {
	a, _ := NewArena(0)
	defer a.Close()
	var caches []*KVCache
	for _, l := range layouts {
		c := cfg
		c.Layout = l
		caches = append(caches, mustNew(t, a, c))
	}
	cfg = caches[len(caches)-1].Config() // the block size a paged layout chose
	if cfg.BlockSize == 0 {
		cfg.BlockSize = 4 // sizes appends and windows on contiguous-only runs
	}
	m := newModel(caches[0].Config())
	type ck struct {
		ids []uint64
		m   *model
	}
	var cks []ck
	for step := range steps {
		B := m.cfg.Batch
		switch op := r.IntN(11); op {
		case 0, 1, 2: // append, sometimes ragged
			n := r.IntN(2 * cfg.BlockSize)
			k, v := randKV(r, m.cfg, n)
			var counts []int
			if r.IntN(3) == 0 {
				counts = make([]int, B)
				for b := range counts {
					counts[b] = r.IntN(n + 1)
				}
			}
			lens := m.lens()
			fits := true
			for b := range B {
				cnt := n
				if counts != nil {
					cnt = counts[b]
				}
				fits = fits && lens[b]+cnt <= cfg.Capacity
			}
			for _, c := range caches {
				err := c.Append(asBytes(k), asBytes(v), Float32, n, counts)
				if fits != (err == nil) || (err != nil && !errors.Is(err, ErrCapacity)) {
					t.Fatalf("%s step %d: %v append %d: err=%v fits=%v", label, step, c.cfg.Layout, n, err, fits)
				}
			}
			if fits {
				m.appendRagged(k, v, n, counts)
			}
		case 3: // truncate every sequence to a random valid length
			n := make([]int, B)
			lens := m.lens()
			for b := range n {
				n[b] = m.winStart[b] + r.IntN(lens[b]-m.winStart[b]+1)
			}
			for _, c := range caches {
				mustOK(t, c.Truncate(n))
			}
			for b := range m.k {
				for h := range m.k[b] {
					m.k[b][h] = m.k[b][h][:n[b]]
					m.v[b][h] = m.v[b][h][:n[b]]
				}
			}
		case 4: // reorder with repeats
			idx := make([]int, B)
			for i := range idx {
				idx[i] = r.IntN(B)
			}
			for _, c := range caches {
				mustOK(t, c.Reorder(idx))
			}
			old := m.clone()
			for b, i := range idx {
				m.k[b], m.v[b] = old.clone().k[i], old.clone().v[i]
				m.winStart[b] = old.winStart[i]
			}
			cks = nil
		case 5: // checkpoint
			var ids []uint64
			for _, c := range caches {
				id, err := c.Checkpoint()
				mustOK(t, err)
				ids = append(ids, id)
			}
			cks = append(cks, ck{ids, m.clone()})
		case 6: // rollback: every layout agrees on whether it is stale
			if len(cks) == 0 {
				continue
			}
			x := cks[r.IntN(len(cks))]
			e0 := caches[0].Rollback(x.ids[0])
			for i, c := range caches[1:] {
				if e := c.Rollback(x.ids[i+1]); (e0 == nil) != (e == nil) {
					t.Fatalf("%s step %d: rollback %v: %v, %v: %v", label, step, caches[0].cfg.Layout, e0, c.cfg.Layout, e)
				}
			}
			if e0 == nil {
				m = x.m.clone()
			} else if !errors.Is(e0, ErrStaleCheckpoint) {
				t.Fatal(e0)
			}
		case 7: // evict: windows that are not block multiples
			keep := r.IntN(3 * cfg.BlockSize)
			for _, c := range caches {
				mustOK(t, c.Evict(keep))
			}
			for b, l := range m.lens() {
				m.winStart[b] = max(m.winStart[b], l-keep)
			}
		case 8: // fork, write into the fork, check it, drop it
			for _, c := range caches {
				f, err := c.Fork()
				mustOK(t, err)
				fm := m.clone()
				n := r.IntN(cfg.BlockSize)
				if slices.Max(fm.lens())+n <= cfg.Capacity {
					k, v := randKV(r, m.cfg, n)
					mustOK(t, f.Append(asBytes(k), asBytes(v), Float32, n, nil))
					fm.append(k, v, n)
				}
				fm.check(t, f)
				f.Close()
			}
		case 9: // select a subset
			perm := r.Perm(B)[:1+r.IntN(B)]
			for _, c := range caches {
				mustOK(t, c.Select(perm))
			}
			m = m.selectSeqs(perm)
			cks = nil
		case 10:
			if r.IntN(4) == 0 {
				for _, c := range caches {
					mustOK(t, c.Reset())
				}
				m = newModel(m.cfg)
				cks = nil
			}
		}
		for _, c := range caches {
			m.check(t, c)
		}
	}
	for _, c := range caches {
		c.Close()
	}
	if st := a.Stats(); st.Allocated != 0 || st.Live != 0 {
		t.Fatalf("%s: after close allocated=%d live=%d", label, st.Allocated, st.Live)
	}
	for _, p := range a.BlockPools() {
		if p.Used != 0 || p.Shared != 0 {
			t.Fatalf("%s: pool not empty after close: %+v", label, p)
		}
	}
}

func TestAppendCostProportionalToNewTokens(t *testing.T) {
	for _, cfg := range geometries {
		a, _ := NewArena(0)
		c := mustNew(t, a, cfg)
		r := rand.New(rand.NewPCG(1, 2))
		row := int64(cfg.KVHeads*(cfg.HeadDimK+c.Config().HeadDimV)*cfg.Elem.Size()) * int64(cfg.Batch)
		for step := 1; step <= cfg.Capacity; step++ {
			k, v := randKV(r, c.Config(), 1)
			if err := c.Append(asBytes(k), asBytes(v), Float32, 1, nil); err != nil {
				t.Fatal(err)
			}
			if got := c.Counters().AppendBytes; got != int64(step)*row {
				t.Fatalf("%v: after %d steps append copied %d bytes, want %d", cfg, step, got, int64(step)*row)
			}
		}
	}
}

func TestAppendErrorsLeaveCacheIntact(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 2, HeadDimK: 4, Capacity: 4, Elem: Float16}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	m := newModel(c.Config())
	r := rand.New(rand.NewPCG(3, 4))
	k, v := randKV(r, c.Config(), 3)
	if err := c.Append(asBytes(k), asBytes(v), Float32, 3, nil); err != nil {
		t.Fatal(err)
	}
	m.append(k, v, 3)
	k2, v2 := randKV(r, c.Config(), 2)
	cases := []struct {
		name   string
		k, v   []byte
		src    ElemType
		n      int
		counts []int
		want   error
	}{
		{"past capacity", asBytes(k2), asBytes(v2), Float32, 2, nil, ErrCapacity},
		{"short k", asBytes(k2)[:8], asBytes(v2), Float32, 2, nil, ErrInvalidArgument},
		{"negative n", nil, nil, Float32, -1, nil, ErrInvalidArgument},
		{"bad counts length", asBytes(k2), asBytes(v2), Float32, 2, []int{1}, ErrInvalidArgument},
		{"count above n", asBytes(k2), asBytes(v2), Float32, 2, []int{3, 0}, ErrInvalidArgument},
		{"negative count", asBytes(k2), asBytes(v2), Float32, 2, []int{-1, 0}, ErrInvalidArgument},
		{"bad type", asBytes(k2), asBytes(v2), ElemType(9), 2, nil, ErrInvalidArgument},
	}
	for _, tc := range cases {
		err := c.Append(tc.k, tc.v, tc.src, tc.n, tc.counts)
		if !errors.Is(err, tc.want) {
			t.Errorf("%s: err %v, want %v", tc.name, err, tc.want)
		}
		m.check(t, c)
	}
	// ragged append within capacity works
	if err := c.Append(asBytes(k2), asBytes(v2), Float32, 2, []int{1, 0}); err != nil {
		t.Fatal(err)
	}
	if got := c.Lengths(); !slices.Equal(got, []int{4, 3}) {
		t.Fatalf("ragged lengths %v", got)
	}
}

func TestForkIsIndependent(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 2, HeadDimK: 4, HeadDimV: 3, Capacity: 10, Elem: BFloat16}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	m := newModel(c.Config())
	r := rand.New(rand.NewPCG(5, 6))
	k, v := randKV(r, cfg, 4)
	mustAppend(t, c, k, v, 4)
	m.append(k, v, 4)
	f, err := c.Fork()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fm := m.clone()
	k2, v2 := randKV(r, cfg, 2)
	mustAppend(t, f, k2, v2, 2)
	fm.append(k2, v2, 2)
	mustOK(t, c.Truncate([]int{1}))
	for b := range m.k {
		for h := range m.k[b] {
			m.k[b][h], m.v[b][h] = m.k[b][h][:1], m.v[b][h][:1]
		}
	}
	m.check(t, c)
	fm.check(t, f)
	want := int64(2 * 2 * 4 * (4 + 3) * 2)
	if got := c.Counters().CopyBytes; got != want {
		t.Fatalf("fork copied %d bytes, want %d", got, want)
	}
}

func TestReorderCopiesOnlyDuplicates(t *testing.T) {
	cfg := Config{Batch: 4, KVHeads: 1, HeadDimK: 2, Capacity: 8, Elem: Float32}
	cases := []struct {
		idx    []int
		copies int
	}{
		{[]int{0, 1, 2, 3}, 0},
		{[]int{3, 2, 1, 0}, 0},
		{[]int{0, 0, 0, 0}, 3},
		{[]int{1, 1, 2, 2}, 2},
	}
	for _, tc := range cases {
		a, _ := NewArena(0)
		c := mustNew(t, a, cfg)
		r := rand.New(rand.NewPCG(7, 8))
		k, v := randKV(r, cfg, 5)
		mustAppend(t, c, k, v, 5)
		c.ResetCounters()
		if err := c.Reorder(tc.idx); err != nil {
			t.Fatal(err)
		}
		per := int64(5 * 2 * 4 * 2)
		if got := c.Counters().CopyBytes; got != int64(tc.copies)*per {
			t.Errorf("reorder %v copied %d bytes, want %d", tc.idx, got, int64(tc.copies)*per)
		}
	}
}

func TestReorderRejectsBadIndices(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 1, HeadDimK: 2, Capacity: 4, Elem: Float32}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	for _, idx := range [][]int{{0, 2}, {-1, 0}, {0}, {0, 1, 1}} {
		err := c.Reorder(idx)
		if err == nil {
			t.Errorf("reorder %v accepted", idx)
		}
	}
	if !errors.Is(c.Reorder([]int{0, 5}), ErrOutOfRange) {
		t.Error("out-of-range index is not ErrOutOfRange")
	}
}

func TestRollbackAfterTruncate(t *testing.T) {
	cfg := Config{Batch: 1, KVHeads: 1, HeadDimK: 2, Capacity: 16, Elem: Float32}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	r := rand.New(rand.NewPCG(9, 9))
	k, v := randKV(r, cfg, 6)
	mustAppend(t, c, k, v, 6)
	id, _ := c.Checkpoint()
	mustOK(t, c.Truncate([]int{2}))
	if err := c.Rollback(id); err != nil {
		t.Fatalf("rollback after truncate: %v", err)
	}
	if got := c.Lengths()[0]; got != 6 {
		t.Fatalf("length after rollback %d, want 6", got)
	}
	mustOK(t, c.Truncate([]int{2}))
	k1, v1 := randKV(r, cfg, 1)
	mustAppend(t, c, k1, v1, 1) // overwrites position 2
	if err := c.Rollback(id); !errors.Is(err, ErrStaleCheckpoint) {
		t.Fatalf("rollback over overwritten rows: %v", err)
	}
	c.ReleaseCheckpoint(id)
	if err := c.Rollback(id); !errors.Is(err, ErrStaleCheckpoint) {
		t.Fatalf("rollback of released checkpoint: %v", err)
	}
}

func TestTruncateValidation(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 1, HeadDimK: 2, Capacity: 8, Elem: Float32}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	k, v := randKV(rand.New(rand.NewPCG(1, 1)), cfg, 3)
	mustAppend(t, c, k, v, 3)
	for _, n := range [][]int{{-1}, {4}, {1, 2, 3}, {0, 9}} {
		if err := c.Truncate(n); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("truncate %v: %v", n, err)
		}
	}
	if got := c.Lengths(); !slices.Equal(got, []int{3, 3}) {
		t.Fatalf("failed truncates changed lengths to %v", got)
	}
	if err := c.Truncate([]int{1, 3}); err != nil {
		t.Fatal(err)
	}
}

func TestBudget(t *testing.T) {
	cfg := Config{Batch: 1, KVHeads: 2, HeadDimK: 8, Capacity: 16, Elem: Float32}
	size := int64(2 * 16 * 8 * 4 * 2)
	a, _ := NewArena(2*size + size/2)
	c1 := mustNew(t, a, cfg)
	c2 := mustNew(t, a, cfg)
	_, err := New(a, cfg)
	var be *BudgetError
	if !errors.As(err, &be) || !errors.Is(err, ErrBudget) {
		t.Fatalf("third cache: %v", err)
	}
	if be.Requested != size || be.Committed != 2*size {
		t.Fatalf("budget error numbers %+v", be)
	}
	if _, err := c1.Fork(); !errors.Is(err, ErrBudget) {
		t.Fatalf("fork over budget: %v", err)
	}
	c2.Close()
	c3, err := New(a, cfg) // reuses c2's pooled buffers
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	st := a.Stats()
	if st.Allocated != 2*size || st.Committed > a.budget {
		t.Fatalf("stats %+v", st)
	}
	if err := a.SetBudget(size); !errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("budget below allocation accepted: %v", err)
	}
}

func TestArenaLiveBytes(t *testing.T) {
	cfg := Config{Batch: 2, KVHeads: 1, HeadDimK: 4, Capacity: 8, Elem: Float16}
	a, _ := NewArena(0)
	c := mustNew(t, a, cfg)
	k, v := randKV(rand.New(rand.NewPCG(2, 2)), cfg, 3)
	mustAppend(t, c, k, v, 3)
	row := int64(4 * 2 * 2)
	if got := a.Stats().Live; got != 2*3*row {
		t.Fatalf("live %d want %d", got, 2*3*row)
	}
	mustOK(t, c.Evict(1))
	if got := a.Stats().Live; got != 2*1*row {
		t.Fatalf("live after evict %d want %d", got, 2*row)
	}
	c.Close()
	if st := a.Stats(); st.Live != 0 || st.Allocated != 0 {
		t.Fatalf("after close %+v", st)
	}
	if err := c.Append(nil, nil, Float32, 0, nil); !errors.Is(err, ErrClosed) {
		t.Fatalf("append after close: %v", err)
	}
}

func TestNewValidation(t *testing.T) {
	a, _ := NewArena(0)
	bad := []Config{
		{Batch: 0, KVHeads: 1, HeadDimK: 1, Capacity: 1},
		{Batch: 1, KVHeads: -1, HeadDimK: 1, Capacity: 1},
		{Batch: 1, KVHeads: 1, HeadDimK: 1, Capacity: 0},
		{Batch: 1, KVHeads: 1, HeadDimK: 1, HeadDimV: -2, Capacity: 1},
		{Batch: 1, KVHeads: 1, HeadDimK: 1, Capacity: 1, Elem: ElemType(7)},
		{Batch: 1 << 20, KVHeads: 1 << 10, HeadDimK: 1 << 10, Capacity: 1 << 20},
		{Batch: 1_000_000_000, KVHeads: 1, HeadDimK: 8, Capacity: 4}, // small bytes, absurd batch
		{Batch: 1, KVHeads: maxKVHeads + 1, HeadDimK: 8, Capacity: 4},
		{Batch: 1, KVHeads: 1, HeadDimK: maxHeadDim + 1, Capacity: 4},
	}
	for _, cfg := range bad {
		if _, err := New(a, cfg); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%+v: %v", cfg, err)
		}
	}
	if _, err := NewArena(-1); !errors.Is(err, ErrInvalidArgument) {
		t.Error("negative budget accepted")
	}
}

func mustAppend(t *testing.T, c *KVCache, k, v []float32, n int) {
	t.Helper()
	if err := c.Append(asBytes(k), asBytes(v), Float32, n, nil); err != nil {
		t.Fatal(err)
	}
}

func mustOK(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
