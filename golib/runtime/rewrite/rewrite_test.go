package rewrite

import (
	"errors"
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func TestFindPairs(t *testing.T) {
	g := func(ins, outs []string) *model.Graph {
		gr := &model.Graph{Initializers: map[string]*tensor.Tensor{}}
		for _, n := range ins {
			gr.Inputs = append(gr.Inputs, model.ValueInfo{Name: n})
		}
		for _, n := range outs {
			gr.Outputs = append(gr.Outputs, model.ValueInfo{Name: n})
		}
		return gr
	}
	cases := []struct {
		name       string
		ins, outs  []string
		given      map[string]string
		want       [][4]string // pastK, pastV, presK, presV per layer
		incomplete bool
	}{
		{"exporter names", []string{"ids", "past_key_values.1.key", "past_key_values.1.value", "past_key_values.0.key", "past_key_values.0.value"},
			[]string{"logits", "present.0.key", "present.0.value", "present.1.key", "present.1.value"}, nil,
			[][4]string{{"past_key_values.0.key", "past_key_values.0.value", "present.0.key", "present.0.value"},
				{"past_key_values.1.key", "past_key_values.1.value", "present.1.key", "present.1.value"}}, false},
		{"by position", []string{"ids", "past_k0", "past_v0"}, []string{"y", "present_k0", "present_v0"}, nil,
			[][4]string{{"past_k0", "past_v0", "present_k0", "present_v0"}}, false},
		{"caller map", []string{"ids", "kc", "vc"}, []string{"y", "ko", "vo"}, map[string]string{"kc": "ko", "vc": "vo"},
			[][4]string{{"kc", "vc", "ko", "vo"}}, false},
		{"value twin missing", []string{"past_key_values.0.key"}, []string{"present.0.key"}, nil,
			[][4]string{{"past_key_values.0.key", "past_key_values.0.value", "present.0.key", ""}}, true},
		{"no pasts", []string{"ids"}, []string{"logits"}, nil, nil, false},
	}
	for _, c := range cases {
		ps, err := findPairs(g(c.ins, c.outs), c.given)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(ps) != len(c.want) {
			t.Fatalf("%s: %d pairs, want %d", c.name, len(ps), len(c.want))
		}
		for i, p := range ps {
			got := [4]string{p.pastK, p.pastV, p.presK, p.presV}
			if got != c.want[i] || (p.reason != "") != c.incomplete {
				t.Errorf("%s: pair %d = %v (reason %q), want %v", c.name, i, got, p.reason, c.want[i])
			}
		}
	}
	if _, err := findPairs(g([]string{"a"}, []string{"b"}), map[string]string{"x": "b"}); err == nil {
		t.Error("a pair map naming no input: no error")
	}
}

func TestResolveReshape(t *testing.T) {
	cases := []struct {
		in     []int
		target []int64
		want   []int
		ok     bool
	}{
		{[]int{2, 4, 7, 8}, []int64{-1, 7, 8}, []int{8, 7, 8}, true},
		{[]int{2, 4, 7, 8}, []int64{0, 0, -1}, []int{2, 4, 56}, true},
		{[]int{8, 8, 7}, []int64{2, 4, 8, 7}, []int{2, 4, 8, 7}, true},
		{[]int{2, 4, 7, 8}, []int64{-1, -1, 8}, nil, false},
		{[]int{2, 4, 7, 8}, []int64{3, -1}, nil, false},
		{[]int{2, 4}, []int64{9}, nil, false},
	}
	for _, c := range cases {
		got, ok := resolveReshape(c.in, c.target)
		if ok != c.ok || (ok && !equalInts(got, c.want)) {
			t.Errorf("resolveReshape(%v, %v) = %v, %v; want %v, %v", c.in, c.target, got, ok, c.want, c.ok)
		}
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestMaskVerdict checks the run-time mask check: causal plus left padding
// is accepted (with each sequence's first attended position), anything
// else is refused with errs.ErrNotImplemented.
func TestMaskVerdict(t *testing.T) {
	neg := float32(math.Inf(-1))
	const B, S, P = 2, 3, 2 // T = 5
	T := P + S
	// additive [B, 1, S, T] masks built from a rule
	build := func(attend func(b, i, t int) bool) *tensor.Tensor {
		v := make([]float32, B*S*T)
		for b := 0; b < B; b++ {
			for i := 0; i < S; i++ {
				for tt := 0; tt < T; tt++ {
					if !attend(b, i, tt) {
						v[(b*S+i)*T+tt] = neg
					}
				}
			}
		}
		m, err := tensor.FromSlice(tensor.Shape{B, 1, S, T}, v)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	firsts := []int{0, 3} // sequence 1 is left-padded by 3 positions
	held := []int{2, 0}   // the tokens the state holds of each
	causalPad := func(b, i, tt int) bool { return tt >= firsts[b] && tt <= P+i }
	cases := []struct {
		name   string
		attend func(b, i, t int) bool
		want   []int // nil: refused
		window int
	}{
		{"causal + left padding", causalPad, firsts, 0},
		{"padding queries unmasked", func(b, i, tt int) bool {
			if P+i < firsts[b] {
				return true // exporters unmask fully masked rows
			}
			return causalPad(b, i, tt)
		}, firsts, 0},
		{"bidirectional", func(b, i, tt int) bool { return tt >= firsts[b] }, nil, 0},
		{"sliding window of 2", func(b, i, tt int) bool { return causalPad(b, i, tt) && tt > P+i-2 }, firsts, 2},
		{"two windows", func(b, i, tt int) bool { return causalPad(b, i, tt) && tt > P+i-2-i%2 }, nil, 0},
		{"padding in the middle", func(b, i, tt int) bool { return causalPad(b, i, tt) && !(b == 0 && tt == 1) }, nil, 0},
	}
	k := &cacheAttention{maskMode: maskAdditive}
	g := geometry{b: B, s: S}
	for _, c := range cases {
		ctx := ops.NewContext([]*tensor.Tensor{nil, nil, nil, build(c.attend)}, nil, 1, nil)
		got, err := k.verdict(ctx, ctx.Input(3), g, P, held)
		switch {
		case c.want == nil && !errors.Is(err, errs.ErrNotImplemented):
			t.Errorf("%s: err %v, want a NotImplemented refusal", c.name, err)
		case c.want != nil && (err != nil || !equalInts(got.firsts, c.want) || got.window != c.window):
			t.Errorf("%s: %+v, %v; want %v window %d", c.name, got, err, c.want, c.window)
		}
	}
	// an additive value that is neither 0 nor blocking is refused
	bad := build(causalPad)
	bad.Float32()[0] = -3
	ctx := ops.NewContext([]*tensor.Tensor{nil, nil, nil, bad}, nil, 1, nil)
	if _, err := k.verdict(ctx, bad, g, P, held); !errors.Is(err, errs.ErrNotImplemented) {
		t.Errorf("additive value -3: err %v", err)
	}
}
