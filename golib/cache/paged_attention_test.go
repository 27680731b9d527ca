package cache_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu"
)

// f32Bytes views f as bytes.
func f32Bytes(f []float32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(f))), 4*len(f))
}

// twinCaches returns a contiguous and a paged cache holding the same rows:
// lens[b] tokens of sequence b (ragged), the first evict[b] evicted.
func twinCaches(t testing.TB, r *rand.Rand, cfg cache.Config, bs int, lens []int, keep int) (*cache.KVCache, *cache.KVCache) {
	t.Helper()
	a, err := cache.NewArena(0)
	if err != nil {
		t.Fatal(err)
	}
	pc := cfg
	pc.Layout, pc.BlockSize = cache.Paged, bs
	var out []*cache.KVCache
	n := 0
	for _, l := range lens {
		n = max(n, l)
	}
	k := make([]float32, cfg.Batch*cfg.KVHeads*n*cfg.HeadDimK)
	v := make([]float32, cfg.Batch*cfg.KVHeads*n*cfg.HeadDimK)
	for i := range k {
		k[i] = 2*r.Float32() - 1
		v[i] = 2*r.Float32() - 1
	}
	for _, c := range []cache.Config{cfg, pc} {
		kv, err := cache.New(a, c)
		if err != nil {
			t.Fatal(err)
		}
		if err := kv.Append(f32Bytes(k), f32Bytes(v), cache.Float32, n, lens); err != nil {
			t.Fatal(err)
		}
		if keep > 0 {
			if err := kv.Evict(keep); err != nil {
				t.Fatal(err)
			}
		}
		t.Cleanup(kv.Close)
		out = append(out, kv)
	}
	return out[0], out[1]
}

// TestPagedAttentionMatchesContiguous runs the decode/prefill attention
// kernel over a contiguous and a paged cache with the same rows: MHA, GQA,
// MQA; fp32, fp16, bf16; q_len 1-16; sliding windows (option and evicted
// cache); ragged batches with lengths around block boundaries. Outputs agree
// within 1e-6 and the kernel reads the same K/V bytes from both (no gather).
func TestPagedAttentionMatchesContiguous(t *testing.T) {
	const d = 32
	r := rand.New(rand.NewPCG(11, 12))
	for _, heads := range [][2]int{{4, 4}, {8, 2}, {4, 1}} {
		for _, elem := range []cache.ElemType{cache.Float32, cache.Float16, cache.BFloat16} {
			for _, bs := range []int{16, 64} {
				for _, qLen := range []int{1, 3, 16} {
					for _, win := range []struct{ opt, keep int }{{0, 0}, {37, 0}, {0, 45}} {
						lens := []int{bs - 1 + qLen, bs + qLen, 3*bs + 5}
						cfg := cache.Config{Batch: len(lens), KVHeads: heads[1], HeadDimK: d, Capacity: 4*bs + 32, Elem: elem}
						cc, pc := twinCaches(t, r, cfg, bs, lens, win.keep)
						q := make([]float32, cfg.Batch*heads[0]*qLen*d)
						for i := range q {
							q[i] = 2*r.Float32() - 1
						}
						var outs [2][]float32
						var read [2]int64
						for i, c := range []*cache.KVCache{cc, pc} {
							c.ResetCounters()
							view, err := c.BeginRead()
							if err != nil {
								t.Fatal(err)
							}
							outs[i] = make([]float32, cfg.Batch*heads[0]*qLen*d)
							err = cpu.AttentionPrefill(outs[i], q, qLen, heads[0], view, cpu.Options{Window: win.opt})
							c.EndRead()
							if err != nil {
								t.Fatal(err)
							}
							read[i] = c.Counters().AttentionBytes
						}
						name := fmt.Sprintf("h%d/%d %v bs%d q%d win%v", heads[0], heads[1], elem, bs, qLen, win)
						if read[0] != read[1] {
							t.Fatalf("%s: attention read %d bytes from contiguous, %d from paged", name, read[0], read[1])
						}
						for i := range outs[0] {
							if diff := math.Abs(float64(outs[0][i] - outs[1][i])); diff > 1e-6*(1+math.Abs(float64(outs[0][i]))) {
								t.Fatalf("%s: out[%d] contiguous %v paged %v", name, i, outs[0][i], outs[1][i])
							}
						}
					}
				}
			}
		}
	}
}

// BenchmarkPagedDecode times one fp32 decode step (GQA 32/8, head dim 128)
// over the contiguous layout and the paged layout with blocks of 16-128
// tokens at 1k-32k tokens, 1 and 2 threads. The two caches are timed in
// alternation, call by call, and the metric paged/contig is the median of
// the per-pair time ratios, so load from other processes cancels out. It is
// how the default block size was chosen.
func BenchmarkPagedDecode(b *testing.B) {
	defer cpu.SetThreads(cpu.Threads())
	const qh, kvh, d = 32, 8, 128
	r := rand.New(rand.NewPCG(3, 5))
	for _, L := range []int{1024, 4096, 16384, 32768} {
		for _, bs := range []int{16, 32, 64, 128} {
			lens := []int{L}
			cfg := cache.Config{Batch: 1, KVHeads: kvh, HeadDimK: d, Capacity: L, Elem: cache.Float32}
			cc, pc := twinCaches(b, r, cfg, bs, lens, 0)
			q := make([]float32, qh*d)
			for i := range q {
				q[i] = 2*r.Float32() - 1
			}
			dst := make([]float32, qh*d)
			for _, th := range []int{1, 2} {
				b.Run(fmt.Sprintf("L%d/paged%d/t%d", L, bs, th), func(b *testing.B) {
					cpu.SetThreads(th)
					views := make([]cache.View, 2)
					for i, c := range []*cache.KVCache{cc, pc} {
						v, err := c.BeginRead()
						if err != nil {
							b.Fatal(err)
						}
						defer c.EndRead()
						views[i] = v
					}
					var ratios []float64
					var sum [2]time.Duration
					for i := 0; b.Loop(); i++ {
						var t [2]time.Duration
						for j := range 2 {
							k := (i + j) % 2 // alternate which layout goes first
							t0 := time.Now()
							if err := cpu.Attention(dst, q, 1, qh, views[k], cpu.Options{}); err != nil {
								b.Fatal(err)
							}
							t[k] = time.Since(t0)
						}
						sum[0] += t[0]
						sum[1] += t[1]
						ratios = append(ratios, float64(t[1])/float64(t[0]))
					}
					slices.Sort(ratios)
					b.ReportMetric(ratios[len(ratios)/2], "paged/contig")
					b.ReportMetric(float64(sum[0].Nanoseconds())/float64(len(ratios)), "contig-ns")
					b.ReportMetric(float64(sum[1].Nanoseconds())/float64(len(ratios)), "paged-ns")
				})
			}
		}
	}
}
