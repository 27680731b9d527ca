package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// newBenchCache returns a float32 cache of one sequence filled with L random
// tokens (newBenchCacheOf: of another storage type). Unlike testView it lives in the cache package's own buffers
// (2 MiB-aligned, advised for transparent huge pages), so the measured
// bandwidth is what the Python decode step sees.
func newBenchCache(b *testing.B, kvh, d, L int) *cache.KVCache {
	b.Helper()
	return newBenchCacheOf(b, cache.Float32, kvh, d, L)
}

func newBenchCacheOf(b *testing.B, elem cache.ElemType, kvh, d, L int) *cache.KVCache {
	b.Helper()
	return newBenchCacheQ(b, elem, kvh, d, L, cache.QuantConfig{})
}

// newBenchCacheQ is newBenchCacheOf with a quantization option (q).
func newBenchCacheQ(b *testing.B, elem cache.ElemType, kvh, d, L int, q cache.QuantConfig) *cache.KVCache {
	b.Helper()
	c, done := openBenchCache(b, elem, kvh, d, L, q)
	b.Cleanup(done)
	return c
}

// openBenchCache is newBenchCacheQ for a cache the caller closes (done)
// itself, e.g. one shared by sub-benchmarks created only when one runs.
func openBenchCache(b *testing.B, elem cache.ElemType, kvh, d, L int, q cache.QuantConfig) (c *cache.KVCache, done func()) {
	b.Helper()
	a, err := cache.NewArena(0)
	if err != nil {
		b.Fatal(err)
	}
	c, err = cache.New(a, cache.Config{Batch: 1, KVHeads: kvh, HeadDimK: d, Capacity: L, Elem: elem, Quant: q})
	if err != nil {
		a.Close()
		b.Fatal(err)
	}
	done = func() { c.Close(); a.Close() }
	rng := rand.New(rand.NewPCG(uint64(L), uint64(kvh)))
	const chunk = 512 // tokens per Append: bounded scratch
	k := make([]byte, kvh*chunk*d*4)
	v := make([]byte, kvh*chunk*d*4)
	for at := 0; at < L; at += chunk {
		n := min(chunk, L-at)
		for _, buf := range [][]byte{k[:kvh*n*d*4], v[:kvh*n*d*4]} {
			for i := 0; i < len(buf); i += 4 {
				binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(3.4*rng.Float32()-1.7))
			}
		}
		if err := c.Append(k[:kvh*n*d*4], v[:kvh*n*d*4], cache.Float32, n, nil); err != nil {
			done()
			b.Fatal(err)
		}
	}
	return c, done
}

// BenchmarkDecodeBW times one fp32 decode step (q_len 1, head_dim 128) of
// GQA 32/8 and MHA 32/32 over a real cache at contexts around and beyond
// the L3, 1 and 2 threads, and reports the effective K+V read bandwidth in
// GB/s (1e9 bytes/s), the figure the 85%-of-streaming-read target
// is about (compare with BenchmarkStreamRead / ReadBandwidth).
func BenchmarkDecodeBW(b *testing.B) {
	defer SetThreads(Threads())
	const d = 128
	for _, hd := range [][2]int{{32, 8}, {32, 32}} {
		for _, L := range []int{4096, 16384, 32768} {
			c := newBenchCache(b, hd[1], d, L)
			runDecodeSteps(b, fmt.Sprintf("h%d-%d/L%d", hd[0], hd[1], L), c, hd[0], d)
		}
	}
}

