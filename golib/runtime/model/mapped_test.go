package model

import (
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// sameLoad fails unless two loads of the same bytes agree: both failed, or
// both gave the same initializers (type, shape, values) and node count.
func sameLoad(t *testing.T, a *Model, aerr error, b *Model, berr error) {
	t.Helper()
	if (aerr == nil) != (berr == nil) {
		t.Fatalf("plain load error %v, mapped load error %v", aerr, berr)
	}
	if aerr != nil {
		return
	}
	if len(a.Graph.Nodes) != len(b.Graph.Nodes) || len(a.Graph.Initializers) != len(b.Graph.Initializers) {
		t.Fatalf("plain load: %d nodes, %d initializers; mapped: %d, %d", len(a.Graph.Nodes),
			len(a.Graph.Initializers), len(b.Graph.Nodes), len(b.Graph.Initializers))
	}
	for name, x := range a.Graph.Initializers {
		y := b.Graph.Initializers[name]
		if y == nil || x.DType() != y.DType() || !x.Shape().Equal(y.Shape()) || string(x.Bytes()) != string(y.Bytes()) {
			t.Fatalf("initializer %q differs between the plain and the mapped load", name)
		}
	}
}

// TestLoadMapped: a model file loaded mapped (its raw_data aliased) equals
// the same bytes decoded plainly, for raw initializers at every alignment,
// typed-field ones, a subgraph's, and a graph field written twice (which
// the mapped loader leaves to the plain decoding); the aligned raw tensors
// alias the file; truncated and corrupted files fail as the plain load does.
func TestLoadMapped(t *testing.T) {
	var inits []*onnxpb.TensorProto
	var nodes []*onnxpb.NodeProto
	prev := "x"
	// Names of 1-4 characters put the raw bytes at every offset mod 4.
	for i, name := range []string{"a", "bb", "ccc", "dddd", "e"} {
		inits = append(inits, onnxtest.Raw(name, 1, []int64{3}, f32raw(float32(i), 2, 3)))
		out := "y" + name
		nodes = append(nodes, onnxtest.Node("Add", []string{prev, name}, []string{out}))
		prev = out
	}
	inits = append(inits, onnxtest.Floats("f", []int64{3}, []float32{7, 8, 9}), onnxtest.Int64s("i", []int64{2}, []int64{4, 5}))
	sub := onnxtest.Graph(nil, nil, []*onnxpb.ValueInfoProto{onnxtest.Info("s", 1)},
		onnxtest.Raw("s", 1, []int64{3}, f32raw(1, 1, 1)))
	nodes = append(nodes, onnxtest.Node("If", []string{"c"}, []string{"z"},
		onnxtest.AttrGraph("then_branch", sub), onnxtest.AttrGraph("else_branch", sub)))
	g := onnxtest.Graph(nodes,
		[]*onnxpb.ValueInfoProto{onnxtest.Info("x", 1, 3), onnxtest.Info("c", 9)},
		[]*onnxpb.ValueInfoProto{onnxtest.Info(prev, 1, 3), onnxtest.Info("z", 1)}, inits...)
	good := onnxtest.Bytes(onnxtest.Model(17, g, nil))
	// The graph field again (a second initializer): the decoder merges the two.
	twice := protowire.AppendTag(append([]byte(nil), good...), modelGraphField, protowire.BytesType)
	twice = protowire.AppendBytes(twice, onnxtest.Bytes(&onnxpb.ModelProto{Graph: onnxtest.Graph(nil, nil, nil,
		onnxtest.Raw("late", 1, []int64{1}, f32raw(5)))})[2:])

	dir := t.TempDir()
	load := func(b []byte) (*Model, error) {
		path := filepath.Join(dir, "m.onnx")
		must(t, os.WriteFile(path, b, 0o644))
		return Load(path, Options{MapMinBytes: 1})
	}
	for name, b := range map[string][]byte{"plain": good, "graph twice": twice} {
		plain, perr := LoadBytes(b, Options{})
		if perr != nil {
			t.Fatalf("%s: %v", name, perr)
		}
		mapped, merr := load(b)
		sameLoad(t, plain, perr, mapped, merr)
		if name != "plain" {
			continue
		}
		backed := 0
		for _, n := range []string{"a", "bb", "ccc", "dddd", "e"} {
			if mapped.Graph.Initializers[n].FileBacked() {
				backed++
			}
		}
		if tensor.MapFileSupported && backed == 0 {
			t.Error("no raw initializer aliases the mapped file")
		}
	}
	for _, cut := range []int{1, 7, len(good) / 3, len(good) / 2, len(good) - 1} {
		bad := append([]byte(nil), good[:cut]...)
		plain, perr := LoadBytes(bad, Options{})
		mapped, merr := load(bad)
		sameLoad(t, plain, perr, mapped, merr)
		flipped := append([]byte(nil), good...)
		flipped[cut] ^= 0xff
		plain, perr = LoadBytes(flipped, Options{})
		mapped, merr = load(flipped)
		sameLoad(t, plain, perr, mapped, merr)
	}
}
