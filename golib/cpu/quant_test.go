package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// Error bounds of quantized attention against float32 attention over the
// unquantized values (the reference kernel on both sides, so only the
// storage differs), as max |got - want| over the outputs: K and V are
// uniform in [-1.7, 1.7] (outputs are weighted means of such values), q is
// N(0, 1), or N(0, 3) with softcap; windows of a few tokens average little
// of the V rounding away. Set at about twice the largest error observed over
// TestQuantAttentionGrid, TestQuantQLen and TestQuantSplitKV
// (OLKV_QUANT_ERRLOG=1 prints each case's): int8 1.26e-2 (K per token),
// 6.9e-3 (K per channel); int4 1.27e-1 (per token), 1.91e-1 (per channel).
// Outlier-channel data (TestQuantOutlierChannels) is compared between the
// two K axes instead.
var quantVsF32Bound = map[cache.QuantFormat]float64{
	cache.QuantInt8: 2.5e-2,
	cache.QuantInt4: 4e-1,
}

// quantCase is one quantized attention call to check.
type quantCase struct {
	elem        cache.ElemType
	qHeads, kvh int
	dk, dv      int
	lens        []int
	ws          []int
	qLen        int
	cfg         cache.QuantConfig
	page        int
	opts        Options
	qScale      float32
	outliers    int
	tol         [2]float64 // against the oracle (abs, rel); zero: the native tolerance
}

func (c quantCase) String() string {
	return fmt.Sprintf("%s-%s-g%d-r%d/%v/h%d-%d/d%d-%d/L%v/ws%v/q%d/p%d/%+v", c.cfg.Format, c.cfg.KAxis, c.cfg.Group,
		c.cfg.Residual, c.elem, c.qHeads, c.kvh, c.dk, c.dv, c.lens, c.ws, c.qLen, c.page, c.opts)
}

func (c quantCase) setup(seed uint64) (*quantView, []float32, int) {
	rng := rand.New(rand.NewPCG(seed, 11))
	qv := newQuantView(rng, quantViewOpts{elem: c.elem, kvh: c.kvh, dk: c.dk, dv: c.dv, lens: c.lens,
		cfg: c.cfg, page: c.page, outliers: c.outliers})
	if c.ws != nil {
		copy(qv.native.ws, c.ws)
		copy(qv.orig.ws, c.ws)
	}
	qs := c.qScale
	if qs == 0 {
		qs = 1
	}
	rows := len(c.lens) * c.qHeads * c.qLen
	return qv, randVec(rng, rows*c.dk, qs), rows
}

// maxAbsDiff returns max |a-b|.
func maxAbsDiff(a, b []float32) float64 {
	m := 0.0
	for i := range a {
		m = max(m, math.Abs(float64(a[i])-float64(b[i])))
	}
	return m
}

