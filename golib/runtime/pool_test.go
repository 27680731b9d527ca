package runtime

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestSizeClasses(t *testing.T) {
	prevClass, prevSize := -1, 0
	for n := 1; n <= 1<<20; n++ {
		c, size := sizeClass(n)
		if size < n || size%8 != 0 {
			t.Fatalf("sizeClass(%d) = %d bytes", n, size)
		}
		if n > poolMinClass && size > n+n/8+8 {
			t.Fatalf("sizeClass(%d) = %d bytes: more than 12.5%% slack", n, size)
		}
		if c < prevClass || (c == prevClass) != (size == prevSize) || c > prevClass+1 {
			t.Fatalf("sizeClass(%d) = (%d, %d) after (%d, %d): classes not contiguous", n, c, size, prevClass, prevSize)
		}
		prevClass, prevSize = c, size
	}
}

// aliasGraph keeps a value and a Reshape of it alive while later nodes
// allocate: y = Reshape(x + w) + x*x, z = Neg(y). Recycling the Add's
// buffer when "a" is released (its alias "r" still lives) would hand it to
// the Mul and corrupt y.
func aliasGraph() *onnxpb.ModelProto {
	g := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Add", []string{"x", "w"}, []string{"a"}),
		onnxtest.Node("Reshape", []string{"a", "shape"}, []string{"r"}),
		onnxtest.Node("Mul", []string{"x", "x"}, []string{"m"}),
		onnxtest.Node("Reshape", []string{"m", "shape"}, []string{"mr"}),
		onnxtest.Node("Add", []string{"r", "mr"}, []string{"y"}),
		onnxtest.Node("Neg", []string{"y"}, []string{"z"}),
	}, []vi{onnxtest.Info("x", 1, 4, 8)}, []vi{onnxtest.Info("y", 1, 32), onnxtest.Info("z", 1, 32)},
		onnxtest.Floats("w", []int64{8}, []float32{1, 2, 3, 4, 5, 6, 7, 8}),
		onnxtest.Int64s("shape", []int64{1}, []int64{32}))
	return onnxtest.Model(17, g, nil)
}

func aliasInput(v float32) (*tensor.Tensor, []float32) {
	x := make([]float32, 32)
	want := make([]float32, 32)
	for i := range x {
		x[i] = v + float32(i)
		want[i] = x[i] + float32(i%8+1) + x[i]*x[i]
	}
	t, _ := tensor.FromSlice(tensor.Shape{4, 8}, x)
	return t, want
}

func checkAlias(t *testing.T, what string, y, z *tensor.Tensor, want []float32) {
	t.Helper()
	for i, w := range want {
		if y.Float32()[i] != w || z.Float32()[i] != -w {
			t.Fatalf("%s: y[%d] = %v, z[%d] = %v, want %v and %v", what, i, y.Float32()[i], i, z.Float32()[i], w, -w)
		}
	}
}

func dataPtr(t *tensor.Tensor) unsafe.Pointer { return unsafe.Pointer(unsafe.SliceData(t.Bytes())) }

// TestPoolNoAliasingBetweenLiveValues: values alive at the same time never
// share a pooled buffer, over runs that reuse buffers.
func TestPoolNoAliasingBetweenLiveValues(t *testing.T) {
	s := session(t, aliasGraph())
	st := s.DefaultState()
	for run := 0; run < 5; run++ {
		x, want := aliasInput(float32(run))
		outs, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkAlias(t, "run", outs[0], outs[1], want)
		if dataPtr(outs[0]) == dataPtr(outs[1]) {
			t.Fatal("outputs y and z share a buffer")
		}
		st.Release(outs...)
	}
	if ps := st.PoolStats(); ps.Reused == 0 {
		t.Fatalf("no buffer was reused over 5 runs: %+v", ps)
	}
}

// TestPoolReuse: once the outputs are released, a repeated run allocates
// nothing new.
func TestPoolReuse(t *testing.T) {
	s := session(t, aliasGraph())
	st := s.DefaultState()
	x, _ := aliasInput(1)
	feeds := map[string]*tensor.Tensor{"x": x}
	for run := 0; run < 2; run++ {
		outs, _, err := s.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		st.Release(outs...)
	}
	before := st.PoolStats()
	for run := 0; run < 3; run++ {
		outs, _, err := s.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		st.Release(outs...)
	}
	after := st.PoolStats()
	if after.Allocated != before.Allocated || after.Reused-before.Reused != 3*4 {
		t.Fatalf("steady-state runs allocated: before %+v, after %+v (want 4 reused buffers per run)", before, after)
	}
}

