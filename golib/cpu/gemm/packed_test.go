package gemm

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/codec"
)

// TestSgemmPacked checks the packed path against the naive loop over odd
// sizes, both layouts of B and A, every kernel variant and 1-3 threads.
func TestSgemmPacked(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(11, 12))
		for _, k := range []int{1, 3, 17, 129, 1376} {
			for _, n := range []int{1, 3, 17, 33, 129, 1376} {
				for m := 1; m <= PackedRows; m++ {
					for _, tr := range [][2]bool{{false, false}, {false, true}, {true, false}} {
						transA, transB := tr[0], tr[1]
						for _, threads := range []int{1, 3} {
							name := fmt.Sprintf("m%d_n%d_k%d_tA%v_tB%v_t%d", m, n, k, transA, transB, threads)
							lda, ldb := k+1, n+2
							if transA {
								lda = m + 1
							}
							if transB {
								ldb = k + 3
							}
							ar, br := m, k
							if transA {
								ar = k
							}
							if transB {
								br = n
							}
							a := randSlice(r, ar*lda)
							b := randSlice(r, br*ldb)
							ldc := n + 1
							c := randSlice(r, m*ldc)
							want := append([]float32(nil), c...)
							// alpha 1 on one thread: one row then adds the full
							// slivers straight into C (panelRow).
							alpha, beta := float32(1), float32(0.5)
							if threads == 3 {
								alpha, beta = 0.75, 0
							}
							naive(transA, transB, m, n, k, alpha, a, lda, b, ldb, beta, want, ldc)
							pb, err := PackB(transB, k, n, b, ldb)
							if err != nil {
								t.Fatal(name, err)
							}
							if err := SgemmPacked(threads, transA, m, alpha, a, lda, pb, beta, c, ldc); err != nil {
								t.Fatal(name, err)
							}
							for i := range m {
								for j := range n {
									g, w := c[i*ldc+j], want[i*ldc+j]
									if d := g - w; d > 1e-3*float32(k) || -d > 1e-3*float32(k) {
										t.Fatalf("%s: c[%d][%d] = %v, want %v", name, i, j, g, w)
									}
								}
							}
						}
					}
				}
			}
		}
	})
}

// TestSgemmPackedBlocked checks SgemmPacked beyond PackedRows rows (the
// blocked algorithm reading the packed blocks) against the naive loop, with
// sizes that cross the row, column and inner-dimension blocks and leave edge
// tiles, on every path (the portable kernel's narrower slivers are cut
// from the packed blocks: repackSlivers), with two threads splitting the
// column blocks.
func TestSgemmPackedBlocked(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(9, 10))
		for _, sz := range [][3]int{{5, 33, 17}, {64, 40, 300}, {125, 530, 257}, {7, 1, 1}, {9, 1100, 520}} {
			for _, transA := range []bool{false, true} {
				m, n, k := sz[0], sz[1], sz[2]
				lda, ar := k+1, m
				if transA {
					lda, ar = m+2, k
				}
				a := randSlice(r, ar*lda)
				b := randSlice(r, k*n)
				c := randSlice(r, m*n)
				want := append([]float32(nil), c...)
				naive(transA, false, m, n, k, 0.5, a, lda, b, n, 0.25, want, n)
				pb, err := PackB(false, k, n, b, n)
				if err != nil {
					t.Fatal(err)
				}
				err = SgemmPacked(2, transA, m, 0.5, a, lda, pb, 0.25, c, n)
				if err != nil {
					t.Fatal(err)
				}
				for i := range want {
					if d := c[i] - want[i]; d > 1e-3*float32(k) || -d > 1e-3*float32(k) {
						t.Fatalf("m%d n%d k%d transA %v: C[%d] = %v, want %v", m, n, k, transA, i, c[i], want[i])
					}
				}
			}
		}
	})
}

