package runtime

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestCacheStateLoad loads a tensor-path run's presents into a state and
// checks that the next step equals the tensor path's; refused loads
// change nothing.
func TestCacheStateLoad(t *testing.T) {
	s, err := NewSessionFromBytes(attnLayer("ok"), Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	pk, _ := tensor.New(tensor.Float32, tensor.Shape{1, 2, 0, 8})
	pv, _ := tensor.New(tensor.Float32, tensor.Shape{1, 2, 0, 8})
	run := func(n int) (*tensor.Tensor, *tensor.Tensor, *tensor.Tensor, []*tensor.Tensor) {
		q, k, v := randTensor(t, rng, 1, 4, n, 8), randTensor(t, rng, 1, 2, n, 8), randTensor(t, rng, 1, 2, n, 8)
		out, _, err := s.Run(map[string]*tensor.Tensor{"q": q, "k": k, "v": v,
			"past_key_values.0.key": pk, "past_key_values.0.value": pv}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return q, k, v, out
	}
	_, _, _, first := run(7)
	pk, pv = first[2].Clone(), first[3].Clone()
	cs, err := s.NewCacheState(StateConfig{Batch: 1, MaxLength: 10, Elem: cache.Float32, ElemSet: true})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	rows := []LayerRows{{K: pk.Bytes(), V: pv.Bytes(), KVHeads: 2, HeadDimK: 8, HeadDimV: 8}}
	refused := []struct {
		name string
		rows []LayerRows
		n    int
		want error
	}{
		{"no layer", nil, 7, errs.ErrInvalidArgument},
		{"wrong heads", []LayerRows{{K: pk.Bytes(), V: pv.Bytes(), KVHeads: 3, HeadDimK: 8, HeadDimV: 8}}, 7, errs.ErrShape},
		{"negative n", rows, -1, errs.ErrInvalidArgument},
		{"rows shorter than n", rows, 11, nil},
	}
	for _, tc := range refused {
		err := cs.Load(tc.rows, cache.Float32, tc.n)
		if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
		if cs.Length() != 0 {
			t.Fatalf("%s: length %d after a refused load", tc.name, cs.Length())
		}
	}
	if err := cs.Load(rows, cache.Float32, 7); err != nil {
		t.Fatal(err)
	}
	if cs.Length() != 7 || cs.Lengths()[0] != 7 {
		t.Fatalf("length %d / %v after loading 7", cs.Length(), cs.Lengths())
	}
	q, k, v, want := run(1)
	got, _, err := s.RunCache(cs, map[string]*tensor.Tensor{"q": q, "k": k, "v": v}, []string{"y"})
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want[0].Float32() {
		if g := got[0].Float32()[i]; math.Abs(float64(g-w)) > 1e-5 {
			t.Fatalf("y[%d] = %v after the load, tensor path %v", i, g, w)
		}
	}
}