// TestPoolHeldOutputsNotRecycled: outputs the caller has not released keep
// their values while later runs of the same state execute; after Release
// their buffers serve the next runs.
func TestPoolHeldOutputsNotRecycled(t *testing.T) {
	s := session(t, aliasGraph())
	st := s.DefaultState()
	x1, want1 := aliasInput(1)
	held, _, err := s.Run(map[string]*tensor.Tensor{"x": x1}, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range held {
		if !st.Leased(o) {
			t.Fatal("a pooled output is not leased to the caller")
		}
	}
	for run := 0; run < 3; run++ {
		x, want := aliasInput(float32(10 + run))
		outs, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkAlias(t, "later run", outs[0], outs[1], want)
		for _, o := range outs {
			if dataPtr(o) == dataPtr(held[0]) || dataPtr(o) == dataPtr(held[1]) {
				t.Fatal("a later run wrote into a held output")
			}
		}
		st.Release(outs...)
		checkAlias(t, "held output", held[0], held[1], want1)
	}
	st.Release(held...)
	st.Release(held...) // a second release is ignored
	if st.Leased(held[0]) {
		t.Fatal("released output still leased")
	}
	before := st.PoolStats()
	x, want := aliasInput(3)
	outs, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkAlias(t, "after release", outs[0], outs[1], want)
	if after := st.PoolStats(); after.Allocated != before.Allocated {
		t.Fatalf("released outputs were not reused: before %+v, after %+v", before, after)
	}
}

// TestPoolOutputsFedBack: a run's outputs fed to the next run (a decode
// loop's present -> past) are read intact while that run allocates.
func TestPoolOutputsFedBack(t *testing.T) {
	g := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Add", []string{"x", "one"}, []string{"a"}),
		onnxtest.Node("Mul", []string{"a", "two"}, []string{"y"}),
	}, []vi{onnxtest.Info("x", 1, 16)}, []vi{onnxtest.Info("y", 1, 16)},
		onnxtest.Floats("one", []int64{1}, []float32{1}), onnxtest.Floats("two", []int64{1}, []float32{2}))
	s := session(t, onnxtest.Model(17, g, nil))
	st := s.DefaultState()
	x, _ := tensor.New(tensor.Float32, tensor.Shape{16})
	want := float32(0)
	var prev []*tensor.Tensor
	for run := 0; run < 8; run++ {
		outs, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st.Release(prev...) // the previous output was this run's feed
		prev = outs
		want = (want + 1) * 2
		for i, v := range outs[0].Float32() {
			if v != want {
				t.Fatalf("run %d: y[%d] = %v, want %v", run, i, v, want)
			}
		}
		x = outs[0]
	}
}

// TestPoolUnrequestedOutputsAndErrors: outputs the caller did not ask for,
// and the values of a failed run, go back to the pool.
func TestPoolUnrequestedOutputsAndErrors(t *testing.T) {
	s := session(t, aliasGraph())
	st := s.DefaultState()
	x, want := aliasInput(2)
	outs, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, []string{"z"})
	if err != nil {
		t.Fatal(err)
	}
	if ps := st.PoolStats(); ps.Recycled == 0 || ps.FreeBytes == 0 {
		t.Fatalf("the unrequested output y was not recycled: %+v", ps)
	}
	for i, w := range want {
		if outs[0].Float32()[i] != -w {
			t.Fatalf("z[%d] = %v, want %v", i, outs[0].Float32()[i], -w)
		}
	}
	bad, _ := tensor.New(tensor.Float32, tensor.Shape{4, 4}) // Reshape to 32 fails
	if _, _, err := s.Run(map[string]*tensor.Tensor{"x": bad}, nil); err == nil {
		t.Fatal("a bad shape ran")
	}
	if ps := st.PoolStats(); ps.FreeBytes == 0 {
		t.Fatalf("a failed run kept its buffers: %+v", ps)
	}
}

// TestPoolReleaseWhileRunning releases outputs from another goroutine while
// the state runs (run with -race).
func TestPoolReleaseWhileRunning(t *testing.T) {
	s := session(t, aliasGraph())
	st := s.DefaultState()
	results := make(chan []*tensor.Tensor, 4)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for outs := range results {
			st.Release(outs...)
		}
	}()
	for run := 0; run < 50; run++ {
		x, want := aliasInput(float32(run))
		outs, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		checkAlias(t, "run", outs[0], outs[1], want)
		results <- outs
	}
	close(results)
	wg.Wait()
}

