package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

func BenchmarkZZMHA(b *testing.B) {
	defer SetThreads(Threads())
	const qh, kvh, d, L = 32, 32, 128, 16384
	for _, name := range []string{"fp16", "int8", "int4"} {
		b.Run(name, func(b *testing.B) {
			var c *cache.KVCache
			switch name {
			case "fp16":
				c = newBenchCacheOf(b, cache.Float16, kvh, d, L)
			case "int8":
				c = newBenchCacheQ(b, cache.Float16, kvh, d, L, cache.QuantConfig{Format: cache.QuantInt8, Group: 64, Residual: 0})
			case "int4":
				c = newBenchCacheQ(b, cache.Float16, kvh, d, L, cache.QuantConfig{Format: cache.QuantInt4, Group: 64, Residual: 0})
			}
			SetThreads(1)
			rng := rand.New(rand.NewPCG(3, 5))
			q := randVec(rng, qh*d, 1)
			dst := make([]float32, qh*d)
			v, err := c.BeginRead()
			if err != nil {
				b.Fatal(err)
			}
			defer c.EndRead()
			read := &readCounter{View: v}
			for b.Loop() {
				if err := Attention(dst, q, 1, qh, read, Options{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(read.n)/b.Elapsed().Seconds()/1e9, "GB/s")
			_ = fmt.Sprint()
		})
	}
}
