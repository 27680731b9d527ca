package mha

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// tcase describes one attention call; data is random and seeded.
type tcase struct {
	name                 string
	b, hq, hkv, s, l, p  int // batch, heads, q len, new kv len, past len (-1: no past)
	dk, dv               int
	in3D                 bool
	attrs                Attrs
	mask                 []int // nil: no mask
	boolMask             bool
	maskFalseRow         int // >= 0: bool mask row (all batches/heads) set to false
	nonpad               []int64
	wantQK, wantPresents bool
	sinks                bool // random per-head sink logits (with attrs.SmoothSoftmax)
}

func base(name string) tcase {
	return tcase{name: name, b: 2, hq: 2, hkv: 2, s: 3, l: 3, p: -1, dk: 8, dv: 8, maskFalseRow: -1}
}

func cases() []tcase {
	var cs []tcase
	add := func(c tcase, f func(*tcase)) {
		f(&c)
		cs = append(cs, c)
	}
	add(base("mha 4D"), func(c *tcase) {})
	add(base("mha 3D"), func(c *tcase) { c.in3D = true; c.attrs.QNumHeads, c.attrs.KVNumHeads = 2, 2 })
	add(base("gqa 4D"), func(c *tcase) { c.hq, c.hkv = 6, 2 })
	add(base("mqa 3D dv!=dk"), func(c *tcase) {
		c.hq, c.hkv, c.dv, c.in3D = 4, 1, 5, true
		c.attrs.QNumHeads, c.attrs.KVNumHeads = 4, 1
	})
	add(base("dv!=dk 4D"), func(c *tcase) { c.dk, c.dv = 16, 4 })
	add(base("causal"), func(c *tcase) { c.attrs.IsCausal = true })
	add(base("causal q longer than kv"), func(c *tcase) { c.attrs.IsCausal, c.s, c.l = true, 5, 3 })
	add(base("causal past end-aligned"), func(c *tcase) { c.attrs.IsCausal, c.p = true, 4; c.wantPresents = true })
	add(base("causal zero past"), func(c *tcase) { c.attrs.IsCausal, c.p = true, 0; c.wantPresents = true })
	add(base("past 3D gqa presents"), func(c *tcase) {
		c.hq, c.hkv, c.p, c.in3D, c.dv = 4, 2, 5, true, 6
		c.attrs.QNumHeads, c.attrs.KVNumHeads = 4, 2
		c.wantPresents = true
	})
	add(base("decode past 37"), func(c *tcase) { c.s, c.l, c.p, c.attrs.IsCausal, c.hq, c.hkv = 1, 1, 37, true, 8, 2 })
	add(base("decode past 700 presents"), func(c *tcase) {
		c.s, c.l, c.p, c.attrs.IsCausal, c.hq, c.hkv, c.wantPresents = 1, 1, 700, true, 8, 2, true
	})
	add(base("causal prefill past 600 presents"), func(c *tcase) {
		c.s, c.l, c.p, c.attrs.IsCausal, c.hq, c.hkv, c.wantPresents = 3, 3, 600, true, 4, 2, true
	})
	add(base("bool mask 2D"), func(c *tcase) { c.mask, c.boolMask = []int{3, 3}, true })
	add(base("bool mask 3D heads"), func(c *tcase) { c.mask, c.boolMask = []int{2, 3, 3}, true })
	add(base("bool mask 4D broadcast"), func(c *tcase) { c.mask, c.boolMask = []int{2, 1, 3, 3}, true })
	add(base("float mask 4D full"), func(c *tcase) { c.mask = []int{2, 2, 3, 3} })
	add(base("float mask rank 1"), func(c *tcase) { c.mask = []int{3} })
	add(base("float mask row broadcast"), func(c *tcase) { c.mask = []int{1, 1, 1, 3} })
	add(base("short float mask padded"), func(c *tcase) { c.mask, c.p = []int{3, 5}, 3 })
	add(base("short bool mask padded"), func(c *tcase) { c.mask, c.boolMask, c.p = []int{3, 2}, true, 1 })
	add(base("bool mask + causal + past"), func(c *tcase) {
		c.mask, c.boolMask, c.p, c.attrs.IsCausal = []int{3, 5}, true, 2, true
		c.wantQK, c.attrs.QKMode = true, 2
	})
	add(base("float mask + causal"), func(c *tcase) { c.mask, c.attrs.IsCausal, c.wantQK, c.attrs.QKMode = []int{3, 3}, true, true, 2 })
	add(base("fully masked row"), func(c *tcase) {
		c.mask, c.boolMask, c.maskFalseRow, c.wantQK, c.attrs.QKMode = []int{3, 3}, true, 1, true, 3
	})
	add(base("scale"), func(c *tcase) { c.attrs.Scale, c.attrs.HasScale = 0.7, true })
	for mode := range 4 {
		add(base("softcap mode"), func(c *tcase) {
			c.name += string(rune('0' + mode))
			c.attrs.Softcap, c.attrs.QKMode, c.wantQK = 1.5, mode, true
			c.mask, c.attrs.IsCausal = []int{2, 1, 3, 3}, true
		})
		add(base("mode"), func(c *tcase) {
			c.name += string(rune('0' + mode))
			c.attrs.QKMode, c.wantQK, c.p = mode, true, 2
		})
	}
	add(base("nonpad"), func(c *tcase) { c.nonpad = []int64{2, 3} })
	add(base("nonpad causal external cache"), func(c *tcase) {
		c.s, c.l, c.nonpad, c.attrs.IsCausal = 2, 6, []int64{3, 6}, true
	})
	add(base("nonpad zero and qk"), func(c *tcase) { c.nonpad, c.wantQK, c.attrs.QKMode = []int64{0, 2}, true, 3 })
	add(base("softmax double"), func(c *tcase) { c.attrs.SoftmaxPrecision, c.attrs.IsCausal = PrecisionDouble, true })
	add(base("prefill crosses row blocks"), func(c *tcase) {
		c.b, c.s, c.l, c.attrs.IsCausal, c.hq, c.hkv, c.dk, c.dv = 1, 70, 70, true, 2, 1, 16, 16
	})
	add(base("prefill blocks with qk"), func(c *tcase) {
		c.b, c.s, c.l, c.p, c.attrs.IsCausal, c.wantQK = 1, 40, 40, 3, true, true
	})
	add(base("gqa 4D causal row blocks cross heads"), func(c *tcase) {
		c.b, c.hq, c.hkv, c.s, c.l, c.p, c.attrs.IsCausal = 1, 8, 2, 20, 20, 5, true
	})
	add(base("gqa 3D decode per-head mask"), func(c *tcase) {
		c.in3D, c.hq, c.hkv, c.s, c.l, c.p = true, 6, 2, 1, 1, 9
		c.attrs.QNumHeads, c.attrs.KVNumHeads = 6, 2
		c.mask, c.boolMask, c.wantPresents = []int{2, 6, 1, 10}, true, true
	})
	add(base("gqa 3D prefill per head"), func(c *tcase) {
		c.in3D, c.hq, c.hkv, c.s, c.l, c.attrs.IsCausal = true, 4, 2, 5, 5, true
		c.attrs.QNumHeads, c.attrs.KVNumHeads = 4, 2
	})
	add(base("mqa nonpad causal row blocks"), func(c *tcase) {
		c.hq, c.hkv, c.s, c.l, c.attrs.IsCausal = 4, 1, 12, 30, true
		c.nonpad = []int64{20, 30}
	})
	add(base("window left causal past"), func(c *tcase) {
		c.s, c.l, c.p, c.attrs.IsCausal = 4, 4, 6, true
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow = true, 2, -1
	})
	add(base("window both sides inf masking qk"), func(c *tcase) {
		c.s, c.l = 6, 6
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow, c.attrs.InfMasking = true, 0, 2, true
		c.wantQK, c.attrs.QKMode = true, 2
	})
	add(base("window right only gqa blocks"), func(c *tcase) {
		c.b, c.hq, c.hkv, c.s, c.l = 1, 4, 2, 40, 40
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow = true, -1, 3
	})
	add(base("inf masking fully masked bool row"), func(c *tcase) {
		c.mask, c.boolMask, c.maskFalseRow, c.wantQK, c.attrs.QKMode, c.attrs.InfMasking = []int{3, 3}, true, 2, true, 3, true
	})
	// Windows on the streaming engine (see TestStreamableCases).
	add(base("stream window decode gqa presents"), func(c *tcase) {
		c.s, c.l, c.p, c.hq, c.hkv, c.attrs.IsCausal, c.wantPresents = 1, 1, 300, 8, 2, true, true
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow = true, 15, -1
	})
	add(base("stream window prefill tiles"), func(c *tcase) {
		c.b, c.hq, c.hkv, c.s, c.l, c.attrs.IsCausal = 1, 4, 2, 40, 40, true
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow = true, 7, -1
	})
	add(base("stream window right 0 without is_causal"), func(c *tcase) {
		c.s, c.l, c.p = 3, 3, 20
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow = true, 4, 0
	})
	add(base("stream opset-25 masking causal unbounded window"), func(c *tcase) {
		c.s, c.l, c.p, c.attrs.IsCausal = 1, 1, 50, true
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow, c.attrs.InfMasking = true, -1, -1, true
	})
	add(base("stream window nonpad causal"), func(c *tcase) {
		c.s, c.l, c.attrs.IsCausal, c.nonpad = 2, 30, true, []int64{20, 30}
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow = true, 5, -1
	})
	// Decode shapes served by the streaming engine (see TestStreamableCases).
	add(base("stream decode 4D presents"), func(c *tcase) {
		c.s, c.l, c.p, c.hq, c.hkv, c.wantPresents = 1, 1, 300, 4, 2, true
	})
	add(base("stream decode 3D gqa presents dv!=dk"), func(c *tcase) {
		c.in3D, c.hq, c.hkv, c.s, c.l, c.p, c.dv, c.wantPresents = true, 6, 2, 1, 1, 70, 5, true
		c.attrs.QNumHeads, c.attrs.KVNumHeads, c.attrs.IsCausal = 6, 2, true
	})
	add(base("stream causal 3 tokens over a past of 1000"), func(c *tcase) {
		c.b, c.hq, c.hkv, c.s, c.l, c.p, c.attrs.IsCausal, c.wantPresents = 2, 3, 1, 3, 3, 1000, true, true
	})
	add(base("stream mqa no presents scale"), func(c *tcase) {
		c.hq, c.hkv, c.s, c.l, c.p, c.dk, c.dv = 4, 1, 1, 1, 129, 64, 64
		c.attrs.Scale, c.attrs.HasScale = 0.3, true
	})
	add(base("stream no past one key"), func(c *tcase) { c.s, c.l, c.p, c.wantPresents = 1, 1, -1, true })
	add(base("stream gqa dk 48 dv 80 past 200 presents"), func(c *tcase) {
		c.b, c.hq, c.hkv, c.s, c.l, c.p, c.dk, c.dv, c.wantPresents = 1, 8, 2, 1, 1, 200, 48, 80, true
	})
	add(base("stream odd dims dk 20 dv 12 past 67"), func(c *tcase) {
		c.hq, c.hkv, c.s, c.l, c.p, c.dk, c.dv = 3, 1, 1, 1, 67, 20, 12
	})
	add(base("causal one query over three new keys"), func(c *tcase) { c.s, c.l, c.p, c.attrs.IsCausal = 1, 3, 4, true })
	add(base("smooth softmax"), func(c *tcase) { c.attrs.SmoothSoftmax, c.attrs.IsCausal = true, true })
	add(base("smooth softmax head sinks gqa window nonpad"), func(c *tcase) {
		c.hq, c.hkv, c.s, c.l, c.sinks, c.attrs.SmoothSoftmax, c.attrs.IsCausal = 4, 2, 2, 9, true, true, true
		c.attrs.SlidingWindow, c.attrs.LeftWindow, c.attrs.RightWindow = true, 3, -1
		c.nonpad = []int64{9, 5}
	})
	add(base("smooth softmax double precision softcap"), func(c *tcase) {
		c.sinks, c.attrs.SmoothSoftmax, c.attrs.SoftmaxPrecision, c.attrs.Softcap = true, true, PrecisionDouble, 3
	})
	add(base("smooth softmax decode past 200"), func(c *tcase) {
		c.s, c.l, c.p, c.hq, c.hkv, c.sinks, c.attrs.SmoothSoftmax = 1, 1, 200, 8, 2, true, true
	})
	add(base("empty batch"), func(c *tcase) { c.b = 0 })
	add(base("empty query"), func(c *tcase) { c.s = 0 })
	add(base("no keys at all"), func(c *tcase) { c.l, c.p = 0, 0 })
	return cs
}

