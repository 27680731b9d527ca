package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// BenchmarkDecodeQuant times one decode step (q_len 1) of GQA 32/8, head
// dim 128, batch 1, at 16k and 32k tokens on 1 and 2 threads, over our fp16
// cache and over our int8 and int4 caches (K per channel, V per token,
// group 32, and group 64 as int8-g64/int4-g64, residual 128 in fp16), on
// the active kernel path (OLKV_KERNEL
// selects another). The three storages run one after the other inside each
// (context, threads) pair, so -count=N alternates them (int8-intdots, int4-intdots: int8, int4
// with the integer loops, SetQuantIntDots, on the paths that have them:
// AVX-512 with VNNI, AVX2); ratios of ns/op are
// the figure to read (speed-up = fp16 time / quantized time). GB/s is the
// bytes the kernel reports reading (quantized rows plus scales).
func BenchmarkDecodeQuant(b *testing.B) {
	defer SetThreads(Threads())
	const qh, kvh, d, res = 32, 8, 128, 128
	for _, L := range []int{16384, 32768} {
		fp16 := newBenchCacheOf(b, cache.Float16, kvh, d, L)
		type storage struct {
			name string
			v    func() (cache.View, func())
		}
		var views []storage
		read := func(c *cache.KVCache, intDots bool) func() (cache.View, func()) {
			return func() (cache.View, func()) {
				v, err := c.BeginRead()
				if err != nil {
					b.Fatal(err)
				}
				scores, accum := QuantIntLoops()
				SetQuantIntDots(intDots)
				return v, func() { SetQuantIntLoops(scores, accum); c.EndRead() }
			}
		}
		views = append(views, storage{"fp16", read(fp16, false)})
		quantBenchStorages(b, kvh, d, L, res, func(name string, qc *cache.KVCache, intDots bool) {
			views = append(views, storage{name, read(qc, intDots)})
		})
		rng := rand.New(rand.NewPCG(3, 5))
		q := randVec(rng, qh*d, 1)
		dst := make([]float32, qh*d)
		for _, th := range []int{1, 2} {
			for _, vw := range views {
				b.Run(fmt.Sprintf("L%d/t%d/%s", L, th, vw.name), func(b *testing.B) {
					SetThreads(th)
					v, done := vw.v()
					defer done()
					read := &readCounter{View: v}
					b.ReportAllocs()
					for b.Loop() {
						if err := Attention(dst, q, 1, qh, read, Options{}); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(read.n)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// quantBenchStorages builds the quantized caches the decode benchmarks
// compare with fp16 (int8 and int4 at groups 32 and 64, residual res) and
// calls add for each: once without the integer loops and, where the CPU has
// them, once with them ("-intdots"); a group other than the default is in
// the name ("-g64").
func quantBenchStorages(b *testing.B, kvh, d, L, res int, add func(name string, c *cache.KVCache, intDots bool)) {
	for _, g := range []int{32, 64} {
		for _, f := range quantFormats {
			c := newBenchCacheQ(b, cache.Float16, kvh, d, L, cache.QuantConfig{Format: f, Group: g, Residual: res})
			name := f.String()
			if g != cache.DefaultQuantGroup {
				name += fmt.Sprintf("-g%d", g)
			}
			add(name, c, false)
			if activeOps().quant != nil && activeOps().quant.intDots4 != nil {
				add(name+"-intdots", c, true)
			}
		}
	}
}

// readCounter counts the bytes a kernel reports reading through a view.
type readCounter struct {
	cache.View
	n int64
}

func (r *readCounter) AddBytesRead(n int64) { r.n += n; r.View.AddBytesRead(n) }

// BenchmarkDecodeQuantAB is BenchmarkDecodeQuant measured side by side on a
// loaded machine: one iteration runs rounds of a few calls of every storage
// in turn (fp16, int8 and int4 each without and, where available, with
// integer dots; group 32, the default, and group 64: int8-g64, int4-g64)
// and reports each one's median time per step (ms-<storage>) and the speed-ups
// over fp16 (x-<storage> = fp16 median / storage median). Run it with
// -benchtime=1x.
func BenchmarkDecodeQuantAB(b *testing.B) {
	defer SetThreads(Threads())
	defer SetQuantIntLoops(QuantIntLoops())
	const qh, kvh, d, res, rounds, calls = 32, 8, 128, 128, 15, 3
	for _, L := range []int{16384, 32768} {
		type storage struct {
			name    string
			c       *cache.KVCache
			intDots bool
		}
		sts := []storage{{"fp16", newBenchCacheOf(b, cache.Float16, kvh, d, L), false}}
		quantBenchStorages(b, kvh, d, L, res, func(name string, c *cache.KVCache, intDots bool) {
			sts = append(sts, storage{name, c, intDots})
		})
		rng := rand.New(rand.NewPCG(3, 5))
		q := randVec(rng, qh*d, 1)
		dst := make([]float32, qh*d)
		for _, th := range []int{1, 2} {
			b.Run(fmt.Sprintf("L%d/t%d", L, th), func(b *testing.B) {
				SetThreads(th)
				for b.Loop() {
					times := make([][]float64, len(sts))
					for r := 0; r < rounds; r++ {
						for i, st := range sts {
							v, err := st.c.BeginRead()
							if err != nil {
								b.Fatal(err)
							}
							SetQuantIntDots(st.intDots)
							if err := Attention(dst, q, 1, qh, v, Options{}); err != nil { // warm
								b.Fatal(err)
							}
							t0 := time.Now()
							for k := 0; k < calls; k++ {
								if err := Attention(dst, q, 1, qh, v, Options{}); err != nil {
									b.Fatal(err)
								}
							}
							times[i] = append(times[i], float64(time.Since(t0).Nanoseconds())/calls)
							st.c.EndRead()
						}
					}
					med := make([]float64, len(sts))
					for i := range sts {
						med[i] = medianOf(times[i])
						b.ReportMetric(med[i]/1e6, "ms-"+sts[i].name)
					}
					for i := 1; i < len(sts); i++ {
						b.ReportMetric(med[0]/med[i], "x-"+sts[i].name)
					}
				}
			})
		}
	}
}

// BenchmarkQuantPairedAB measures each change of quantVariants against the
// code without it, alternating call by call in one process (the only
// comparison a shared machine allows): one decode step of GQA 32/8, head
// dim 128, batch 1, 16k tokens, over int8 and int4 caches at groups 32 and
// 64 (integer loops on), one thread. It reports the median of the per-pair
// ratios time without / time with (above 1: the change is faster) and the
// median times. Run it with -benchtime=1x (one iteration is 40 pairs).
func BenchmarkQuantPairedAB(b0 *testing.B) {
	b := b0
	defer SetThreads(Threads())
	defer SetQuantIntLoops(QuantIntLoops())
	const qh, kvh, d, L, res, pairs = 32, 8, 128, 16384, 128, 40
	rng := rand.New(rand.NewPCG(3, 5))
	q := randVec(rng, qh*d, 1)
	dst := make([]float32, qh*d)
	type config struct {
		f     cache.QuantFormat
		g     int
		paged bool
	}
	var cfgs []config
	for _, g := range []int{32, 64} {
		for _, f := range quantFormats {
			cfgs = append(cfgs, config{f, g, false})
		}
	}
	for _, f := range quantFormats {
		cfgs = append(cfgs, config{f, 32, true})
	}
	for _, cf := range cfgs {
		{
			f, g := cf.f, cf.g
			name := fmt.Sprintf("%s-g%d", f, g)
			if cf.paged {
				name += "-paged"
			}
			var c *cache.KVCache
			for _, vr := range quantVariants {
				b.Run(name+"/"+vr.name, func(b *testing.B) {
					if c == nil { // closed when the parent ends, not this sub-benchmark
						c = newBenchCacheQ(b0, cache.Float16, kvh, d, L, cache.QuantConfig{Format: f, Group: g, Residual: res})
						if cf.paged {
							c = newBenchCachePaged(b0, kvh, d, L, cache.QuantConfig{Format: f, Group: g, Residual: res})
						}
					}
					SetThreads(1)
					SetQuantIntDots(true)
					defer vr.set(true)
					v, err := c.BeginRead()
					if err != nil {
						b.Fatal(err)
					}
					defer c.EndRead()
					for b.Loop() {
						var ratio, off, on []float64
						for i := 0; i < pairs; i++ {
							var dt [2]float64
							for k, o := range []bool{false, true} {
								vr.set(o)
								t0 := time.Now()
								if err := Attention(dst, q, 1, qh, v, Options{}); err != nil {
									b.Fatal(err)
								}
								dt[k] = time.Since(t0).Seconds()
							}
							ratio = append(ratio, dt[0]/dt[1])
							off, on = append(off, dt[0]), append(on, dt[1])
						}
						b.ReportMetric(medianOf(ratio), "off/on")
						b.ReportMetric(medianOf(off)*1e3, "ms-off")
						b.ReportMetric(medianOf(on)*1e3, "ms-on")
					}
				})
			}
		}
	}
}

// newBenchCachePaged is newBenchCacheQ's fp16 cache in the paged layout
// (its blocks are the sealed chunks).
func newBenchCachePaged(b *testing.B, kvh, d, L int, q cache.QuantConfig) *cache.KVCache {
	b.Helper()
	a, err := cache.NewArena(0)
	if err != nil {
		b.Fatal(err)
	}
	c, err := cache.New(a, cache.Config{Batch: 1, KVHeads: kvh, HeadDimK: d, Capacity: L, Elem: cache.Float16,
		Quant: q, Layout: cache.Paged, BlockSize: q.Group})
	if err != nil {
		a.Close()
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close(); a.Close() })
	rng := rand.New(rand.NewPCG(uint64(L), uint64(kvh)))
	const chunk = 512
	k := make([]float32, kvh*chunk*d)
	v := make([]float32, kvh*chunk*d)
	for at := 0; at < L; at += chunk {
		n := min(chunk, L-at)
		for i := range k {
			k[i], v[i] = 3.4*rng.Float32()-1.7, 3.4*rng.Float32()-1.7
		}
		kb := unsafe.Slice((*byte)(unsafe.Pointer(&k[0])), 4*kvh*n*d)
		vb := unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), 4*kvh*n*d)
		if err := c.Append(kb, vb, cache.Float32, n, nil); err != nil {
			b.Fatal(err)
		}
	}
	return c
}
