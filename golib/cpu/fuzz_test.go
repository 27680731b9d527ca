package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// FuzzAttention draws a geometry (head dims, KV heads, GQA group, q_len,
// lengths, paging, storage type), options (scale, softcap, window, window
// start) and optionally one of the non-finite poisons, then runs every
// kernel path on 1 and 3 threads against ReferenceAttention: both must
// refuse the same calls, and accepted ones must agree under the non-finite
// rule (sameAsReference). Run with
//
//	go test ./golib/cpu -run '^$' -fuzz FuzzAttention -fuzztime 20s
//
// Plain `go test` only runs the seeds (and testdata/fuzz).
func FuzzAttention(f *testing.F) {
	f.Add(uint64(1), uint8(63), uint8(63), uint8(1), uint8(3), uint8(0), uint16(40), uint8(0), uint8(0), float32(0), float32(0), uint16(0), uint8(0))
	f.Add(uint64(2), uint8(16), uint8(8), uint8(2), uint8(0), uint8(2), uint16(300), uint8(1), uint8(16), float32(0.1), float32(5), uint16(50), uint8(3))
	f.Add(uint64(3), uint8(127), uint8(127), uint8(0), uint8(7), uint8(15), uint16(20), uint8(2), uint8(1), float32(0), float32(30), uint16(3), uint8(200))
	f.Fuzz(func(t *testing.T, seed uint64, dk, dv, kvh, group, qLen uint8, L uint16, elem, page uint8,
		scale, softcap float32, window uint16, special uint8) {
		sh := nonFiniteShape{
			elem:   []cache.ElemType{cache.Float32, cache.Float16, cache.BFloat16}[elem%3],
			dk:     1 + int(dk)%160,
			dv:     1 + int(dv)%160,
			kvh:    1 + int(kvh)%4,
			qLen:   1 + int(qLen)%maxQLen,
			page:   int(page) % 40,
			qHeads: 0,
		}
		sh.qHeads = sh.kvh * (1 + int(group)%8)
		rng := rand.New(rand.NewPCG(seed, 3))
		sh.lens = []int{max(sh.qLen, 1+int(L)%700)}
		if seed%3 == 1 {
			sh.lens = append(sh.lens, max(sh.qLen, 1+int(L)%37))
		}
		tv := newTestView(rng, sh.elem, sh.kvh, sh.dk, sh.dv, sh.lens)
		tv.page = sh.page
		rows := len(sh.lens) * sh.qHeads * sh.qLen
		q := randVec(rng, rows*sh.dk, 1)
		// scale and softcap as the fuzzer gives them (NaN and negative
		// ones must be refused by both), finite ones kept where float32
		// scores stay accurate against float64 (|score| of a few dozen)
		o := Options{Scale: scale, Softcap: softcap, Window: int(window) % 400}
		if o.Scale > 0 && !math.IsInf(float64(o.Scale), 1) {
			o.Scale = float32(math.Mod(float64(o.Scale), 2/math.Sqrt(float64(sh.dk))))
		}
		if o.Softcap > 0 && !math.IsInf(float64(o.Softcap), 1) {
			o.Softcap = float32(math.Mod(float64(o.Softcap), 50))
		}
		same := sameAsReference
		if n := int(special) % (2 * len(poisons)); n < len(poisons) {
			p := poisons[n]
			if p.illCond {
				same = boundedLikeReference
			}
			if p.q != nil {
				p.q(q)
			}
			if p.kv != nil {
				p.kv(tv.setStored, sh.lens, sh.dk, sh.dv)
			}
			if p.opts != nil {
				p.opts(&o)
			}
		}
		if seed%5 == 2 {
			for b := range tv.ws {
				tv.ws[b] = int(seed>>8) % (sh.lens[b] - sh.qLen + 1)
			}
		}
		want := make([]float32, rows*sh.dv)
		refErr := ReferenceAttention(want, q, sh.qLen, sh.qHeads, tv, o)
		mag := maxFiniteV(tv)
		got := make([]float32, len(want))
		_, paths := KernelPaths()
		defer restoreKernel(t)
		defer SetThreads(Threads())
		for _, path := range paths {
			if err := SetKernel(path); err != nil {
				t.Fatal(err)
			}
			for _, th := range []int{1, 3} {
				SetThreads(th)
				err := Attention(got, q, sh.qLen, sh.qHeads, tv, o)
				if (err == nil) != (refErr == nil) {
					t.Fatalf("%+v %+v path=%s threads=%d: kernel error %v, reference error %v", sh, o, path, th, err, refErr)
				}
				if err != nil {
					continue
				}
				if i, ok := same(got, want, mag); !ok {
					t.Fatalf("%+v %+v special=%d path=%s threads=%d: element %d = %v, reference %v",
						sh, o, special, path, th, i, got[i], want[i])
				}
			}
		}
	})
}