func (c tcase) shapes() Shapes {
	var s Shapes
	if c.in3D {
		s.Q = []int{c.b, c.s, c.hq * c.dk}
		s.K = []int{c.b, c.l, c.hkv * c.dk}
		s.V = []int{c.b, c.l, c.hkv * c.dv}
	} else {
		s.Q = []int{c.b, c.hq, c.s, c.dk}
		s.K = []int{c.b, c.hkv, c.l, c.dk}
		s.V = []int{c.b, c.hkv, c.l, c.dv}
	}
	if c.p >= 0 {
		s.PastKey = []int{c.b, c.hkv, c.p, c.dk}
		s.PastValue = []int{c.b, c.hkv, c.p, c.dv}
	}
	s.Mask = c.mask
	if c.nonpad != nil {
		s.NonpadKVSeqlen = []int{len(c.nonpad)}
	}
	return s
}

func randVec(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// TestAttentionCases runs every case on every kernel variant: on one
// thread (the streamable cases on the streaming engine), on all threads, and with
// the engine off (every case on the general unit).
func TestAttentionCases(t *testing.T) {
	defer setPaths("auto")
	defer func() { unitDecode = true }()
	for _, path := range gemm.Paths() {
		setPaths(path)
		for _, mode := range []struct {
			name    string
			threads int
			unit    bool
		}{{"stream", 1, true}, {"threads", 0, true}, {"general", 0, false}} {
			unitDecode = mode.unit
			t.Run(path+"/"+mode.name, func(t *testing.T) { testCases(t, mode.threads) })
		}
	}
}

// testCases checks every case against the reference with the given thread
// bound (0: all).
func testCases(t *testing.T, threads int) {
	for ci, c := range cases() {
		t.Run(c.name, func(t *testing.T) {
			r := rand.New(rand.NewPCG(uint64(ci), 7))
			sh := c.shapes()
			g, err := Plan(c.attrs, sh)
			if err != nil {
				t.Fatalf("Plan: %v", err)
			}
			g.Threads = threads
			in := Inputs{Q: randVec(r, prod(sh.Q)), K: randVec(r, prod(sh.K)), V: randVec(r, prod(sh.V)),
				NonpadKVSeqlen: c.nonpad}
			if c.sinks {
				in.HeadSink = randVec(r, c.hq)
			}
			if c.p >= 0 {
				in.PastKey, in.PastValue = randVec(r, prod(sh.PastKey)), randVec(r, prod(sh.PastValue))
			}
			if c.mask != nil {
				n := prod(c.mask)
				if c.boolMask {
					in.Mask.Bool = make([]bool, n)
					for i := range n {
						in.Mask.Bool[i] = r.IntN(4) != 0
					}
					if c.maskFalseRow >= 0 {
						last := c.mask[len(c.mask)-1]
						for i := range n {
							if (i/last)%c.mask[len(c.mask)-2] == c.maskFalseRow {
								in.Mask.Bool[i] = false
							}
						}
					}
				} else {
					in.Mask.Float = randVec(r, n)
				}
			}
			out := Outputs{Y: make([]float32, prod(g.YShape))}
			if c.wantQK {
				out.QK = make([]float32, prod(g.QKShape))
			}
			if c.wantPresents {
				// NaN-filled: the Attention op does not zero the present
				// outputs, so every position must be written.
				out.PresentKey = nanVec(prod(g.PresentKeyShape))
				out.PresentValue = nanVec(prod(g.PresentValueShape))
			}
			if err := g.Run(in, out); err != nil {
				t.Fatalf("Run: %v", err)
			}
			y, pk, pv, qk := reference(g, in)
			near(t, "Y", out.Y, y)
			if c.wantQK {
				near(t, "qk", out.QK, qk)
			}
			if c.wantPresents {
				near(t, "present_key", out.PresentKey, pk)
				near(t, "present_value", out.PresentValue, pv)
			}
			if c.maskFalseRow >= 0 {
				for i, v := range out.Y[c.maskFalseRow*c.dv : (c.maskFalseRow+1)*c.dv] {
					if v != 0 {
						t.Fatalf("fully masked row: Y[%d] = %v, want 0", i, v)
					}
				}
			}
		})
	}
}

func nanVec(n int) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(math.NaN())
	}
	return v
}

