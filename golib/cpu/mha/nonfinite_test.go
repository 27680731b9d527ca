package mha

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// nonFiniteCases are the cases of cases() plus shapes whose head sizes
// reach the vector loops of the streaming engine (multiples of 16), softcap
// and prefill tiles on the engine.
func nonFiniteCases() []tcase {
	cs := cases()
	c := base("stream decode dk64")
	c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.wantPresents = 1, 1, 100, 4, 2, 64, 64, true
	cs = append(cs, c)
	c = base("stream causal multi-token dk32")
	c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.attrs.IsCausal = 3, 3, 70, 4, 2, 32, 32, true
	cs = append(cs, c)
	c = base("stream softcap decode dk16")
	c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.attrs.Softcap = 1, 1, 50, 4, 1, 16, 16, 2.5
	cs = append(cs, c)
	c = base("stream causal prefill tiles softcap dk16")
	c.b, c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.attrs.IsCausal, c.attrs.Softcap = 1, 20, 20, 5, 4, 2, 16, 16, true, 30
	c.wantPresents = true
	cs = append(cs, c)
	c = base("stream decode bool mask dk16")
	c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.mask, c.boolMask = 1, 1, 40, 4, 2, 16, 16, []int{2, 1, 1, 41}, true
	cs = append(cs, c)
	c = base("stream decode short float mask dk16")
	c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.mask = 1, 1, 40, 4, 2, 16, 16, []int{2, 4, 1, 30}
	cs = append(cs, c)
	c = base("stream causal prefill tiles float mask dk16")
	c.b, c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.attrs.IsCausal, c.mask = 1, 20, 20, 4, 4, 2, 16, 16, true, []int{20, 24}
	cs = append(cs, c)
	c = base("stream nonpad causal dk16")
	c.s, c.l, c.hq, c.hkv, c.dk, c.dv, c.attrs.IsCausal, c.nonpad = 2, 30, 4, 2, 16, 16, true, []int64{20, 30}
	cs = append(cs, c)
	c = base("stream noncausal prefill tiles mask dk16")
	c.b, c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.mask = 1, 20, 20, 3, 4, 2, 16, 16, []int{20, 23}
	cs = append(cs, c)
	c = base("general causal blocks dk64")
	c.b, c.s, c.l, c.p, c.hq, c.hkv, c.dk, c.dv, c.attrs.IsCausal = 1, 40, 40, 2, 2, 1, 64, 64, true
	cs = append(cs, c)
	// scale 0 skips the product (gemm's alpha = 0): Q and K are checked.
	c = base("scale 0")
	c.attrs.Scale, c.attrs.HasScale = 0, true
	cs = append(cs, c)
	c = base("scale inf stream decode")
	c.s, c.l, c.p, c.attrs.Scale, c.attrs.HasScale = 1, 1, 20, float32(math.Inf(1)), true
	cs = append(cs, c)
	return cs
}

// poison plants a non-finite or huge value into the inputs.
type poison struct {
	name string
	f    func(in *Inputs)
}

