package cpu

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// TestAttentionPrefill checks tiled long-query attention against the
// reference run one query row at a time on the matching cache prefix (row i
// of sequence b attends positions 0 .. L_b - qLen + i), for q_len around
// the tile size, GQA layouts, storage types, windows and ragged batches.
func TestAttentionPrefill(t *testing.T) {
	cases := []struct {
		elem        cache.ElemType
		qHeads, kvh int
		dk, dv      int
		lens        []int
		qLen        int
		opts        Options
	}{
		{cache.Float32, 4, 2, 16, 16, []int{17}, 17, Options{}},
		{cache.Float32, 4, 2, 16, 16, []int{40}, 33, Options{}},
		{cache.Float32, 8, 2, 32, 24, []int{100, 70}, 64, Options{}},
		{cache.Float16, 4, 4, 64, 64, []int{50}, 50, Options{Softcap: 5}},
		{cache.BFloat16, 6, 3, 16, 16, []int{90, 120}, 45, Options{Window: 20}},
		{cache.Float32, 2, 1, 8, 8, []int{5}, 5, Options{}},
		{cache.Float32, 8, 2, 32, 32, []int{300}, 40, Options{Threads: 1}},
		{cache.Float32, 8, 2, 32, 32, []int{300, 200}, 40, Options{Threads: 2}},
		{cache.Float16, 8, 1, 64, 64, []int{900}, 4, Options{Threads: 2}},
	}
	for ci, c := range cases {
		rng := rand.New(rand.NewPCG(uint64(ci), 11))
		tv := newTestView(rng, c.elem, c.kvh, c.dk, c.dv, c.lens)
		units := len(c.lens) * c.qHeads
		q := randVec(rng, units*c.qLen*c.dk, 1)
		got := make([]float32, units*c.qLen*c.dv)
		if err := AttentionPrefill(got, q, c.qLen, c.qHeads, tv, c.opts); err != nil {
			t.Fatalf("case %d: %v", ci, err)
		}
		row := make([]float32, units*c.dk)
		want := make([]float32, units*c.dv)
		pv := &prefixView{View: tv}
		tol := tolerance[c.elem]
		for i := 0; i < c.qLen; i++ {
			for u := 0; u < units; u++ {
				copy(row[u*c.dk:(u+1)*c.dk], q[(u*c.qLen+i)*c.dk:])
			}
			pv.cut = c.qLen - 1 - i
			if err := ReferenceAttention(want, row, 1, c.qHeads, pv, c.opts); err != nil {
				t.Fatalf("case %d row %d: reference: %v", ci, i, err)
			}
			for u := 0; u < units; u++ {
				for j := 0; j < c.dv; j++ {
					g, w := got[(u*c.qLen+i)*c.dv+j], want[u*c.dv+j]
					if d := math.Abs(float64(g - w)); !(d <= tol[0]+tol[1]*math.Abs(float64(w))) {
						t.Fatalf("case %d row %d unit %d elem %d: %v, want %v", ci, i, u, j, g, w)
					}
				}
			}
		}
	}
}

func TestAttentionPrefillErrors(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	tv := newTestView(rng, cache.Float32, 2, 8, 8, []int{20})
	q := make([]float32, 2*30*8)
	dst := make([]float32, 2*30*8)
	if err := AttentionPrefill(dst, q, 30, 2, tv, Options{}); err == nil {
		t.Error("q_len beyond the cached length: no error")
	}
	if err := AttentionPrefill(dst, q, 0, 2, tv, Options{}); err == nil {
		t.Error("q_len 0: no error")
	}
	if err := AttentionPrefill(dst[:7], q[:2*20*8], 20, 2, tv, Options{}); err == nil {
		t.Error("short dst: no error")
	}
	if err := AttentionPrefill(dst, q, 20, 2, nil, Options{}); err == nil {
		t.Error("nil view: no error")
	}
}
