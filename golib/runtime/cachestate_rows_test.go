package runtime

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestStateAdoptAndSelect joins two prefilled states into one and keeps a
// subset again: lengths, logical length and the no-copy counters; a refused
// adopt changes nothing.
func TestStateAdoptAndSelect(t *testing.T) {
	s, err := NewSessionFromBytes(attnLayer("ok"), Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(9, 9))
	prefilled := func(n, maxLen int) *CacheState {
		cs, err := s.NewCacheState(StateConfig{Batch: 1, MaxLength: maxLen})
		if err != nil {
			t.Fatal(err)
		}
		feeds := map[string]*tensor.Tensor{"q": randTensor(t, rng, 1, 4, n, 8), "k": randTensor(t, rng, 1, 2, n, 8),
			"v": randTensor(t, rng, 1, 2, n, 8)}
		if _, _, err := s.RunCache(cs, feeds, []string{"y"}); err != nil {
			t.Fatal(err)
		}
		return cs
	}
	a, b, c := prefilled(5, 32), prefilled(9, 32), prefilled(3, 32)
	defer a.Close()
	if _, err := a.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	odd := prefilled(2, 16)
	defer odd.Close()
	if err := a.Adopt(odd); err == nil {
		t.Fatal("adopting a state of another max_length: no error")
	}
	if odd.Closed() || a.Batch() != 1 {
		t.Fatal("a refused adopt changed the states")
	}
	if err := a.Adopt(b); err != nil {
		t.Fatal(err)
	}
	if err := a.Adopt(c); err != nil {
		t.Fatal(err)
	}
	if !b.Closed() || !c.Closed() || a.Batch() != 3 || a.Length() != 9 || !slices.Equal(a.Lengths(), []int{5, 9, 3}) {
		t.Fatalf("after adopt: closed %v %v, batch %d, length %d, lengths %v", b.Closed(), c.Closed(), a.Batch(),
			a.Length(), a.Lengths())
	}
	if err := a.Rollback(1); err == nil {
		t.Error("a checkpoint from before the adopt still restores")
	}
	if err := a.Select([]int{2, 0}); err != nil {
		t.Fatal(err)
	}
	if a.Batch() != 2 || a.Length() != 5 || !slices.Equal(a.Lengths(), []int{3, 5}) {
		t.Fatalf("after select: batch %d, length %d, lengths %v", a.Batch(), a.Length(), a.Lengths())
	}
	if err := a.Select([]int{1, 1}); err == nil || a.Batch() != 2 {
		t.Errorf("select with a repeated index: %v (batch %d)", err, a.Batch())
	}
	if n := a.Caches()[0].Counters().CopyBytes; n != 0 {
		t.Errorf("adopt and select copied %d bytes", n)
	}
}
