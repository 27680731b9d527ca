package runtime

import (
	"fmt"
	"sync"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/onnxpb"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// TestConcurrentStates runs one session from several goroutines, each with
// its own State (run with -race).
func TestConcurrentStates(t *testing.T) {
	s := session(t, chain())
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			st := NewState()
			for i := 0; i < 20; i++ {
				v := float32(g*100 + i)
				x, _ := tensor.FromSlice(tensor.Shape{1, 2}, []float32{v, v})
				outs, _, err := s.RunState(st, map[string]*tensor.Tensor{"x": x}, []string{"y"})
				if err != nil {
					errc <- err
					return
				}
				if got, want := outs[0].Float32()[0], (v+1)*v-1; got != want {
					errc <- fmt.Errorf("goroutine %d run %d: %v, want %v", g, i, got, want)
					return
				}
			}
		}(g)
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
}

// TestInitializerDefaultsCanBeFed: a graph input that has an initializer is
// optional; feeding it overrides the default.
func TestInitializerDefaultsCanBeFed(t *testing.T) {
	g := onnxtest.Graph([]*onnxpb.NodeProto{onnxtest.Node("Add", []string{"x", "w"}, []string{"y"})},
		[]vi{onnxtest.Info("x", 1, 2), onnxtest.Info("w", 1, 2)}, []vi{onnxtest.Info("y", 1, 2)},
		onnxtest.Floats("w", []int64{2}, []float32{1, 1}))
	s := session(t, onnxtest.Model(17, g, nil))
	if len(s.Inputs()) != 1 || s.Inputs()[0].Name != "x" {
		t.Fatalf("inputs %+v: the initializer-backed input must not be required", s.Inputs())
	}
	x := f32(t, tensor.Shape{2}, 1, 2)
	cases := []struct {
		feeds map[string]*tensor.Tensor
		want  string
	}{
		{map[string]*tensor.Tensor{"x": x}, "[2 3]"},
		{map[string]*tensor.Tensor{"x": x, "w": f32(t, tensor.Shape{2}, 10, 20)}, "[11 22]"},
	}
	for _, c := range cases {
		outs, _, err := s.Run(c.feeds, nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := fmt.Sprint(outs[0].Float32()); got != c.want {
			t.Errorf("y = %s, want %s", got, c.want)
		}
	}
}