func poisons() []poison {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	at := func(s []float32, i int, v float32) {
		if len(s) > 0 {
			s[(i%len(s)+len(s))%len(s)] = v
		}
	}
	first := func(s []float32, n int, v float32) {
		for i := range min(len(s), n) {
			s[i] = v
		}
	}
	fill := func(s []float32, v float32) {
		for i := range s {
			s[i] = v
		}
	}
	return []poison{
		{"q-nan", func(in *Inputs) { at(in.Q, 0, nan) }},
		{"q-row-nan", func(in *Inputs) { first(in.Q, 8, nan) }},
		{"q-inf", func(in *Inputs) { at(in.Q, 0, inf) }},
		{"q-neg-inf", func(in *Inputs) { at(in.Q, 0, -inf) }},
		{"q-row-inf", func(in *Inputs) { first(in.Q, 8, inf) }},
		{"q-row-neg-inf", func(in *Inputs) { first(in.Q, 8, -inf) }},
		{"q-last-neg-inf", func(in *Inputs) { at(in.Q, -1, -inf) }},
		{"k-inf", func(in *Inputs) { at(in.K, 0, inf) }},
		{"k-neg-inf", func(in *Inputs) { at(in.K, len(in.K)/2, -inf) }},
		{"k-last-nan", func(in *Inputs) { at(in.K, -1, nan) }},
		{"past-k-inf", func(in *Inputs) { at(in.PastKey, 0, inf) }},
		{"v-inf", func(in *Inputs) { at(in.V, 0, inf) }},
		{"v-neg-inf", func(in *Inputs) { at(in.V, len(in.V)/2, -inf) }},
		{"v-last-inf", func(in *Inputs) { at(in.V, -1, inf) }},
		{"v-last-nan", func(in *Inputs) { at(in.V, -1, nan) }},
		// The last V element of sequence 0 (of 2): past its nonpad length
		// in the nonpad cases.
		{"v-seq0-last-nan", func(in *Inputs) { at(in.V, len(in.V)/2-1, nan) }},
		{"v-seq0-last-inf", func(in *Inputs) { at(in.V, len(in.V)/2-1, inf) }},
		{"past-v-nan", func(in *Inputs) { at(in.PastValue, 1, nan) }},
		{"past-v-neg-inf", func(in *Inputs) { at(in.PastValue, -1, -inf) }},
		{"q-huge", func(in *Inputs) { fill(in.Q, 3e38) }},
		{"q-neg-huge", func(in *Inputs) { fill(in.Q, -3e38) }},
		{"q-row-huge", func(in *Inputs) { first(in.Q, 8, 3e38) }},
		// One key row huge (all of K huge would make every score equal
		// and the softmax ill-conditioned in any float32 evaluation).
		{"k-row-huge", func(in *Inputs) { first(in.K, 8, 3e38) }},
		{"k-row-neg-huge", func(in *Inputs) { first(in.K, 8, -3e38) }},
		{"past-k-row-huge", func(in *Inputs) { first(in.PastKey, 8, 3e38) }},
		{"qk-huge", func(in *Inputs) { first(in.Q, 8, 3e38); first(in.K, 8, -3e38) }},
		{"mask-inf", func(in *Inputs) { at(in.Mask.Float, 0, inf) }},
		{"mask-nan", func(in *Inputs) { at(in.Mask.Float, 1, nan) }},
		{"mask-row-neg-inf", func(in *Inputs) {
			if in.Mask.Float != nil {
				first(in.Mask.Float, 3, -inf)
			}
		}},
		{"sink-inf", func(in *Inputs) { at(in.HeadSink, 0, inf) }},
		{"sink-nan", func(in *Inputs) { at(in.HeadSink, 0, nan) }},
	}
}

// nonFiniteInputs builds case c's random inputs and outputs (qk and
// presents when the case asks for them).
func nonFiniteInputs(t *testing.T, c tcase, seed uint64) (*Geometry, Inputs, Outputs) {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, 9))
	sh := c.shapes()
	g, err := Plan(c.attrs, sh)
	if err != nil {
		t.Fatalf("%s: Plan: %v", c.name, err)
	}
	in := Inputs{Q: randVec(r, prod(sh.Q)), K: randVec(r, prod(sh.K)), V: randVec(r, prod(sh.V)),
		NonpadKVSeqlen: c.nonpad}
	if c.sinks {
		in.HeadSink = randVec(r, c.hq)
	}
	if c.p >= 0 {
		in.PastKey, in.PastValue = randVec(r, prod(sh.PastKey)), randVec(r, prod(sh.PastValue))
	}
	if c.mask != nil {
		in.Mask.Float = randVec(r, prod(c.mask))
		if c.boolMask {
			in.Mask.Float, in.Mask.Bool = nil, make([]bool, prod(c.mask))
			for i := range in.Mask.Bool {
				in.Mask.Bool[i] = r.IntN(4) != 0
			}
		}
	}
	out := Outputs{Y: make([]float32, prod(g.YShape))}
	if c.wantQK {
		out.QK = make([]float32, prod(g.QKShape))
	}
	if c.wantPresents {
		out.PresentKey = nanVec(prod(g.PresentKeyShape))
		out.PresentValue = nanVec(prod(g.PresentValueShape))
	}
	return g, in, out
}

// sameAsReference reports whether a float32 output equals the float64
// reference value w rounded to float32: NaN where it is NaN, the same
// infinity, finite values within tolerance.
func sameAsReference(got float32, w float64) bool {
	gv, w := float64(got), float64(float32(w))
	switch {
	case math.IsNaN(w) || math.IsNaN(gv):
		return math.IsNaN(w) && math.IsNaN(gv)
	case math.IsInf(w, 0) || math.IsInf(gv, 0):
		return gv == w
	}
	return math.Abs(gv-w) <= 2e-5+2e-5*math.Abs(w)
}

