package cpu

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// BenchmarkDecode times one decode step (q_len 1) of GQA 32/8, head_dim 128
// over 1k/4k/16k contexts for every kernel path, storage type and 1-2
// threads. The reported bandwidth is K+V bytes read per second.
func BenchmarkDecode(b *testing.B) {
	_, paths := KernelPaths()
	defer SetThreads(Threads())
	defer SetKernel("auto")
	for _, L := range []int{256, 1024, 4096, 16384} {
		for _, e := range []cache.ElemType{cache.Float32, cache.Float16, cache.BFloat16} {
			c := attnCase{name: "decode", elem: e, qHeads: 32, kvh: 8, dk: 128, dv: 128, lens: []int{L}, qLen: 1}
			tv, q, rows := c.setup(11)
			dst := make([]float32, rows*c.dv)
			bytes := int64(L * c.kvh * (c.dk + c.dv) * e.Size())
			for _, path := range paths {
				for _, th := range []int{1, 2} {
					b.Run(fmt.Sprintf("L%d/%v/%s/t%d", L, e, path, th), func(b *testing.B) {
						SetThreads(th)
						if err := SetKernel(path); err != nil {
							b.Fatal(err)
						}
						b.SetBytes(bytes)
						b.ReportAllocs()
						for b.Loop() {
							if err := Attention(dst, q, 1, c.qHeads, tv, c.opts); err != nil {
								b.Fatal(err)
							}
						}
					})
				}
			}
		}
	}
}

// BenchmarkDecodeHeads covers MHA and MQA layouts (fp32, best path).
func BenchmarkDecodeHeads(b *testing.B) {
	defer SetThreads(Threads())
	for _, hd := range [][2]int{{32, 32}, {32, 8}, {32, 1}} {
		for _, L := range []int{1024, 16384} {
			c := attnCase{name: "heads", elem: cache.Float32, qHeads: hd[0], kvh: hd[1], dk: 128, dv: 128, lens: []int{L}, qLen: 1}
			tv, q, rows := c.setup(12)
			dst := make([]float32, rows*c.dv)
			for _, th := range []int{1, 2} {
				b.Run(fmt.Sprintf("h%d-%d/L%d/t%d", hd[0], hd[1], L, th), func(b *testing.B) {
					SetThreads(th)
					b.SetBytes(int64(L * c.kvh * (c.dk + c.dv) * 4))
					for b.Loop() {
						if err := Attention(dst, q, 1, c.qHeads, tv, c.opts); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		}
	}
}

// BenchmarkHandoff measures the fixed per-call cost of the pool: a tiny
// call that still wakes the helpers (serial threshold bypassed by size).
func BenchmarkHandoff(b *testing.B) {
	defer SetThreads(Threads())
	c := attnCase{name: "handoff", elem: cache.Float32, qHeads: 8, kvh: 8, dk: 64, dv: 64, lens: []int{128}, qLen: 1}
	tv, q, rows := c.setup(13)
	dst := make([]float32, rows*c.dv)
	for _, th := range []int{1, 2} {
		b.Run(fmt.Sprintf("t%d", th), func(b *testing.B) {
			SetThreads(th)
			for b.Loop() {
				if err := Attention(dst, q, 1, c.qHeads, tv, c.opts); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStreamRead is the machine's streaming-read bandwidth on a
// 1 GiB buffer (sum of float32), the physical limit of decode.
func BenchmarkStreamRead(b *testing.B) {
	buf := make([]float32, 1<<28)
	for i := range buf {
		buf[i] = float32(i & 7)
	}
	_ = rand.N(1)
	b.SetBytes(int64(len(buf)) * 4)
	var sink float32
	for b.Loop() {
		sink += activeOps().maxOf(buf)
	}
	_ = sink
}
