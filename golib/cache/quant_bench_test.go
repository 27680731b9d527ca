package cache

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkQuantAppend measures a decode step's append (one token, batch 1,
// 8 KV heads of 128, fp16 storage) on a native cache and on quantized ones:
// the quantized figure includes the seal of one chunk every Group tokens.
// Reported per token appended (all heads, K and V).
func BenchmarkQuantAppend(b *testing.B) {
	cases := []struct {
		name string
		q    QuantConfig
	}{
		{"fp16", QuantConfig{}},
		{"int8-channel", QuantConfig{Format: QuantInt8, Group: 32, Residual: 128}},
		{"int8-token", QuantConfig{Format: QuantInt8, Group: 32, KAxis: KPerToken, Residual: 128}},
		{"int4-channel", QuantConfig{Format: QuantInt4, Group: 32, Residual: 128}},
	}
	for _, layout := range []Layout{Contiguous, Paged} {
		for _, tc := range cases {
			b.Run(fmt.Sprintf("%v/%s", layout, tc.name), func(b *testing.B) {
				const capacity = 1 << 14
				cfg := Config{Batch: 1, KVHeads: 8, HeadDimK: 128, Capacity: capacity, Elem: Float16, Layout: layout, Quant: tc.q}
				a, _ := NewArena(0)
				defer a.Close()
				c, err := New(a, cfg)
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				k, v := randQKV(rand.New(rand.NewPCG(1, 1)), cfg, 1)
				kb, vb := asBytes(k), asBytes(v)
				b.SetBytes(int64(len(kb) + len(vb)))
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					if c.lens[0] == capacity {
						b.StopTimer()
						_ = c.Reset()
						b.StartTimer()
					}
					if err := c.Append(kb, vb, Float32, 1, nil); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