// BenchmarkDecodeStepPacked is BenchmarkDecodeStep (B as stored) with the
// weights packed once beforehand, on every path (the paths of a case back
// to back).
func BenchmarkDecodeStepPacked(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	var ws []*PackedB
	total := 0
	for _, s := range decodeStep {
		pb, err := PackB(false, s[0], s[1], randSlice(r, s[0]*s[1]), s[1])
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, pb)
		total += 4 * s[0] * s[1]
	}
	a := randSlice(r, 4*2816)
	c := make([]float32, 4*32000)
	defer SetPath(Path())
	for _, m := range []int{1, 3, 4} {
		for _, threads := range []int{1, 2} {
			for _, path := range Paths() {
				b.Run(fmt.Sprintf("m%d/threads%d/%s", m, threads, path), func(b *testing.B) {
					SetPath(path)
					b.SetBytes(int64(total))
					for b.Loop() {
						for i, s := range decodeStep {
							if err := SgemmPacked(threads, false, m, 1, a, s[0], ws[i], 0, c, s[1]); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
		}
	}
}

// TestSgemmPackedHalf checks PackBHalf products (both encodings, B as
// stored and transposed) against the naive loop on the widened values:
// decode-shaped rows (the per-sliver widening) and longer products (the
// blocked algorithm widening each packed k-block), with sizes that cross
// the sliver, column and inner-dimension blocks.
func TestSgemmPackedHalf(t *testing.T) {
	withPath(t, func(t *testing.T) {
		r := rand.New(rand.NewPCG(21, 22))
		sizes := [][3]int{{1, 33, 17}, {2, 1, 300}, {3, 530, 257}, {4, 64, 1}, {9, 1100, 520}, {70, 40, 300}}
		if testing.Short() || raceEnabled {
			sizes = [][3]int{{1, 33, 17}, {3, 40, 257}, {9, 40, 300}}
		}
		for _, kind := range []Half{Float16, BFloat16} {
			for _, sz := range sizes {
				for _, transB := range []bool{false, true} {
					m, n, k := sz[0], sz[1], sz[2]
					br, bc := k, n
					if transB {
						br, bc = n, k
					}
					ldb := bc + 3
					bh := make([]uint16, br*ldb)
					for i := range bh {
						bh[i] = codec.F32ToF16(float32(r.NormFloat64()))
						if kind == BFloat16 {
							bh[i] = codec.F32ToBF16(float32(r.NormFloat64()))
						}
					}
					bf := make([]float32, len(bh))
					cvt16Go(kind, bf, bh)
					a := randSlice(r, m*k)
					c := randSlice(r, m*n)
					want := append([]float32(nil), c...)
					naive(false, transB, m, n, k, 0.5, a, k, bf, ldb, 0.25, want, n)
					pb, err := PackBHalf(kind, transB, k, n, bh, ldb)
					if err != nil {
						t.Fatal(err)
					}
					if err := SgemmPacked(2, false, m, 0.5, a, k, pb, 0.25, c, n); err != nil {
						t.Fatal(err)
					}
					for i := range want {
						if d := c[i] - want[i]; d > 1e-4*float32(k) || -d > 1e-4*float32(k) {
							t.Fatalf("kind %d m%d n%d k%d transB %v: C[%d] = %v, want %v", kind, m, n, k, transB, i, c[i], want[i])
						}
					}
				}
			}
		}
		if _, err := PackBHalf(Half(7), false, 2, 2, make([]uint16, 4), 2); !errors.Is(err, ErrShape) {
			t.Fatalf("unknown encoding: err %v, want ErrShape", err)
		}
		if _, err := PackBHalf(Float16, false, 2, 2, make([]uint16, 3), 2); !errors.Is(err, ErrShape) {
			t.Fatalf("short B: err %v, want ErrShape", err)
		}
	})
}

// BenchmarkPrefillPacked is BenchmarkDecodeStepPacked for prompt-sized row
// counts (the blocked algorithm reading the packed blocks), reporting the
// weight bytes streamed per second and GFLOP/s, the paths back to back.
func BenchmarkPrefillPacked(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	var ws []*PackedB
	total, flops := 0, 0
	for _, s := range decodeStep {
		pb, err := PackB(false, s[0], s[1], randSlice(r, s[0]*s[1]), s[1])
		if err != nil {
			b.Fatal(err)
		}
		ws = append(ws, pb)
		total += 4 * s[0] * s[1]
		flops += 2 * s[0] * s[1]
	}
	const maxRows = 128
	a := randSlice(r, maxRows*2816)
	c := make([]float32, maxRows*32000)
	defer SetPath(Path())
	for _, m := range []int{5, 16, 128} {
		for _, threads := range []int{1, 2} {
			for _, path := range Paths()[1:] {
				b.Run(fmt.Sprintf("m%d/threads%d/%s", m, threads, path), func(b *testing.B) {
					SetPath(path)
					b.SetBytes(int64(total))
					for b.Loop() {
						for i, s := range decodeStep {
							if err := SgemmPacked(threads, false, m, 1, a, s[0], ws[i], 0, c, s[1]); err != nil {
								b.Fatal(err)
							}
						}
					}
					b.ReportMetric(float64(m)*float64(flops)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// smallStep is the MatMul shapes (k, n) of one decode step of a small
// Llama-style export (hidden 256, one KV head of 64, MLP 512, four layers,
// a tied 1024-word head): weights that fit in the L2/L3, where a call's
// fixed cost and the in-cache rate matter, not DRAM bandwidth.
var smallStep = func() [][2]int {
	var s [][2]int
	for range 4 {
		s = append(s, [2]int{256, 256}, [2]int{256, 64}, [2]int{256, 64}, [2]int{256, 256},
			[2]int{256, 512}, [2]int{256, 512}, [2]int{512, 256})
	}
	return append(s, [2]int{256, 1024})
}()

// BenchmarkSmallStepPacked runs the products of smallStep (one row, the
// weights packed) per path: the whole step as the export runs it, and each
// shape alone (its weights hot in L1/L2).
func BenchmarkSmallStepPacked(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	ws := make([]*PackedB, len(smallStep))
	total := 0
	for i, s := range smallStep {
		pb, err := PackB(false, s[0], s[1], randSlice(r, s[0]*s[1]), s[1])
		if err != nil {
			b.Fatal(err)
		}
		ws[i], total = pb, total+4*s[0]*s[1]
	}
	a := randSlice(r, 4*512)
	c := make([]float32, 4*1024)
	defer SetPath(Path())
	for _, path := range Paths()[1:] {
		b.Run("step/"+path, func(b *testing.B) {
			SetPath(path)
			b.SetBytes(int64(total))
			for b.Loop() {
				for i, s := range smallStep {
					if err := SgemmPacked(1, false, 1, 1, a, s[0], ws[i], 0, c, s[1]); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
		for _, i := range []int{0, 1, 4, 6, len(smallStep) - 1} {
			s := smallStep[i]
			b.Run(fmt.Sprintf("%dx%d/%s", s[0], s[1], path), func(b *testing.B) {
				SetPath(path)
				b.SetBytes(int64(4 * s[0] * s[1]))
				for b.Loop() {
					if err := SgemmPacked(1, false, 1, 1, a, s[0], ws[i], 0, c, s[1]); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkPackedHugePages times the decode step's products (decodeStep's
// weights, one and four rows, one and two threads) over packs advised for
// transparent huge pages against the same packs built without the advice
// (hugePacks off), alternating step by step in one process (the only
// comparison a shared machine allows): the median per-pair ratio
// plain/huge (above 1: the advice pays) and both sides' median weight
// GB/s. Run it with -benchtime=1x (one iteration is 16 pairs). The packs
// get huge pages only where the kernel has transparent huge pages
// ("always" or "madvise" in /sys/kernel/mm/transparent_hugepage/enabled).
func BenchmarkPackedHugePages(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	var sides [2][]*PackedB // plain, huge
	total := 0
	defer func(on bool) { hugePacks = on }(hugePacks)
	for _, s := range decodeStep {
		w := randSlice(r, s[0]*s[1])
		for i, on := range []bool{false, true} {
			hugePacks = on
			pb, err := PackB(false, s[0], s[1], w, s[1])
			if err != nil {
				b.Fatal(err)
			}
			sides[i] = append(sides[i], pb)
		}
		total += 4 * s[0] * s[1]
	}
	a := randSlice(r, 4*2816)
	c := make([]float32, 4*32000)
	for _, m := range []int{1, 4} {
		for _, threads := range []int{1, 2} {
			b.Run(fmt.Sprintf("m%d/threads%d", m, threads), func(b *testing.B) {
				step := func(ws []*PackedB) float64 {
					t0 := time.Now()
					for i, s := range decodeStep {
						if err := SgemmPacked(threads, false, m, 1, a, s[0], ws[i], 0, c, s[1]); err != nil {
							b.Fatal(err)
						}
					}
					return time.Since(t0).Seconds()
				}
				var ratio, plain, huge []float64
				for b.Loop() {
					for i := range 16 {
						var dt [2]float64
						for j := range 2 {
							side := (i + j) % 2 // the side that goes first alternates
							dt[side] = step(sides[side])
						}
						ratio = append(ratio, dt[0]/dt[1])
						plain = append(plain, float64(total)/dt[0]/1e9)
						huge = append(huge, float64(total)/dt[1]/1e9)
					}
				}
				b.ReportMetric(median(ratio), "plain/huge")
				b.ReportMetric(median(plain), "plainGB/s")
				b.ReportMetric(median(huge), "hugeGB/s")
			})
		}
	}
}

// median returns the median of x (the upper one of an even count).
func median(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}
