package cpu

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// chunkedView is a testView that asks to be read chunk positions at a
// time (ChunkedView) and records the longest request it got.
type chunkedView struct {
	*testView
	chunk   int
	mu      sync.Mutex
	longest int
}

func (c *chunkedView) SegmentChunk() int { return c.chunk }

func (c *chunkedView) AppendSegments(dst []cache.Segment, b, h, from, to int) []cache.Segment {
	c.mu.Lock()
	c.longest = max(c.longest, to-from)
	c.mu.Unlock()
	return c.testView.AppendSegments(dst, b, h, from, to)
}

// TestChunkedView: a ChunkedView is asked for at most its chunk (rounded to
// whole K/V blocks) positions per request, and the result is exactly the
// one over the same rows read at once, on one thread and split over two.
func TestChunkedView(t *testing.T) {
	defer SetThreads(Threads())
	c := attnCase{name: "chunks", elem: cache.Float32, qHeads: 8, kvh: 1, dk: 64, dv: 64, lens: []int{3000}, qLen: 2}
	tv, q, rows := c.setup(21)
	bt := blockTokens(c.dk, c.dv)
	for _, th := range []int{1, 2} {
		SetThreads(th)
		want := make([]float32, rows*c.dv)
		if err := Attention(want, q, c.qLen, c.qHeads, tv, c.opts); err != nil {
			t.Fatal(err)
		}
		for _, chunk := range []int{0, 1, bt, 3*bt + 5} {
			cv := &chunkedView{testView: tv, chunk: chunk}
			got := make([]float32, rows*c.dv)
			if err := Attention(got, q, c.qLen, c.qHeads, cv, c.opts); err != nil {
				t.Fatal(err)
			}
			limit := max(chunk/bt, 1) * bt
			if chunk <= 0 {
				limit = c.lens[0]
			}
			if cv.longest > limit {
				t.Errorf("threads %d chunk %d: a request of %d positions, want <= %d", th, chunk, cv.longest, limit)
			}
			for i := range want {
				if got[i] != want[i] {
					t.Fatalf("threads %d chunk %d: out[%d] = %v, want %v", th, chunk, i, got[i], want[i])
				}
			}
		}
	}
}

// TestExactHook: Options.Exact is called exactly for the rows whose float32
// computation meets a non-finite value (a NaN in their query row, or in a
// K row every row sees), with the row's coordinates, and what it writes is
// the row's output; finite inputs never call it. One thread and split-KV
// over two (the merge's recomputation) both go through it, and so do
// AttentionPrefill's tiles (rows numbered among all query tokens).
func TestExactHook(t *testing.T) {
	defer SetThreads(Threads())
	for _, qLen := range []int{3, 2*MaxQLen + 3} {
		// Three sequences of one KV head: two threads split every unit.
		c := attnCase{name: "hook", elem: cache.Float32, qHeads: 4, kvh: 1, dk: 32, dv: 16, lens: []int{900, 700, 500}, qLen: qLen}
		testExactHook(t, c)
	}
}

func testExactHook(t *testing.T, c attnCase) {
	for _, th := range []int{1, 2} {
		for _, poison := range []string{"none", "q", "k"} {
			SetThreads(th)
			tv, q, rows := c.setup(31)
			wantRow := map[[3]int]bool{}
			switch poison {
			case "q": // sequence 1, query head 3, the last position
				q[((1*c.qHeads+3)*c.qLen+c.qLen-1)*c.dk+5] = float32(math.NaN())
				wantRow[[3]int{1, 3, c.qLen - 1}] = true
			case "k": // sequence 0, position 10: every head, every position
				copy(tv.k[0][0][(10*c.dk+3)*4:], []byte{0xff, 0xff, 0xff, 0xff}) // a NaN
				for h := range c.qHeads {
					for i := range c.qLen {
						wantRow[[3]int{0, h, i}] = true
					}
				}
			}
			var mu sync.Mutex
			called := map[[3]int]int{}
			o := c.opts
			o.Exact = func(out []float32, b, h, i int) error {
				mu.Lock()
				called[[3]int{b, h, i}]++
				mu.Unlock()
				for j := range out {
					out[j] = float32(1000*b + 100*h + 10*i)
				}
				return nil
			}
			got := make([]float32, rows*c.dv)
			if err := AttentionPrefill(got, q, c.qLen, c.qHeads, tv, o); err != nil {
				t.Fatal(err)
			}
			name := fmt.Sprintf("q_len %d threads %d poison %s", c.qLen, th, poison)
			if len(called) != len(wantRow) {
				t.Errorf("%s: hook called for %v, want %v", name, called, wantRow)
			}
			for k, n := range called {
				if !wantRow[k] || n != 1 {
					t.Errorf("%s: hook called %d times for row %v", name, n, k)
				}
			}
			for b := range len(c.lens) {
				for h := range c.qHeads {
					for i := range c.qLen {
						row := got[((b*c.qHeads+h)*c.qLen+i)*c.dv:][:c.dv]
						if wantRow[[3]int{b, h, i}] {
							if row[0] != float32(1000*b+100*h+10*i) || row[c.dv-1] != row[0] {
								t.Errorf("%s: row %d/%d/%d = %v, not the hook's", name, b, h, i, row[0])
							}
						} else if row[0] != row[0] {
							t.Errorf("%s: row %d/%d/%d is NaN without the hook", name, b, h, i)
						}
					}
				}
			}
		}
	}
}

