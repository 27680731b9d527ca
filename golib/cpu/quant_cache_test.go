package cpu

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// TestQuantRealCache runs every path over the cache's own quantized storage
// (contiguous and paged layouts, the cache's sealing and residual window),
// appended in several calls so that chunks seal as the window moves,
// against the reference on the same view (the oracle, native tolerance) and
// against float32 attention over a native cache of the same values
// (quantVsF32Bound), and checks that the cache's attention-bytes counter
// equals what the reference reads.
func TestQuantRealCache(t *testing.T) {
	const kvh, d = 2, 64
	n := 0
	for _, layout := range []cache.Layout{cache.Contiguous, cache.Paged} {
		for _, f := range quantFormats {
			for _, ax := range kAxes {
				for _, res := range []int{0, 40} {
					n++
					L := []int{31, 97, 300}[n%3]
					qcfg := cache.QuantConfig{Format: f, Group: []int{32, 64}[n%2], KAxis: ax, Residual: res}
					name := fmt.Sprintf("%v/%s/%s/r%d/L%d", layout, f, ax, res, L)
					t.Run(name, func(t *testing.T) {
						checkRealQuantCache(t, layout, qcfg, []cache.ElemType{cache.Float16, cache.Float32}[n%2], kvh, d, L, n)
					})
				}
			}
		}
	}
}

func checkRealQuantCache(t *testing.T, layout cache.Layout, qcfg cache.QuantConfig, elem cache.ElemType, kvh, d, L, seed int) {
	a, err := cache.NewArena(0)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	const batch, qHeads = 2, 8
	mk := func(q cache.QuantConfig) *cache.KVCache {
		// a quantized paged cache's blocks are its sealed chunks
		c, err := cache.New(a, cache.Config{Batch: batch, KVHeads: kvh, HeadDimK: d, Capacity: L, Elem: elem,
			Layout: layout, BlockSize: qcfg.Group, Quant: q})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	qc, fc := mk(qcfg), mk(cache.QuantConfig{})
	defer qc.Close()
	defer fc.Close()
	rng := rand.New(rand.NewPCG(uint64(seed), 3))
	for done := 0; done < L; {
		step := min(L-done, 1+rng.IntN(50))
		buf := make([]byte, batch*kvh*step*d*4)
		vbuf := make([]byte, len(buf))
		for _, b := range [][]byte{buf, vbuf} {
			for i := 0; i < len(b); i += 4 {
				binary.LittleEndian.PutUint32(b[i:], math.Float32bits(3.4*rng.Float32()-1.7))
			}
		}
		for _, c := range []*cache.KVCache{qc, fc} {
			if err := c.Append(buf, vbuf, cache.Float32, step, nil); err != nil {
				t.Fatal(err)
			}
		}
		done += step
	}
	for _, qLen := range []int{1, 4} {
		q := randVec(rng, batch*qHeads*qLen*d, 1)
		want := make([]float32, len(q))
		f32 := make([]float32, len(q))
		fv, err := fc.BeginRead()
		if err != nil {
			t.Fatal(err)
		}
		err = ReferenceAttention(f32, q, qLen, qHeads, fv, Options{})
		fc.EndRead()
		if err != nil {
			t.Fatal(err)
		}
		qv, err := qc.BeginRead()
		if err != nil {
			t.Fatal(err)
		}
		before := qc.Counters().AttentionBytes
		if err := ReferenceAttention(want, q, qLen, qHeads, qv, Options{}); err != nil {
			qc.EndRead()
			t.Fatal(err)
		}
		refRead := qc.Counters().AttentionBytes - before
		if e, b := maxAbsDiff(want, f32), quantVsF32Bound[qcfg.Format]; !(e <= b) {
			t.Errorf("q_len %d: dequantized attention differs from float32 by %.3g, bound %.3g", qLen, e, b)
		}
		_, paths := KernelPaths()
		got := make([]float32, len(q))
		tol := intLoopTol(tolerance[elem], qcfg.Format, qcfg.KAxis, d, d, qcfg.Group) // the integer loops on the paths that have them
		for _, path := range paths {
			if err := SetKernel(path); err != nil {
				t.Fatal(err)
			}
			before := qc.Counters().AttentionBytes
			if err := Attention(got, q, qLen, qHeads, qv, Options{}); err != nil {
				t.Fatalf("path %s: %v", path, err)
			}
			if r := qc.Counters().AttentionBytes - before; r != refRead {
				t.Errorf("path %s q_len %d: attention bytes %d, reference read %d", path, qLen, r, refRead)
			}
			for i := range got {
				if d := math.Abs(float64(got[i]) - float64(want[i])); !(d <= tol[0]+tol[1]*math.Abs(float64(want[i]))) {
					t.Fatalf("path %s q_len %d: element %d = %v, want %v", path, qLen, i, got[i], want[i])
				}
			}
		}
		qc.EndRead()
		restoreKernel(t)
	}
}

// TestQuantScalesStream: the contiguous layout stores each head's chunk
// scales one after the other (scalesStream holds for consecutive sealed
// chunks of a head, K per channel and per token), the paged layout's chunk
// blocks lie apart (it does not), so the kernel prefetches the next
// super-block's scales only there.
func TestQuantScalesStream(t *testing.T) {
	const kvh, d, L = 2, 128, 300
	for _, layout := range []cache.Layout{cache.Contiguous, cache.Paged} {
		for _, f := range quantFormats {
			for _, ax := range kAxes {
				a, err := cache.NewArena(0)
				if err != nil {
					t.Fatal(err)
				}
				c, err := cache.New(a, cache.Config{Batch: 1, KVHeads: kvh, HeadDimK: d, Capacity: L, Elem: cache.Float16,
					Layout: layout, BlockSize: 32, Quant: cache.QuantConfig{Format: f, Group: 32, KAxis: ax, Residual: 16}})
				if err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, kvh*L*d*4)
				for i := 0; i < len(buf); i += 4 {
					binary.LittleEndian.PutUint32(buf[i:], math.Float32bits(float32(i%37)/37-0.5))
				}
				if err := c.Append(buf, buf, cache.Float32, L, nil); err != nil {
					t.Fatal(err)
				}
				v, err := c.BeginRead()
				if err != nil {
					t.Fatal(err)
				}
				for h := 0; h < kvh; h++ {
					segs := v.AppendSegments(nil, 0, h, 0, L)
					checked := 0
					for i := 0; i+1 < len(segs); i++ {
						if segs[i+1].Q.Format == cache.QuantNone {
							break
						}
						want := layout == cache.Contiguous
						if got := scalesStream(&segs[i].Q, &segs[i+1].Q); got != want {
							t.Errorf("%v %s %s head %d chunks %d, %d: scalesStream = %v, want %v", layout, f, ax, h, i, i+1, got, want)
						}
						checked++
					}
					if checked < 5 {
						t.Errorf("%v %s %s: only %d pairs of sealed chunks", layout, f, ax, checked)
					}
				}
				c.EndRead()
				c.Close()
				a.Close()
			}
		}
	}
}
