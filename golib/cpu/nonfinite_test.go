package cpu

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// The non-finite rule (package doc, "Non-finite values"): every kernel path
// returns what ReferenceAttention (float64) returns, NaN for NaN, ±Inf for
// ±Inf, and finite values where float32 intermediates would overflow but
// float64 ones do not. These tests run every path KernelPaths lists (new
// paths included once they register), on one and several threads (split-KV
// merge), decode and prefill, over NaN, ±Inf, huge and subnormal values in
// q, K, V, scale and softcap, and NaN hidden behind the window and the
// window start (masked positions must not leak).

var (
	nan    = float32(math.NaN())
	posInf = float32(math.Inf(1))
	huge   = float32(3e38)
	subn   = float32(1e-40) // subnormal float32
)

// poison is one way of planting special values into a case.
type poison struct {
	name string
	// q changes the query (all rows) in place.
	q func(q []float32)
	// kv changes stored rows: set(isV, b, h, pos, d, value).
	kv func(set func(isV bool, b, h, pos, d int, x float32), lens []int, dk, dv int)
	// opts changes the options.
	opts func(o *Options)
	// illCond: every query element is huge, so a score whose products
	// cancel (a K row summing to about 0, likely with 16-bit K and a
	// small head dim) is ill-conditioned: float32 and the reference round
	// it to different values, which a softcap's tanh then saturates to
	// +-cap or not. Where the case is not chosen for it, only the pattern
	// of non-finite outputs and their bound by V are comparable
	// (boundedLikeReference).
	illCond bool
}

func allTo(x float32) func([]float32) {
	return func(q []float32) {
		for i := range q {
			q[i] = x
		}
	}
}

func firstTo(x float32) func([]float32) { return func(q []float32) { q[0] = x } }

// lastPos plants x at the newest position (visible to every query row).
func lastPos(isV bool, d int, x float32) func(func(bool, int, int, int, int, float32), []int, int, int) {
	return func(set func(bool, int, int, int, int, float32), lens []int, dk, dv int) {
		for b, L := range lens {
			set(isV, b, 0, L-1, d, x)
		}
	}
}

// middleRow sets a whole K or V row in the middle of sequence 0, head 0.
func middleRow(isV bool, x float32) func(func(bool, int, int, int, int, float32), []int, int, int) {
	return func(set func(bool, int, int, int, int, float32), lens []int, dk, dv int) {
		n := dk
		if isV {
			n = dv
		}
		for d := 0; d < n; d++ {
			set(isV, 0, 0, lens[0]/2, d, x)
		}
	}
}

// firstPos plants x at position 0 of every sequence: with a window or a
// window start that excludes position 0 it must have no effect.
func firstPos(isV bool, x float32) func(func(bool, int, int, int, int, float32), []int, int, int) {
	return func(set func(bool, int, int, int, int, float32), lens []int, dk, dv int) {
		n := dk
		if isV {
			n = dv
		}
		for b := range lens {
			for d := 0; d < n; d++ {
				set(isV, b, 0, 0, d, x)
			}
		}
	}
}

var poisons = []poison{
	{name: "q-all-nan", q: allTo(nan)},
	{name: "q-one-nan", q: firstTo(nan)},
	{name: "q-one-inf", q: firstTo(posInf)},
	{name: "q-one-neginf", q: firstTo(-posInf)},
	{name: "q-all-huge", q: allTo(huge), illCond: true},
	{name: "q-all-neghuge", q: allTo(-huge), illCond: true},
	{name: "q-one-huge", q: firstTo(huge)},
	{name: "q-subnormal", q: allTo(subn)},
	{name: "k-last-nan", kv: lastPos(false, 0, nan)},
	{name: "k-last-inf", kv: lastPos(false, 1, posInf)},
	{name: "k-last-neginf", kv: lastPos(false, 0, -posInf)},
	{name: "k-row-huge", kv: middleRow(false, huge)},
	{name: "k-row-neghuge", kv: middleRow(false, -huge)},
	{name: "k-row-subnormal", kv: middleRow(false, subn)},
	{name: "v-last-nan", kv: lastPos(true, 0, nan)},
	{name: "v-last-inf", kv: lastPos(true, 1, posInf)},
	{name: "v-last-neginf", kv: lastPos(true, 0, -posInf)},
	{name: "v-row-huge", kv: middleRow(true, huge)},
	{name: "v-row-subnormal", kv: middleRow(true, subn)},
	{name: "scale-inf", opts: func(o *Options) { o.Scale = posInf }},
	{name: "scale-huge", opts: func(o *Options) { o.Scale = huge }},
	{name: "scale-subnormal", opts: func(o *Options) { o.Scale = subn }},
	{name: "softcap-inf", opts: func(o *Options) { o.Softcap = posInf }},
	{name: "softcap-huge", opts: func(o *Options) { o.Softcap = huge }},
	{name: "softcap-subnormal", opts: func(o *Options) { o.Softcap = subn }},
	{name: "softcap-q-huge", q: allTo(huge), opts: func(o *Options) { o.Softcap = 30 }, illCond: true},
	{name: "softcap-q-nan", q: firstTo(nan), opts: func(o *Options) { o.Softcap = 30 }},
	{name: "softcap-k-inf", kv: lastPos(false, 0, posInf), opts: func(o *Options) { o.Softcap = 30 }},
	{name: "window-hides-nan-k", kv: firstPos(false, nan), opts: func(o *Options) { o.Window = 3 }},
	{name: "window-hides-nan-v", kv: firstPos(true, nan), opts: func(o *Options) { o.Window = 3 }},
	{name: "window-hides-inf-k", kv: firstPos(false, posInf), opts: func(o *Options) { o.Window = 2 }},
}

