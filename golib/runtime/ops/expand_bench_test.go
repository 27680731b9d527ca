package ops

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// BenchmarkExpandRepeatKV times the repeat_kv Expand of eager-attention
// exports ([1, 2, 1, 40, 16] to [1, 2, 3, 40, 16], float32: the tiny
// fixture models' decode step) and a broadcast mask row.
func BenchmarkExpandRepeatKV(b *testing.B) {
	for _, c := range []struct {
		name    string
		in, out tensor.Shape
	}{{"repeat_kv", tensor.Shape{1, 2, 1, 40, 16}, tensor.Shape{1, 2, 3, 40, 16}},
		{"mask", tensor.Shape{1, 1, 1, 40}, tensor.Shape{1, 4, 1, 40}}} {
		b.Run(c.name, func(b *testing.B) {
			x, _ := tensor.New(tensor.Float32, c.in)
			out, _ := tensor.New(tensor.Float32, c.out)
			for b.Loop() {
				if err := broadcastInto(out, x); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
