package runtime

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
	"google.golang.org/protobuf/proto"
)

// TestReleaseConstants: a session that owns its model releases the values
// of the weights only packed products read (MatMul, Gemm, MatMulNBits) and
// of those folding left unread, keeps every constant something else reads
// (a Gather, a graph output, a graph input's default, a subgraph), and
// computes exactly what a session over a model it does not own (nothing
// released) computes, for decode-sized and prefill-sized products (the
// portable build's blocked products read the packs too).
func TestReleaseConstants(t *testing.T) {
	const d = 128 // 128 x 128 float32: 64 KiB, minReleaseBytes
	r := rand.New(rand.NewPCG(1, 2))
	weight := func(name string) *onnxpb.TensorProto {
		w := make([]float32, d*d)
		for i := range w {
			w[i] = r.Float32() - 0.5
		}
		return onnxtest.Floats(name, []int64{d, d}, w)
	}
	type vi = *onnxpb.ValueInfoProto
	sub := func(nodes []*onnxpb.NodeProto, out string) *onnxpb.GraphProto {
		return onnxtest.Graph(nodes, nil, []vi{onnxtest.Info(out, 1, -1, d)})
	}
	nodes := []*onnxpb.NodeProto{
		onnxtest.Node("MatMul", []string{"x", "packed"}, []string{"y1"}),
		onnxtest.Node("Gemm", []string{"x", "gemm"}, []string{"y2"}, onnxtest.AttrInt("transB", 1)),
		onnxtest.Node("Transpose", []string{"folded"}, []string{"folded_t"}),
		onnxtest.Node("MatMul", []string{"x", "folded_t"}, []string{"y3"}),
		onnxtest.Node("MatMul", []string{"x", "gathered"}, []string{"y4"}),
		onnxtest.Node("Gather", []string{"gathered", "idx"}, []string{"rows"}),
		onnxtest.Node("MatMul", []string{"x", "output"}, []string{"y5"}),
		onnxtest.Node("MatMul", []string{"x", "default"}, []string{"y6"}),
		onnxtest.Node("MatMul", []string{"x", "captured"}, []string{"y7"}),
		onnxtest.Node("If", []string{"c"}, []string{"y8"},
			onnxtest.AttrGraph("then_branch", sub([]*onnxpb.NodeProto{onnxtest.Node("MatMul", []string{"x", "captured"}, []string{"t"})}, "t")),
			onnxtest.AttrGraph("else_branch", sub([]*onnxpb.NodeProto{onnxtest.Node("Neg", []string{"x"}, []string{"e"})}, "e"))),
	}
	// A 4-bit MatMulNBits weight of 1024 x 128 (64 KiB of nibbles) and
	// its scales (below minReleaseBytes: kept).
	const nbN = 1024
	nb := make([]byte, nbN*d/2)
	for i := range nb {
		nb[i] = byte(r.Uint32())
	}
	nbs := make([]float32, nbN*d/32)
	for i := range nbs {
		nbs[i] = r.Float32() / 8
	}
	nbits := onnxtest.Node("MatMulNBits", []string{"x", "nbits", "nbits_scales"}, []string{"y9"},
		onnxtest.AttrInt("K", d), onnxtest.AttrInt("N", nbN), onnxtest.AttrInt("bits", 4), onnxtest.AttrInt("block_size", 32))
	nbits.Domain = proto.String("com.microsoft")
	nodes = append(nodes, nbits)
	outs := []vi{onnxtest.Info("rows", 1, 2, d), onnxtest.Info("output", 1, d, d), onnxtest.Info("y9", 1, -1, nbN)}
	for _, o := range []string{"y1", "y2", "y3", "y4", "y5", "y6", "y7", "y8"} {
		outs = append(outs, onnxtest.Info(o, 1, -1, d))
	}
	g := onnxtest.Graph(nodes,
		[]vi{onnxtest.Info("x", 1, -1, d), onnxtest.Info("c", 9), onnxtest.Info("default", 1, d, d)}, outs,
		weight("packed"), weight("gemm"), weight("folded"), weight("gathered"), weight("output"), weight("default"),
		weight("captured"), onnxtest.Int64s("idx", []int64{2}, []int64{3, 5}),
		onnxtest.Raw("nbits", 2, []int64{nbN, d / 32, 16}, nb), onnxtest.Floats("nbits_scales", []int64{nbN, d / 32}, nbs))
	b := onnxtest.Bytes(onnxtest.Model(17, g, map[string]int64{"com.microsoft": 1}))
	// The same model with its initializers in an external data file
	// (mapped by the loader: the kept ones stay file-backed).
	dir := t.TempDir()
	gx := proto.Clone(g).(*onnxpb.GraphProto)
	externalize(t, gx, dir)
	path := filepath.Join(dir, "m.onnx")
	if err := os.WriteFile(path, onnxtest.Bytes(onnxtest.Model(17, gx, map[string]int64{"com.microsoft": 1})), 0o644); err != nil {
		t.Fatal(err)
	}
	fromBytes, err := NewSessionFromBytes(b, Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	fromFile, err := NewSession(path, Options{Threads: 2, Model: model.Options{MapMinBytes: 1}})
	if err != nil {
		t.Fatal(err)
	}
	if w := fromFile.Model().Graph.Initializers["gathered"]; tensor.MapFileSupported && !w.FileBacked() {
		t.Error("a kept weight of the external data file is not file-backed")
	}
	for _, owned := range []*Session{fromBytes, fromFile} {
		checkReleased(t, owned, b, r)
	}
}

// checkReleased checks owned, a session over the model of b that released
// its packed-only constants, against a session over b that released
// nothing: which constants it released, and its outputs for 1, 3 and 40
// rows.
func checkReleased(t *testing.T, owned *Session, b []byte, r *rand.Rand) {
	t.Helper()
	const d = 128
	m, err := model.LoadBytes(b, model.Options{})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := NewSessionFromModel(m, Options{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	released := map[string]bool{"packed": true, "gemm": true, "folded": true, "nbits": true}
	for name, want := range m.Graph.Initializers {
		got := owned.Model().Graph.Initializers[name].Bytes()
		zero := true
		for i, v := range got {
			if v != 0 {
				zero = false
			}
			if !released[name] && v != want.Bytes()[i] {
				t.Fatalf("kept constant %q changed at %d", name, i)
			}
		}
		if zero != released[name] {
			t.Errorf("constant %q: released %v, want %v", name, zero, released[name])
		}
	}
	for _, rows := range []int{1, 3, 40} {
		x, err := tensor.New(tensor.Float32, tensor.Shape{rows, d})
		if err != nil {
			t.Fatal(err)
		}
		for i := range x.Float32() {
			x.Float32()[i] = r.Float32() - 0.5
		}
		c, err := tensor.New(tensor.Bool, tensor.Shape{})
		if err != nil {
			t.Fatal(err)
		}
		c.Bool()[0] = true
		feeds := map[string]*tensor.Tensor{"x": x, "c": c}
		a, _, err := owned.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		w, _, err := kept.Run(feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		for i := range w {
			if !equalTensor(a[i], w[i]) {
				t.Fatalf("%d rows: output %s differs from the session that released nothing", rows, owned.Outputs()[i].Name)
			}
		}
	}
}

// TestReleaseStorage: a released tensor keeps its type, shape and length
// and reads as zero; an empty one has nothing to release.
func TestReleaseStorage(t *testing.T) {
	x, err := tensor.New(tensor.Float32, tensor.Shape{3, 5})
	if err != nil {
		t.Fatal(err)
	}
	for i := range x.Float32() {
		x.Float32()[i] = float32(i + 1)
	}
	if !x.ReleaseStorage() {
		t.Skip("no read-only zero mapping on this platform")
	}
	if x.DType() != tensor.Float32 || !x.Shape().Equal(tensor.Shape{3, 5}) || x.Len() != 15 {
		t.Fatalf("released tensor is %v %v with %d values", x.DType(), x.Shape(), x.Len())
	}
	for i, v := range x.Float32() {
		if v != 0 {
			t.Fatalf("released value %d reads %v", i, v)
		}
	}
	e, err := tensor.New(tensor.Float32, tensor.Shape{0, 4})
	if err != nil {
		t.Fatal(err)
	}
	if e.ReleaseStorage() {
		t.Fatal("an empty tensor reported a release")
	}
}

// externalize moves every initializer of g into the data file w.bin in dir,
// each at an offset that is a multiple of 64.
func externalize(t *testing.T, g *onnxpb.GraphProto, dir string) {
	t.Helper()
	var data []byte
	for _, tp := range g.Initializer {
		raw := tp.RawData
		for _, v := range tp.FloatData {
			raw = binary.LittleEndian.AppendUint32(raw, math.Float32bits(v))
		}
		for _, v := range tp.Int64Data {
			raw = binary.LittleEndian.AppendUint64(raw, uint64(v))
		}
		for len(data)%64 != 0 {
			data = append(data, 0)
		}
		tp.ExternalData = []*onnxpb.StringStringEntryProto{
			{Key: proto.String("location"), Value: proto.String("w.bin")},
			{Key: proto.String("offset"), Value: proto.String(fmt.Sprint(len(data)))},
			{Key: proto.String("length"), Value: proto.String(fmt.Sprint(len(raw)))},
		}
		tp.DataLocation = onnxpb.TensorProto_EXTERNAL.Enum()
		tp.RawData, tp.FloatData, tp.Int64Data = nil, nil, nil
		data = append(data, raw...)
	}
	if err := os.WriteFile(filepath.Join(dir, "w.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
}
