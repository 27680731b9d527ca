package gemm

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// Decode-shaped (one token through a projection or the LM head) and
// prefill-shaped products. Each reports GFLOP/s (2*m*n*k per op).
var benchShapes = []struct {
	name    string
	m, n, k int
	transB  bool
}{
	{"decode_1x1024x1024", 1, 1024, 1024, false},
	{"decode_1x32000x1024", 1, 32000, 1024, false},
	{"decode_1x1024x1024_tB", 1, 1024, 1024, true},
	{"decode_1x32000x1024_tB", 1, 32000, 1024, true},
	{"prefill_16x1024x1024_1thread", 16, 1024, 1024, false},
	{"prefill_16x32000x1024_1thread", 16, 32000, 1024, false},
	{"prefill_128x1024x1024", 128, 1024, 1024, false},
	{"prefill_256x1024x1024_1thread", 256, 1024, 1024, false},
	{"prefill_512x1024x1024", 512, 1024, 1024, false},
	{"prefill_512x4096x1024_tB", 512, 4096, 1024, true},
}

func BenchmarkSgemm(b *testing.B) {
	defer SetPath("auto")
	for _, path := range Paths() {
		for _, s := range benchShapes {
			b.Run(fmt.Sprintf("%s/%s", path, s.name), func(b *testing.B) {
				SetPath(path)
				if strings.HasSuffix(s.name, "_1thread") {
					SetThreads(1)
					defer SetThreads(0)
				}
				r := rand.New(rand.NewPCG(5, 6))
				a := randSlice(r, s.m*s.k)
				w := randSlice(r, s.k*s.n)
				c := make([]float32, s.m*s.n)
				ldb := s.n
				if s.transB {
					ldb = s.k
				}
				b.SetBytes(int64(4 * s.k * s.n)) // weight bytes streamed per op
				b.ResetTimer()
				for b.Loop() {
					if err := Sgemm(false, s.transB, s.m, s.n, s.k, 1, a, s.k, w, ldb, 0, c, s.n); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkMicro times each variant's register-tile kernel alone on packed
// panels that sit in L1 (kc = kcBlock): the compute ceiling of the blocked
// path on one thread.
func BenchmarkMicro(b *testing.B) {
	for _, ks := range registry {
		b.Run(ks.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(7, 8))
			ap := randSlice(r, ks.mr*kcBlock)
			bp := randSlice(r, ks.nr*kcBlock)
			c := make([]float32, ks.mr*ks.nr)
			for b.Loop() {
				ks.micro(kcBlock, ap, bp, 1, c, ks.nr)
			}
			b.ReportMetric(2*float64(ks.mr*ks.nr*kcBlock)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// BenchmarkSgemmHalfB: decode-shaped products with float16 weights (half
// the bytes of the float32 weights of BenchmarkSgemm).
func BenchmarkSgemmHalfB(b *testing.B) {
	for _, s := range benchShapes[:3] {
		b.Run(s.name, func(b *testing.B) {
			r := rand.New(rand.NewPCG(5, 6))
			a := randSlice(r, s.m*s.k)
			w := make([]uint16, s.k*s.n)
			for i := range w {
				w[i] = uint16(r.Uint32()&0x3fff) | 0x2000 // normal halves
			}
			c := make([]float32, s.m*s.n)
			ldb := s.n
			if s.transB {
				ldb = s.k
			}
			b.SetBytes(int64(2 * s.k * s.n))
			for b.Loop() {
				if err := SgemmHalfB(0, Float16, false, s.transB, s.m, s.n, s.k, 1, a, s.k, w, ldb, 0, c, s.n); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(2*float64(s.m)*float64(s.n)*float64(s.k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}

// decodeStep lists the weight shapes ([k, n], row-major) of one decode step
// of the benchmark decoder (4 layers of hidden 1024, 16/8 heads of 64,
// SiLU MLP of 2816, vocabulary 32000): about 320 MB, ten times the L3 of
// the machines we measure on, so every product streams its weights from
// DRAM as in a real decode step.
var decodeStep = func() [][2]int {
	var s [][2]int
	for range 4 {
		s = append(s, [2]int{1024, 1024}, [2]int{1024, 512}, [2]int{1024, 512}, [2]int{1024, 1024},
			[2]int{1024, 2816}, [2]int{1024, 2816}, [2]int{2816, 1024})
	}
	return append(s, [2]int{1024, 32000})
}()

// BenchmarkDecodeStep runs the products of one decode step (M = 1 and 4,
// B as stored and transposed) with cold weights on 1 and 2 threads, and
// reports the weight bytes streamed per second (MB/s).
func BenchmarkDecodeStep(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	var ws [][]float32
	total := 0
	for _, s := range decodeStep {
		ws = append(ws, randSlice(r, s[0]*s[1]))
		total += 4 * s[0] * s[1]
	}
	a := randSlice(r, 4*2816)
	c := make([]float32, 4*32000)
	for _, m := range []int{1, 4} {
		for _, transB := range []bool{false, true} {
			for _, threads := range []int{1, 2} {
				b.Run(fmt.Sprintf("m%d/transB=%v/threads%d", m, transB, threads), func(b *testing.B) {
					b.SetBytes(int64(total))
					for b.Loop() {
						for i, s := range decodeStep {
							k, n, ldb := s[0], s[1], s[1]
							if transB {
								ldb = k
							}
							if err := SgemmThreads(threads, false, transB, m, n, k, 1, a, k, ws[i], ldb, 0, c, n); err != nil {
								b.Fatal(err)
							}
						}
					}
				})
			}
		}
	}
}

// BenchmarkPanel times each variant's decode-step panel kernel alone on
// one packed sliver of kcBlock rows (32 KiB, in L1/L2): the ceiling of the
// packed decode path on one thread, in sliver bytes per second.
func BenchmarkPanel(b *testing.B) {
	for _, ks := range registry {
		for _, m := range []int{1, 2, 3, 4} {
			b.Run(fmt.Sprintf("%s/m%d", ks.name, m), func(b *testing.B) {
				r := rand.New(rand.NewPCG(7, 9))
				p := randSlice(r, kcBlock*packNR)
				var a [skinnyRows][]float32
				for i := range m {
					a[i] = randSlice(r, kcBlock)
				}
				var out [skinnyRows][packNR]float32
				b.SetBytes(int64(4 * len(p)))
				for b.Loop() {
					ks.panel(m, kcBlock, &a, p, &out)
				}
			})
		}
	}
}

// BenchmarkPanelHalf is BenchmarkPanel over a float16 sliver (16 KiB):
// the variant's panelHalf kernel, or the widening plus panel it replaces.
func BenchmarkPanelHalf(b *testing.B) {
	for _, ks := range registry {
		for _, m := range []int{1, 2, 3, 4} {
			b.Run(fmt.Sprintf("%s/m%d", ks.name, m), func(b *testing.B) {
				r := rand.New(rand.NewPCG(7, 9))
				ph := make([]uint16, kcBlock*packNR)
				for i := range ph {
					ph[i] = uint16(r.Uint32()&0x3fff) | 0x2000
				}
				var a [skinnyRows][]float32
				for i := range m {
					a[i] = randSlice(r, kcBlock)
				}
				var out [skinnyRows][packNR]float32
				wide := make([]float32, len(ph))
				b.SetBytes(int64(2 * len(ph)))
				for b.Loop() {
					if ks.panelHalf != nil {
						ks.panelHalf(Float16, m, kcBlock, &a, ph, &out)
						continue
					}
					ks.cvt16(Float16, wide, ph)
					ks.panel(m, kcBlock, &a, wide, &out)
				}
			})
		}
	}
}

// BenchmarkShortVectors times the vector kernels on 64 (and 67: a scalar
// tail) values per call, every path: their fixed cost per call, where a
// missing VZEROUPPER before scalar code shows (see ClearAVXUpperBits in
// simd_amd64.go: 136 ns a 64-value dot on a Zen 3 without it, 14 with).
func BenchmarkShortVectors(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 10))
	x, y := randSlice(r, 67), randSlice(r, 67)
	var sink float32
	defer SetPath(Path())
	for _, n := range []int{64, 67} {
		for _, path := range Paths() {
			SetPath(path)
			ks := active()
			b.Run(fmt.Sprintf("dot%d/%s", n, path), func(b *testing.B) {
				for b.Loop() {
					sink += ks.dot(x[:n], y[:n])
				}
			})
			b.Run(fmt.Sprintf("axpy%d/%s", n, path), func(b *testing.B) {
				for b.Loop() {
					ks.axpy(0.5, x[:n], y[:n])
				}
			})
		}
	}
	_ = sink
}
