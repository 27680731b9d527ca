package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// tensorViewOf lays a testView's rows out as [batch, kv_heads, maxLen, dim]
// buffers, with NaN-like garbage (0xFF bytes) in the rows past each length,
// and returns them as a cache.TensorView.
func tensorViewOf(t *testing.T, tv *testView, maxLen int) *cache.TensorView {
	t.Helper()
	es := tv.elem.Size()
	rowK, rowV := tv.dk*es, tv.dv*es
	k := make([]byte, tv.batch*tv.kvh*maxLen*rowK)
	v := make([]byte, tv.batch*tv.kvh*maxLen*rowV)
	for i := range k {
		k[i] = 0xFF
	}
	for i := range v {
		v[i] = 0xFF
	}
	for b := 0; b < tv.batch; b++ {
		for h := 0; h < tv.kvh; h++ {
			head := b*tv.kvh + h
			copy(k[head*maxLen*rowK:], tv.k[b][h])
			copy(v[head*maxLen*rowV:], tv.v[b][h])
		}
	}
	var view cache.TensorView
	if err := view.Reset(tv.elem, tv.batch, tv.kvh, maxLen, tv.dk, tv.dv, k, v, append([]int(nil), tv.lens...)); err != nil {
		t.Fatal(err)
	}
	return &view
}

// TestAttentionOverTensorView: the streaming kernel reads a past/present
// buffer in place through cache.TensorView and gives exactly what it gives
// on the same rows behind another View, and matches the reference.
func TestAttentionOverTensorView(t *testing.T) {
	defer restoreKernel(t)
	rng := rand.New(rand.NewPCG(7, 9))
	for _, c := range []struct {
		elem       cache.ElemType
		kvh, group int
		dk, qLen   int
		lens       []int
		maxLen     int
		window     int
		softcap    float32
	}{
		{cache.Float32, 2, 4, 64, 1, []int{5, 37}, 64, 0, 0},
		{cache.Float16, 1, 8, 128, 1, []int{300}, 512, 0, 0},
		{cache.BFloat16, 4, 1, 32, 3, []int{3, 9, 17}, 20, 0, 0},
		{cache.Float32, 2, 2, 64, 2, []int{40, 2}, 48, 8, 30},
		{cache.Float16, 2, 4, 80, 1, []int{64}, 64, 0, 0},
	} {
		tv := newTestView(rng, c.elem, c.kvh, c.dk, c.dk, c.lens)
		view := tensorViewOf(t, tv, c.maxLen)
		qHeads := c.kvh * c.group
		q := make([]float32, len(c.lens)*qHeads*c.qLen*c.dk)
		for i := range q {
			q[i] = rng.Float32()*2 - 1
		}
		n := len(c.lens) * qHeads * c.qLen * c.dk
		o := Options{Window: c.window, Softcap: c.softcap}
		ref, onTest, onTensor := make([]float32, n), make([]float32, n), make([]float32, n)
		if err := ReferenceAttention(ref, q, c.qLen, qHeads, view, o); err != nil {
			t.Fatal(err)
		}
		if err := Attention(onTest, q, c.qLen, qHeads, tv, o); err != nil {
			t.Fatal(err)
		}
		if err := Attention(onTensor, q, c.qLen, qHeads, view, o); err != nil {
			t.Fatal(err)
		}
		for i := range ref {
			if onTensor[i] != onTest[i] || math.Abs(float64(onTensor[i]-ref[i])) > 2e-5 {
				t.Fatalf("%v lens %v: element %d: tensor view %v, other view %v, reference %v", c.elem, c.lens, i, onTensor[i], onTest[i], ref[i])
			}
		}
		if view.BytesRead() == 0 {
			t.Errorf("%v: no bytes counted as read", c.elem)
		}
	}
}

// TestAttentionThreadBound: Options.Threads caps a call's threads below
// the pool's; a call capped at one thread computes exactly what a
// one-thread pool computes (no split-KV merge).
func TestAttentionThreadBound(t *testing.T) {
	defer SetThreads(0)
	rng := rand.New(rand.NewPCG(3, 4))
	tv := newTestView(rng, cache.Float32, 1, 64, 64, []int{2000})
	q := make([]float32, 8*64)
	for i := range q {
		q[i] = rng.Float32() - 0.5
	}
	one, capped := make([]float32, len(q)), make([]float32, len(q))
	SetThreads(1)
	if err := Attention(one, q, 1, 8, tv, Options{}); err != nil {
		t.Fatal(err)
	}
	SetThreads(4)
	if err := Attention(capped, q, 1, 8, tv, Options{Threads: 1}); err != nil {
		t.Fatal(err)
	}
	for i := range one {
		if one[i] != capped[i] {
			t.Fatalf("element %d: %v with Threads 1, %v on a one-thread pool", i, capped[i], one[i])
		}
	}
	if err := Attention(capped, q, 1, 8, tv, Options{Threads: -1}); err == nil {
		t.Error("a negative thread bound was accepted")
	}
}
