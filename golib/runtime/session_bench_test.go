package runtime

import (
	"fmt"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// BenchmarkRunSmallGraph measures the per-run and per-node overhead of the
// executor on a 4-node graph of tiny tensors.
func BenchmarkRunSmallGraph(b *testing.B) {
	s, err := NewSessionFromBytes(mustBytes(b), Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	x, _ := tensor.FromSlice(tensor.Shape{1, 2}, []float32{1, 2})
	feeds := map[string]*tensor.Tensor{"x": x}
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := s.Run(feeds, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkResidualAdd is the residual Add + RMS-style scaling of a decode
// step at hidden size 4096: three elementwise ops over 4096 floats.
func BenchmarkResidualAdd(b *testing.B) {
	const hidden = 4096
	w := make([]float32, hidden)
	g := onnxtest.Graph([]*onnxpb.NodeProto{
		onnxtest.Node("Add", []string{"x", "w"}, []string{"a"}),
		onnxtest.Node("Mul", []string{"a", "w"}, []string{"m"}),
		onnxtest.Node("Sub", []string{"m", "x"}, []string{"y"}),
	}, []vi{onnxtest.Info("x", 1, 1, hidden)}, []vi{onnxtest.Info("y", 1, 1, hidden)},
		onnxtest.Floats("w", []int64{hidden}, w))
	s, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(17, g, nil)), Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	x, _ := tensor.New(tensor.Float32, tensor.Shape{1, hidden})
	feeds := map[string]*tensor.Tensor{"x": x}
	b.SetBytes(3 * 3 * hidden * 4)
	for b.Loop() {
		if _, _, err := s.Run(feeds, nil); err != nil {
			b.Fatal(err)
		}
	}
}

func mustBytes(b *testing.B) []byte {
	data := chainBytes()
	if data == nil {
		b.Fatal("cannot serialize the test model")
	}
	return data
}

// BenchmarkExecutorPerNode runs a chain of 256 Neg nodes on one float: the
// kernels do almost nothing, so ns/op divided by 256 is the executor's cost
// per node (dispatch, value slots, memory tracking, pooled output).
func BenchmarkExecutorPerNode(b *testing.B) {
	const n = 256
	nodes := make([]*onnxpb.NodeProto, n)
	prev := "x"
	for i := range nodes {
		out := fmt.Sprintf("v%d", i)
		if i == n-1 {
			out = "y"
		}
		nodes[i] = onnxtest.Node("Neg", []string{prev}, []string{out})
		prev = out
	}
	g := onnxtest.Graph(nodes, []vi{onnxtest.Info("x", 1, 1)}, []vi{onnxtest.Info("y", 1, 1)})
	s, err := NewSessionFromBytes(onnxtest.Bytes(onnxtest.Model(17, g, nil)), Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	x, _ := tensor.FromSlice(tensor.Shape{1}, []float32{1})
	feeds := map[string]*tensor.Tensor{"x": x}
	b.ReportAllocs()
	for b.Loop() {
		outs, _, err := s.Run(feeds, nil)
		if err != nil {
			b.Fatal(err)
		}
		s.DefaultState().Release(outs...)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/node")
}
