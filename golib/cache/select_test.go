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
