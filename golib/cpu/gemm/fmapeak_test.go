//go:build goexperiment.simd && amd64

package gemm

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// fmaPeakIters is the iterations of one fmaPeakAVX2 call (2.3M flops).
const fmaPeakIters = 12000

// BenchmarkFMAPeak reports one core's AVX2 FMA throughput (twelve
// independent ymm FMAs in a loop, no memory operands): the ceiling the
// small-row products of BenchmarkSmallM are compared with.
func BenchmarkFMAPeak(b *testing.B) {
	for b.Loop() {
		fmaPeakAVX2(fmaPeakIters)
	}
	b.ReportMetric(192*fmaPeakIters*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
}

// BenchmarkSmallM times one-thread products of 4 and 16 rows of op(A) by
// a packed B of 512-4096 (the prefill of a short prompt, a few sequences'
// decode step) on each SIMD path, in GFLOP/s; set against BenchmarkFMAPeak
// (run in the same process: -bench 'FMAPeak|SmallM') for the fraction of
// the FMA peak.
func BenchmarkSmallM(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 10))
	a := randSlice(r, 16*4096)
	c := make([]float32, 16*4096)
	defer SetPath(Path())
	for _, s := range [][2]int{{1024, 1024}, {512, 2048}, {1024, 4096}, {4096, 1024}} {
		k, n := s[0], s[1]
		pb, err := PackB(false, k, n, randSlice(r, k*n), n)
		if err != nil {
			b.Fatal(err)
		}
		for _, m := range []int{4, 16} {
			for _, path := range Paths()[1:] {
				b.Run(fmt.Sprintf("m%d/k%d/n%d/%s", m, k, n, path), func(b *testing.B) {
					SetPath(path)
					for b.Loop() {
						if err := SgemmPacked(1, false, m, 1, a, k, pb, 0, c, n); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(2*float64(m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// BenchmarkBlockOrder times one-thread prefill-sized products (16, 17
// and 128 rows of op(A) by a packed B) on the AVX2 path with the blocked
// algorithm's micro calls panel by panel, sliver by sliver
// (kernels.sliverMajor) and sliver by sliver with the next sliver
// prefetched (kernels.microNext) by the first full A panel alone
// (nextPanels 1) or by all of them a part each, in GFLOP/s, with one B (in the caches)
// and with twelve 1024 x 1024 ones used in turn (48 MiB, beyond the L3:
// the weights of a prefill arrive from memory): the A/B of the loop order
// in one process.
func BenchmarkBlockOrder(b *testing.B) {
	r := rand.New(rand.NewPCG(9, 11))
	a := randSlice(r, 128*1024)
	c := make([]float32, 128*2048)
	defer SetPath(Path())
	if !SetPath("avx2") {
		b.Skip("no AVX2 path here")
	}
	ks := &avx2Kernels
	defer func(sm bool, mn func(int, []float32, []float32, float32, []float32, int, []float32), np int) {
		ks.sliverMajor, ks.microNext, ks.nextPanels = sm, mn, np
	}(ks.sliverMajor, ks.microNext, ks.nextPanels)
	next := ks.microNext
	for _, s := range [][4]int{{16, 1024, 1024, 1}, {16, 512, 2048, 1}, {17, 1024, 1024, 1}, {128, 1024, 1024, 1},
		{16, 1024, 1024, 12}, {128, 1024, 1024, 12}} {
		m, k, n, count := s[0], s[1], s[2], s[3]
		pbs := make([]*PackedB, count)
		for i := range pbs {
			var err error
			if pbs[i], err = PackB(false, k, n, randSlice(r, k*n), n); err != nil {
				b.Fatal(err)
			}
		}
		for _, order := range []string{"panel", "sliver", "sliver+prefetch1", "sliver+prefetch"} {
			b.Run(fmt.Sprintf("m%d/k%d/n%d/weights%d/%s", m, k, n, count, order), func(b *testing.B) {
				ks.sliverMajor, ks.microNext, ks.nextPanels = order != "panel", nil, 0
				switch order {
				case "sliver+prefetch1":
					ks.microNext, ks.nextPanels = next, 1
				case "sliver+prefetch":
					ks.microNext = next
				}
				for b.Loop() {
					for _, pb := range pbs {
						if err := SgemmPacked(1, false, m, 1, a, k, pb, 0, c, n); err != nil {
							b.Fatal(err)
						}
					}
				}
				b.ReportMetric(2*float64(count*m*n*k)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			})
		}
	}
}

// BenchmarkTileRows times the AVX2 micro kernel of each tile height (3,
// 2, 1 rows) over 16 packed slivers of kcBlock rows (512 KiB, in L2) with
// one A panel, as the blocked algorithm calls it, in GFLOP/s: set against
// BenchmarkFMAPeak, the micro kernel's fraction of the AVX2 FMA peak.
func BenchmarkTileRows(b *testing.B) {
	r := rand.New(rand.NewPCG(7, 8))
	ap := randSlice(r, 3*kcBlock)
	bp := randSlice(r, 16*packNR*kcBlock)
	c := make([]float32, 3*packNR)
	for _, rows := range []int{3, 2, 1} {
		b.Run(fmt.Sprintf("rows%d", rows), func(b *testing.B) {
			for b.Loop() {
				for s := range 16 {
					microRowsAVX2(rows, kcBlock, ap, bp[s*packNR*kcBlock:], 1, c, packNR)
				}
			}
			b.ReportMetric(2*16*float64(rows*packNR*kcBlock)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
