package cache

import (
	"errors"
	"math/rand/v2"
	"testing"
)

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