// setStored writes x into a stored K (or V) element, rounded to the view's
// element type (fp16 turns 3e38 into +Inf: the reference reads the same bits).
func (tv *testView) setStored(isV bool, b, h, pos, d int, x float32) {
	rows, dim := tv.k[b][h], tv.dk
	if isV {
		rows, dim = tv.v[b][h], tv.dv
	}
	if d >= dim || pos < 0 || pos >= tv.lens[b] {
		return
	}
	i := pos*dim + d
	switch tv.elem {
	case cache.Float32:
		binary.LittleEndian.PutUint32(rows[4*i:], math.Float32bits(x))
	case cache.Float16:
		binary.LittleEndian.PutUint16(rows[2*i:], codec.F32ToF16(x))
	case cache.BFloat16:
		binary.LittleEndian.PutUint16(rows[2*i:], codec.F32ToBF16(x))
	}
}

// sameAsReference reports the first element where got differs from want
// under the non-finite rule: NaN where want is NaN, the same infinity where
// want is infinite, else within the float32 tolerance scaled by the largest
// finite magnitude involved (huge V values make absolute errors huge too).
func sameAsReference(got, want []float32, mag float64) (int, bool) {
	return matchesReference(got, want, func(g, w float64) bool {
		return math.Abs(g-w) <= 2e-5+2e-5*math.Abs(w)+2e-6*mag
	})
}

// boundedLikeReference is sameAsReference for an ill-conditioned case
// (poison.illCond): NaN and infinities where the reference has them, and
// finite outputs within the largest finite |V| (a weighted mean of V rows)
// where its are finite.
func boundedLikeReference(got, want []float32, mag float64) (int, bool) {
	return matchesReference(got, want, func(g, _ float64) bool {
		return math.Abs(g) <= mag*(1+1e-5)+1e-5
	})
}

// matchesReference reports the first element where got breaks the
// non-finite rule against want (NaN where want is NaN, the same infinity
// where want is infinite) or, where want is finite, fails ok(got, want).
func matchesReference(got, want []float32, ok func(g, w float64) bool) (int, bool) {
	for i, w := range want {
		g := got[i]
		switch {
		case w != w:
			if g == g {
				return i, false
			}
		case math.IsInf(float64(w), 0):
			if g != w {
				return i, false
			}
		default:
			if !ok(float64(g), float64(w)) { // NaN fails too
				return i, false
			}
		}
	}
	return 0, true
}

// maxFinite is the largest finite |x| stored in V (the scale of output errors).
func maxFiniteV(tv *testView) float64 {
	m := 1.0
	for b := range tv.v {
		for h := range tv.v[b] {
			for _, x := range decodeRow(tv.v[b][h], len(tv.v[b][h])/tv.elem.Size(), tv.elem) {
				if a := math.Abs(float64(x)); !math.IsInf(a, 0) && a > m {
					m = a
				}
			}
		}
	}
	return m
}

type nonFiniteShape struct {
	elem        cache.ElemType
	qHeads, kvh int
	dk, dv      int
	lens        []int
	qLen        int
	page        int
}

