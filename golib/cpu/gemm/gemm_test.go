package gemm

import (
	"errors"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// naive is the reference: a triple loop in float64.
func naive(transA, transB bool, m, n, k int, alpha float32, a []float32, lda int,
	b []float32, ldb int, beta float32, c []float32, ldc int) {
	for i := range m {
		for j := range n {
			var s float64
			for l := range k {
				var av, bv float32
				if transA {
					av = a[l*lda+i]
				} else {
					av = a[i*lda+l]
				}
				if transB {
					bv = b[j*ldb+l]
				} else {
					bv = b[l*ldb+j]
				}
				s += float64(av) * float64(bv)
			}
			old := float64(0)
			if beta != 0 {
				old = float64(beta) * float64(c[i*ldc+j])
			}
			c[i*ldc+j] = float32(float64(alpha)*s + old)
		}
	}
}

func randSlice(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// withPath runs f once for every available kernel variant.
func withPath(t *testing.T, f func(t *testing.T)) {
	t.Helper()
	defer SetPath("auto")
	for _, name := range Paths() {
		if !SetPath(name) {
			t.Fatalf("SetPath(%q) failed", name)
		}
		t.Run(name, f)
	}
}

func sizes(t *testing.T) []int {
	if testing.Short() || raceEnabled {
		return []int{1, 3, 17, 64}
	}
	return []int{1, 3, 5, 17, 64, 129}
}

func TestSgemmGrid(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(1, 2))
		sz := sizes(t)
		for _, m := range sz {
			for _, n := range sz {
				for _, k := range sz {
					for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}, {true, true}} {
						alpha, beta := float32(1), float32(0)
						if (m+n+k)%3 == 1 {
							alpha, beta = 0.5, -1.25
						}
						compare(t, r, tr[0], tr[1], m, n, k, alpha, beta, 3)
					}
				}
			}
		}
	})
}

// compare runs one product with padded leading dimensions against naive.
func compare(t *testing.T, r *rand.Rand, transA, transB bool, m, n, k int, alpha, beta float32, pad int) {
	t.Helper()
	ar, ac := m, k
	if transA {
		ar, ac = k, m
	}
	br, bc := k, n
	if transB {
		br, bc = n, k
	}
	lda, ldb, ldc := ac+pad, bc+pad, n+pad
	a, b := randSlice(r, ar*lda), randSlice(r, br*ldb)
	c := randSlice(r, m*ldc)
	want := append([]float32(nil), c...)
	naive(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc)
	if err := Sgemm(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc); err != nil {
		t.Fatalf("m=%d n=%d k=%d: %v", m, n, k, err)
	}
	tol := 1e-5 * math.Sqrt(float64(k)+1) * 8
	for i := range m {
		for j := range ldc {
			got, w := c[i*ldc+j], want[i*ldc+j]
			if j >= n { // padding must stay untouched
				if got != w {
					t.Fatalf("tA=%v tB=%v m=%d n=%d k=%d: padding C[%d][%d] changed", transA, transB, m, n, k, i, j)
				}
				continue
			}
			if math.Abs(float64(got-w)) > tol*(1+math.Abs(float64(w))) {
				t.Fatalf("tA=%v tB=%v m=%d n=%d k=%d alpha=%v beta=%v: C[%d][%d]=%v want %v",
					transA, transB, m, n, k, alpha, beta, i, j, got, w)
			}
		}
	}
}

// TestSgemmLarge crosses every blocking boundary (kc, mc, nc) once.
func TestSgemmLarge(t *testing.T) {
	if testing.Short() || raceEnabled {
		t.Skip("large products are slow under -race and -short")
	}
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(3, 4))
		for _, s := range [][3]int{{250, 530, 300}, {121, 1025, 257}, {5, 700, 513}} {
			compare(t, r, false, false, s[0], s[1], s[2], 1, 0, 1)
			compare(t, r, true, true, s[0], s[1], s[2], 0.5, 2, 0)
		}
	})
}

