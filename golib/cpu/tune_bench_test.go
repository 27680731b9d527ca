package cpu

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// BenchmarkTunePaired compares, call by call in one process (the only
// comparison a shared machine allows), the decode step at the current
// prefetch distance and block size against one changed setting: a
// prefetchTokens of 32, 128 or 192 rows, or blocks of half or twice
// blockBytes. GQA 32/8 d128, fp32 and fp16, 16k tokens (beyond the L3),
// 1 and 2 threads, each SIMD path. The side that goes first alternates
// from pair to pair: on the Granite Rapids-class Xeon the second of two
// identical calls measured 1-7% faster (part of its K/V still in the
// L3 the first filled). It reports the median per-pair time
// ratio base/variant (above 1: the variant is faster) and both sides'
// median K+V GB/s.
func BenchmarkTunePaired(b *testing.B) {
	_, paths := KernelPaths()
	defer SetThreads(Threads())
	defer SetKernel("auto")
	defer func(pf, bb int) { prefetchTokens, blockBytes = pf, bb }(prefetchTokens, blockBytes)
	pf0, bb0 := prefetchTokens, blockBytes
	variants := []struct {
		name   string
		pf, bb int
	}{
		{"pf32", 32, bb0}, {"pf128", 128, bb0}, {"pf192", 192, bb0},
		{"blk/2", pf0, bb0 / 2}, {"blk*2", pf0, bb0 * 2},
	}
	const d, L, kvh, qh = 128, 16384, 8, 32
	for _, e := range []cache.ElemType{cache.Float32, cache.Float16} {
		var c *cache.KVCache
		done := func() {}
		rng := rand.New(rand.NewPCG(3, 5))
		q := randVec(rng, qh*d, 1)
		dst := make([]float32, qh*d)
		bytes := float64(L * kvh * 2 * d * e.Size())
		for _, path := range paths {
			if path == "go" {
				continue
			}
			for _, th := range []int{1, 2} {
				for _, vr := range variants {
					b.Run(fmt.Sprintf("%v/%s/t%d/%s", e, path, th, vr.name), func(b *testing.B) {
						if c == nil {
							c, done = openBenchCache(b, e, kvh, d, L, cache.QuantConfig{})
						}
						SetThreads(th)
						if err := SetKernel(path); err != nil {
							b.Fatal(err)
						}
						v, err := c.BeginRead()
						if err != nil {
							b.Fatal(err)
						}
						defer c.EndRead()
						var base, alt []float64
						it := 0
						for b.Loop() {
							it++
							for j := 0; j < 2; j++ {
								i := (j + it) % 2 // the side that goes first alternates
								prefetchTokens, blockBytes = pf0, bb0
								if i == 1 {
									prefetchTokens, blockBytes = vr.pf, vr.bb
								}
								t0 := time.Now()
								if err := Attention(dst, q, 1, qh, v, Options{}); err != nil {
									b.Fatal(err)
								}
								if dt := time.Since(t0).Seconds(); i == 1 {
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
						b.ReportMetric(bytes/medianOf(base)/1e9, "baseGB/s")
						b.ReportMetric(bytes/medianOf(alt)/1e9, "variantGB/s")
					})
				}
			}
		}
		done()
	}
}

// medianOf returns the median of x (x is not changed).
func medianOf(x []float64) float64 {
	s := slices.Clone(x)
	slices.Sort(s)
	return s[len(s)/2]
}
