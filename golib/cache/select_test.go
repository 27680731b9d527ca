package cache

import (
	"errors"
	"math/rand/v2"
	"testing"
)

// TestSelectKeepsSubsetWithoutCopy keeps subsets of sequences in various
// orders and checks the rows against the model, the byte accounting and
// that no K/V byte is copied.
func TestSelectKeepsSubsetWithoutCopy(t *testing.T) {
	cases := []struct {
		name string
		idx  []int
	}{
		{"all in order", []int{0, 1, 2, 3}},
		{"drop the middle", []int{0, 3}},
		{"permuted subset", []int{2, 0}},
		{"one", []int{1}},
	}
	for _, cs := range cases {
		for _, g := range geometries {
			cfg := g
			cfg.Batch = 4
			a, _ := NewArena(0)
			c := mustNew(t, a, cfg)
			cfg = c.Config()
			m := newModel(cfg)
			r := rand.New(rand.NewPCG(3, 4))
			for _, n := range []int{3, 2} {
				k, v := randKV(r, cfg, n)
				mustAppend(t, c, k, v, n)
				m.append(k, v, n)
			}
			committed := a.Stats().Allocated
			if err := c.Select(cs.idx); err != nil {
				t.Fatalf("%s: %v", cs.name, err)
			}
			want := newModel(cfg)
			want.cfg.Batch = len(cs.idx)
			want.k, want.v, want.winStart = nil, nil, nil
			for _, i := range cs.idx {
				want.k = append(want.k, m.k[i])
				want.v = append(want.v, m.v[i])
				want.winStart = append(want.winStart, m.winStart[i])
			}
			want.check(t, c)
			if c.Config().Batch != len(cs.idx) || c.Counters().CopyBytes != 0 {
				t.Errorf("%s: batch %d, copy bytes %d", cs.name, c.Config().Batch, c.Counters().CopyBytes)
			}
			perSeq := committed / 4
			if got := a.Stats().Allocated; got != perSeq*int64(len(cs.idx)) {
				t.Errorf("%s: arena holds %d bytes after select, want %d", cs.name, got, perSeq*int64(len(cs.idx)))
			}
			if got, want := a.Stats().Live, c.Info().LiveBytes; got != want {
				t.Errorf("%s: arena live %d, cache live %d", cs.name, got, want)
			}
			// the kept sequences still append
			k, v := randKV(r, c.Config(), 1)
			mustAppend(t, c, k, v, 1)
			want.append(k, v, 1)
			want.check(t, c)
		}
	}
}

func TestSelectRejectsBadIndices(t *testing.T) {
	cfg := Config{Batch: 3, KVHeads: 1, HeadDimK: 4, Capacity: 8, Elem: Float32}
	for _, tc := range []struct {
		idx  []int
		want error
	}{
		{nil, ErrInvalidArgument},
		{[]int{0, 1, 2, 0}, ErrInvalidArgument},
		{[]int{0, 0}, ErrInvalidArgument},
		{[]int{3}, ErrOutOfRange},
		{[]int{-1}, ErrOutOfRange},
	} {
		a, _ := NewArena(0)
		c := mustNew(t, a, cfg)
		k, v := randKV(rand.New(rand.NewPCG(1, 1)), cfg, 2)
		mustAppend(t, c, k, v, 2)
		if err := c.Select(tc.idx); !errors.Is(err, tc.want) {
			t.Errorf("select %v: %v, want %v", tc.idx, err, tc.want)
		}
		if c.Config().Batch != 3 || len(c.Lengths()) != 3 {
			t.Errorf("select %v failed but changed the batch to %d", tc.idx, c.Config().Batch)
		}
	}
}

// TestAdoptMovesSequences moves the sequences of one cache to the end of
// another: rows, accounting, no copy, the source closed.
func TestAdoptMovesSequences(t *testing.T) {
	for _, g := range geometries {
		a, _ := NewArena(0)
		r := rand.New(rand.NewPCG(7, 8))
		dstCfg, srcCfg := g, g
		dstCfg.Batch, srcCfg.Batch = 2, 3
		dst, src := mustNew(t, a, dstCfg), mustNew(t, a, srcCfg)
		dstCfg, srcCfg = dst.Config(), src.Config()
		md, ms := newModel(dstCfg), newModel(srcCfg)
		k, v := randKV(r, dstCfg, 4)
		mustAppend(t, dst, k, v, 4)
		md.append(k, v, 4)
		k, v = randKV(r, srcCfg, 1)
		mustAppend(t, src, k, v, 1)
		ms.append(k, v, 1)
		allocated := a.Stats().Allocated
		if err := dst.Adopt(src); err != nil {
			t.Fatal(err)
		}
		md.cfg.Batch = 5
		md.k, md.v = append(md.k, ms.k...), append(md.v, ms.v...)
		md.winStart = append(md.winStart, ms.winStart...)
		md.check(t, dst)
		if !src.Closed() || a.Stats().Allocated != allocated || dst.Counters().CopyBytes != 0 {
			t.Errorf("src closed %v, arena %d -> %d, copy bytes %d", src.Closed(), allocated, a.Stats().Allocated,
				dst.Counters().CopyBytes)
		}
		if got, want := a.Stats().Live, dst.Info().LiveBytes; got != want {
			t.Errorf("arena live %d, cache live %d", got, want)
		}
		dst.Close()
		if s := a.Stats(); s.Allocated != 0 || s.Live != 0 {
			t.Errorf("after close: %+v", s)
		}
	}
}

func TestAdoptRejectsMismatch(t *testing.T) {
	base := Config{Batch: 1, KVHeads: 2, HeadDimK: 4, Capacity: 8, Elem: Float32}
	other, _ := NewArena(0)
	for _, tc := range []struct {
		name  string
		mut   func(*Config)
		arena *Arena
	}{
		{"capacity", func(c *Config) { c.Capacity = 9 }, nil},
		{"heads", func(c *Config) { c.KVHeads = 1 }, nil},
		{"elem", func(c *Config) { c.Elem = Float16 }, nil},
		{"arena", func(c *Config) {}, other},
	} {
		a, _ := NewArena(0)
		dst := mustNew(t, a, base)
		cfg := base
		tc.mut(&cfg)
		sa := a
		if tc.arena != nil {
			sa = tc.arena
		}
		src := mustNew(t, sa, cfg)
		if err := dst.Adopt(src); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%s: %v", tc.name, err)
		}
		if src.Closed() || dst.Config().Batch != 1 {
			t.Errorf("%s: a refused adopt changed the caches", tc.name)
		}
	}
	a, _ := NewArena(0)
	c := mustNew(t, a, base)
	if err := c.Adopt(c); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("self adopt: %v", err)
	}
	d := mustNew(t, a, base)
	d.Close()
	if err := c.Adopt(d); !errors.Is(err, ErrClosed) {
		t.Errorf("closed source: %v", err)
	}
}