// checkQuantPaths runs every kernel path and thread count on one case
// against the dequantize-then-reference oracle (the float32 tolerance of
// the native path) and against float32 attention on the unquantized values
// (quantVsF32Bound). It returns the error against float32.
func checkQuantPaths(t *testing.T, c quantCase, threads []int) float64 {
	t.Helper()
	qv, q, rows := c.setup(uint64(c.dk*131 + c.qLen + len(c.lens)*7 + c.cfg.Residual))
	want := make([]float32, rows*c.dv)
	if err := ReferenceAttention(want, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
		t.Fatalf("%v: reference: %v", c, err)
	}
	refRead := qv.native.read.Swap(0)
	f32 := make([]float32, rows*c.dv)
	if err := ReferenceAttention(f32, q, c.qLen, c.qHeads, qv.orig, c.opts); err != nil {
		t.Fatalf("%v: float32 reference: %v", c, err)
	}
	errF32 := maxAbsDiff(want, f32)
	if os.Getenv("OLKV_QUANT_ERRLOG") != "" {
		fmt.Fprintf(os.Stderr, "QERR %s %s %.4g\n", c.cfg.Format, c.cfg.KAxis, errF32)
	}
	if b := quantVsF32Bound[c.cfg.Format]; c.outliers == 0 && !(errF32 <= b) {
		t.Errorf("%v: dequantized attention differs from float32 by %.3g, bound %.3g", c, errF32, b)
	}
	tol := tolerance[c.elem]
	if c.tol != [2]float64{} {
		tol = c.tol
	} else {
		// the native tolerance holds for the float score loops only
		defer SetQuantIntLoops(QuantIntLoops())
		SetQuantIntDots(false)
	}
	_, paths := KernelPaths()
	defer restoreKernel(t)
	defer SetThreads(Threads())
	got := make([]float32, rows*c.dv)
	exact0 := exactRows.Load()
	for _, path := range paths {
		if err := SetKernel(path); err != nil {
			t.Fatal(err)
		}
		for _, th := range threads {
			SetThreads(th)
			for i := range got {
				got[i] = float32(math.NaN())
			}
			if err := Attention(got, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
				t.Fatalf("%v path=%s threads=%d: %v", c, path, th, err)
			}
			// A split-KV boundary inside a chunk reads its per-channel
			// scales once per part; the reference reads them once.
			slack := int64(0)
			if th > 1 && c.cfg.KAxis == cache.KPerChannel {
				slack = int64(4*th*len(c.lens)*c.kvh) * int64(8*c.dk)
			}
			if r := qv.native.read.Swap(0); r < refRead || r > refRead+slack {
				t.Errorf("%v path=%s threads=%d: bytes read %d, want %d", c, path, th, r, refRead)
			}
			if os.Getenv("OLKV_QUANT_ERRLOG") != "" {
				fmt.Fprintf(os.Stderr, "QORACLE %s %s %s %.4g\n", path, c.cfg.Format, c.cfg.KAxis, maxAbsDiff(got, want))
			}
			for i := range got {
				d := math.Abs(float64(got[i]) - float64(want[i]))
				if !(d <= tol[0]+tol[1]*math.Abs(float64(want[i]))) {
					t.Fatalf("%v path=%s threads=%d: element %d (row %d) = %v, want %v (|diff| %.3g)",
						c, path, th, i, i/c.dv, got[i], want[i], d)
				}
			}
		}
	}
	if n := exactRows.Load() - exact0; n != 0 {
		t.Errorf("%v: %d finite rows took the float64 fallback", c, n)
	}
	if qv.evictedRead.Load() || qv.native.evictedRead.Load() {
		t.Errorf("%v: a kernel read positions below the window start", c)
	}
	return errF32
}

var quantFormats = []cache.QuantFormat{cache.QuantInt8, cache.QuantInt4}
var kAxes = []cache.KAxis{cache.KPerChannel, cache.KPerToken}

// TestQuantAttentionGrid: every path against the oracle over formats, K
// axes, head layouts (MHA, GQA, MQA), head dims 64/96/128, groups 32/64,
// residual windows and lengths around the residual and chunk boundaries,
// native fp32/fp16/bf16 residual rows, softcap, windows and 1-2 threads.
func TestQuantAttentionGrid(t *testing.T) {
	heads := [][2]int{{8, 8}, {16, 4}, {8, 1}}
	dims := []int{64, 96, 128}
	small := raceEnabled || asanEnabled || testing.Short()
	if small {
		dims = []int{64, 96}
	}
	elems := []cache.ElemType{cache.Float32, cache.Float16, cache.BFloat16}
	n := 0
	for _, f := range quantFormats {
		for _, ax := range kAxes {
			for _, hd := range heads {
				for _, d := range dims {
					n++
					g := []int{32, 64}[n%2]
					res := []int{0, 16, 128}[n%3]
					lens := []int{g - 1, g, g + 1, res + g - 1, res + g, res + g + 1, res + 3*g + 5, 700}
					if small {
						lens = []int{res + g + 1, 300}
					}
					for li, L := range lens {
						c := quantCase{elem: elems[(n+li)%3], qHeads: hd[0], kvh: hd[1], dk: d, dv: d,
							lens: []int{L}, qLen: 1, cfg: cache.QuantConfig{Format: f, Group: g, KAxis: ax, Residual: res}}
						if li%3 == 1 {
							c.lens = []int{L, max(1, L/2)}
						}
						switch (n + li) % 4 {
						case 1:
							c.opts.Softcap, c.qScale = 4, 3
						case 2:
							c.opts.Window = 1 + L/3
						case 3:
							c.page = 16
						}
						checkQuantPaths(t, c, []int{1, 2})
					}
				}
			}
		}
	}
}

