package runtime

import (
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestGeometryPassBy: the run loop passes kept geometry nodes by without
// visiting them (shapeCache.ready, dirty) in runs where none of their
// geometry inputs changed; over a sequence of decode geometries (growth,
// repeats, a longer input, shrinking, a failed run in between) an
// exported-style decoder gives what a fresh session gives for each step,
// and after a run that repeats the last geometry every kept geometry node
// other than a shape read is passed by.
func TestGeometryPassBy(t *testing.T) {
	cfg := exportedConfig{layers: 2, hidden: 32, heads: 4, headDim: 8, vocab: 50}
	s := session(t, exportedDecoder(cfg, 5))
	defer s.Close()
	steps := []struct {
		past, seq int
		fail      bool // feeds that make the run fail half-way
	}{
		{4, 1, false}, {5, 1, false}, {5, 1, false}, {6, 1, false}, {6, 3, false}, {6, 3, false},
		{2, 1, false}, {7, 1, true}, {7, 1, false}, {7, 1, false}, {8, 2, false}, {9, 1, false},
		{1, 1, false}, {1, 1, false}, {12, 4, false}, {13, 1, true}, {13, 1, true}, {13, 1, false},
	}
	prev := [2]int{-1, -1}
	for step, st := range steps {
		rng := rand.New(rand.NewSource(int64(step)))
		feeds := exportedFeeds(cfg, rng, st.past, st.seq)
		if st.fail { // layer 1's past value has one token too many: its attention product fails
			feeds["past_key_values.1.value"], _ = tensor.New(tensor.Float32, tensor.Shape{1, cfg.heads, st.past + 1, cfg.headDim})
		}
		outs, _, err := s.Run(feeds, nil)
		if st.fail {
			if err == nil {
				t.Fatalf("step %d: a run with an inconsistent past did not fail", step)
			}
			prev = [2]int{-1, -1}
			continue
		}
		if err != nil {
			t.Fatalf("step %d: %v", step, err)
		}
		fresh := session(t, exportedDecoder(cfg, 5))
		want, _, err := fresh.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := range outs {
			if !equalTensor(outs[k], want[k]) {
				t.Fatalf("step %d (past %d, %d new): output %q differs from a fresh session's", step, st.past, st.seq, s.Outputs()[k].Name)
			}
		}
		fresh.Close()
		if cur := [2]int{st.past, st.seq}; cur == prev {
			sh := s.DefaultState().fr.shapes
			passed := 0
			for i, n := range s.Plan().Nodes {
				if !n.geometry || !n.keep || n.shapeRead >= 0 || sh.outs[i] == nil {
					continue
				}
				if sh.ready[i] == 0 || sh.dirty[i] {
					t.Fatalf("step %d (repeated geometry): kept geometry node %s (%s) was visited", step, n.Name, n.OpType)
				}
				passed++
			}
			if passed < 10 {
				t.Fatalf("step %d: %d geometry nodes passed by, want at least 10", step, passed)
			}
		}
		prev = [2]int{st.past, st.seq}
		s.DefaultState().Release(outs...)
	}
}
