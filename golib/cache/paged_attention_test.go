package cache_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
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
// tokens at 1k-32k tokens, 1 and 2 threads; compare the ns/op of a row with
// its contiguous twin. It is how the default block size was chosen.
func BenchmarkPagedDecode(b *testing.B) {
	defer cpu.SetThreads(cpu.Threads())
	const qh, kvh, d = 32, 8, 128
	r := rand.New(rand.NewPCG(3, 5))
	for _, L := range []int{1024, 4096, 16384, 32768} {
		for _, bs := range []int{0, 16, 32, 64, 128} {
			cfg := cache.Config{Batch: 1, KVHeads: kvh, HeadDimK: d, Capacity: L, Elem: cache.Float32}
			a, _ := cache.NewArena(0)
			if bs > 0 {
				cfg.Layout, cfg.BlockSize = cache.Paged, bs
			}
			c, err := cache.New(a, cfg)
			if err != nil {
				b.Fatal(err)
			}
			const chunk = 512
			k := make([]float32, kvh*chunk*d)
			for i := range k {
				k[i] = 2*r.Float32() - 1
			}
			for done := 0; done < L; done += chunk {
				n := min(chunk, L-done)
				if err := c.Append(f32Bytes(k[:kvh*n*d]), f32Bytes(k[:kvh*n*d]), cache.Float32, n, nil); err != nil {
					b.Fatal(err)
				}
			}
			q := make([]float32, qh*d)
			for i := range q {
				q[i] = 2*r.Float32() - 1
			}
			dst := make([]float32, qh*d)
			for _, th := range []int{1, 2} {
				b.Run(fmt.Sprintf("L%d/%s/t%d", L, layoutName(bs), th), func(b *testing.B) {
					cpu.SetThreads(th)
					view, err := c.BeginRead()
					if err != nil {
						b.Fatal(err)
					}
					defer c.EndRead()
					b.ReportAllocs()
					for b.Loop() {
						if err := cpu.Attention(dst, q, 1, qh, view, cpu.Options{}); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			c.Close()
			a.Close()
		}
	}
}

func layoutName(bs int) string {
	if bs == 0 {
		return "contiguous"
	}
	return fmt.Sprintf("paged%d", bs)
}