// TestQuantQLen sweeps q_len 1..16 (causal inside the new tokens) with and
// without a window, the new tokens straddling sealed and native rows.
func TestQuantQLen(t *testing.T) {
	for ql := 1; ql <= maxQLen; ql++ {
		for wi, w := range []int{0, 5, 40} {
			f := quantFormats[(ql+wi)%2]
			c := quantCase{elem: cache.Float16, qHeads: 8, kvh: 2, dk: 64, dv: 64, lens: []int{70, 40},
				qLen: ql, page: 8, opts: Options{Window: w},
				cfg: cache.QuantConfig{Format: f, Group: 32, KAxis: kAxes[ql%2], Residual: 4}}
			checkQuantPaths(t, c, []int{1, 2})
		}
	}
}

// TestQuantSplitKV forces the split-KV merge (one KV head, long context)
// over quantized chunks, with windows and evicted prefixes.
func TestQuantSplitKV(t *testing.T) {
	L := 2000
	if raceEnabled || asanEnabled {
		L = 400 // still split on 2-3 threads (one unit, 400 >= 2 x minSplitTokens)
	}
	for _, f := range quantFormats {
		for _, c := range []quantCase{
			{elem: cache.Float32, qHeads: 8, kvh: 1, dk: 128, dv: 128, lens: []int{L}, qLen: 1,
				cfg: cache.QuantConfig{Format: f, Group: 32, Residual: 128}},
			{elem: cache.BFloat16, qHeads: 4, kvh: 1, dk: 64, dv: 64, lens: []int{L, L / 3}, qLen: 3,
				ws: []int{L / 4, 64}, opts: Options{Window: L / 2, Softcap: 2}, qScale: 2,
				cfg: cache.QuantConfig{Format: f, Group: 64, KAxis: cache.KPerToken, Residual: 32}},
		} {
			checkQuantPaths(t, c, []int{2, 3})
		}
	}
}

// TestQuantOutlierChannels: with a few outlier K channels (4 channels x20),
// per-channel K scales lose much less than per-token ones, whose groups'
// scales the outliers inflate.
func TestQuantOutlierChannels(t *testing.T) {
	for _, f := range quantFormats {
		var errs [2]float64
		for i, ax := range kAxes {
			c := quantCase{elem: cache.Float16, qHeads: 8, kvh: 2, dk: 128, dv: 128, lens: []int{512}, qLen: 1,
				cfg: cache.QuantConfig{Format: f, Group: 32, KAxis: ax, Residual: 0}, outliers: 4, qScale: 2}
			errs[i] = checkQuantPaths(t, c, []int{1})
		}
		t.Logf("%s: error vs float32 with outlier channels: per channel %.3g, per token %.3g", f, errs[0], errs[1])
		if !(2*errs[0] < errs[1]) {
			t.Errorf("%s: per-channel K error %.3g is not below half the per-token one %.3g", f, errs[0], errs[1])
		}
	}
}