// TestMaskArgs: a mask needs Exact and exactly one kind of data, its
// strides and length must be >= 0 and its rows inside the data; the
// reference takes none. Every error wraps cache.ErrInvalidArgument.
func TestMaskArgs(t *testing.T) {
	c := attnCase{name: "mask", elem: cache.Float32, qHeads: 4, kvh: 2, dk: 16, dv: 16, lens: []int{40, 30}, qLen: 2}
	tv, q, rows := c.setup(41)
	dst := make([]float32, rows*c.dv)
	exact := func([]float32, int, int, int) error { return nil }
	ok := Mask{Float: make([]float32, 2*4*2*40), StrideB: 4 * 2 * 40, StrideH: 2 * 40, StrideI: 40, Len: 40}
	if err := Attention(dst, q, c.qLen, c.qHeads, tv, Options{Mask: &ok, Exact: exact}); err != nil {
		t.Fatalf("valid mask: %v", err)
	}
	for _, bad := range []struct {
		name  string
		m     Mask
		exact bool
	}{
		{"no exact", ok, false},
		{"both kinds", Mask{Float: ok.Float, Bool: make([]bool, len(ok.Float)), Len: 1}, true},
		{"no data", Mask{Len: 0}, true},
		{"negative stride", Mask{Float: ok.Float, StrideB: -1, Len: 1}, true},
		{"rows past the data", Mask{Float: ok.Float, StrideB: ok.StrideB, StrideH: ok.StrideH, StrideI: ok.StrideI, Len: 41}, true},
	} {
		o := Options{Mask: &bad.m}
		if bad.exact {
			o.Exact = exact
		}
		if err := Attention(dst, q, c.qLen, c.qHeads, tv, o); !errors.Is(err, cache.ErrInvalidArgument) {
			t.Errorf("%s: error %v, want ErrInvalidArgument", bad.name, err)
		}
	}
	if err := ReferenceAttention(dst, q, c.qLen, c.qHeads, tv, Options{Mask: &ok, Exact: exact}); !errors.Is(err, cache.ErrInvalidArgument) {
		t.Errorf("reference with a mask: error %v, want ErrInvalidArgument", err)
	}
}

// TestNonCausal: with Options.NonCausal every query row attends every
// stored position, so row (b, h, i) of a call equals the reference's
// one-token call with that row, for one call and for AttentionPrefill's
// tiles, on one thread and split over two; a window is refused with it.
func TestNonCausal(t *testing.T) {
	defer SetThreads(Threads())
	for _, qLen := range []int{1, 5, 2*MaxQLen + 7} {
		c := attnCase{name: "noncausal", elem: cache.Float16, qHeads: 4, kvh: 2, dk: 32, dv: 32, lens: []int{300, 90}, qLen: qLen}
		tv, q, rows := c.setup(51)
		for _, th := range []int{1, 2} {
			SetThreads(th)
			got := make([]float32, rows*c.dv)
			if err := AttentionPrefill(got, q, qLen, c.qHeads, tv, Options{NonCausal: true}); err != nil {
				t.Fatal(err)
			}
			q1, want := make([]float32, len(c.lens)*c.qHeads*c.dk), make([]float32, len(c.lens)*c.qHeads*c.dv)
			for i := range qLen {
				for bh := range len(c.lens) * c.qHeads {
					copy(q1[bh*c.dk:(bh+1)*c.dk], q[(bh*qLen+i)*c.dk:])
				}
				if err := ReferenceAttention(want, q1, 1, c.qHeads, tv, Options{}); err != nil {
					t.Fatal(err)
				}
				for bh := range len(c.lens) * c.qHeads {
					for d := range c.dv {
						g, w := got[(bh*qLen+i)*c.dv+d], want[bh*c.dv+d]
						if math.Abs(float64(g-w)) > 1e-4+1e-3*math.Abs(float64(w)) {
							t.Fatalf("q_len %d threads %d: row %d/%d [%d] = %v, reference %v", qLen, th, bh, i, d, g, w)
						}
					}
				}
			}
		}
		if err := Attention(make([]float32, rows*c.dv)[:0], q[:0], 1, c.qHeads, tv, Options{NonCausal: true, Window: 4}); !errors.Is(err, cache.ErrInvalidArgument) {
			t.Errorf("window with NonCausal: error %v", err)
		}
	}
}