// runDecodeSteps runs sub-benchmarks name/t1 and name/t2 of one fp32 decode
// step (q_len 1, qh query heads of head dim d) over the whole of c on 1 and
// 2 threads, reporting the K+V GB/s read and the allocations per step.
func runDecodeSteps(b *testing.B, name string, c *cache.KVCache, qh, d int) {
	rng := rand.New(rand.NewPCG(3, 5))
	q := randVec(rng, qh*d, 1)
	dst := make([]float32, qh*d)
	info := c.Info()
	bytes := float64(info.Lengths[0] * info.KVHeads * 2 * d * 4)
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprintf("%s/t%d", name, th), func(b *testing.B) {
			SetThreads(th)
			v, err := c.BeginRead()
			if err != nil {
				b.Fatal(err)
			}
			defer c.EndRead()
			b.ReportAllocs()
			for b.Loop() {
				if err := Attention(dst, q, 1, qh, v, Options{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
		})
	}
}

// BenchmarkPrefetchDistance sweeps prefetchTokens (how many rows ahead the
// assembly loops prefetch K and V) on the SIMD paths, GQA 32/8 and MHA 32/32
// d128 at 16k tokens (beyond the L3), fp32 and fp16, one thread, reporting
// K+V GB/s. The distances of one run are measured one after another:
// repeat whole runs (one distance each, -test.bench .../pf64$) to
// interleave them on a shared machine.
func BenchmarkPrefetchDistance(b *testing.B) {
	defer SetThreads(Threads())
	defer SetKernel("auto")
	defer func(pf int) { prefetchTokens = pf }(prefetchTokens)
	const d, L = 128, 16384
	for _, hd := range [][2]int{{32, 8}, {32, 32}} {
		for _, e := range []cache.ElemType{cache.Float32, cache.Float16} {
			c := newBenchCacheOf(b, e, hd[1], d, L)
			rng := rand.New(rand.NewPCG(3, 5))
			q := randVec(rng, hd[0]*d, 1)
			dst := make([]float32, hd[0]*d)
			bytes := int64(L * hd[1] * 2 * d * e.Size())
			for _, path := range []string{"avx2", "avx512"} {
				if SetKernel(path) != nil {
					continue
				}
				for _, pf := range []int{0, 16, 32, 64, 128, 256} {
					b.Run(fmt.Sprintf("h%d-%d/%v/%s/pf%d", hd[0], hd[1], e, path, pf), func(b *testing.B) {
						SetThreads(1)
						if err := SetKernel(path); err != nil {
							b.Fatal(err)
						}
						prefetchTokens = pf
						v, err := c.BeginRead()
						if err != nil {
							b.Fatal(err)
						}
						defer c.EndRead()
						for b.Loop() {
							if err := Attention(dst, q, 1, hd[0], v, Options{}); err != nil {
								b.Fatal(err)
							}
						}
						b.ReportMetric(float64(bytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
					})
				}
			}
		}
	}
}

// BenchmarkDecodePaths times one decode step (q_len 1) of GQA 32/8 and MHA
// 32/32 at head dims 64 and 128, fp32/fp16/bf16, beyond the L3 (16k and 32k
// tokens), 1 and 2 threads, on every SIMD path with the paths of one case
// run back to back (the comparison a shared machine allows), reporting K+V
// GB/s. Select cases with -test.bench, e.g. 'DecodePaths/h32-32/d128/float32/L16384/t1'.
func BenchmarkDecodePaths(b *testing.B) {
	_, paths := KernelPaths()
	defer SetThreads(Threads())
	defer SetKernel("auto")
	forDecodePathCases(b, []int{64, 128}, func(cs *decodePathCase) {
		for _, th := range []int{1, 2} {
			for _, path := range paths {
				if path == "go" {
					continue
				}
				b.Run(fmt.Sprintf("%s/t%d/%s", cs.name, th, path), func(b *testing.B) {
					v := cs.read(b, th, path)
					b.ReportAllocs()
					for b.Loop() {
						if err := Attention(cs.dst, cs.q, 1, cs.qh, v, Options{}); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(cs.bytes*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	})
}

// BenchmarkDecodeHeadDims times one fp32 decode step (q_len 1) of MHA 32/32
// and GQA 32/8 at head dims 80, 96, 128 and 256 (Phi-2, Phi-3, Llama,
// Gemma), 1 and 2 threads, the context scaled so that every case reads the
// same K+V bytes (16k tokens at head dim 128: beyond the L3), on the active
// kernel path, reporting K+V GB/s: the single-row loops of head dims other
// than 128 against those of 128.
func BenchmarkDecodeHeadDims(b *testing.B) {
	defer SetThreads(Threads())
	for _, hd := range [][2]int{{32, 32}, {32, 8}} {
		for _, d := range []int{80, 96, 128, 256} {
			c := newBenchCache(b, hd[1], d, 16384*128/d)
			runDecodeSteps(b, fmt.Sprintf("h%d-%d/d%d", hd[0], hd[1], d), c, hd[0], d)
		}
	}
}
