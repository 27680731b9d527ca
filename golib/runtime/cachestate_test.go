package runtime

import (
	"fmt"
	"math"
	mathrand "math/rand"
	"math/rand/v2"
	goruntime "runtime"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// attnLayer is a one-layer graph: Attention over q, k, v with a past, and
// Shape of the past (the past length exporters derive positions from).
// variant changes one thing that makes the layer illegal for the rewrite.
func attnLayer(variant string) []byte {
	type vi = *onnxpb.ValueInfoProto
	causal := int64(1)
	if variant == "noncausal" {
		causal = 0
	}
	mask := ""
	inputs := []vi{onnxtest.Info("q", 1, 1, 4, -1, 8), onnxtest.Info("k", 1, 1, 2, -1, 8), onnxtest.Info("v", 1, 1, 2, -1, 8),
		onnxtest.Info("past_key_values.0.key", 1, 1, 2, -1, 8), onnxtest.Info("past_key_values.0.value", 1, 1, 2, -1, 8)}
	if variant == "mask" {
		mask = "m"
		inputs = append(inputs, onnxtest.Info("m", 9, 1, 1, -1, -1))
	}
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("Attention", []string{"q", "k", "v", mask, "past_key_values.0.key", "past_key_values.0.value"},
			[]string{"y", "present.0.key", "present.0.value"}, onnxtest.AttrInt("is_causal", causal)),
		onnxtest.Node("Shape", []string{"past_key_values.0.key"}, []string{"plen"}, onnxtest.AttrInt("start", 2), onnxtest.AttrInt("end", 3)),
	}
	outputs := []vi{onnxtest.Info("y", 1, 1, 4, -1, 8), onnxtest.Info("plen", 7, 1),
		onnxtest.Info("present.0.key", 1, 1, 2, -1, 8), onnxtest.Info("present.0.value", 1, 1, 2, -1, 8)}
	switch variant {
	case "present_read":
		nodes = append(nodes, onnxtest.Node("Identity", []string{"present.0.key"}, []string{"seen"}))
		outputs = append(outputs, onnxtest.Info("seen", 1, 1, 2, -1, 8))
	case "past_read":
		nodes = append(nodes, onnxtest.Node("Neg", []string{"past_key_values.0.value"}, []string{"seen"}))
		outputs = append(outputs, onnxtest.Info("seen", 1, 1, 2, -1, 8))
	}
	return onnxtest.Bytes(onnxtest.Model(23, onnxtest.Graph(nodes, inputs, outputs), nil))
}

func TestCachePlanLegality(t *testing.T) {
	cases := []struct {
		variant string
		reason  string // "" : rewritten
	}{
		{"ok", ""},
		{"noncausal", "is_causal=0"},
		{"present_read", `present "present.0.key" is also read by Identity`},
		{"past_read", `past "past_key_values.0.value" is read by`},
		{"mask", ""}, // read at run time and checked
	}
	for _, c := range cases {
		s, err := NewSessionFromBytes(attnLayer(c.variant), Options{Threads: 1})
		if err != nil {
			t.Fatalf("%s: %v", c.variant, err)
		}
		plan := s.CachePlan()
		if len(plan) != 1 || plan[0].PastKey != "past_key_values.0.key" || plan[0].PresentValue != "present.0.value" {
			t.Fatalf("%s: plan %+v", c.variant, plan)
		}
		l := plan[0]
		if c.reason == "" {
			if !l.Rewritten || l.Reason != "" || !s.CacheRewritten() {
				t.Errorf("%s: not rewritten: %q", c.variant, l.Reason)
			}
		} else {
			if l.Rewritten || !strings.Contains(l.Reason, c.reason) {
				t.Errorf("%s: reason %q, want it to contain %q", c.variant, l.Reason, c.reason)
			}
			if _, err := s.NewCacheState(StateConfig{Batch: 1}); err == nil {
				t.Errorf("%s: a state was created for a tensor-path model", c.variant)
			}
		}
		s.Close()
	}
}