// TestNonFiniteEveryPath runs every case on every kernel path, with the
// streaming engine (on one thread) and the general unit, after planting NaN, ±Inf or huge finite values
// (3e38, whose float32 products overflow) in Q, K, V, the past, the float
// mask or the sinks, against the float64 reference (exactRow on every row):
// Y, and qk_matmul_output where the case asks for it, are NaN exactly where
// the reference is NaN, the same infinity where it is infinite, finite
// values within tolerance. The cases include causal rows (also across row
// blocks and with a past), bool and float masks, fully masked rows, nonpad
// lengths, windows, softcap, double softmax and sinks, so that a NaN or an
// infinity meets excluded positions under onnxruntime's -MaxFloat32 (and
// the opset-25 -Inf) masking, as the reference defines it.
func TestNonFiniteEveryPath(t *testing.T) {
	defer setPaths("auto")
	defer func() { unitDecode = true }()
	for _, path := range gemm.Paths() {
		setPaths(path)
		for _, unit := range []bool{true, false} {
			unitDecode = unit
			for ci, c := range nonFiniteCases() {
				for _, p := range poisons() {
					g, in, out := nonFiniteInputs(t, c, uint64(ci))
					if unit {
						g.Threads = 1
					}
					p.f(&in)
					if err := g.Run(in, out); err != nil {
						t.Fatalf("%s: Run: %v", c.name, err)
					}
					y, _, _, qk := reference(g, in)
					for what, got := range map[string][]float32{"Y": out.Y, "qk": out.QK} {
						want := y
						if what == "qk" {
							want = qk
						}
						for i := range got {
							if !sameAsReference(got[i], want[i]) {
								t.Errorf("%s unit=%v %s %s: %s[%d] = %v, reference %v", path, unit, c.name, p.name, what, i, got[i], want[i])
								break
							}
						}
					}
				}
			}
		}
	}
}

// TestFiniteNoFallback: finite inputs never take the float64 fallback on
// any path (the counter exactRows does not move), and a planted NaN does.
func TestFiniteNoFallback(t *testing.T) {
	defer setPaths("auto")
	defer func() { unitDecode = true }()
	for _, path := range gemm.Paths() {
		setPaths(path)
		for _, unit := range []bool{true, false} {
			unitDecode = unit
			poisoned := int64(0)
			for ci, c := range nonFiniteCases() {
				if math.IsInf(float64(c.attrs.Scale), 0) {
					continue // not finite
				}
				g, in, out := nonFiniteInputs(t, c, uint64(ci))
				if unit {
					g.Threads = 1
				}
				before := exactRows.Load()
				if err := g.Run(in, out); err != nil {
					t.Fatalf("%s: Run: %v", c.name, err)
				}
				if n := exactRows.Load() - before; n != 0 {
					t.Errorf("%s unit=%v %s: %d rows took the fallback on finite inputs", path, unit, c.name, n)
				}
				if len(in.Q) == 0 {
					continue
				}
				in.Q[0] = float32(math.NaN())
				before = exactRows.Load()
				if err := g.Run(in, out); err != nil {
					t.Fatalf("%s: Run: %v", c.name, err)
				}
				poisoned += exactRows.Load() - before
			}
			if poisoned == 0 {
				t.Errorf("%s unit=%v: a NaN in Q never took the fallback", path, unit)
			}
		}
	}
}

// TestCheckKernels: on every path, nonFinite is false for finite values
// and true as soon as one value is NaN or ±Inf, at every length and
// position (vector bodies and tails).
func TestCheckKernels(t *testing.T) {
	defer gemm.SetPath("auto")
	r := rand.New(rand.NewPCG(3, 4))
	for _, path := range gemm.Paths() {
		gemm.SetPath(path)
		nonFinite := pickNonFinite()
		for n := 1; n <= 70; n++ {
			s := randVec(r, n)
			if nonFinite(s) {
				t.Fatalf("%s n=%d: nonFinite on finite values", path, n)
			}
			for _, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
				for i := range n {
					old := s[i]
					s[i] = bad
					if !nonFinite(s) {
						t.Fatalf("%s n=%d: %v at %d: nonFinite false", path, n, bad, i)
					}
					s[i] = old
				}
			}
		}
	}
}
