package runtime

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
)

// TestCachePlanSharesTheWeightPacks: the cache path's plan, built after the
// tensor path's with the same ops.Packs, packs no weight again (before, a
// session held every packed weight twice, besides the initializer).
func TestCachePlanSharesTheWeightPacks(t *testing.T) {
	// One Attention layer with a past (rewritten for the cache path) whose
	// output goes through a projection with a constant weight.
	type vi = *onnxpb.ValueInfoProto
	w := make([]float32, 8*8)
	for i := range w {
		w[i] = float32(i%5) - 2
	}
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("Attention", []string{"q", "k", "v", "", "past_key_values.0.key", "past_key_values.0.value"},
			[]string{"y", "present.0.key", "present.0.value"}, onnxtest.AttrInt("is_causal", 1)),
		onnxtest.Node("MatMul", []string{"y", "w"}, []string{"z"}),
	}
	inputs := []vi{onnxtest.Info("q", 1, 1, 4, -1, 8), onnxtest.Info("k", 1, 1, 2, -1, 8), onnxtest.Info("v", 1, 1, 2, -1, 8),
		onnxtest.Info("past_key_values.0.key", 1, 1, 2, -1, 8), onnxtest.Info("past_key_values.0.value", 1, 1, 2, -1, 8)}
	outputs := []vi{onnxtest.Info("z", 1, 1, 4, -1, 8),
		onnxtest.Info("present.0.key", 1, 1, 2, -1, 8), onnxtest.Info("present.0.value", 1, 1, 2, -1, 8)}
	g := onnxtest.Graph(nodes, inputs, outputs, onnxtest.Floats("w", []int64{8, 8}, w))
	m, err := model.LoadBytes(onnxtest.Bytes(onnxtest.Model(23, g, nil)), model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	packs := ops.NewPacks()
	if _, err := buildPlan(m, true, packs); err != nil {
		t.Fatal(err)
	}
	n := packs.Len()
	if n == 0 {
		t.Fatal("the tensor path's plan packed no weight")
	}
	cp, err := newCachePath(m, nil, packs)
	if err != nil {
		t.Fatal(err)
	}
	if cp.plan == nil {
		t.Fatal("the decoder was not rewritten for the cache path")
	}
	if packs.Len() != n {
		t.Fatalf("the cache path's plan made %d packs of its own (tensor path: %d)", packs.Len()-n, n)
	}
	// Without shared packs each plan makes its own.
	alone := ops.NewPacks()
	if _, err := newCachePath(m, nil, alone); err != nil {
		t.Fatal(err)
	}
	if alone.Len() != n {
		t.Fatalf("the cache path's plan alone made %d packs, want the tensor path's %d", alone.Len(), n)
	}
}
