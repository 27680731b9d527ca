package cpu

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// Tolerances of every kernel path against ReferenceAttention. The reference
// reads the same stored rows (fp16/bf16 widening is exact), so the
// difference is float32 accumulation and the polynomial exp versus float64
// and math.Exp: it does not depend on the storage type. Outputs are
// weighted means of N(0,1) values, |o| <= ~4.
//
//	float32  : |got-want| <= 2e-5 + 2e-5*|want|
//	float16  : same (storage rounding is seen by both sides)
//	bfloat16 : same
//
// Observed maximum on the full grid is ~2e-6.
var tolerance = map[cache.ElemType][2]float64{
	cache.Float32:  {2e-5, 2e-5},
	cache.Float16:  {2e-5, 2e-5},
	cache.BFloat16: {2e-5, 2e-5},
}

// attnCase is one attention call to check.
type attnCase struct {
	name        string
	elem        cache.ElemType
	qHeads, kvh int
	dk, dv      int
	lens        []int
	ws          []int // window start per sequence (nil: none)
	qLen        int
	page        int
	opts        Options
	qScale      float32 // stddev of q (large values make softcap matter)
}

func (c attnCase) String() string {
	return fmt.Sprintf("%s/%v/h%d-%d/d%d-%d/L%v/ws%v/q%d/p%d/%+v", c.name, c.elem, c.qHeads, c.kvh,
		c.dk, c.dv, c.lens, c.ws, c.qLen, c.page, c.opts)
}

// setup builds the view and the query of a case.
func (c attnCase) setup(seed uint64) (*testView, []float32, int) {
	rng := rand.New(rand.NewPCG(seed, 7))
	tv := newTestView(rng, c.elem, c.kvh, c.dk, c.dv, c.lens)
	tv.page = c.page
	if c.ws != nil {
		copy(tv.ws, c.ws)
	}
	qs := c.qScale
	if qs == 0 {
		qs = 1
	}
	rows := len(c.lens) * c.qHeads * c.qLen
	return tv, randVec(rng, rows*c.dk, qs), rows
}

