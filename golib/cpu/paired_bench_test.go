package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// BenchmarkDecodePathsPaired times one decode step (q_len 1) on every SIMD
// path call by call with a streaming-read probe pass (StreamRead over a
// 256 MiB buffer, best path, same thread count) between, GQA 32/8 and MHA
// 32/32, head dims 128 and 64, fp32/fp16/bf16, 16k and 32k tokens, 1 and 2
// threads. The paths' order rotates from one round to the next: the
// second of two calls over the same cache finds part of it in the L3 the
// first left (identical sides measured 1-7% apart with a fixed order). It
// reports each path's K+V GB/s as a fraction of the median probe
// (<path>_frac, the target metric), the median per-round time
// ratio of the first path to each other (e.g. avx2/avx512, above 1: the
// other is faster) and the probe's median GB/s. Select cases with
// -test.bench, e.g. 'DecodePathsPaired/h32-8/d128/float16/L32768'.
func BenchmarkDecodePathsPaired(b *testing.B) {
	_, all := KernelPaths()
	var paths []string
	for _, p := range all {
		if p != "go" {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		b.Skip("no SIMD path")
	}
	defer SetThreads(Threads())
	defer SetKernel("auto")
	var probe []float32
	forDecodePathCases(b, []int{128, 64}, func(cs *decodePathCase) {
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("%s/t%d", cs.name, th), func(b *testing.B) {
				if probe == nil {
					probe = make([]float32, 64<<20)
					for i := range probe {
						probe[i] = float32(i & 7)
					}
				}
				c := cs.open(b)
				SetThreads(th)
				v, err := c.BeginRead()
				if err != nil {
					b.Fatal(err)
				}
				defer c.EndRead()
				times := make([][]float64, len(paths))
				var gbps []float64
				round := 0
				for b.Loop() {
					round++
					for j := range paths {
						i := (j + round) % len(paths)
						if err := SetKernel(paths[i]); err != nil {
							b.Fatal(err)
						}
						t0 := time.Now()
						if err := Attention(cs.dst, cs.q, 1, cs.qh, v, Options{}); err != nil {
							b.Fatal(err)
						}
						times[i] = append(times[i], time.Since(t0).Seconds())
					}
					if err := SetKernel("auto"); err != nil {
						b.Fatal(err)
					}
					g, err := StreamRead(probe, th)
					if err != nil {
						b.Fatal(err)
					}
					gbps = append(gbps, g)
				}
				pm := medianOf(gbps)
				for i, p := range paths {
					b.ReportMetric(cs.bytes/medianOf(times[i])/1e9/pm, p+"_frac")
					if i == 0 {
						continue
					}
					r := make([]float64, len(gbps))
					for j := range r {
						r[j] = times[0][j] / times[i][j]
					}
					b.ReportMetric(medianOf(r), paths[0]+"/"+p)
				}
				b.ReportMetric(pm, "probeGB/s")
			})
		}
	})
}

// decodePathCase is one case of the decode-path benchmarks' grid: q heads
// qh over kvh KV heads of head dim d, element type e, L tokens; its query
// and output, the K+V bytes a step reads, the sub-benchmark name prefix,
// and the cache, filled on first use (open) and closed after the case.
type decodePathCase struct {
	qh, kvh, d, L int
	e             cache.ElemType
	q, dst        []float32
	bytes         float64
	name          string
	c             *cache.KVCache
	done          func()
}

// open returns the case's cache, filling it on the first call.
func (cs *decodePathCase) open(b *testing.B) *cache.KVCache {
	if cs.c == nil {
		cs.c, cs.done = openBenchCache(b, cs.e, cs.kvh, cs.d, cs.L, cache.QuantConfig{})
	}
	return cs.c
}

// read opens the case's cache at th threads on kernel path, begins a read
// and ends it when b finishes.
func (cs *decodePathCase) read(b *testing.B, th int, path string) cache.View {
	c := cs.open(b)
	SetThreads(th)
	if err := SetKernel(path); err != nil {
		b.Fatal(err)
	}
	v, err := c.BeginRead()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(c.EndRead)
	return v
}

// forDecodePathCases runs run for every case of the decode-path grid (GQA
// 32/8 and MHA 32/32, head dims dims, fp32/fp16/bf16, 16k and 32k tokens),
// closing each case's cache after it.
func forDecodePathCases(b *testing.B, dims []int, run func(cs *decodePathCase)) {
	for _, hd := range [][2]int{{32, 8}, {32, 32}} {
		for _, d := range dims {
			for _, e := range []cache.ElemType{cache.Float32, cache.Float16, cache.BFloat16} {
				for _, L := range []int{16384, 32768} {
					rng := rand.New(rand.NewPCG(3, 5))
					cs := &decodePathCase{qh: hd[0], kvh: hd[1], d: d, L: L, e: e,
						q: randVec(rng, hd[0]*d, 1), dst: make([]float32, hd[0]*d),
						bytes: float64(L * hd[1] * 2 * d * e.Size()),
						name:  fmt.Sprintf("h%d-%d/d%d/%v/L%d", hd[0], hd[1], d, e, L)}
					run(cs)
					if cs.done != nil {
						cs.done()
					}
				}
			}
		}
	}
}
