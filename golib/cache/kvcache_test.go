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
			randomOps(t, cfg, rand.New(rand.NewPCG(seed, uint64(gi))), 60, fmt.Sprintf("cfg %d seed %d", gi, seed))
		}
	}
}

// randomOps applies steps operations drawn from r (append, truncate,
// reorder, checkpoint, rollback, evict) to a fresh cache of cfg and to the
// model, and compares the two after every step; label names the run in
// failures. TestRandomOperations and FuzzCacheOps share it.
func randomOps(t *testing.T, cfg Config, r *rand.Rand, steps int, label string) {
	a, _ := NewArena(0)
	defer a.Close()
	c := mustNew(t, a, cfg)
	defer c.Close()
	m := newModel(c.Config())
	type ck struct {
		id uint64
		m  *model
	}
	var cks []ck
	for step := range steps {
		switch op := r.IntN(8); op {
		case 0, 1, 2: // append
			n := r.IntN(4)
			k, v := randKV(r, c.Config(), n)
			err := c.Append(asBytes(k), asBytes(v), Float32, n, nil)
			fits := slices.Max(m.lens())+n <= cfg.Capacity
			if fits != (err == nil) || (err != nil && !errors.Is(err, ErrCapacity)) {
				t.Fatalf("%s step %d: append %d: err=%v fits=%v", label, step, n, err, fits)
			}
			if err == nil {
				m.append(k, v, n)
			}
		case 3: // truncate all to a random valid length
			lo := slices.Max(m.winStart)
			hi := slices.Min(m.lens())
			if hi < lo {
				continue
			}
			n := lo + r.IntN(hi-lo+1)
			if err := c.Truncate([]int{n}); err != nil {
				t.Fatal(err)
			}
			for b := range m.k {
				for h := range m.k[b] {
					m.k[b][h] = m.k[b][h][:n]
					m.v[b][h] = m.v[b][h][:n]
				}
			}
		case 4: // reorder with repeats
			idx := make([]int, cfg.Batch)
			for i := range idx {
				idx[i] = r.IntN(cfg.Batch)
			}
			if err := c.Reorder(idx); err != nil {
				t.Fatal(err)
			}
			old := m.clone()
			for b, i := range idx {
				m.k[b], m.v[b] = old.clone().k[i], old.clone().v[i]
				m.winStart[b] = old.winStart[i]
			}
			cks = nil
		case 5: // checkpoint
			id, err := c.Checkpoint()
			if err != nil {
				t.Fatal(err)
			}
			cks = append(cks, ck{id, m.clone()})
		case 6: // rollback to a random checkpoint, valid iff model rows intact
			if len(cks) == 0 {
				continue
			}
			x := cks[r.IntN(len(cks))]
			err := c.Rollback(x.id)
			if err == nil {
				// the restored content must equal the snapshot
				m = x.m.clone()
			} else if !errors.Is(err, ErrStaleCheckpoint) {
				t.Fatal(err)
			}
		case 7: // evict
			keep := r.IntN(6)
			if err := c.Evict(keep); err != nil {
				t.Fatal(err)
			}
			for b, l := range m.lens() {
				m.winStart[b] = max(m.winStart[b], l-keep)
			}
		}
		m.check(t, c)
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