// checkPaths runs every available kernel path (and thread counts) against
// the reference on one case.
func checkPaths(t *testing.T, c attnCase, threads []int) {
	t.Helper()
	tv, q, rows := c.setup(uint64(len(c.name)*7919 + c.dk + c.qLen))
	want := make([]float32, rows*c.dv)
	if err := ReferenceAttention(want, q, c.qLen, c.qHeads, tv, c.opts); err != nil {
		t.Fatalf("%v: reference: %v", c, err)
	}
	refRead := tv.read.Swap(0)
	tol := tolerance[c.elem]
	_, paths := KernelPaths()
	defer restoreKernel(t)
	defer SetThreads(Threads())
	got := make([]float32, rows*c.dv)
	for _, path := range paths {
		if err := SetKernel(path); err != nil {
			t.Fatal(err)
		}
		for _, th := range threads {
			SetThreads(th)
			for i := range got {
				got[i] = float32(math.NaN())
			}
			if err := Attention(got, q, c.qLen, c.qHeads, tv, c.opts); err != nil {
				t.Fatalf("%v path=%s threads=%d: %v", c, path, th, err)
			}
			if r := tv.read.Swap(0); r != refRead {
				t.Errorf("%v path=%s threads=%d: bytes read %d, want %d", c, path, th, r, refRead)
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
	if tv.evictedRead.Load() {
		t.Errorf("%v: a kernel read positions below the window start", c)
	}
}

func restoreKernel(t *testing.T) {
	if err := SetKernel("auto"); err != nil {
		t.Error(err)
	}
}

// TestAttentionGrid is the full grid of shapes: every path against the reference
// over head layouts, head dims, lengths around the block size, storage
// types, softcap and window, batches of 1-3 sequences of different lengths
// and q_len in 1..16. Under -race or -short a representative subset runs.
func TestAttentionGrid(t *testing.T) {
	heads := [][2]int{{32, 32}, {32, 8}, {12, 4}, {21, 3}, {8, 1}}
	dims := []int{64, 96, 128, 256}
	elems := []cache.ElemType{cache.Float32, cache.Float16, cache.BFloat16}
	small := raceEnabled || testing.Short()
	if small {
		dims = []int{64, 96}
	}
	qLens := []int{1, 3, 16, 2, 7}
	n := 0
	for _, hd := range heads {
		for _, d := range dims {
			bt := blockTokens(d, d)
			lengths := []int{1, 7, bt - 1, bt, bt + 1, 4097}
			if small {
				lengths = []int{1, 7, bt + 1, 300}
			}
			for _, L := range lengths {
				for _, e := range elems {
					n++
					batch := 1 + n%3
					lens := make([]int, batch)
					qLen := min(qLens[n%len(qLens)], L)
					for b := range lens {
						// Different lengths per sequence; only the first one is
						// long, which keeps the grid's run time reasonable.
						lens[b] = max(qLen, L-5*b)
						if L > 512 && b > 0 {
							lens[b] = max(qLen, L/(3*b)+b)
						}
					}
					c := attnCase{name: "grid", elem: e, qHeads: hd[0], kvh: hd[1], dk: d, dv: d,
						lens: lens, qLen: qLen}
					switch n % 4 {
					case 1:
						c.opts.Softcap, c.qScale = 4, 3
					case 2:
						c.opts.Window = 1 + L/3
					case 3:
						c.opts.Scale = 0.05
					}
					threads := []int{1, 2}
					if n%5 == 0 {
						threads = []int{3}
					}
					checkPaths(t, c, threads)
				}
			}
		}
	}
}

// TestAttentionOddHeadDims checks the head dims the AVX-512 loops pass to
// the AVX2 ones or to archsimd (not a multiple of 64: 16-160, and 40, not a
// multiple of 16) on every path, GQA and MHA, each storage type, lengths
// around four-token steps.
func TestAttentionOddHeadDims(t *testing.T) {
	for _, d := range []int{16, 32, 40, 48, 80, 112, 160} {
		for _, hd := range [][2]int{{8, 2}, {4, 4}} {
			for i, e := range []cache.ElemType{cache.Float32, cache.Float16, cache.BFloat16} {
				L := 37 + 64*i
				c := attnCase{name: "odd-dims", elem: e, qHeads: hd[0], kvh: hd[1], dk: d, dv: d,
					lens: []int{L, L - 9}, qLen: 1 + i}
				checkPaths(t, c, []int{1, 2})
			}
		}
	}
}

// TestAttentionQLen sweeps q_len 1..16 (causal inside the new tokens) with
// and without a window, on paged segments.
func TestAttentionQLen(t *testing.T) {
	for ql := 1; ql <= maxQLen; ql++ {
		for _, w := range []int{0, 5, 40} {
			checkPaths(t, attnCase{name: "qlen", elem: cache.Float32, qHeads: 8, kvh: 2, dk: 64, dv: 64,
				lens: []int{70, 33}, qLen: ql, page: 16, opts: Options{Window: w}}, []int{1, 2})
		}
	}
}

// TestAttentionSegments walks pages of several sizes, window starts (evicted
// prefixes) and differing K/V head dims.
func TestAttentionSegments(t *testing.T) {
	cases := []attnCase{
		{name: "page1", elem: cache.Float16, qHeads: 4, kvh: 2, dk: 32, dv: 32, lens: []int{50}, qLen: 1, page: 1},
		{name: "page33", elem: cache.BFloat16, qHeads: 6, kvh: 3, dk: 64, dv: 64, lens: []int{200, 99}, qLen: 2, page: 33},
		{name: "evicted", elem: cache.Float32, qHeads: 4, kvh: 1, dk: 64, dv: 64, lens: []int{300, 120}, ws: []int{200, 100},
			qLen: 4, page: 64, opts: Options{Window: 100}},
		{name: "dkdv", elem: cache.Float32, qHeads: 4, kvh: 2, dk: 96, dv: 40, lens: []int{130, 3}, qLen: 3},
		{name: "odd-dims", elem: cache.Float16, qHeads: 3, kvh: 3, dk: 17, dv: 9, lens: []int{77}, qLen: 1},
		{name: "tiny-dims", elem: cache.Float32, qHeads: 2, kvh: 1, dk: 1, dv: 2, lens: []int{5}, qLen: 5},
	}
	for _, c := range cases {
		checkPaths(t, c, []int{1, 2})
	}
}

// TestAttentionSplitKV forces the split-KV merge (one KV head, long context)
// with several thread counts.
func TestAttentionSplitKV(t *testing.T) {
	L := 3000
	if raceEnabled {
		L = 700
	}
	for _, c := range []attnCase{
		{name: "mqa", elem: cache.Float32, qHeads: 8, kvh: 1, dk: 128, dv: 128, lens: []int{L}, qLen: 1},
		{name: "mqa-window", elem: cache.BFloat16, qHeads: 8, kvh: 1, dk: 64, dv: 64, lens: []int{L}, qLen: 3,
			opts: Options{Window: L / 2, Softcap: 2}, qScale: 2},
		{name: "batch3", elem: cache.Float16, qHeads: 4, kvh: 1, dk: 64, dv: 64, lens: []int{L, 20, L / 2}, qLen: 2},
	} {
		checkPaths(t, c, []int{2, 3, 4, 7})
	}
}

// TestAttentionErrors checks argument validation of both kernels.
func TestAttentionErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	base := func() *testView { return newTestView(rng, cache.Float32, 2, 8, 8, []int{5, 3}) }
	good := func() ([]float32, []float32) { return make([]float32, 2*4*1*8), make([]float32, 2*4*1*8) }
	cases := []struct {
		name   string
		mutate func(dst, q *[]float32, qLen, qHeads *int, tv **testView, o *Options)
	}{
		{"short q", func(dst, q *[]float32, _, _ *int, _ **testView, _ *Options) { *q = (*q)[1:] }},
		{"long dst", func(dst, q *[]float32, _, _ *int, _ **testView, _ *Options) { *dst = append(*dst, 0) }},
		{"q heads not multiple", func(_, _ *[]float32, _, qh *int, _ **testView, _ *Options) { *qh = 3 }},
		{"zero q heads", func(_, _ *[]float32, _, qh *int, _ **testView, _ *Options) { *qh = 0 }},
		{"q len 0", func(_, _ *[]float32, ql, _ *int, _ **testView, _ *Options) { *ql = 0 }},
		{"q len 17", func(_, _ *[]float32, ql, _ *int, _ **testView, _ *Options) { *ql = 17 }},
		{"q len > seq len", func(dst, q *[]float32, ql, _ *int, _ **testView, _ *Options) {
			*ql = 4
			*dst, *q = make([]float32, 2*4*4*8), make([]float32, 2*4*4*8)
		}},
		{"negative window", func(_, _ *[]float32, _, _ *int, _ **testView, o *Options) { o.Window = -1 }},
		{"negative softcap", func(_, _ *[]float32, _, _ *int, _ **testView, o *Options) { o.Softcap = -1 }},
		{"NaN scale", func(_, _ *[]float32, _, _ *int, _ **testView, o *Options) { o.Scale = float32(math.NaN()) }},
		{"window start past queries", func(_, _ *[]float32, _, _ *int, tv **testView, _ *Options) { (*tv).ws[1] = 3 }},
		{"nil view", func(_, _ *[]float32, _, _ *int, tv **testView, _ *Options) { *tv = nil }},
		{"malformed segment", func(_, _ *[]float32, _, _ *int, tv **testView, _ *Options) { (*tv).badSegment = true }},
	}
	for _, tc := range cases {
		for _, k := range []struct {
			name string
			fn   func([]float32, []float32, int, int, cache.View, Options) error
		}{{"reference", ReferenceAttention}, {"streaming", Attention}} {
			dst, q := good()
			qLen, qHeads, tv, o := 1, 4, base(), Options{}
			tc.mutate(&dst, &q, &qLen, &qHeads, &tv, &o)
			var v cache.View
			if tv != nil {
				v = tv
			}
			err := k.fn(dst, q, qLen, qHeads, v, o)
			if !errors.Is(err, cache.ErrInvalidArgument) {
				t.Errorf("%s/%s: err = %v, want ErrInvalidArgument", tc.name, k.name, err)
			}
		}
	}
	// The unmodified call succeeds, so the cases above fail for their reason.
	dst, q := good()
	if err := Attention(dst, q, 1, 4, base(), Options{}); err != nil {
		t.Fatalf("valid call: %v", err)
	}
}

// TestSetKernel checks path selection and its error.
func TestSetKernel(t *testing.T) {
	defer restoreKernel(t)
	activeName, paths := KernelPaths()
	if paths[0] != "go" || activeName != paths[len(paths)-1] && KernelStartupError() == nil {
		t.Logf("active %q, paths %v (OLKV_KERNEL may force one)", activeName, paths)
	}
	for _, p := range paths {
		if err := SetKernel(p); err != nil {
			t.Errorf("SetKernel(%q): %v", p, err)
		}
		if a, _ := KernelPaths(); a != p {
			t.Errorf("after SetKernel(%q) active is %q", p, a)
		}
	}
	if err := SetKernel("sse9"); !errors.Is(err, cache.ErrInvalidArgument) {
		t.Errorf("SetKernel(sse9) = %v, want ErrInvalidArgument", err)
	}
	if err := SetKernel("auto"); err != nil {
		t.Fatal(err)
	}
	if a, _ := KernelPaths(); a != paths[len(paths)-1] {
		t.Errorf("auto selected %q, want %q", a, paths[len(paths)-1])
	}
}

// TestAttentionNoAllocs proves that a warm decode step does not allocate,
// on one thread and with the pool.
func TestAttentionNoAllocs(t *testing.T) {
	if raceEnabled || asanEnabled {
		t.Skip("the race detector and the address sanitizer allocate")
	}
	defer SetThreads(Threads())
	for _, c := range []attnCase{
		{name: "gqa", elem: cache.Float32, qHeads: 32, kvh: 8, dk: 128, dv: 128, lens: []int{1024}, qLen: 1},
		{name: "mqa-split", elem: cache.Float16, qHeads: 8, kvh: 1, dk: 64, dv: 64, lens: []int{2048, 100}, qLen: 2},
	} {
		tv, q, rows := c.setup(3)
		dst := make([]float32, rows*c.dv)
		for _, th := range []int{1, 2, 4} {
			SetThreads(th)
			if err := Attention(dst, q, c.qLen, c.qHeads, tv, c.opts); err != nil {
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(20, func() {
				if err := Attention(dst, q, c.qLen, c.qHeads, tv, c.opts); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Errorf("%v threads=%d: %v allocations per call, want 0", c, th, allocs)
			}
		}
	}
}

// TestReadBandwidth checks the probe's argument validation and that it
// returns a positive figure on a small buffer.
func TestReadBandwidth(t *testing.T) {
	for _, c := range []struct {
		bytes          int64
		threads, iters int
	}{{1 << 10, 1, 1}, {4 << 20, 0, 1}, {4 << 20, 1, 0}, {4 << 20, maxProbeThreads + 1, 1}, {1 << 62, 1, 1}} {
		if _, err := ReadBandwidth(c.bytes, c.threads, c.iters); !errors.Is(err, cache.ErrInvalidArgument) {
			t.Errorf("ReadBandwidth(%d, %d, %d) = %v, want ErrInvalidArgument", c.bytes, c.threads, c.iters, err)
		}
	}
	gbps, err := ReadBandwidth(8<<20, 2, 2)
	if err != nil || !(gbps > 0) {
		t.Fatalf("ReadBandwidth(8 MiB, 2, 2) = %v, %v", gbps, err)
	}
}

// TestBlockSize checks the L2-derived block size: a quarter of the L2 within
// [64 KiB, 256 KiB], 64 KiB when the L2 is unknown, and the token count of a
// block within [16, 512] for every head dim.
func TestBlockSize(t *testing.T) {
	for _, c := range []struct{ l2, want int }{
		{-1, 64 << 10}, {0, 64 << 10}, {256 << 10, 64 << 10}, {512 << 10, 128 << 10},
		{1 << 20, 256 << 10}, {2 << 20, 256 << 10},
	} {
		if got := l2BlockBytes(c.l2); got != c.want {
			t.Errorf("l2BlockBytes(%d) = %d, want %d", c.l2, got, c.want)
		}
	}
	defer func(b int) { blockBytes = b }(blockBytes)
	for _, c := range []struct{ bytes, dk, dv, want int }{
		{64 << 10, 128, 128, 128}, {256 << 10, 128, 128, 512}, {256 << 10, 64, 64, 512},
		{256 << 10, 96, 256, 256}, {64 << 10, 4096, 4096, 16},
	} {
		blockBytes = c.bytes
		if got := blockTokens(c.dk, c.dv); got != c.want {
			t.Errorf("blockTokens(%d, %d) with %d-byte blocks = %d, want %d", c.dk, c.dv, c.bytes, got, c.want)
		}
	}
}

// TestStreamRead checks the one-pass probe on a caller's buffer: argument
// validation, more threads than elements, and an untouched buffer.
func TestStreamRead(t *testing.T) {
	for _, c := range []struct {
		n, threads int
	}{{0, 1}, {16, 0}, {16, maxProbeThreads + 1}} {
		if _, err := StreamRead(make([]float32, c.n), c.threads); !errors.Is(err, cache.ErrInvalidArgument) {
			t.Errorf("StreamRead(%d floats, %d threads) = %v, want ErrInvalidArgument", c.n, c.threads, err)
		}
	}
	buf := make([]float32, 1<<16)
	for i := range buf {
		buf[i] = float32(i)
	}
	for _, threads := range []int{1, 2, 3, maxProbeThreads} {
		if gbps, err := StreamRead(buf, threads); err != nil || !(gbps > 0) {
			t.Fatalf("StreamRead(%d threads) = %v, %v", threads, gbps, err)
		}
	}
	for i, x := range buf {
		if x != float32(i) {
			t.Fatalf("buf[%d] changed to %v", i, x)
		}
	}
}

// TestSetThreadsClamp checks the thread setting's bounds: <= 0 restores one
// per CPU, more than MaxThreads is clamped.
func TestSetThreadsClamp(t *testing.T) {
	defer SetThreads(Threads())
	for _, c := range []struct{ n, want int }{{MaxThreads + 5, MaxThreads}, {0, runtime.NumCPU()}, {-3, runtime.NumCPU()}, {3, 3}} {
		SetThreads(c.n)
		if got := Threads(); got != c.want {
			t.Errorf("SetThreads(%d): Threads() = %d, want %d", c.n, got, c.want)
		}
	}
}
