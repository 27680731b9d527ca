package runtime

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// The decoder benchmarks run a decoder exported to a file, for example the
// built-in Llama decoder:
//
//	python -c "from onnx_light_kv import models; models.save_model(models.build('llama',
//	    models.DecoderConfig(layers=4, hidden=1024, q_heads=16, kv_heads=8, head_dim=64,
//	    vocab=32000, max_positions=8192)), 'llama.onnx')"
//	OLKV_DECODER_MODEL=llama.onnx go test -run - -bench Decoder -benchmem ./golib/runtime
//
// They are skipped when OLKV_DECODER_MODEL is not set.

func decoderSession(b *testing.B, threads int) *Session {
	path := os.Getenv("OLKV_DECODER_MODEL")
	if path == "" {
		b.Skip("OLKV_DECODER_MODEL is not set")
	}
	s, err := NewSession(path, Options{Threads: threads})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// decoderFeeds returns one decode step's feeds at context past tokens:
// every float input of rank 4 is a past of shape [1, d1, context, d3].
func decoderFeeds(b *testing.B, s *Session, context int) map[string]*tensor.Tensor {
	feeds := map[string]*tensor.Tensor{}
	for _, in := range s.Inputs() {
		switch {
		case in.DType == tensor.Int64:
			feeds[in.Name] = tensor.Scalar(int64(context))
			feeds[in.Name], _ = feeds[in.Name].Reshaped(tensor.Shape{1, 1})
		case len(in.Shape) == 4:
			t, err := tensor.New(in.DType, tensor.Shape{1, int(in.Shape[1].Value), context, int(in.Shape[3].Value)})
			if err != nil {
				b.Fatal(err)
			}
			feeds[in.Name] = t
		default:
			b.Fatalf("decoder input %q: unexpected shape", in.Name)
		}
	}
	return feeds
}

// BenchmarkDecoderFixed runs decode steps at a fixed context.
func BenchmarkDecoderFixed(b *testing.B) {
	for _, threads := range []int{1, 2} {
		for _, context := range []int{512, 4096} {
			b.Run(fmt.Sprintf("threads=%d/context=%d", threads, context), func(b *testing.B) {
				s := decoderSession(b, threads)
				feeds := decoderFeeds(b, s, context)
				b.ReportAllocs()
				for b.Loop() {
					outs, _, err := s.Run(feeds, nil)
					if err != nil {
						b.Fatal(err)
					}
					s.DefaultState().Release(outs...)
				}
			})
		}
	}
}

// BenchmarkDecoderGrowing is a real decode loop: each step feeds its
// present outputs back as the next past, so every step works on new, one
// token larger tensors. The caller releases a step's outputs after the next
// step has consumed them, like the Python binding does.
func BenchmarkDecoderGrowing(b *testing.B) {
	for _, threads := range []int{1, 2} {
		for _, context := range []int{512, 4096} {
			b.Run(fmt.Sprintf("threads=%d/context=%d", threads, context), func(b *testing.B) {
				s := decoderSession(b, threads)
				start := decoderFeeds(b, s, context)
				outNames := make([]string, 0, len(s.Outputs()))
				for _, o := range s.Outputs() {
					outNames = append(outNames, o.Name)
				}
				feeds := map[string]*tensor.Tensor{}
				var held []*tensor.Tensor
				b.ReportAllocs()
				step := 0
				for b.Loop() {
					if step%256 == 0 { // restart the loop so contexts stay near the nominal one
						s.DefaultState().Release(held...)
						held = nil
						for k, v := range start {
							feeds[k] = v
						}
					}
					pos, _ := tensor.FromSlice(tensor.Shape{1, 1}, []int64{int64(context + step%256)})
					feeds["position_ids"] = pos
					outs, _, err := s.Run(feeds, outNames)
					if err != nil {
						b.Fatal(err)
					}
					s.DefaultState().Release(held...)
					held = outs
					for i, o := range outNames {
						if strings.HasPrefix(o, "present") {
							feeds["past_key_values"+strings.TrimPrefix(o, "present")] = outs[i]
						}
					}
					step++
				}
				s.DefaultState().Release(held...)
			})
		}
	}
}