func near(t *testing.T, what string, got []float32, want []float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i, w := range want {
		gv := float64(got[i])
		if math.IsInf(w, 0) || w == -math.MaxFloat32 {
			if gv != w && !(w == -math.MaxFloat32 && gv == float64(lowest)) {
				t.Fatalf("%s[%d] = %v, want %v", what, i, gv, w)
			}
			continue
		}
		if math.IsNaN(gv) || math.Abs(gv-w) > 2e-5+2e-5*math.Abs(w) {
			t.Fatalf("%s[%d] = %v, want %v", what, i, gv, w)
		}
	}
}

func TestPlanErrors(t *testing.T) {
	q4, k4, v4 := []int{1, 2, 3, 4}, []int{1, 2, 3, 4}, []int{1, 2, 3, 4}
	cases := []struct {
		name  string
		attrs Attrs
		s     Shapes
		want  error
	}{
		{"rank mix", Attrs{}, Shapes{Q: q4, K: []int{1, 3, 8}, V: v4}, ErrShape},
		{"rank 2", Attrs{}, Shapes{Q: []int{1, 2}, K: []int{1, 2}, V: []int{1, 2}}, ErrShape},
		{"3D without heads", Attrs{}, Shapes{Q: []int{1, 3, 8}, K: []int{1, 3, 8}, V: []int{1, 3, 8}}, ErrShape},
		{"3D hidden not divisible", Attrs{QNumHeads: 3, KVNumHeads: 1}, Shapes{Q: []int{1, 3, 8}, K: []int{1, 3, 8}, V: []int{1, 3, 8}}, ErrShape},
		{"3D head size mismatch", Attrs{QNumHeads: 2, KVNumHeads: 1}, Shapes{Q: []int{1, 3, 8}, K: []int{1, 3, 8}, V: []int{1, 3, 8}}, ErrShape},
		{"4D heads attr disagrees", Attrs{QNumHeads: 4}, Shapes{Q: q4, K: k4, V: v4}, ErrShape},
		{"batch mismatch", Attrs{}, Shapes{Q: []int{2, 2, 3, 4}, K: k4, V: v4}, ErrShape},
		{"gqa not divisible", Attrs{}, Shapes{Q: []int{1, 3, 3, 4}, K: k4, V: v4}, ErrShape},
		{"head dim mismatch", Attrs{}, Shapes{Q: []int{1, 2, 3, 5}, K: k4, V: v4}, ErrShape},
		{"v seq mismatch", Attrs{}, Shapes{Q: q4, K: k4, V: []int{1, 2, 4, 4}}, ErrShape},
		{"past key only", Attrs{}, Shapes{Q: q4, K: k4, V: v4, PastKey: []int{1, 2, 1, 4}}, ErrShape},
		{"past heads", Attrs{}, Shapes{Q: q4, K: k4, V: v4, PastKey: []int{1, 1, 1, 4}, PastValue: []int{1, 1, 1, 4}}, ErrShape},
		{"past lengths differ", Attrs{}, Shapes{Q: q4, K: k4, V: v4, PastKey: []int{1, 2, 1, 4}, PastValue: []int{1, 2, 2, 4}}, ErrShape},
		{"mask not broadcastable", Attrs{}, Shapes{Q: q4, K: k4, V: v4, Mask: []int{3, 3, 3}}, ErrShape},
		{"mask too long", Attrs{}, Shapes{Q: q4, K: k4, V: v4, Mask: []int{3, 4}}, ErrShape},
		{"mask rank 5", Attrs{}, Shapes{Q: q4, K: k4, V: v4, Mask: []int{1, 1, 1, 3, 3}}, ErrShape},
		{"qk mode 4", Attrs{QKMode: 4}, Shapes{Q: q4, K: k4, V: v4}, ErrValue},
		{"softmax precision int", Attrs{SoftmaxPrecision: 7}, Shapes{Q: q4, K: k4, V: v4}, ErrValue},
		{"NaN softcap", Attrs{Softcap: float32(math.NaN())}, Shapes{Q: q4, K: k4, V: v4}, ErrValue},
		{"nonpad with past", Attrs{}, Shapes{Q: q4, K: k4, V: v4, PastKey: []int{1, 2, 1, 4}, PastValue: []int{1, 2, 1, 4}, NonpadKVSeqlen: []int{1}}, ErrShape},
		{"nonpad shape", Attrs{}, Shapes{Q: q4, K: k4, V: v4, NonpadKVSeqlen: []int{2}}, ErrShape},
		{"negative dim", Attrs{}, Shapes{Q: []int{1, 2, -3, 4}, K: k4, V: v4}, ErrShape},
		{"overflowing size", Attrs{}, Shapes{Q: []int{1 << 20, 2, 1 << 20, 1 << 24}, K: []int{1 << 20, 2, 3, 1 << 24}, V: []int{1 << 20, 2, 3, 4}}, ErrShape},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Plan(tc.attrs, tc.s); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
}

func TestRunErrors(t *testing.T) {
	s := Shapes{Q: []int{1, 1, 2, 2}, K: []int{1, 1, 2, 2}, V: []int{1, 1, 2, 2}, NonpadKVSeqlen: []int{1}}
	g, err := Plan(Attrs{}, s)
	if err != nil {
		t.Fatal(err)
	}
	four := make([]float32, 4)
	ok := Inputs{Q: four, K: four, V: four, NonpadKVSeqlen: []int64{1}}
	cases := []struct {
		name string
		in   Inputs
		out  Outputs
		want error
	}{
		{"short Q", Inputs{Q: four[:3], K: four, V: four, NonpadKVSeqlen: []int64{1}}, Outputs{Y: four}, ErrShape},
		{"short Y", ok, Outputs{Y: four[:2]}, ErrShape},
		{"qk length", ok, Outputs{Y: four, QK: four[:3]}, ErrShape},
		{"nonpad too long", Inputs{Q: four, K: four, V: four, NonpadKVSeqlen: []int64{3}}, Outputs{Y: four}, ErrValue},
		{"nonpad negative", Inputs{Q: four, K: four, V: four, NonpadKVSeqlen: []int64{-1}}, Outputs{Y: four}, ErrValue},
		{"nonpad missing", Inputs{Q: four, K: four, V: four}, Outputs{Y: four}, ErrShape},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := g.Run(tc.in, tc.out); !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
		})
	}
	gm, err := Plan(Attrs{}, Shapes{Q: s.Q, K: s.K, V: s.V, Mask: []int{2, 2}})
	if err != nil {
		t.Fatal(err)
	}
	both := Inputs{Q: four, K: four, V: four, Mask: Mask{Float: four, Bool: make([]bool, 4)}}
	if err := gm.Run(both, Outputs{Y: four}); !errors.Is(err, ErrShape) {
		t.Fatalf("mask with both kinds: got %v", err)
	}
}