func nonFiniteShapes() []nonFiniteShape {
	long := 1500
	if raceEnabled || asanEnabled || testing.Short() {
		long = 300 // still split on 3 threads (one unit, 300 >= 2 x minSplitTokens)
	}
	return []nonFiniteShape{
		{cache.Float32, 4, 1, 64, 64, []int{40}, 1, 0},         // GQA 4: four-row loops
		{cache.Float32, 8, 2, 128, 128, []int{300, 77}, 2, 64}, // several blocks, paged
		{cache.Float16, 4, 2, 64, 64, []int{100}, 1, 0},        // 16-bit rows read in place
		{cache.BFloat16, 3, 3, 17, 9, []int{33}, 3, 0},         // odd dims, one-row loops
		{cache.Float32, 8, 1, 64, 64, []int{long}, 1, 0},       // split-KV merge on >1 thread
	}
}

// TestNonFiniteEveryPath checks decode attention (q_len <= 16) on every
// kernel path and 1-3 threads against the reference, for every poison.
func TestNonFiniteEveryPath(t *testing.T) {
	_, paths := KernelPaths()
	defer restoreKernel(t)
	defer SetThreads(Threads())
	for si, sh := range nonFiniteShapes() {
		for pi, p := range poisons {
			rng := rand.New(rand.NewPCG(uint64(si), uint64(pi)))
			tv := newTestView(rng, sh.elem, sh.kvh, sh.dk, sh.dv, sh.lens)
			tv.page = sh.page
			rows := len(sh.lens) * sh.qHeads * sh.qLen
			q := randVec(rng, rows*sh.dk, 1)
			var o Options
			if p.q != nil {
				p.q(q)
			}
			if p.kv != nil {
				p.kv(tv.setStored, sh.lens, sh.dk, sh.dv)
			}
			if p.opts != nil {
				p.opts(&o)
			}
			if p.name == "window-hides-inf-k" || p.name == "window-hides-nan-k" || p.name == "window-hides-nan-v" {
				// a window start hides position 0 too
				for b := range tv.ws {
					tv.ws[b] = min(1, sh.lens[b]-sh.qLen)
				}
			}
			want := make([]float32, rows*sh.dv)
			if err := ReferenceAttention(want, q, sh.qLen, sh.qHeads, tv, o); err != nil {
				t.Fatalf("%s/%d: reference: %v", p.name, si, err)
			}
			mag := maxFiniteV(tv)
			got := make([]float32, len(want))
			for _, path := range paths {
				if err := SetKernel(path); err != nil {
					t.Fatal(err)
				}
				for _, th := range []int{1, 3} {
					SetThreads(th)
					for i := range got {
						got[i] = 12345
					}
					if err := Attention(got, q, sh.qLen, sh.qHeads, tv, o); err != nil {
						t.Fatalf("%s/%d path=%s threads=%d: %v", p.name, si, path, th, err)
					}
					if i, ok := sameAsReference(got, want, mag); !ok {
						t.Errorf("%s/shape%d(%v) path=%s threads=%d: element %d (row %d) = %v, reference %v",
							p.name, si, sh.elem, path, th, i, i/sh.dv, got[i], want[i])
					}
				}
			}
		}
	}
}

// TestNonFinitePrefill checks AttentionPrefill (tiles of 16 query rows) on
// every path against the reference run row by row on the matching prefix.
func TestNonFinitePrefill(t *testing.T) {
	_, paths := KernelPaths()
	defer restoreKernel(t)
	const qHeads, kvh, d, L, qLen = 4, 2, 32, 60, 40
	for pi, p := range poisons {
		rng := rand.New(rand.NewPCG(99, uint64(pi)))
		tv := newTestView(rng, cache.Float32, kvh, d, d, []int{L})
		units := qHeads
		q := randVec(rng, units*qLen*d, 1)
		var o Options
		if p.q != nil {
			// poison the rows of the first query token of each head only
			for u := 0; u < units; u++ {
				p.q(q[u*qLen*d : (u*qLen+1)*d])
			}
		}
		if p.kv != nil {
			p.kv(tv.setStored, tv.lens, d, d)
		}
		if p.opts != nil {
			p.opts(&o)
		}
		want := make([]float32, units*qLen*d)
		row := make([]float32, units*d)
		out := make([]float32, units*d)
		pv := &prefixView{View: tv}
		for i := 0; i < qLen; i++ {
			for u := 0; u < units; u++ {
				copy(row[u*d:(u+1)*d], q[(u*qLen+i)*d:])
			}
			pv.cut = qLen - 1 - i
			if err := ReferenceAttention(out, row, 1, qHeads, pv, o); err != nil {
				t.Fatalf("%s row %d: reference: %v", p.name, i, err)
			}
			for u := 0; u < units; u++ {
				copy(want[(u*qLen+i)*d:(u*qLen+i+1)*d], out[u*d:(u+1)*d])
			}
		}
		mag := maxFiniteV(tv)
		got := make([]float32, len(want))
		for _, path := range paths {
			if err := SetKernel(path); err != nil {
				t.Fatal(err)
			}
			if err := AttentionPrefill(got, q, qLen, qHeads, tv, o); err != nil {
				t.Fatalf("%s path=%s: %v", p.name, path, err)
			}
			if i, ok := sameAsReference(got, want, mag); !ok {
				t.Errorf("%s path=%s prefill: element %d (unit %d, row %d) = %v, reference %v",
					p.name, path, i, i/(qLen*d), i/d%qLen, got[i], want[i])
			}
		}
	}
}

