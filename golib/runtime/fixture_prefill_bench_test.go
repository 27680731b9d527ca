package runtime

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// prefillTokens is the prompt length of BenchmarkFixturePrefill (as
// bench_models.py's default --prompt).
const prefillTokens = 16

// BenchmarkFixturePrefill runs the prefill of a prefillTokens-token prompt
// (empty pasts) on the exports of OLKV_FIXTURE_MODELS (see
// BenchmarkFixtureDecode), 1 and 2 threads.
func BenchmarkFixturePrefill(b *testing.B) {
	fixtureBenchCases(b, func(b *testing.B, path string, threads int) {
		d := openGrowingDriver(b, path, Options{Threads: threads})
		b.ReportAllocs()
		for b.Loop() {
			d.prefill(b, prefillTokens)
		}
	})
}

// prefill runs one prompt of n tokens over empty pasts and releases its
// outputs.
func (d *growingDriver) prefill(tb testing.TB, n int) {
	ids, pos, mask := make([]int64, n), make([]int64, n), make([]int64, n)
	for i := range n {
		ids[i], pos[i], mask[i] = int64(i*7%200), int64(i), 1
	}
	for _, in := range d.s.Inputs() {
		var err error
		switch {
		case len(in.Shape) == 4:
			d.feeds[in.Name], err = tensor.New(in.DType, tensor.Shape{1, int(in.Shape[1].Value), 0, int(in.Shape[3].Value)})
		case in.Name == "input_ids":
			d.feeds[in.Name], err = tensor.FromSlice(tensor.Shape{1, n}, ids)
		case in.Name == "position_ids":
			d.feeds[in.Name], err = tensor.FromSlice(tensor.Shape{1, n}, pos)
		case in.Name == "attention_mask":
			d.feeds[in.Name], err = tensor.FromSlice(tensor.Shape{1, n}, mask)
		}
		if err != nil {
			tb.Fatal(err)
		}
	}
	d.s.DefaultState().Release(d.held...)
	d.held = nil
	outs, _, err := d.s.Run(d.feeds, d.outNames)
	if err != nil {
		tb.Fatal(err)
	}
	d.s.DefaultState().Release(outs...)
	d.reset(tb)
}