func TestExpPaths(t *testing.T) {
	defer gemm.SetPath("auto")
	row0 := []float32{0, -1e-8, -0.5, -1, -3.25, -10, -20.5, -50, -80, -87.3, -87.4, -88, -100, -1e30,
		float32(math.Inf(-1)), -math.MaxFloat32, -2, -0.693, -0.347, -5.5}
	for k := range 45 { // long enough for every vector width plus a tail
		row0 = append(row0, -float32(k)*0.37)
	}
	for _, path := range gemm.Paths() {
		gemm.SetPath(path)
		row := append([]float32(nil), row0...)
		sum := pickExp()(row, 0)
		var want float64
		for i, x := range row0 {
			w := math.Exp(float64(x))
			if w < 1.2e-38 {
				w = 0
			}
			want += w
			if math.Abs(float64(row[i])-w) > 4e-7*w+1e-38 {
				t.Fatalf("%s: exp(%v) = %v, want %v", path, x, row[i], w)
			}
		}
		if math.Abs(sum-want) > 1e-6*want {
			t.Fatalf("%s: sum %v, want %v", path, sum, want)
		}
	}
}

func TestExp32(t *testing.T) {
	for x := float32(-90); x <= 1; x += 0.0137 {
		got, want := float64(exp32(x)), math.Exp(float64(x))
		if want < 1.2e-38 {
			if got > 1.2e-38 {
				t.Fatalf("exp32(%v) = %v, want ~0", x, got)
			}
			continue
		}
		if math.Abs(got-want) > 4e-7*want {
			t.Fatalf("exp32(%v) = %v, want %v (rel %g)", x, got, want, math.Abs(got-want)/want)
		}
	}
	if !math.IsNaN(float64(exp32(float32(math.NaN())))) || exp32(float32(math.Inf(-1))) != 0 {
		t.Fatal("exp32 special values")
	}
}