// TestQuantNonFinite plants NaN and ±Inf in scales, zeros and the query:
// every path gives the dequantize-then-reference result (the package's one
// non-finite rule).
func TestQuantNonFinite(t *testing.T) {
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	type poison struct {
		name string
		fn   func(qv *quantView, q []float32)
	}
	poisons := []poison{
		{"nan-kscale", func(qv *quantView, _ []float32) { qv.ks[0][0][3] = nan }},
		{"inf-kscale", func(qv *quantView, _ []float32) { qv.ks[0][0][5] = inf }},
		{"ninf-kscale-last", func(qv *quantView, _ []float32) { s := qv.ks[0][0]; s[len(s)-1] = -inf }},
		{"nan-vscale", func(qv *quantView, _ []float32) { qv.vs[0][0][2] = nan }},
		{"inf-vscale", func(qv *quantView, _ []float32) { qv.vs[0][0][9] = inf }},
		{"inf-kzero", func(qv *quantView, _ []float32) {
			if qv.kz[0][0] != nil {
				qv.kz[0][0][1] = inf
			}
		}},
		{"nan-vzero", func(qv *quantView, _ []float32) {
			if qv.vz[0][0] != nil {
				qv.vz[0][0][4] = nan
			}
		}},
		{"huge-kscale", func(qv *quantView, _ []float32) { qv.ks[0][0][0] = 3e38 }},
		{"nan-q", func(_ *quantView, q []float32) { q[1] = nan }},
		{"inf-q", func(_ *quantView, q []float32) { q[0] = inf }},
	}
	_, paths := KernelPaths()
	defer restoreKernel(t)
	defer SetThreads(Threads())
	defer SetQuantIntLoops(QuantIntLoops())
	threadCounts := 2
	if raceEnabled || asanEnabled {
		threadCounts = 1
	}
	for _, f := range quantFormats {
		for _, ax := range kAxes {
			for pi, p := range poisons {
				d := 64 << (pi % 2) // head dim 128: the integer loops' shapes
				c := quantCase{elem: cache.Float32, qHeads: 8, kvh: 2, dk: d, dv: d, lens: []int{300, 90}, qLen: 2,
					cfg: cache.QuantConfig{Format: f, Group: 32, KAxis: ax, Residual: 16}}
				qv, q, rows := c.setup(uint64(pi))
				p.fn(qv, q)
				want := make([]float32, rows*c.dv)
				if err := ReferenceAttention(want, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
					t.Fatal(err)
				}
				got := make([]float32, len(want))
				for _, path := range paths {
					if err := SetKernel(path); err != nil {
						t.Fatal(err)
					}
					for _, th := range []int{1, 2}[:threadCounts] {
						for _, intOn := range []bool{false, true} {
							// the integer score loop (int8 K per channel, VNNI):
							// the same non-finite pattern, finite values within
							// intDotsTol (2e-6*mag)
							mag := 2.0
							if intOn {
								if !intDotsUsed(f, ax, c.dk, c.dv, c.cfg.Group) {
									continue
								}
								mag = intDotsTol[0] / 2e-6
							}
							SetThreads(th)
							SetQuantIntDots(intOn)
							if err := Attention(got, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
								t.Fatal(err)
							}
							if i, ok := sameAsReference(got, want, mag); !ok {
								t.Errorf("%s %v path=%s threads=%d int dots %v: element %d (row %d) = %v, reference %v",
									p.name, c, path, th, intOn, i, i/c.dv, got[i], want[i])
							}
						}
					}
				}
			}
		}
	}
}

// TestQuantMalformedSegment: segments whose scales or rows do not cover
// their length are errors of every path and of the reference (never a
// panic or an out-of-bounds read).
func TestQuantMalformedSegment(t *testing.T) {
	defer restoreKernel(t)
	_, paths := KernelPaths()
	for mi, mut := range []func(sg *cache.Segment){
		func(sg *cache.Segment) { sg.Q.VGroup = 5 },                    // group does not divide the head dim
		func(sg *cache.Segment) { sg.Q.KScale = sg.Q.KScale[:10] },     // channel scales too short
		func(sg *cache.Segment) { sg.Q.VScale = sg.Q.VScale[:1] },      // token scales too short
		func(sg *cache.Segment) { sg.Q.Format = cache.QuantFormat(9) }, // unknown format
		func(sg *cache.Segment) { sg.Q.KAxis = cache.KAxis(7) },        // unknown axis
		func(sg *cache.Segment) { sg.K = sg.K[:len(sg.K)-1] },          // rows too short
		func(sg *cache.Segment) { sg.Q.VZero = nil },                   // int4 without zeros
	} {
		c := quantCase{elem: cache.Float32, qHeads: 4, kvh: 1, dk: 64, dv: 64, lens: []int{100}, qLen: 1,
			cfg: cache.QuantConfig{Format: cache.QuantInt4, Group: 32}}
		qv, q, rows := c.setup(1)
		qv.mutate = mut
		dst := make([]float32, rows*c.dv)
		if err := ReferenceAttention(dst, q, c.qLen, c.qHeads, qv, c.opts); err == nil {
			t.Errorf("case %d: reference accepted a malformed quantized segment", mi)
		}
		for _, path := range paths {
			if err := SetKernel(path); err != nil {
				t.Fatal(err)
			}
			if err := Attention(dst, q, c.qLen, c.qHeads, qv, c.opts); err == nil {
				t.Errorf("case %d path=%s: malformed quantized segment accepted", mi, path)
			}
		}
	}
}

