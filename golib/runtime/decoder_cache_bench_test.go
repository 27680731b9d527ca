package runtime

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// BenchmarkDecoderCache times one decode step of the cache path (a
// CacheState, only the new token fed) at a fixed context, 1 and 2 threads,
// on the decoder of OLKV_DECODER_MODEL (see decoderSession; skipped when it
// is not set). The model:
//
//	python -c "from onnx_light_kv import models as M; M.save_model(M.build('llama',
//	    M.DecoderConfig(layers=8, hidden=1024, q_heads=32, kv_heads=8, head_dim=128, vocab=32000,
//	    intermediate=2816, max_positions=16512)), 'llama.onnx')"
//	OLKV_DECODER_MODEL=llama.onnx GOEXPERIMENT=simd go test -run - -bench DecoderCache ./golib/runtime
//
// The session profiles its nodes, and the benchmark reports where a step's
// time goes (per step, ms): "attn-ms" (the CacheAttention nodes), "matmul-ms"
// (MatMul and Gemm) and "other-ms" (every other node and the executor), so
// a two-thread step that loses can be told apart from a slow kernel.
func BenchmarkDecoderCache(b *testing.B) {
	path := os.Getenv("OLKV_DECODER_MODEL")
	if path == "" {
		b.Skip("OLKV_DECODER_MODEL is not set")
	}
	for _, threads := range []int{1, 2} {
		for _, context := range []int{1024, 4096, 16384} {
			b.Run(fmt.Sprintf("threads=%d/context=%d", threads, context), func(b *testing.B) {
				s, err := NewSession(path, Options{Threads: threads, Profile: true})
				if err != nil {
					b.Fatal(err)
				}
				defer s.Close()
				cs := decoderCacheState(b, s, context)
				defer cs.Close()
				feeds := map[string]*tensor.Tensor{}
				for _, in := range s.Inputs() {
					if s.cache.pasts[in.Name] {
						continue
					}
					if in.DType != tensor.Int64 {
						b.Fatalf("decoder input %q: expected int64 ids or positions", in.Name)
					}
					feeds[in.Name], _ = tensor.Scalar(int64(context)).Reshaped(tensor.Shape{1, 1})
				}
				out := []string{s.Outputs()[0].Name}
				var attn, mm, total float64
				b.ReportAllocs()
				for b.Loop() {
					outs, stats, err := s.RunCache(cs, feeds, out)
					if err != nil {
						b.Fatal(err)
					}
					s.DefaultState().Release(outs...)
					if err := cs.Truncate(context); err != nil {
						b.Fatal(err)
					}
					total += stats.Duration.Seconds() * 1e3
					for _, e := range stats.Events {
						switch e.OpType {
						case "CacheAttention":
							attn += e.Duration.Seconds() * 1e3
						case "MatMul", "Gemm":
							mm += e.Duration.Seconds() * 1e3
						}
					}
				}
				n := float64(b.N)
				b.ReportMetric(attn/n, "attn-ms")
				b.ReportMetric(mm/n, "matmul-ms")
				b.ReportMetric((total-attn-mm)/n, "other-ms")
			})
		}
	}
}

// decoderCacheState returns a float32 state of s holding context
// positions of K/V rows per layer, normal values of standard deviation
// 0.5 (as bench_cache_path.py loads; zeros would give every position the
// same score, which no real cache does).
func decoderCacheState(b *testing.B, s *Session, context int) *CacheState {
	cs, err := s.NewCacheState(StateConfig{Batch: 1, MaxLength: context + 8, Elem: cache.Float32, ElemSet: true})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	rows := make([]LayerRows, len(cs.Layers()))
	for i, l := range cs.Layers() {
		if l.KVHeads <= 0 || l.HeadDimK <= 0 || l.HeadDimV <= 0 {
			b.Fatalf("layer %d: the graph does not declare its K/V geometry", l.Index)
		}
		rows[i] = LayerRows{K: randomRows(rng, l.KVHeads*context*l.HeadDimK), V: randomRows(rng, l.KVHeads*context*l.HeadDimV),
			KVHeads: l.KVHeads, HeadDimK: l.HeadDimK, HeadDimV: l.HeadDimV}
	}
	if err := cs.Load(rows, cache.Float32, context); err != nil {
		b.Fatal(err)
	}
	return cs
}

// randomRows returns n float32 values (normal, standard deviation 0.5) as
// little-endian bytes.
func randomRows(rng *rand.Rand, n int) []byte {
	out := make([]byte, 4*n)
	for i := 0; i < n; i++ {
		u := math.Float32bits(float32(rng.NormFloat64() * 0.5))
		out[4*i], out[4*i+1], out[4*i+2], out[4*i+3] = byte(u), byte(u>>8), byte(u>>16), byte(u>>24)
	}
	return out
}
