package runtime

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func opTypes(p *Plan) string {
	var ops []string
	for _, n := range p.Nodes {
		ops = append(ops, n.OpType)
	}
	return strings.Join(ops, " ")
}

// fusedPair builds model b twice, with fusion (the session a user gets)
// and as the reference without folding or fusion, and fails the test when
// node's presence in the fused plan is not fused or, when fused, any of
// the chain's op types in leftovers is still in the plan. It returns both
// sessions.
func fusedPair(t *testing.T, name string, b []byte, node string, fused bool, leftovers ...string) (s, ref *Session) {
	t.Helper()
	s, err := NewSessionFromBytes(b, Options{Threads: 1})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	plan := opTypes(s.Plan())
	if got := strings.Contains(plan, node); got != fused {
		t.Fatalf("%s: fused = %v, want %v (plan %s)", name, got, fused, plan)
	}
	for _, op := range leftovers {
		if fused && strings.Contains(plan, op) {
			t.Errorf("%s: chain node %q left in the plan: %s", name, op, plan)
		}
	}
	ref, err = NewSessionFromBytes(b, Options{Threads: 1, DisableFolding: true})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return s, ref
}

func constNode(out string, v ...int64) *onnxpb.NodeProto {
	return onnxtest.Node("Constant", nil, []string{out}, onnxtest.AttrTensor("value", onnxtest.Int64s(out, []int64{int64(len(v))}, v)))
}