// TestNonFiniteReferenceRule pins the rule on the reference itself, so the
// documented semantics cannot drift with it: a NaN anywhere in a row's
// scores gives a NaN row; an infinite score gives NaN (inf - inf); a NaN or
// infinity in V reaches only its column; huge finite q gives the finite
// float64 result (the value row of the best key).
func TestNonFiniteReferenceRule(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 5))
	tv := newTestView(rng, cache.Float32, 1, 4, 4, []int{3})
	run := func(q []float32) []float32 {
		out := make([]float32, 4)
		if err := ReferenceAttention(out, q, 1, 1, tv, Options{}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	isNaN := func(x float32) bool { return x != x }
	for _, c := range []struct {
		name string
		q    []float32
		want func([]float32) bool
	}{
		{"nan", []float32{nan, 0, 0, 0}, func(o []float32) bool { return isNaN(o[0]) && isNaN(o[3]) }},
		{"inf", []float32{posInf, 1, 1, 1}, func(o []float32) bool { return isNaN(o[0]) && isNaN(o[3]) }},
		{"huge", []float32{huge, huge, huge, huge}, func(o []float32) bool {
			for _, x := range o {
				if isNaN(x) || math.IsInf(float64(x), 0) {
					return false
				}
			}
			return true
		}},
	} {
		if o := run(c.q); !c.want(o) {
			t.Errorf("%s: reference gives %v", c.name, o)
		}
	}
	tv.setStored(true, 0, 0, 2, 1, nan)
	o := run([]float32{1, 1, 1, 1})
	if !isNaN(o[1]) || isNaN(o[0]) || isNaN(o[2]) {
		t.Errorf("NaN in V column 1: reference gives %v", o)
	}
}

// TestFiniteStaysFast checks that finite inputs never take the exact path
// (which would be correct but slow) on any kernel path, and that a NaN does.
func TestFiniteStaysFast(t *testing.T) {
	_, paths := KernelPaths()
	defer restoreKernel(t)
	defer SetThreads(Threads())
	for si, sh := range nonFiniteShapes() {
		rng := rand.New(rand.NewPCG(uint64(si), 77))
		tv := newTestView(rng, sh.elem, sh.kvh, sh.dk, sh.dv, sh.lens)
		tv.page = sh.page
		rows := len(sh.lens) * sh.qHeads * sh.qLen
		q := randVec(rng, rows*sh.dk, 3)
		got := make([]float32, rows*sh.dv)
		for _, path := range paths {
			if err := SetKernel(path); err != nil {
				t.Fatal(err)
			}
			for _, th := range []int{1, 3} {
				SetThreads(th)
				for _, o := range []Options{{}, {Softcap: 5}, {Window: 7}} {
					before := exactRows.Load()
					if err := Attention(got, q, sh.qLen, sh.qHeads, tv, o); err != nil {
						t.Fatal(err)
					}
					if n := exactRows.Load() - before; n != 0 {
						t.Errorf("shape %d path=%s threads=%d %+v: %d finite rows took the exact path", si, path, th, o, n)
					}
				}
			}
			q[0] = nan
			before := exactRows.Load()
			if err := Attention(got, q, sh.qLen, sh.qHeads, tv, Options{}); err != nil {
				t.Fatal(err)
			}
			if exactRows.Load() == before {
				t.Errorf("shape %d path=%s: a NaN query did not take the exact path", si, path)
			}
			q[0] = 1
		}
	}
}