// TestSkinnySplitK forces the inner-dimension split of the streaming path
// (which Sgemm only picks for products big enough to share).
func TestSkinnySplitK(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(9, 9))
		// Odd sizes, chunks not multiples of 8 rows, a reduction wider than
		// one strip (n > reduceCols), more chunks than threads, and rows
		// wider than one column pass (n > skinnyChunk).
		for _, s := range [][3]int{{1, 37, 50}, {3, 20, 9}, {4, 33, 130}, {2, 5, 3}, {2, 4100, 70}, {3, 33, 1000}, {1, 17, 257},
			{2, skinnyChunk + 37, 9}, {1, skinnyChunk + 5, 70}} {
			m, n, k := s[0], s[1], s[2]
			for _, transA := range []bool{false, true} {
				lda := k
				if transA {
					lda = m
				}
				a, b := randSlice(r, m*k), randSlice(r, k*n)
				c := randSlice(r, m*n)
				want := append([]float32(nil), c...)
				naive(transA, false, m, n, k, 0.5, a, lda, b, n, 1, want, n)
				p := product{transA: transA, m: m, n: n, k: k, alpha: 0.5, a: a, lda: lda, b: b, ldb: n,
					c: c, ldc: n, ks: active(), threads: 3}
				p.skinny()
				for i := range want {
					if math.Abs(float64(c[i]-want[i])) > 1e-4*(1+math.Abs(float64(want[i]))) {
						t.Fatalf("m=%d n=%d k=%d transA=%v: C[%d]=%v want %v", m, n, k, transA, i, c[i], want[i])
					}
				}
			}
		}
	})
}

// TestSkinnyTransB covers the transposed-B streaming path for every row
// count it serves, odd inner sizes and 16-bit B.
func TestSkinnyTransB(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		for m := 1; m <= skinnyRows; m++ {
			for _, k := range []int{1, 15, 16, 33, 130} {
				compare(t, r, false, true, m, 70, k, 0.5, 1, 2)
				compare(t, r, true, true, m, 37, k, 1, 0, 0)
			}
		}
	})
}

func TestSgemmBetaZeroIgnoresNaN(t *testing.T) {
	withPath(t, func(t *testing.T) {
		for _, m := range []int{1, 9} {
			a := []float32{1, 2}
			a = append(a, make([]float32, 2*m-2)...)
			b := []float32{3, 4}
			c := make([]float32, m)
			for i := range c {
				c[i] = float32(math.NaN())
			}
			if err := Sgemm(false, false, m, 1, 2, 1, a, 2, b, 1, 0, c, 1); err != nil {
				t.Fatal(err)
			}
			if c[0] != 11 {
				t.Fatalf("m=%d: c[0]=%v want 11", m, c[0])
			}
		}
	})
}

func TestSgemmErrors(t *testing.T) {
	buf := make([]float32, 16)
	cases := []struct {
		name    string
		m, n, k int
		lda     int
		a, c    []float32
	}{
		{"negative", -1, 2, 2, 2, buf, buf},
		{"lda too small", 2, 2, 3, 2, buf, buf},
		{"A too short", 4, 2, 4, 4, buf[:15], buf},
		{"C too short", 2, 4, 2, 2, buf, buf[:7]},
		{"overflow", 1 << 40, 2, 2, 1 << 40, buf, buf},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Sgemm(false, false, tc.m, tc.n, tc.k, 1, tc.a, tc.lda, buf, max(tc.n, 1), 0, tc.c, max(tc.n, 1))
			if !errors.Is(err, ErrShape) {
				t.Fatalf("got %v, want ErrShape", err)
			}
		})
	}
	// Empty products are valid and leave C alone apart from beta.
	c := []float32{2}
	if err := Sgemm(false, false, 1, 1, 0, 1, nil, 1, nil, 1, 3, c, 1); err != nil || c[0] != 6 {
		t.Fatalf("k=0: err=%v c=%v", err, c)
	}
	if err := Sgemm(false, false, 0, 0, 5, 1, nil, 5, nil, 1, 3, nil, 1); err != nil {
		t.Fatalf("m=n=0: %v", err)
	}
}

func TestForCoversEveryIndexOnce(t *testing.T) {
	for _, n := range []int{0, 1, 2, 7, 100} {
		hits := make([]int32, n)
		For(n, func(i int) {
			// nested calls must not deadlock
			For(3, func(int) {})
			hits[i]++
		})
		for i, h := range hits {
			if h != 1 {
				t.Fatalf("n=%d: index %d ran %d times", n, i, h)
			}
		}
	}
}

func TestForConcurrentCallers(t *testing.T) {
	var wg sync.WaitGroup
	var total atomic.Int64
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				For(13, func(int) {
					For(2, func(int) { total.Add(1) })
				})
			}
		}()
	}
	wg.Wait()
	if got := total.Load(); got != 8*50*13*2 {
		t.Fatalf("ran %d bodies, want %d", got, 8*50*13*2)
	}
}