// TestFoldPlan: what folding removes and what it must keep, and that the
// folded graph computes what the graph as written computes.
func TestFoldPlan(t *testing.T) {
	x := onnxtest.Info("x", 1, 2, 3)
	cases := []struct {
		name    string
		nodes   []*onnxpb.NodeProto
		inputs  []vi
		outputs []vi
		inits   []*onnxpb.TensorProto
		want    string // op types left, in order
	}{
		{name: "constant chain folds",
			nodes: []*onnxpb.NodeProto{constNode("c", 2, 3), onnxtest.Node("Reshape", []string{"w", "c"}, []string{"w2"}),
				onnxtest.Node("Add", []string{"x", "w2"}, []string{"y"})},
			inputs: []vi{x}, outputs: []vi{onnxtest.Info("y", 1, 2, 3)},
			inits: []*onnxpb.TensorProto{onnxtest.Floats("w", []int64{6}, []float32{1, 2, 3, 4, 5, 6})},
			want:  "Add"},
		{name: "identity and no-op cast dropped",
			nodes: []*onnxpb.NodeProto{onnxtest.Node("Identity", []string{"x"}, []string{"a"}),
				onnxtest.Node("Cast", []string{"a"}, []string{"b"}, onnxtest.AttrInt("to", 1)),
				onnxtest.Node("Relu", []string{"b"}, []string{"y"})},
			inputs: []vi{x}, outputs: []vi{onnxtest.Info("y", 1, 2, 3)},
			want: "Relu"},
		{name: "identity producing a graph output kept",
			nodes: []*onnxpb.NodeProto{onnxtest.Node("Relu", []string{"x"}, []string{"a"}),
				onnxtest.Node("Identity", []string{"a"}, []string{"y"})},
			inputs: []vi{x}, outputs: []vi{onnxtest.Info("y", 1, 2, 3)},
			want: "Relu Identity"},
		{name: "cast of a value of unknown type kept (passes through at run time)",
			nodes: []*onnxpb.NodeProto{onnxtest.Node("Relu", []string{"x"}, []string{"a"}),
				onnxtest.Node("Cast", []string{"a"}, []string{"b"}, onnxtest.AttrInt("to", 1)),
				onnxtest.Node("Neg", []string{"b"}, []string{"y"})},
			inputs: []vi{x}, outputs: []vi{onnxtest.Info("y", 1, 2, 3)},
			want: "Relu Cast Neg"},
		{name: "converting cast kept",
			nodes:  []*onnxpb.NodeProto{onnxtest.Node("Cast", []string{"x"}, []string{"y"}, onnxtest.AttrInt("to", 7))},
			inputs: []vi{x}, outputs: []vi{onnxtest.Info("y", 7, 2, 3)},
			want: "Cast"},
		{name: "constant graph output kept",
			nodes:  []*onnxpb.NodeProto{constNode("c", 1, 2), onnxtest.Node("Neg", []string{"c"}, []string{"y"})},
			inputs: nil, outputs: []vi{onnxtest.Info("y", 7, 2)},
			want: "Neg"},
		{name: "random op kept",
			nodes: []*onnxpb.NodeProto{onnxtest.Node("Dropout", []string{"w"}, []string{"r"}),
				onnxtest.Node("Add", []string{"x", "r"}, []string{"y"})},
			inputs: []vi{x}, outputs: []vi{onnxtest.Info("y", 1, 2, 3)},
			inits: []*onnxpb.TensorProto{onnxtest.Floats("w", []int64{3}, []float32{1, 2, 3})},
			want:  "Dropout Add"},
		{name: "overridable initializer not a constant",
			nodes:   []*onnxpb.NodeProto{onnxtest.Node("Neg", []string{"w"}, []string{"n"}), onnxtest.Node("Add", []string{"x", "n"}, []string{"y"})},
			inputs:  []vi{x, onnxtest.Info("w", 1, 3)},
			outputs: []vi{onnxtest.Info("y", 1, 2, 3)},
			inits:   []*onnxpb.TensorProto{onnxtest.Floats("w", []int64{3}, []float32{1, 2, 3})},
			want:    "Neg Add"},
		{name: "feed-dependent node kept",
			nodes:  []*onnxpb.NodeProto{constNode("c", 6), onnxtest.Node("Reshape", []string{"x", "c"}, []string{"y"})},
			inputs: []vi{x}, outputs: []vi{onnxtest.Info("y", 1, 6)},
			want: "Reshape"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := onnxtest.Model(17, onnxtest.Graph(c.nodes, c.inputs, c.outputs, c.inits...), nil)
			folded, err := NewSessionFromBytes(onnxtest.Bytes(m), Options{Threads: 1})
			if err != nil {
				t.Fatal(err)
			}
			asWritten, err := NewSessionFromBytes(onnxtest.Bytes(m), Options{Threads: 1, DisableFolding: true})
			if err != nil {
				t.Fatal(err)
			}
			if got := opTypes(folded.Plan()); got != c.want {
				t.Errorf("folded plan runs %q, want %q", got, c.want)
			}
			if len(asWritten.Plan().Nodes) != len(c.nodes) {
				t.Errorf("DisableFolding plan has %d nodes, want %d", len(asWritten.Plan().Nodes), len(c.nodes))
			}
			feeds := map[string]*tensor.Tensor{}
			if len(c.inputs) > 0 {
				feeds["x"] = f32(t, tensor.Shape{2, 3}, -1, 2, -3, 4, -5, 6)
			}
			got, _, err := folded.Run(feeds, nil)
			if err != nil {
				t.Fatal(err)
			}
			want, _, err := asWritten.Run(feeds, nil)
			if err != nil {
				t.Fatal(err)
			}
			if g, w := got[0].String(), want[0].String(); g != w {
				t.Errorf("folded %s, as written %s", g, w)
			}
		})
	}
}