func randTensor(t *testing.T, rng *rand.Rand, shape ...int) *tensor.Tensor {
	n := 1
	for _, d := range shape {
		n *= d
	}
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(rng.NormFloat64())
	}
	x, err := tensor.FromSlice(tensor.Shape(shape), v)
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// TestRunCacheEqualsTensorPath runs steps of 5, 1, 1, 23 and 2 new tokens
// on a state and on the tensor path (presents fed back) and compares Y and
// the past length Shape reports; a failed step leaves the state unchanged.
func TestRunCacheEqualsTensorPath(t *testing.T) {
	s, err := NewSessionFromBytes(attnLayer("ok"), Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cs, err := s.NewCacheState(StateConfig{Batch: 1, MaxLength: 64})
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	rng := rand.New(rand.NewPCG(1, 2))
	pk, _ := tensor.New(tensor.Float32, tensor.Shape{1, 2, 0, 8})
	pv, _ := tensor.New(tensor.Float32, tensor.Shape{1, 2, 0, 8})
	past := 0
	for _, n := range []int{5, 1, 1, 23, 2} {
		q, k, v := randTensor(t, rng, 1, 4, n, 8), randTensor(t, rng, 1, 2, n, 8), randTensor(t, rng, 1, 2, n, 8)
		want, _, err := s.Run(map[string]*tensor.Tensor{"q": q, "k": k, "v": v,
			"past_key_values.0.key": pk, "past_key_values.0.value": pv}, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := s.RunCache(cs, map[string]*tensor.Tensor{"q": q, "k": k, "v": v}, []string{"y", "plen"})
		if err != nil {
			t.Fatalf("step of %d: %v", n, err)
		}
		if p := got[1].Int64()[0]; p != int64(past) {
			t.Errorf("step of %d: Shape(past) = %d, want %d", n, p, past)
		}
		for i, w := range want[0].Float32() {
			if g := got[0].Float32()[i]; math.Abs(float64(g-w)) > 1e-5 {
				t.Fatalf("step of %d: y[%d] = %v, want %v", n, i, g, w)
			}
		}
		pk, pv = want[2].Clone(), want[3].Clone()
		past += n
		if cs.Length() != past || cs.Lengths()[0] != past {
			t.Fatalf("state length %d / %v, want %d", cs.Length(), cs.Lengths(), past)
		}
	}
	if c := cs.Caches()[0].Counters(); c.ExportBytes != 0 || c.AppendBytes != int64(past*2*2*8*4) {
		t.Errorf("counters %+v: want %d append bytes and no export", c, past*2*2*8*4)
	}
	// a step that fails (K with the wrong head count) changes nothing
	q, k, v := randTensor(t, rng, 1, 4, 1, 8), randTensor(t, rng, 1, 3, 1, 8), randTensor(t, rng, 1, 3, 1, 8)
	if _, _, err := s.RunCache(cs, map[string]*tensor.Tensor{"q": q, "k": k, "v": v}, nil); err == nil {
		t.Fatal("a K of 3 heads for a cache of 2: no error")
	}
	if cs.Length() != past || cs.Lengths()[0] != past {
		t.Errorf("after a failed step: length %d / %v, want %d", cs.Length(), cs.Lengths(), past)
	}
	// feeding a past with a state is refused, naming it
	_, _, err = s.RunCache(cs, map[string]*tensor.Tensor{"q": q, "k": k, "v": v, "past_key_values.0.key": pk}, nil)
	if err == nil || !strings.Contains(err.Error(), "past_key_values.0.key") {
		t.Errorf("past fed with a state: %v", err)
	}
	// presents are exported when asked for
	q, k, v = randTensor(t, rng, 1, 4, 1, 8), randTensor(t, rng, 1, 2, 1, 8), randTensor(t, rng, 1, 2, 1, 8)
	got, _, err := s.RunCache(cs, map[string]*tensor.Tensor{"q": q, "k": k, "v": v}, []string{"present.0.key"})
	if err != nil {
		t.Fatal(err)
	}
	if sh := got[0].Shape(); sh[2] != past+1 {
		t.Errorf("exported present shape %v, want %d positions", sh, past+1)
	}
}

// TestRunCacheAllocationNotProportionalToContext measures the bytes a
// decode step allocates at two contexts: they must not grow with the
// context (the past is never copied or materialized).
func TestRunCacheAllocationNotProportionalToContext(t *testing.T) {
	if testing.Short() {
		t.Skip("allocation measurement")
	}
	s, err := NewSessionFromBytes(attnLayer("ok"), Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	perStep := func(context int) float64 {
		cs, err := s.NewCacheState(StateConfig{Batch: 1, MaxLength: context + 64})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		feeds := func(n int) map[string]*tensor.Tensor {
			return map[string]*tensor.Tensor{"q": randTensor(t, rng, 1, 4, n, 8), "k": randTensor(t, rng, 1, 2, n, 8),
				"v": randTensor(t, rng, 1, 2, n, 8)}
		}
		if _, _, err := s.RunCache(cs, feeds(context), []string{"y"}); err != nil {
			t.Fatal(err)
		}
		step := feeds(1)
		var before, after goruntime.MemStats
		goruntime.ReadMemStats(&before)
		const n = 32
		for i := 0; i < n; i++ {
			outs, _, err := s.RunCache(cs, step, []string{"y"})
			if err != nil {
				t.Fatal(err)
			}
			cs.State().Release(outs...)
		}
		goruntime.ReadMemStats(&after)
		return float64(after.TotalAlloc-before.TotalAlloc) / n
	}
	small, large := perStep(64), perStep(1024)
	if large > small+2048 {
		t.Errorf("a decode step allocates %.0f bytes at context 1024 and %.0f at 64: it grows with the context", large, small)
	}
	t.Logf("bytes allocated per decode step: %.0f at context 64, %.0f at 1024", small, large)
}

// TestCachePlanDecomposedFactorsAndMasks: in a decomposed attention, a Mul
// by a vector (a query norm's weight right before the scores) is part of q,
// not the scale, so the layer is rewritten and runs as the tensor path; a
// mask with a per-head bias (ALiBi) keeps the layer on the tensor path with
// a reason, instead of a plan that every state run would then refuse.
func TestCachePlanDecomposedFactorsAndMasks(t *testing.T) {
	cases := []struct {
		name   string
		cfg    exportedConfig
		reason string // "": rewritten
	}{
		{"plain", exportedConfig{}, ""},
		{"query weight vector", exportedConfig{qWeight: true}, ""},
		{"per-head bias", exportedConfig{headBias: true}, "per-head bias"},
	}
	for _, c := range cases {
		cfg := c.cfg
		cfg.layers, cfg.hidden, cfg.heads, cfg.headDim, cfg.vocab, cfg.presentConcat = 2, 32, 4, 8, 50, true
		s := session(t, exportedDecoder(cfg, 7))
		for _, l := range s.CachePlan() {
			if c.reason == "" && !l.Rewritten {
				t.Fatalf("%s: layer not rewritten: %s", c.name, l.Reason)
			}
			if c.reason != "" && (l.Rewritten || !strings.Contains(l.Reason, c.reason)) {
				t.Fatalf("%s: rewritten %v, reason %q; want %q", c.name, l.Rewritten, l.Reason, c.reason)
			}
		}
		if c.reason != "" {
			continue
		}
		cs, err := s.NewCacheState(StateConfig{Batch: 1, MaxLength: 32})
		if err != nil {
			t.Fatal(err)
		}
		rng := mathrand.New(mathrand.NewSource(3))
		feeds := exportedFeeds(cfg, rng, 0, 0)
		past := 0
		for _, n := range []int{5, 1, 1, 3} {
			step := exportedFeeds(cfg, rng, 0, n)
			mask := make([]int64, past+n)
			for i := range mask {
				mask[i] = 1
			}
			step["attention_mask"], _ = tensor.FromSlice(tensor.Shape{1, past + n}, mask)
			for name, x := range feeds {
				if strings.HasPrefix(name, "past_key_values.") {
					step[name] = x
				}
			}
			want, _, err := s.Run(step, nil)
			if err != nil {
				t.Fatal(err)
			}
			stateFeeds := map[string]*tensor.Tensor{"input_ids": step["input_ids"], "attention_mask": step["attention_mask"]}
			got, _, err := s.RunCache(cs, stateFeeds, []string{"logits"})
			if err != nil {
				t.Fatalf("%s: step of %d: %v", c.name, n, err)
			}
			for i, w := range want[0].Float32() {
				if g := got[0].Float32()[i]; math.Abs(float64(g-w)) > 1e-4 {
					t.Fatalf("%s: step of %d: logits[%d] = %v, want %v", c.name, n, i, g, w)
				}
			}
			for l := 0; l < cfg.layers; l++ {
				feeds[fmt.Sprintf("past_key_values.%d.key", l)] = want[1+2*l].Clone()
				feeds[fmt.Sprintf("past_key_values.%d.value", l)] = want[2+2*l].Clone()
			}
			past += n
		}
		cs.Close()
	}
}