// TestPoolIdleBuffersDropped: buffers of a shape no longer used leave the
// pool after a few runs, and closing the session empties it.
func TestPoolIdleBuffersDropped(t *testing.T) {
	s := session(t, chain())
	st := s.DefaultState()
	big, _ := tensor.New(tensor.Float32, tensor.Shape{1000, 2})
	outs, _, err := s.Run(map[string]*tensor.Tensor{"x": big}, nil)
	if err != nil {
		t.Fatal(err)
	}
	st.Release(outs...)
	small, _ := tensor.New(tensor.Float32, tensor.Shape{1, 2})
	for run := 0; run < poolMaxIdleRuns+2; run++ {
		outs, _, err := s.Run(map[string]*tensor.Tensor{"x": small}, nil)
		if err != nil {
			t.Fatal(err)
		}
		st.Release(outs...)
	}
	if ps := st.PoolStats(); ps.Dropped == 0 || ps.FreeBytes > 1024 {
		t.Fatalf("idle large buffers stayed in the pool: %+v", ps)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if ps := st.PoolStats(); ps.FreeBytes != 0 {
		t.Fatalf("closed session keeps free buffers: %+v", ps)
	}
	st.Release(outs...) // after close: ignored
}

// TestTrackerOffsetViews: a value that views a pooled buffer at an offset
// keeps the buffer out of the pool after the value it was cut from is
// released.
func TestTrackerOffsetViews(t *testing.T) {
	p := newBufferPool()
	p.beginRun()
	m := newMemTracker(p)
	b, _, _ := p.Alloc(4096)
	base, _ := tensor.FromBytes(tensor.Float32, tensor.Shape{1024}, b)
	view, _ := tensor.FromBytes(tensor.Float32, tensor.Shape{512}, b[2048:])
	feed, _ := tensor.New(tensor.Float32, tensor.Shape{1024})
	m.produced(base, nil)
	m.produced(view, []*tensor.Tensor{base})
	m.produced(feed, nil) // not pooled: tracked for the peak only
	m.released(base)
	if ps := p.snapshot(); ps.Recycled != 0 {
		t.Fatalf("buffer recycled while a view of it lives: %+v", ps)
	}
	if c, _, _ := p.Alloc(4096); unsafe.SliceData(c) == unsafe.SliceData(b) {
		t.Fatal("live buffer handed out again")
	}
	m.released(view)
	if ps := p.snapshot(); ps.Recycled != 1 {
		t.Fatalf("buffer not recycled after its last view: %+v", ps)
	}
	m.released(feed)
	if m.live != 0 || len(m.bufs) != 0 {
		t.Fatalf("tracker not empty: live %d, %d buffers", m.live, len(m.bufs))
	}
}

// TestPoolGrowingTensor: a tensor one token larger every run (a present in
// a decode loop) moves up a size class every few runs; the pool sizes the
// buffer of a growing request poolReach classes ahead and lets requests
// take free buffers up to poolReach classes above theirs, so it allocates
// about once per poolReach+1 classes instead of once per class, and never
// hands out a buffer more than about a third larger than asked.
func TestPoolGrowingTensor(t *testing.T) {
	for c := 0; c < 60; c++ {
		if _, size := sizeClass(classSize(c)); size != classSize(c) {
			t.Fatalf("classSize(%d) = %d is not the capacity of its own class", c, classSize(c))
		}
		if got, _ := sizeClass(classSize(c)); got != c {
			t.Fatalf("classSize(%d) = %d lies in class %d", c, classSize(c), got)
		}
	}
	p := newBufferPool()
	const lo, hi, step = 4096, 16384, 64
	for n := lo; n <= hi; n += step {
		p.beginRun()
		b, _, _ := p.Alloc(n)
		if len(b) != n {
			t.Fatalf("Alloc(%d) returned %d bytes", n, len(b))
		}
		pb := p.lookup(&b[0])
		if pb == nil {
			t.Fatalf("Alloc(%d): buffer not issued", n)
		}
		if c := len(pb.data); c < n || float64(c) > 1.45*float64(n) {
			t.Fatalf("Alloc(%d) used a buffer of %d bytes", n, c)
		}
		p.put(pb)
	}
	classes := 0
	for c, _ := sizeClass(lo); c <= func() int { c, _ := sizeClass(hi); return c }(); c++ {
		classes++
	}
	st := p.snapshot()
	t.Logf("%d runs over %d classes: %d buffers allocated, %d reused", (hi-lo)/step+1, classes, st.Allocated, st.Reused)
	if st.Allocated > int64(classes/(poolReach+1)+2) {
		t.Errorf("%d allocations for a tensor growing over %d classes", st.Allocated, classes)
	}
}

// TestPoolIdleSweep: beginRun drops exactly the free buffers idle for more
// than poolMaxIdleRuns runs (the naive filter over every buffer) while a
// random sequence of allocations and puts in several size classes runs
// over many runs, and keeps the rest in their stack order.
func TestPoolIdleSweep(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	p := newBufferPool()
	var held []*poolBuf
	for run := range 40 {
		// the naive expectation of the sweep beginRun is about to make
		want := make([][]*poolBuf, len(p.free))
		for c, list := range p.free {
			for _, b := range list {
				if p.run+1-b.idle <= poolMaxIdleRuns {
					want[c] = append(want[c], b)
				}
			}
		}
		p.beginRun()
		for c := range want {
			if !slices.Equal(p.free[c], want[c]) {
				t.Fatalf("run %d, class %d: free list %d buffers, want %d (kept in order)", run, c, len(p.free[c]), len(want[c]))
			}
		}
		for range rng.IntN(12) {
			switch {
			case len(held) > 0 && rng.IntN(2) == 0:
				k := rng.IntN(len(held))
				p.put(held[k])
				held = slices.Delete(held, k, k+1)
			case run%7 < 4: // some runs allocate nothing: buffers go idle
				b, _, _ := p.Alloc(64 << rng.IntN(4))
				held = append(held, p.lookup(&b[0]))
			}
		}
	}
}