// TestQuantNoAllocs: after warm-up a decode step over quantized segments
// does not allocate, on every path and 1-2 threads.
func TestQuantNoAllocs(t *testing.T) {
	if raceEnabled || asanEnabled {
		t.Skip("the race detector and the address sanitizer allocate")
	}
	defer restoreKernel(t)
	defer SetThreads(Threads())
	_, paths := KernelPaths()
	for _, f := range quantFormats {
		for _, ax := range kAxes {
			c := quantCase{elem: cache.Float16, qHeads: 16, kvh: 4, dk: 128, dv: 128, lens: []int{1500}, qLen: 1,
				cfg: cache.QuantConfig{Format: f, Group: 32, KAxis: ax, Residual: 128}}
			qv, q, rows := c.setup(9)
			dst := make([]float32, rows*c.dv)
			for _, path := range paths {
				if err := SetKernel(path); err != nil {
					t.Fatal(err)
				}
				for _, th := range []int{1, 2} {
					SetThreads(th)
					if err := Attention(dst, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
						t.Fatal(err)
					}
					allocs := testing.AllocsPerRun(10, func() {
						if err := Attention(dst, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
							t.Fatal(err)
						}
					})
					if allocs != 0 {
						t.Errorf("%v path=%s threads=%d: %v allocations per call, want 0", c, path, th, allocs)
					}
				}
			}
		}
	}
}

// Tolerance of the integer loops (both on, the default) against the
// oracle: the query rows are rounded to int16 per row (steps of
// max|q*s|/32767), a score error of up to half a step times sum|k|; the
// accumulation loop's int16 weights (steps of 1/16383 of a chunk's largest
// p*s) add an error of at most half a step times sum_t |q_t| per element.
// Observed up to 1.1e-4 over TestQuantIntDots (max |got - want|,
// OLKV_QUANT_ERRLOG=1, AVX-512 VNNI and AVX2; outputs of magnitude <=
// 1.7); set at about three times that. The accumulation loop alone (K per
// token, head dim 128, 200-4000 tokens): up to 4.4e-5 (int8) and 7.2e-5
// (int4).
var intDotsTol = [2]float64{3e-4, 2e-5}

// intAccumTol is the tolerance of the accumulation loop alone
// (SetQuantIntLoops(false, true)): up to 7.2e-5 observed, set at
// about twice that.
var intAccumTol = [2]float64{1.5e-4, 2e-5}

// intLoopTol returns the tolerance of a cache of format f, K axis ax, head
// dims dk, dv and group under the integer loops now on (QuantIntLoops),
// where the CPU has them: intDotsTol when the score loop runs, intAccumTol
// when only the accumulation loop does, else base.
func intLoopTol(base [2]float64, f cache.QuantFormat, ax cache.KAxis, dk, dv, group int) [2]float64 {
	if group == 0 {
		group = cache.DefaultQuantGroup
	}
	scores, accum := QuantIntLoops()
	vg := cache.RowGroup(dv, group)
	switch {
	case scores && ax == cache.KPerChannel && (f == cache.QuantInt8 || dk%128 == 0):
		return intDotsTol
	case accum && dv%128 == 0 && (dv == 4*vg || dv == 2*vg):
		return intAccumTol
	}
	return base
}

