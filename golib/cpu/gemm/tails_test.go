package gemm

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// TestPanelRows checks that the A panels of a block cover its rows once,
// in order, none taller than mr, and that a one-row tail is split where
// the kernels have short tiles.
func TestPanelRows(t *testing.T) {
	for _, ks := range registry {
		for mc := 1; mc <= mcBlock; mc++ {
			next := 0
			for q := range panelCount(ks, mc) {
				ir, rows := panelRows(ks, mc, q)
				if ir != next || rows < 1 || rows > ks.mr {
					t.Fatalf("%s mc=%d: panel %d is rows %d+%d after row %d", ks.name, mc, q, ir, rows, next)
				}
				if (q+1)*ks.mr > mcBlock {
					t.Fatalf("%s mc=%d: panel %d is packed past the A buffer", ks.name, mc, q)
				}
				if rows == 1 && mc > ks.mr && ks.microRows != nil && ks.mr > 2 {
					t.Fatalf("%s mc=%d: one-row panel %d", ks.name, mc, q)
				}
				next = ir + rows
			}
			if next != mc {
				t.Fatalf("%s mc=%d: panels end at row %d", ks.name, mc, next)
			}
		}
	}
}

// TestSgemmPanelTails runs the blocked products whose row counts end in
// every panel tail (M 5-17 and 100-130), inner sizes with an odd last
// step and a k-block boundary, and column counts that are not multiples
// of the sliver, with B as stored, packed, and packed float16/bfloat16,
// on one and two threads (column blocks cut into parts of slivers) and
// both micro-call orders, against naive; the
// last row of A holds an Inf and one column of B a NaN, which must reach
// exactly the entries naive puts them in.
func TestSgemmPanelTails(t *testing.T) {
	withPath(t, func(t *testing.T) {
		ks := active()
		defer func(v bool) { ks.sliverMajor = v }(ks.sliverMajor)
		r := rand.New(rand.NewPCG(21, 22))
		ms := []int{5, 7, 10, 13, 16, 17, 100, 101, 103, 112, 118, 121, 127, 128, 130}
		if raceEnabled || testing.Short() {
			ms = []int{7, 16, 100, 130}
		}
		for _, m := range ms {
			for _, kn := range [][2]int{{3, 70}, {257, 33}, {40, 1100}} {
				k, n := kn[0], kn[1]
				if n > 1000 && m > 17 && m != 130 {
					continue // three column blocks, the last 76 wide: a few row counts
				}
				a, b := randSlice(r, m*k), randSlice(r, k*n)
				a[(m-1)*k+k/2] = float32(math.Inf(1))
				b[(k-1)*n+n-2] = float32(math.NaN())
				for _, half := range []Half{0, Float16, BFloat16} {
					bh := make([]uint16, k*n)
					bq := append([]float32(nil), b...)
					for i, v := range b {
						switch half {
						case Float16:
							bh[i] = codec.F32ToF16(v)
							bq[i] = codec.F16ToF32(bh[i])
						case BFloat16:
							bh[i] = codec.F32ToBF16(v)
							bq[i] = codec.BF16ToF32(bh[i])
						}
					}
					want := make([]float32, m*n)
					naive(false, false, m, n, k, 0.5, a, k, bq, n, 0, want, n)
					var pb *PackedB
					var err error
					if half == 0 {
						pb, err = PackB(false, k, n, bq, n)
					} else {
						pb, err = PackBHalf(half, false, k, n, bh, n)
					}
					if err != nil {
						t.Fatal(err)
					}
					for _, sm := range []bool{false, true} {
						ks.sliverMajor = sm
						for threads := 1; threads <= 2; threads++ {
							name := fmt.Sprintf("m=%d k=%d n=%d half=%d sliverMajor=%v threads=%d", m, k, n, half, sm, threads)
							c := randSlice(r, m*n)
							if err := SgemmPacked(threads, false, m, 0.5, a, k, pb, 0, c, n); err != nil {
								t.Fatal(err)
							}
							checkClose(t, name+" packed", c, want, k)
							if half != 0 {
								continue
							}
							c = randSlice(r, m*n)
							if err := SgemmThreads(threads, false, false, m, n, k, 0.5, a, k, bq, n, 0, c, n); err != nil {
								t.Fatal(err)
							}
							checkClose(t, name+" as stored", c, want, k)
						}
					}
				}
			}
		}
	})
}

