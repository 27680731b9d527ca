package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// newBenchQuantView builds a quantized view of one sequence of L tokens
// (kvh heads, head dim d): sealed chunks of group tokens, K per channel, V
// per token, the last residual tokens native fp16. Rows are drawn and
// quantized chunk by chunk, so only the stored bytes stay resident.
func newBenchQuantView(b *testing.B, f cache.QuantFormat, kvh, d, L, residual int) *quantView {
	b.Helper()
	const g = cache.DefaultQuantGroup
	qv := &quantView{cfg: cache.QuantConfig{Format: f, Group: g, Residual: residual},
		kgroup: cache.RowGroup(d, g), vgroup: cache.RowGroup(d, g)}
	qv.native = &testView{elem: cache.Float16, batch: 1, kvh: kvh, dk: d, dv: d, lens: []int{L}, ws: []int{0}}
	sealed := max(L-residual, 0) / g * g
	qv.sealed = []int{sealed}
	one := func() [][]byte { return make([][]byte, kvh) }
	onef := func() [][]float32 { return make([][]float32, kvh) }
	qv.native.k, qv.native.v = [][][]byte{one()}, [][][]byte{one()}
	qv.kq, qv.vq = [][][]byte{one()}, [][][]byte{one()}
	qv.ks, qv.kz, qv.vs, qv.vz = [][][]float32{onef()}, [][][]float32{onef()}, [][][]float32{onef()}, [][][]float32{onef()}
	rng := rand.New(rand.NewPCG(uint64(L), uint64(kvh)))
	draw := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = 3.4*rng.Float32() - 1.7
		}
		return x
	}
	for h := 0; h < kvh; h++ {
		// untouched pages of the native rows below the residual are never
		// faulted in
		qv.native.k[0][h] = make([]byte, L*d*2)
		qv.native.v[0][h] = make([]byte, L*d*2)
		copy(qv.native.k[0][h][sealed*d*2:], encodeF32(draw((L-sealed)*d), cache.Float16))
		copy(qv.native.v[0][h][sealed*d*2:], encodeF32(draw((L-sealed)*d), cache.Float16))
		kq := make([]byte, 0, sealed*f.RowBytes(d))
		vq := make([]byte, 0, sealed*f.RowBytes(d))
		for c := 0; c < sealed; c += g {
			rows, s, z := quantizeChannels(draw(g*d), d, f)
			kq = append(kq, rows...)
			qv.ks[0][h] = append(qv.ks[0][h], s...)
			qv.kz[0][h] = append(qv.kz[0][h], z...)
			rows, s, z = quantizeTokens(draw(g*d), d, qv.vgroup, f)
			vq = append(vq, rows...)
			qv.vs[0][h] = append(qv.vs[0][h], s...)
			qv.vz[0][h] = append(qv.vz[0][h], z...)
		}
		qv.kq[0][h], qv.vq[0][h] = kq, vq
	}
	return qv
}

// BenchmarkDecodeQuant times one decode step (q_len 1) of GQA 32/8, head
// dim 128, batch 1, at 16k and 32k tokens on 1 and 2 threads, over our fp16
// cache and over int8 and int4 sealed chunks (K per channel, V per token,
// group 32, residual 128 fp16), on the active kernel path (OLKV_KERNEL
// selects another). The three storages run one after the other inside each
// (context, threads) pair, so -count=N alternates them (int8-intdots: int8
// with the integer score loop, SetQuantIntDots, where the CPU has AVX-512
// VNNI); ratios of ns/op are
// the figure to read (speed-up = fp16 time / quantized time). GB/s is the
// bytes the kernel reports reading (quantized rows plus scales).
func BenchmarkDecodeQuant(b *testing.B) {
	defer SetThreads(Threads())
	const qh, kvh, d, res = 32, 8, 128, 128
	for _, L := range []int{16384, 32768} {
		fp16 := newBenchCacheOf(b, cache.Float16, kvh, d, L)
		type storage struct {
			name string
			v    func() (cache.View, func())
		}
		views := []storage{
			{"fp16", func() (cache.View, func()) {
				v, err := fp16.BeginRead()
				if err != nil {
					b.Fatal(err)
				}
				return v, fp16.EndRead
			}},
		}
		for _, f := range quantFormats {
			qv := newBenchQuantView(b, f, kvh, d, L, res)
			views = append(views, storage{f.String(), func() (cache.View, func()) { return qv, func() {} }})
			if f == cache.QuantInt8 && activeOps().quant != nil && activeOps().quant.intDots4 != nil {
				views = append(views, storage{"int8-intdots", func() (cache.View, func()) {
					SetQuantIntDots(true)
					return qv, func() { SetQuantIntDots(false) }
				}})
			}
		}
		rng := rand.New(rand.NewPCG(3, 5))
		q := randVec(rng, qh*d, 1)
		dst := make([]float32, qh*d)
		for _, th := range []int{1, 2} {
			for _, vw := range views {
				b.Run(fmt.Sprintf("L%d/t%d/%s", L, th, vw.name), func(b *testing.B) {
					SetThreads(th)
					v, done := vw.v()
					defer done()
					read := &readCounter{View: v}
					b.ReportAllocs()
					for b.Loop() {
						if err := Attention(dst, q, 1, qh, read, Options{}); err != nil {
							b.Fatal(err)
						}
					}
					b.ReportMetric(float64(read.n)/b.Elapsed().Seconds()/1e9, "GB/s")
				})
			}
		}
	}
}

// readCounter counts the bytes a kernel reports reading through a view.
type readCounter struct {
	cache.View
	n int64
}

func (r *readCounter) AddBytesRead(n int64) { r.n += n; r.View.AddBytesRead(n) }
