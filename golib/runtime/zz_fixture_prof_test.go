package runtime

import (
	"os"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

func BenchmarkZZFixture(b *testing.B) {
	path := os.Getenv("ZZ_MODEL")
	if path == "" {
		b.Skip()
	}
	s, err := NewSession(path, Options{Threads: 1})
	if err != nil {
		b.Fatal(err)
	}
	mk := func(p int) map[string]*tensor.Tensor {
		f := map[string]*tensor.Tensor{}
		for _, in := range s.Inputs() {
			switch in.Name {
			case "input_ids":
				f[in.Name], _ = tensor.FromSlice(tensor.Shape{1, 1}, []int64{3})
			case "attention_mask":
				m := make([]int64, p+1)
				for i := range m {
					m[i] = 1
				}
				f[in.Name], _ = tensor.FromSlice(tensor.Shape{1, p + 1}, m)
			case "position_ids":
				f[in.Name], _ = tensor.FromSlice(tensor.Shape{1, 1}, []int64{int64(p)})
			default:
				f[in.Name], _ = tensor.New(tensor.Float32, tensor.Shape{1, int(in.Shape[1].Value), p, int(in.Shape[3].Value)})
			}
		}
		return f
	}
	feeds := []map[string]*tensor.Tensor{mk(32), mk(33)}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		outs, _, err := s.Run(feeds[i%2], nil)
		if err != nil {
			b.Fatal(err)
		}
		s.DefaultState().Release(outs...)
		i++
	}
}

func TestZZGeometry(t *testing.T) {
	path := os.Getenv("ZZ_MODEL")
	if path == "" {
		t.Skip()
	}
	s, err := NewSession(path, Options{Threads: 1, Profile: true})
	if err != nil {
		t.Fatal(err)
	}
	mk := func(p int) map[string]*tensor.Tensor {
		f := map[string]*tensor.Tensor{}
		for _, in := range s.Inputs() {
			switch in.Name {
			case "input_ids":
				f[in.Name], _ = tensor.FromSlice(tensor.Shape{1, 1}, []int64{3})
			case "attention_mask":
				m := make([]int64, p+1)
				for i := range m {
					m[i] = 1
				}
				f[in.Name], _ = tensor.FromSlice(tensor.Shape{1, p + 1}, m)
			case "position_ids":
				f[in.Name], _ = tensor.FromSlice(tensor.Shape{1, 1}, []int64{int64(p)})
			default:
				f[in.Name], _ = tensor.New(tensor.Float32, tensor.Shape{1, int(in.Shape[1].Value), p, int(in.Shape[3].Value)})
			}
		}
		return f
	}
	var st *RunStats
	for p := 30; p < 34; p++ {
		_, st, err = s.Run(mk(p), nil)
		if err != nil {
			t.Fatal(err)
		}
	}
	byName := map[string]*PlanNode{}
	for _, n := range s.Plan().Nodes {
		byName[n.Name] = n
	}
	geo, data := map[string]int{}, map[string]int{}
	for _, e := range st.Events {
		if byName[e.Node].geometry {
			geo[e.OpType]++
		} else {
			data[e.OpType]++
		}
	}
	t.Logf("plan %d nodes, ran %d; geometry recomputed %v; data %v", len(s.Plan().Nodes), len(st.Events), geo, data)
}