// intDotsUsed reports whether an integer loop runs over a cache of format
// f, K axis ax, head dims dk, dv and quantization group (0: the default)
// when they are on (SetQuantIntDots) and the CPU has them: the score loop
// over int8 K per channel, and int4 K per channel with a head dim that is
// a multiple of 128; the accumulation loop where V rows have two or four
// scale groups and a head dim that is a multiple of 128.
func intDotsUsed(f cache.QuantFormat, ax cache.KAxis, dk, dv, group int) bool {
	if group == 0 {
		group = cache.DefaultQuantGroup
	}
	vg := cache.RowGroup(dv, group)
	return (ax == cache.KPerChannel && (f == cache.QuantInt8 || dk%128 == 0)) || (dv%128 == 0 && (dv == 4*vg || dv == 2*vg))
}

// useIntDots skips t where no kernel path has the integer loops, else turns
// them on (SetQuantIntDots) and returns the function restoring the setting.
func useIntDots(t *testing.T) func() {
	t.Helper()
	have := false
	for _, k := range kernelVariants {
		have = have || (k.quant != nil && k.quant.intDots4 != nil)
	}
	if !have {
		t.Skip("no kernel path with integer dots on this CPU/build")
	}
	scores, accum := QuantIntLoops()
	SetQuantIntDots(true)
	return func() { SetQuantIntLoops(scores, accum) }
}

// TestQuantIntDotsShapes runs the integer loops of every path that has
// them (AVX-512 VNNI, AVX2) against the oracle with intDotsTol over query
// lengths 1-4, 1 and 4-8 query heads per KV head, int8/int4 at groups
// 32 and 64, and lengths just around a chunk and the residual window
// (one thread; the thread split is TestQuantIntDots').
func TestQuantIntDotsShapes(t *testing.T) {
	defer useIntDots(t)()
	n := 0
	for _, f := range quantFormats {
		for _, group := range []int{32, 64} {
			// groups of 4 and 8, and of 6, 5, 7 and 1 (MHA) query heads per KV
			// head, whose rows run four at a time from rows that are not a
			// multiple of four (group 6, q_len 2: rows 6-9) and one at a time
			for _, hd := range [][2]int{{8, 2}, {8, 1}, {6, 1}, {10, 2}, {7, 1}, {4, 4}} {
				for qLen := 1; qLen <= 4; qLen++ {
					n++
					res := []int{0, 16}[n%2]
					L := group + res - 1 + n%3 // one below, at and one above a chunk past the window
					c := quantCase{elem: cache.Float16, qHeads: hd[0], kvh: hd[1], dk: 128, dv: 128,
						lens: []int{L, 3*group + res + 1}, qLen: qLen,
						cfg: cache.QuantConfig{Format: f, Group: group, Residual: res}, tol: intDotsTol}
					checkQuantPaths(t, c, []int{1})
				}
			}
		}
	}
}

// TestQuantIntDots runs the integer score loop (SetQuantIntDots) where the
// CPU has it (skipped elsewhere), groups 32 and 64, against the oracle
// with intDotsTol and against float32 with the int8 bound.
func TestQuantIntDots(t *testing.T) {
	defer useIntDots(t)()
	lens := []int{33, 200, 1000}
	if raceEnabled || asanEnabled || testing.Short() {
		lens = []int{200}
	}
	n := 0
	for _, hd := range [][2]int{{16, 4}, {8, 1}, {32, 8}} {
		for _, d := range []int{64, 128} {
			for _, L := range lens {
				n++
				f := quantFormats[n%2]     // int4 runs the integer loop at head dim 128
				group := 32 << (n / 2 % 2) // 64: two V scale groups a row at head dim 128
				c := quantCase{elem: cache.Float16, qHeads: hd[0], kvh: hd[1], dk: d, dv: d, lens: []int{L, L/2 + 1},
					qLen: 1 + n%3*2, cfg: cache.QuantConfig{Format: f, Group: group, Residual: 16}, tol: intDotsTol}
				switch n % 3 {
				case 1:
					c.opts.Softcap, c.qScale = 4, 3
				case 2:
					c.opts.Window = L / 3
				}
				checkQuantPaths(t, c, []int{1, 2})
			}
		}
	}
}