// TestShapeCacheExact drives the exported-style decoder through prefills
// and growing decodes whose geometry changes in every way the feeds allow
// (past length, new tokens, batch), and checks every output bit for bit
// against the graph run as written.
func TestShapeCacheExact(t *testing.T) {
	cfg := exportedConfig{layers: 2, hidden: 16, heads: 2, headDim: 8, vocab: 32}
	data := onnxtest.Bytes(exportedDecoder(cfg, 3))
	fast, err := NewSessionFromBytes(data, Options{Threads: 2, Profile: true})
	if err != nil {
		t.Fatal(err)
	}
	ref, err := NewSessionFromBytes(data, Options{Threads: 2, DisableFolding: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(fast.Plan().Nodes) >= len(ref.Plan().Nodes) {
		t.Fatalf("folding removed nothing: %d nodes", len(fast.Plan().Nodes))
	}
	rng := rand.New(rand.NewSource(4))
	// (past, seq) per run: prefill, decode steps, a repeated geometry, a
	// new prompt, an empty past again.
	steps := [][2]int{{0, 5}, {5, 1}, {6, 1}, {7, 1}, {7, 1}, {0, 3}, {3, 2}, {0, 5}, {5, 1}}
	for i, st := range steps {
		feeds := exportedFeeds(cfg, rng, st[0], st[1])
		got, stats, err := fast.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		want, _, err := ref.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k := range want {
			if g, w := got[k].String(), want[k].String(); g != w {
				t.Fatalf("run %d (past %d, seq %d), output %s: %s, want %s", i, st[0], st[1], fast.Outputs()[k].Name, g, w)
			}
		}
		if i == 4 && len(stats.Events) >= len(fast.Plan().Nodes) {
			t.Errorf("repeated geometry: %d of %d nodes ran, the shape cache skipped none", len(stats.Events), len(fast.Plan().Nodes))
		}
	}
}

// TestShapeCacheBatch: a batch change invalidates the values derived from
// the batch size (and only the run's own values are reused).
func TestShapeCacheBatch(t *testing.T) {
	// y = Reshape(x, Concat(Shape(x)[0], -1)): the target follows the batch.
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("Shape", []string{"x"}, []string{"s"}),
		constNode("i0", 0),
		onnxtest.Node("Gather", []string{"s", "i0"}, []string{"b"}, onnxtest.AttrInt("axis", 0)),
		constNode("m1", -1),
		onnxtest.Node("Concat", []string{"b", "m1"}, []string{"t"}, onnxtest.AttrInt("axis", 0)),
		onnxtest.Node("Reshape", []string{"x", "t"}, []string{"y"}),
	}
	g := onnxtest.Graph(nodes, []vi{onnxtest.Info("x", 1, -1, -1, -1)}, []vi{onnxtest.Info("y", 1, -1, -1)})
	s, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(17, g, nil)), Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	for _, shape := range []tensor.Shape{{2, 3, 4}, {2, 3, 4}, {3, 2, 4}, {2, 3, 4}, {4, 1, 1}} {
		x, _ := tensor.New(tensor.Float32, shape)
		out, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fmt.Sprint(out[0].Shape()), fmt.Sprint(tensor.Shape{shape[0], shape[1] * shape[2]}); got != want {
			t.Errorf("x %v: y has shape %s, want %s", shape, got, want)
		}
	}
}

// TestShapeCacheAfterFailedRun: a run that fails half-way forgets the shape
// cache, so later runs (same geometry as before, or new) compute right.
func TestShapeCacheAfterFailedRun(t *testing.T) {
	// y = Reshape(x, Concat(Shape(x)[0], 5)): fails unless x has 5 values per row.
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("Shape", []string{"x"}, []string{"s"}),
		constNode("i0", 0),
		onnxtest.Node("Gather", []string{"s", "i0"}, []string{"b"}, onnxtest.AttrInt("axis", 0)),
		constNode("five", 5),
		onnxtest.Node("Concat", []string{"b", "five"}, []string{"t"}, onnxtest.AttrInt("axis", 0)),
		onnxtest.Node("Reshape", []string{"x", "t"}, []string{"y"}),
	}
	g := onnxtest.Graph(nodes, []vi{onnxtest.Info("x", 1, -1, -1)}, []vi{onnxtest.Info("y", 1, -1, -1)})
	s, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(17, g, nil)), Options{Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		shape tensor.Shape
		fails bool
	}{{tensor.Shape{2, 5}, false}, {tensor.Shape{2, 3}, true}, {tensor.Shape{2, 5}, false},
		{tensor.Shape{4, 3}, true}, {tensor.Shape{3, 5}, false}, {tensor.Shape{3, 5}, false}}
	for i, c := range cases {
		x, _ := tensor.New(tensor.Float32, c.shape)
		out, _, err := s.Run(map[string]*tensor.Tensor{"x": x}, nil)
		if c.fails {
			if err == nil {
				t.Fatalf("run %d: x %v: no error", i, c.shape)
			}
			continue
		}
		if err != nil {
			t.Fatalf("run %d: x %v: %v", i, c.shape, err)
		}
		if got, want := fmt.Sprint(out[0].Shape()), fmt.Sprint(tensor.Shape{c.shape[0], 5}); got != want {
			t.Errorf("run %d: x %v: y has shape %s, want %s", i, c.shape, got, want)
		}
	}
}
