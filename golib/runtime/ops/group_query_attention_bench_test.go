package ops

import (
	"math/rand"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
	"testing"
)

// BenchmarkGroupQueryAttention: one layer (32 query heads over 8 KV heads
// of 128, rotary) of a decode step after 1023 tokens in a 1088-position
// buffer, and of 256- and 1024-token prompts, in float32 and float16, one
// thread.
func BenchmarkGroupQueryAttention(b *testing.B) {
	for _, c := range []struct {
		name       string
		s, ctx     int
		prompt     bool
		nh, kvh, d int // 0: 32, 8, 128
	}{{"decode-1024", 1, 1024, false, 0, 0, 0}, {"prompt-256", 256, 256, true, 0, 0, 0}, {"prompt-1024", 1024, 1024, true, 0, 0, 0},
		// the tiny fixture exports' geometry (a decode step's fixed cost)
		{"decode-tiny-33", 1, 33, false, 4, 2, 16}} {
		if c.nh == 0 {
			c.nh, c.kvh, c.d = 32, 8, 128
		}
		for _, dt := range []tensor.DType{tensor.Float32, tensor.Float16} {
			b.Run(c.name+"/"+dt.String(), func(b *testing.B) {
				gc := gqaCase{b: 1, s: c.s, nh: c.nh, kvh: c.kvh, d: c.d, past: c.ctx + 64, lens: []int{c.ctx}, dt: dt,
					prompt: c.prompt, window: -1, rotary: 1, rotaryDim: c.d}
				in := gc.inputs(gc.data(rand.New(rand.NewSource(1))))
				f, err := Lookup("com.microsoft", "GroupQueryAttention", 1)
				if err != nil {
					b.Fatal(err)
				}
				n := &Node{OpType: "GroupQueryAttention", Domain: "com.microsoft", Opset: 1, Attrs: gc.attrs(),
					NumInputs: len(in), NumOutputs: 3, InputPresent: make([]bool, len(in)),
					OutputPresent: []bool{true, true, true}, Constants: make([]*tensor.Tensor, len(in))}
				for i, t := range in {
					n.InputPresent[i] = t != nil
				}
				k, err := f(n)
				if err != nil {
					b.Fatal(err)
				}
				for b.Loop() {
					if err := k.Compute(NewContext(in, n.OutputPresent, 1, nil)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