func TestChoose(t *testing.T) {
	for _, name := range []string{"", "auto", "nonsense"} {
		if got := choose(name); got != registry[len(registry)-1] {
			t.Errorf("choose(%q) = %s", name, got.name)
		}
	}
	if got := choose("GO"); got.name != "go" {
		t.Errorf("choose(GO) = %s", got.name)
	}
	if Path() == "" {
		t.Error("empty Path()")
	}
}

// TestSkinnyOneThreadAllocs checks that a one-thread short product (the
// decode step's attention and projection shapes) makes no heap allocation
// once the product pool is warm, and still computes the product.
func TestSkinnyOneThreadAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items at random")
	}
	cases := []struct{ m, n, k int }{{1, 64, 48}, {3, 40, 33}, {4, 256, 64}}
	for _, c := range cases {
		a, b := make([]float32, c.m*c.k), make([]float32, c.k*c.n)
		for i := range a {
			a[i] = float32(i%7) - 3
		}
		for i := range b {
			b[i] = float32(i%5) - 2
		}
		got, want := make([]float32, c.m*c.n), make([]float32, c.m*c.n)
		naive(false, false, c.m, c.n, c.k, 1, a, c.k, b, c.n, 0, want, c.n)
		run := func() {
			if err := SgemmThreads(1, false, false, c.m, c.n, c.k, 1, a, c.k, b, c.n, 0, got, c.n); err != nil {
				t.Fatal(err)
			}
		}
		run()
		if allocs := testing.AllocsPerRun(32, run); allocs != 0 {
			t.Errorf("%dx%dx%d: %v allocations per product, want 0", c.m, c.n, c.k, allocs)
		}
		for i := range want {
			if d := got[i] - want[i]; d > 1e-4 || d < -1e-4 {
				t.Fatalf("%dx%dx%d: c[%d] = %v, want %v", c.m, c.n, c.k, i, got[i], want[i])
			}
		}
	}
}

// TestSgemmSmallRows checks every row count of 1-17 (every edge panel of
// the 3-row and 8-row tiles, the packed decode path up to four rows)
// against naive, with B as stored, packed (PackB) and packed as float16
// (PackBHalf), for column counts that are not multiples of a sliver and
// inner sizes that cross a k-block.
func TestSgemmSmallRows(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(17, 18))
		for m := 1; m <= 17; m++ {
			for _, nk := range [][2]int{{33, 7}, {70, 300}} {
				n, k := nk[0], nk[1]
				compare(t, r, false, false, m, n, k, 1, 0, 2)
				a, b := randSlice(r, m*k), randSlice(r, k*n)
				bh := make([]uint16, k*n)
				for i := range b {
					bh[i] = codec.F32ToF16(b[i])
					b[i] = codec.F16ToF32(bh[i])
				}
				want := make([]float32, m*n)
				naive(false, false, m, n, k, 0.5, a, k, b, n, 0, want, n)
				pb, err := PackB(false, k, n, b, n)
				if err != nil {
					t.Fatal(err)
				}
				ph, err := PackBHalf(Float16, false, k, n, bh, n)
				if err != nil {
					t.Fatal(err)
				}
				for _, p := range []*PackedB{pb, ph} {
					c := randSlice(r, m*n)
					if err := SgemmPacked(1, false, m, 0.5, a, k, p, 0, c, n); err != nil {
						t.Fatal(err)
					}
					tol := 1e-5 * math.Sqrt(float64(k)+1) * 8
					for i := range want {
						if math.Abs(float64(c[i]-want[i])) > tol*(1+math.Abs(float64(want[i]))) {
							t.Fatalf("m=%d n=%d k=%d half=%v: C[%d] = %v, want %v", m, n, k, p.h != nil, i, c[i], want[i])
						}
					}
				}
			}
		}
		// One row, alpha 1, on two threads, with a partial last sliver: the
		// tasks of full slivers write C directly (packedRow), the last one
		// goes through the partial tile.
		n, k := 40*packNR+5, 1024
		a, b := randSlice(r, k), randSlice(r, k*n)
		want := make([]float32, n)
		naive(false, false, 1, n, k, 1, a, k, b, n, 0, want, n)
		pb, err := PackB(false, k, n, b, n)
		if err != nil {
			t.Fatal(err)
		}
		c := randSlice(r, n)
		if err := SgemmPacked(2, false, 1, 1, a, k, pb, 0, c, n); err != nil {
			t.Fatal(err)
		}
		for i := range want {
			if math.Abs(float64(c[i]-want[i])) > 1e-3*(1+math.Abs(float64(want[i]))) {
				t.Fatalf("one row, two threads: C[%d] = %v, want %v", i, c[i], want[i])
			}
		}
	})
}