// TestStreamableCases checks that the "stream" cases above run on the
// streaming engine and that features it does not implement keep the
// general unit.
func TestStreamableCases(t *testing.T) {
	for _, c := range cases() {
		g, err := Plan(c.attrs, c.shapes())
		if err != nil {
			t.Fatal(err)
		}
		var out Outputs
		if c.wantQK {
			out.QK = []float32{}
		}
		got := g.streamMath(out)
		a := c.attrs
		excluded := c.wantQK || c.b == 0 || a.SmoothSoftmax || a.InfMasking && c.mask != nil ||
			a.SlidingWindow && !a.IsCausal && a.RightWindow != 0 ||
			c.attrs.SoftmaxPrecision == PrecisionDouble ||
			(a.IsCausal || a.SlidingWindow) && c.s != c.l && c.nonpad == nil
		if strings.HasPrefix(c.name, "stream ") && !got || excluded && got {
			t.Errorf("%s: streamMath = %v", c.name, got)
		}
	}
}

// TestSigmoidPaths checks Sigmoid on every instruction-set path against
// float64, over both signs, the saturated ends, zeros, infinities and NaN,
// with lengths that leave vector tails.
func TestSigmoidPaths(t *testing.T) {
	defer gemm.SetPath("auto")
	inf := float32(math.Inf(1))
	x0 := []float32{0, float32(math.Copysign(0, -1)), 1e-8, -1e-8, 0.5, -0.5, 1, -1, 3.25, -3.25, 10, -10,
		20.5, -20.5, 50, -50, 87, -87, 88, -88, 100, -100, 1e30, -1e30, inf, -inf, math.MaxFloat32, -math.MaxFloat32}
	for k := range 41 {
		x0 = append(x0, float32(k)*0.61-12)
	}
	for _, path := range gemm.Paths() {
		gemm.SetPath(path)
		for _, n := range []int{len(x0), 15, 7, 1, 0} {
			got := make([]float32, n+1)
			got[n] = 42 // past len(src): untouched
			Sigmoid(got, x0[:n])
			for i, x := range x0[:n] {
				w := 1 / (1 + math.Exp(-float64(x)))
				if w < 1.2e-38 {
					w = 0
				}
				if d := math.Abs(float64(got[i]) - w); d > 3e-7*w+1e-38 {
					t.Fatalf("%s: sigmoid(%v) = %v, want %v", path, x, got[i], w)
				}
			}
			if got[n] != 42 {
				t.Fatalf("%s: wrote past the source length", path)
			}
		}
		nan := make([]float32, 17) // NaN in vector lanes and in the tail
		nan[0], nan[5], nan[16] = float32(math.NaN()), float32(math.NaN()), float32(math.NaN())
		out := make([]float32, len(nan))
		Sigmoid(out, nan)
		for _, i := range []int{0, 5, 16} {
			if !math.IsNaN(float64(out[i])) {
				t.Fatalf("%s: sigmoid(NaN) at %d = %v, want NaN", path, i, out[i])
			}
		}
		if out[1] != 0.5 {
			t.Fatalf("%s: sigmoid(0) next to NaN = %v", path, out[1])
		}
	}
}
