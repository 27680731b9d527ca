package runtime

import (
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// exportedConfig sizes exportedDecoder.
type exportedConfig struct {
	layers, hidden, heads, headDim, vocab int
	// qWeight multiplies q by a per-channel weight vector just before the
	// scores' MatMul (a query norm's weight with no rotary after it, as in
	// NoPE layers); headBias adds a per-head bias to the mask (as ALiBi
	// does), declared [batch, heads, S, T] in the graph's value_info.
	qWeight, headBias bool
	// presentConcat names the past/new Concat's output the present (as the
	// exporters whose layers the cache path rewrites do) instead of an
	// Identity of it.
	presentConcat bool
}

// exportedDecoder builds a decoder graph in the style of the TorchScript and
// optimum exports: every reshape target is computed from Shape/Gather/
// Unsqueeze/Concat chains, the causal mask is built from Range/Less/Where on
// the past and input lengths, constants come as Constant nodes, and there
// are Identity and no-op Cast nodes. Inputs: input_ids [B, S] int64,
// attention_mask [B, P+S] int64, past_key_values.<l>.key/value [B, H, P, D];
// outputs: logits [B, S, vocab] and present.<l>.key/value [B, H, P+S, D].
func exportedDecoder(cfg exportedConfig, seed int64) *onnxpb.ModelProto {
	rng := rand.New(rand.NewSource(seed))
	var nodes []*onnxpb.NodeProto
	var inits []*onnxpb.TensorProto
	id := 0
	fresh := func(p string) string { id++; return fmt.Sprintf("%s_%d", p, id) }
	node := func(op string, in []string, attrs ...*onnxpb.AttributeProto) string {
		out := fresh(op)
		nodes = append(nodes, onnxtest.Node(op, in, []string{out}, attrs...))
		return out
	}
	constI := func(v ...int64) string {
		out := fresh("const")
		t := onnxtest.Int64s(out, []int64{int64(len(v))}, v)
		nodes = append(nodes, onnxtest.Node("Constant", nil, []string{out}, onnxtest.AttrTensor("value", t)))
		return out
	}
	scalarI := func(v int64) string {
		out := fresh("scalar")
		t := onnxtest.Int64s(out, nil, []int64{v})
		nodes = append(nodes, onnxtest.Node("Constant", nil, []string{out}, onnxtest.AttrTensor("value", t)))
		return out
	}
	weight := func(rows, cols int) string {
		name := fresh("w")
		v := make([]float32, rows*cols)
		for i := range v {
			v[i] = float32(rng.NormFloat64()) / float32(math.Sqrt(float64(rows)))
		}
		inits = append(inits, onnxtest.Floats(name, []int64{int64(rows), int64(cols)}, v))
		return name
	}
	const float, int64T = 1, 7
	e, h, d := cfg.hidden, cfg.heads, cfg.headDim
	emb := weight(cfg.vocab, e)
	x := node("Gather", []string{emb, "input_ids"})
	x = node("Identity", []string{x})
	// Mask: positions 0..T-1 against query rows P..P+S-1, plus padding.
	ids := node("Shape", []string{"input_ids"})
	seq := node("Gather", []string{ids, scalarI(1)}, onnxtest.AttrInt("axis", 0))
	pastShape := node("Shape", []string{"past_key_values.0.key"})
	past := node("Gather", []string{pastShape, scalarI(2)}, onnxtest.AttrInt("axis", 0))
	total := node("Add", []string{past, seq})
	cols := node("Range", []string{scalarI(0), total, scalarI(1)})
	rows := node("Range", []string{past, total, scalarI(1)})
	rows = node("Unsqueeze", []string{rows, constI(1)})
	causal := node("LessOrEqual", []string{cols, rows})
	pad := node("Cast", []string{"attention_mask"}, onnxtest.AttrInt("to", 9))
	pad = node("Unsqueeze", []string{pad, constI(1, 2)})
	allowed := node("And", []string{causal, pad})
	zero := fresh("zero")
	inits = append(inits, onnxtest.Floats(zero, nil, []float32{0}))
	neg := fresh("neg")
	inits = append(inits, onnxtest.Floats(neg, nil, []float32{-1e9}))
	mask := node("Where", []string{allowed, zero, neg})
	mask = node("Cast", []string{mask}, onnxtest.AttrInt("to", float)) // no-op Cast
	var declared []*onnxpb.ValueInfoProto
	if cfg.headBias {
		slopes := make([]float32, h)
		for i := range slopes {
			slopes[i] = -0.5 * float32(i+1)
		}
		bias := fresh("head_bias")
		inits = append(inits, onnxtest.Floats(bias, []int64{1, int64(h), 1, 1}, slopes))
		mask = node("Add", []string{mask, bias})
		declared = append(declared, onnxtest.Info(mask, float, -1, int64(h), -1, -1))
	}
	var outputs []*onnxpb.ValueInfoProto
	for l := 0; l < cfg.layers; l++ {
		xs := node("Shape", []string{x})
		b := node("Unsqueeze", []string{node("Gather", []string{xs, scalarI(0)}, onnxtest.AttrInt("axis", 0)), constI(0)})
		s := node("Unsqueeze", []string{node("Gather", []string{xs, scalarI(1)}, onnxtest.AttrInt("axis", 0)), constI(0)})
		heads := node("Concat", []string{b, s, constI(int64(h)), constI(int64(d))}, onnxtest.AttrInt("axis", 0))
		proj := func() string {
			p := node("MatMul", []string{x, weight(e, h*d)})
			p = node("Reshape", []string{p, heads})
			return node("Transpose", []string{p}, onnxtest.AttrInts("perm", 0, 2, 1, 3))
		}
		q, k, v := proj(), proj(), proj()
		if cfg.qWeight {
			w := fresh("q_norm_weight")
			vec := make([]float32, d)
			for i := range vec {
				vec[i] = 0.5 + float32(i)/float32(d)
			}
			inits = append(inits, onnxtest.Floats(w, []int64{int64(d)}, vec))
			q = node("Mul", []string{q, w})
		}
		pk, pv := fmt.Sprintf("past_key_values.%d.key", l), fmt.Sprintf("past_key_values.%d.value", l)
		kv := [2]string{}
		for i, pair := range [][2]string{{pk, k}, {pv, v}} {
			name := fmt.Sprintf("present.%d.%s", l, []string{"key", "value"}[i])
			if cfg.presentConcat {
				nodes = append(nodes, onnxtest.Node("Concat", pair[:], []string{name}, onnxtest.AttrInt("axis", 2)))
				kv[i] = name
			} else {
				kv[i] = node("Concat", pair[:], onnxtest.AttrInt("axis", 2))
				nodes = append(nodes, onnxtest.Node("Identity", []string{kv[i]}, []string{name}))
			}
			outputs = append(outputs, onnxtest.Info(name, float, -1, int64(h), -1, int64(d)))
		}
		k, v = kv[0], kv[1]
		kt := node("Transpose", []string{k}, onnxtest.AttrInts("perm", 0, 1, 3, 2))
		sc := node("MatMul", []string{q, kt})
		scale := fresh("scale")
		inits = append(inits, onnxtest.Floats(scale, nil, []float32{float32(1 / math.Sqrt(float64(d)))}))
		sc = node("Mul", []string{sc, scale})
		sc = node("Add", []string{sc, mask})
		p := node("Softmax", []string{sc}, onnxtest.AttrInt("axis", -1))
		o := node("MatMul", []string{p, v})
		o = node("Transpose", []string{o}, onnxtest.AttrInts("perm", 0, 2, 1, 3))
		flat := node("Concat", []string{b, s, constI(int64(h * d))}, onnxtest.AttrInt("axis", 0))
		o = node("Reshape", []string{o, flat})
		o = node("MatMul", []string{o, weight(h*d, e)})
		x = node("Add", []string{x, o})
	}
	logits := node("MatMul", []string{x, weight(e, cfg.vocab)})
	nodes = append(nodes, onnxtest.Node("Identity", []string{logits}, []string{"logits"}))
	outputs = append([]*onnxpb.ValueInfoProto{onnxtest.Info("logits", float, -1, -1, int64(cfg.vocab))}, outputs...)
	inputs := []*onnxpb.ValueInfoProto{onnxtest.Info("input_ids", int64T, -1, -1), onnxtest.Info("attention_mask", int64T, -1, -1)}
	for l := 0; l < cfg.layers; l++ {
		for _, kv := range []string{"key", "value"} {
			inputs = append(inputs, onnxtest.Info(fmt.Sprintf("past_key_values.%d.%s", l, kv), float, -1, int64(h), -1, int64(d)))
		}
	}
	g := onnxtest.Graph(nodes, inputs, outputs, inits...)
	g.ValueInfo = declared
	return onnxtest.Model(17, g, nil)
}

// exportedFeeds returns the feeds of one step of exportedDecoder with a
// past of past tokens and seq new tokens (batch 1); the past values and ids
// are drawn from rng.
func exportedFeeds(cfg exportedConfig, rng *rand.Rand, past, seq int) map[string]*tensor.Tensor {
	feeds := map[string]*tensor.Tensor{}
	ids := make([]int64, seq)
	for i := range ids {
		ids[i] = rng.Int63n(int64(cfg.vocab))
	}
	feeds["input_ids"], _ = tensor.FromSlice(tensor.Shape{1, seq}, ids)
	mask := make([]int64, past+seq)
	for i := range mask {
		mask[i] = 1
	}
	feeds["attention_mask"], _ = tensor.FromSlice(tensor.Shape{1, past + seq}, mask)
	for l := 0; l < cfg.layers; l++ {
		for _, kv := range []string{"key", "value"} {
			v := make([]float32, cfg.heads*past*cfg.headDim)
			for i := range v {
				v[i] = float32(rng.NormFloat64())
			}
			feeds[fmt.Sprintf("past_key_values.%d.%s", l, kv)], _ = tensor.FromSlice(tensor.Shape{1, cfg.heads, past, cfg.headDim}, v)
		}
	}
	return feeds
}

// benchExported is a tiny exported-style decoder: 4 layers, hidden 64.
var benchExported = exportedConfig{layers: 4, hidden: 64, heads: 4, headDim: 16, vocab: 256}

// BenchmarkExportedDecodeStep runs decode steps (one new token, a past of
// 32 tokens) of a shape-heavy exported-style decoder: its cost is mostly
// the executor's per-node work.
func BenchmarkExportedDecodeStep(b *testing.B) {
	for _, threads := range []int{1, 2} {
		b.Run(fmt.Sprintf("threads=%d", threads), func(b *testing.B) {
			s, err := NewSessionFromBytes(onnxtest.Bytes(exportedDecoder(benchExported, 1)), Options{Threads: threads})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			feeds := exportedFeeds(benchExported, rand.New(rand.NewSource(2)), 32, 1)
			b.ReportAllocs()
			for b.Loop() {
				outs, _, err := s.Run(feeds, nil)
				if err != nil {
					b.Fatal(err)
				}
				s.DefaultState().Release(outs...)
			}
			b.ReportMetric(float64(len(s.Plan().Nodes)), "nodes")
		})
	}
}
