package mha

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// BenchmarkAttention: decode (one query token over a past) and prefill
// (causal, no past) on the tensor path, 16 query heads over 8 KV heads of 64
// dims, present outputs written as the op does.
func BenchmarkAttention(b *testing.B) {
	for _, c := range []struct {
		name      string
		s, l, p   int
		causal    bool
		hq, hkv   int
		headDim   int
		batchSize int
	}{
		{"decode_past1024", 1, 1, 1024, true, 16, 8, 64, 1},
		{"decode_past4096", 1, 1, 4096, true, 16, 8, 64, 1},
		{"prefill_512", 512, 512, 0, true, 16, 8, 64, 1},
	} {
		for _, path := range []string{"stream", "stream_1thread", "general", "general_1thread"} {
			b.Run(c.name+"/"+path, func(b *testing.B) {
				unitDecode = strings.HasPrefix(path, "stream")
				defer func() { unitDecode = true }()
				r := rand.New(rand.NewPCG(1, 2))
				sh := Shapes{
					Q: []int{c.batchSize, c.hq, c.s, c.headDim}, K: []int{c.batchSize, c.hkv, c.l, c.headDim},
					V: []int{c.batchSize, c.hkv, c.l, c.headDim},
				}
				if c.p > 0 {
					sh.PastKey = []int{c.batchSize, c.hkv, c.p, c.headDim}
					sh.PastValue = sh.PastKey
				}
				g, err := Plan(Attrs{IsCausal: c.causal}, sh)
				if err != nil {
					b.Fatal(err)
				}
				if strings.HasSuffix(path, "_1thread") {
					g.Threads = 1
				}
				in := Inputs{Q: randVec(r, prod(sh.Q)), K: randVec(r, prod(sh.K)), V: randVec(r, prod(sh.V))}
				if c.p > 0 {
					in.PastKey, in.PastValue = randVec(r, prod(sh.PastKey)), randVec(r, prod(sh.PastValue))
				}
				out := Outputs{Y: make([]float32, prod(g.YShape)),
					PresentKey: make([]float32, prod(g.PresentKeyShape)), PresentValue: make([]float32, prod(g.PresentValueShape))}
				b.SetBytes(int64(4 * (len(out.PresentKey) + len(out.PresentValue))))
				for b.Loop() {
					if err := g.Run(in, out); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
