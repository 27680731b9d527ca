package cpu

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// tuneVariant is one changed setting of BenchmarkTunePaired: set applies
// it and returns the function that restores the base setting.
type tuneVariant struct {
	name string
	set  func() (undo func())
}

// simdTuneVariants are the CPU-tuning variants of the SIMD files (each flips
// one choice of the active tuning); they append theirs in init.
var simdTuneVariants []tuneVariant

// BenchmarkTunePaired compares, call by call in one process (the only
// comparison a shared machine allows), the decode step at the current
// settings against one changed setting: a prefetchTokens of 16, 32, 128 or 192
// rows, blocks of half or twice blockBytes, or one choice of the CPU
// tuning flipped (simdTuneVariants, e.g. tune-bf16Shuf). The decode-path
// grid (forDecodePathCases, head dims 64 and 128), 1 and 2 threads, each SIMD
// path. The side that goes first alternates from pair to pair: on the
// Granite Rapids-class Xeon the second of two identical calls measured
// 1-7% faster (part of its K/V still in the L3 the first filled). It
// reports the median per-pair time ratio base/variant (above 1: the
// variant is faster) and both sides' median K+V GB/s. Select cases with
// -test.bench, e.g. 'TunePaired/h32-8/d128/bfloat16/L16384/avx2/t1/tune-'.
func BenchmarkTunePaired(b *testing.B) {
	_, paths := KernelPaths()
	defer SetThreads(Threads())
	defer SetKernel("auto")
	defer func(pf, bb int) { prefetchTokens, blockBytes = pf, bb }(prefetchTokens, blockBytes)
	pf0, bb0 := prefetchTokens, blockBytes
	setting := func(pf, bb int) func() (undo func()) {
		return func() func() {
			prefetchTokens, blockBytes = pf, bb
			return func() { prefetchTokens, blockBytes = pf0, bb0 }
		}
	}
	variants := []tuneVariant{
		{"pf16", setting(16, bb0)}, {"pf32", setting(32, bb0)}, {"pf128", setting(128, bb0)}, {"pf192", setting(192, bb0)},
		{"blk/2", setting(pf0, bb0/2)}, {"blk*2", setting(pf0, bb0*2)},
	}
	variants = append(variants, simdTuneVariants...)
	forDecodePathCases(b, []int{64, 128}, func(cs *decodePathCase) {
		for _, path := range paths {
			if path == "go" {
				continue
			}
			for _, th := range []int{1, 2} {
				for _, vr := range variants {
					b.Run(fmt.Sprintf("%s/%s/t%d/%s", cs.name, path, th, vr.name), func(b *testing.B) {
						v := cs.read(b, th, path)
						var base, alt []float64
						it := 0
						for b.Loop() {
							it++
							for j := 0; j < 2; j++ {
								i := (j + it) % 2 // the side that goes first alternates
								undo := func() {}
								if i == 1 {
									undo = vr.set()
								}
								t0 := time.Now()
								err := Attention(cs.dst, cs.q, 1, cs.qh, v, Options{})
								dt := time.Since(t0).Seconds()
								undo()
								if err != nil {
									b.Fatal(err)
								}
								if i == 1 {
									alt = append(alt, dt)
								} else {
									base = append(base, dt)
								}
							}
						}
						ratio := make([]float64, len(base))
						for i := range base {
							ratio[i] = base[i] / alt[i]
						}
						b.ReportMetric(medianOf(ratio), "base/variant")
						b.ReportMetric(cs.bytes/medianOf(base)/1e9, "baseGB/s")
						b.ReportMetric(cs.bytes/medianOf(alt)/1e9, "variantGB/s")
					})
				}
			}
		}
	})
}

// medianOf returns the median of x (x is not changed).
func medianOf(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}