// checkClose compares c with want within the float32 rounding of a
// k-term sum; NaN and infinite entries must match exactly.
func checkClose(t *testing.T, name string, c, want []float32, k int) {
	t.Helper()
	tol := 1e-5 * math.Sqrt(float64(k)+1) * 8
	for i, w := range want {
		g := float64(c[i])
		switch {
		case math.IsNaN(float64(w)) || math.IsInf(float64(w), 0):
			if !(math.IsNaN(g) && math.IsNaN(float64(w))) && g != float64(w) {
				t.Fatalf("%s: C[%d] = %v, want %v", name, i, c[i], w)
			}
		case math.Abs(g-float64(w)) > tol*(1+math.Abs(float64(w))):
			t.Fatalf("%s: C[%d] = %v, want %v", name, i, c[i], w)
		}
	}
}

// TestBlockedOneThreadAllocs checks that a one-thread blocked product
// (prefill rows by a packed and an unpacked B, a split tail included)
// makes no heap allocation once the pools are warm.
func TestBlockedOneThreadAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops items at random")
	}
	r := rand.New(rand.NewPCG(23, 24))
	for _, m := range []int{16, 17} {
		k, n := 300, 70
		a, b := randSlice(r, m*k), randSlice(r, k*n)
		c := make([]float32, m*n)
		pb, err := PackB(false, k, n, b, n)
		if err != nil {
			t.Fatal(err)
		}
		for name, run := range map[string]func(){
			"packed":    func() { _ = SgemmPacked(1, false, m, 1, a, k, pb, 0, c, n) },
			"as stored": func() { _ = SgemmThreads(1, false, false, m, n, k, 1, a, k, b, n, 0, c, n) },
		} {
			run()
			if allocs := testing.AllocsPerRun(16, run); allocs != 0 {
				t.Errorf("m=%d %s: %v allocations per product, want 0", m, name, allocs)
			}
		}
	}
}

// TestNextRows checks that the full A panels of a block prefetch the next
// sliver's rows in consecutive disjoint parts that cover every whole pair
// of its rows (all panels, or the first nextPanels), and other panels
// nothing.
func TestNextRows(t *testing.T) {
	ks := avx2Like()
	for _, np := range []int{0, 1, 3} {
		ks.nextPanels = np
		for _, mc := range []int{1, 2, 3, 4, 5, 7, 16, 17, 100, 120} {
			for _, kc := range []int{1, 2, 3, 7, 64, 255, 256} {
				end := 0
				for q := range panelCount(ks, mc) {
					s0, s1 := nextRows(ks, mc, q, kc)
					if _, rows := panelRows(ks, mc, q); rows < ks.mr && s1 > s0 {
						t.Fatalf("np=%d mc=%d kc=%d: panel %d of %d rows prefetches", np, mc, kc, q, rows)
					}
					if s1 <= s0 {
						continue
					}
					if s0 != end || s1 > kc {
						t.Fatalf("np=%d mc=%d kc=%d: panel %d prefetches %d:%d after %d", np, mc, kc, q, s0, s1, end)
					}
					end = s1
				}
				if mc/ks.mr-boolInt(splitTail(ks, mc)) > 0 && end < kc/2*2 {
					t.Fatalf("np=%d mc=%d kc=%d: prefetches end at %d", np, mc, kc, end)
				}
			}
		}
	}
}

// avx2Like is a kernels value with the AVX2 path's tile shape and edge
// kernels (so the split tail applies), runnable on any build.
func avx2Like() *kernels {
	ks := goKernels
	ks.mr, ks.nr, ks.sliverMajor = 3, 32, true
	ks.microRows = func(int, int, []float32, []float32, float32, []float32, int) {}
	return &ks
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
