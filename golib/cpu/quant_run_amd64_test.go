//go:build goexperiment.simd && amd64

package cpu

import (
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// TestQuantCallLists checks that the call lists (quantOps.dotsRun, axpyRun:
// one assembly call per super-block) give bit for bit the results of the
// per-part calls, over int8 and int4, groups 32 and 64, head dims 64 and
// 128, GQA ratios 1, 4 and 8, q_len 1-4, lengths around the chunk and
// residual boundaries, windows, softcap, block sizes that cut chunks, and
// poisoned scales (the exactRow fallback); and that the grid takes them.
func TestQuantCallLists(t *testing.T) {
	if avx512Ops.quant == nil || avx512Ops.quant.dotsRun == nil {
		t.Skip("no call lists on this CPU/build (AVX-512 VNNI)")
	}
	defer restoreKernel(t)
	defer SetThreads(Threads())
	defer SetQuantIntDots(QuantIntDots())
	defer setQuantCalls(setQuantCalls(true))
	defer func(b int) { blockBytes = b }(blockBytes)
	def := blockBytes
	if err := SetKernel("avx512"); err != nil {
		t.Fatal(err)
	}
	SetQuantIntDots(true)
	lens := []int{31, 32, 33, 160, 161, 600}
	if raceEnabled || asanEnabled || testing.Short() {
		lens = []int{33, 161}
	}
	runs0 := quantCallRuns.Load()
	n := 0
	for _, f := range quantFormats {
		for _, g := range []int{32, 64} {
			for _, d := range []int{64, 128} {
				for _, hd := range [][2]int{{8, 2}, {8, 1}, {4, 4}} {
					for _, L := range lens {
						n++
						c := quantCase{elem: cache.Float16, qHeads: hd[0], kvh: hd[1], dk: d, dv: d, lens: []int{L, L/2 + 3},
							qLen: 1 + n%4, cfg: cache.QuantConfig{Format: f, Group: g, Residual: 16 * (n % 3)}}
						switch n % 4 {
						case 1:
							c.opts.Softcap, c.qScale = 4, 3
						case 2:
							c.opts.Window = L / 3
						}
						blockBytes = def
						if n%5 == 0 {
							blockBytes = 48 * 4 * d // a block of one and a half chunks
						}
						qv, q, rows := c.setup(uint64(n))
						// a poisoned scale: the rows seeing it take exactRow
						if vs := qv.vs[0][0]; n%7 == 0 && len(vs) > 1 {
							vs[1] = float32(math.NaN())
						}
						if ks := qv.ks[0][0]; n%11 == 0 && len(ks) > 2 {
							ks[2] = float32(math.Inf(1))
						}
						want := make([]float32, rows*c.dv)
						got := make([]float32, rows*c.dv)
						for _, th := range []int{1, 2} {
							SetThreads(th)
							setQuantCalls(false)
							if err := Attention(want, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
								t.Fatal(err)
							}
							setQuantCalls(true)
							if err := Attention(got, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
								t.Fatal(err)
							}
							for i := range got {
								if math.Float32bits(got[i]) != math.Float32bits(want[i]) &&
									!(math.IsNaN(float64(got[i])) && math.IsNaN(float64(want[i]))) {
									t.Fatalf("%v threads=%d: element %d (row %d) = %v with call lists, %v without",
										c, th, i, i/c.dv, got[i], want[i])
								}
							}
						}
					}
				}
			}
		}
	}
	if quantCallRuns.Load() == runs0 {
		t.Error("no call list ran over the grid")
	}
}
