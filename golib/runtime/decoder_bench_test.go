package runtime

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

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

// feedPresents makes a step's present outputs (outs, named outNames) the
// next step's past inputs in feeds.
func feedPresents(feeds map[string]*tensor.Tensor, outNames []string, outs []*tensor.Tensor) {
	for i, o := range outNames {
		if strings.HasPrefix(o, "present") {
			feeds["past_key_values"+strings.TrimPrefix(o, "present")] = outs[i]
		}
	}
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
					feedPresents(feeds, outNames, outs)
					step++
				}
				s.DefaultState().Release(held...)
			})
		}
	}
}

// BenchmarkDecoderHugePool runs BenchmarkDecoderGrowing's decode loop on
// two sessions of the model, one whose state's pool advises its large
// buffers for huge pages (hugePoolBuffers) and one whose pool does not,
// alternating step by step (the only comparison a shared machine allows),
// and reports the median per-pair ratio plain/huge (above 1: the advice
// pays) and both sides' median ms per step. Run it with -benchtime=1x (one
// iteration is 64 pairs).
func BenchmarkDecoderHugePool(b *testing.B) {
	defer func(on bool) { hugePoolBuffers = on }(hugePoolBuffers)
	for _, threads := range []int{1, 2} {
		for _, context := range []int{1024, 4096} {
			b.Run(fmt.Sprintf("threads=%d/context=%d", threads, context), func(b *testing.B) {
				type side struct {
					s     *Session
					feeds map[string]*tensor.Tensor
					held  []*tensor.Tensor
					ms    []float64
				}
				var sides [2]*side
				for i := range sides {
					s := decoderSession(b, threads)
					sides[i] = &side{s: s, feeds: decoderFeeds(b, s, context)}
				}
				outNames := make([]string, 0, len(sides[0].s.Outputs()))
				for _, o := range sides[0].s.Outputs() {
					outNames = append(outNames, o.Name)
				}
				step := func(sd *side, huge bool, k int) {
					hugePoolBuffers = huge
					pos, _ := tensor.FromSlice(tensor.Shape{1, 1}, []int64{int64(context + k)})
					sd.feeds["position_ids"] = pos
					t0 := time.Now()
					outs, _, err := sd.s.Run(sd.feeds, outNames)
					if err != nil {
						b.Fatal(err)
					}
					sd.ms = append(sd.ms, float64(time.Since(t0).Microseconds())/1e3)
					sd.s.DefaultState().Release(sd.held...)
					sd.held = outs
					feedPresents(sd.feeds, outNames, outs)
				}
				var ratio []float64
				for b.Loop() {
					for k := range 64 {
						for j := range 2 {
							i := (k + j) % 2 // the side that goes first alternates
							step(sides[i], i == 1, k)
						}
						n := len(sides[0].ms)
						ratio = append(ratio, sides[0].ms[n-1]/sides[1].ms[n-1])
					}
				}
				for _, sd := range sides {
					sd.s.DefaultState().Release(sd.held...)
				}
				slices.Sort(ratio)
				b.ReportMetric(ratio[len(ratio)/2], "plain/huge")
				for i, name := range []string{"plain", "huge"} {
					ms := slices.Clone(sides[i].ms)
					slices.Sort(ms)
					b.ReportMetric(ms[len(ms)/2], "ms-"+name)
				}
			})
		}
	}
}
