package cpu

import (
	"fmt"
	"math"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
)

// TestQuantSuperBlocks checks quantRun's grouping of sealed chunks into
// super-blocks at block sizes that cut it every way: blocks shorter than a
// chunk (a chunk walked in several blocks), blocks of one and a half and of
// about three chunks (flushes before a chunk that does not fit), and the
// default size, whose parts are capped by superFloats for many query rows
// (q_len 16); with windows, softcap, both formats and K axes, and the
// integer score loop where the CPU has it.
func TestQuantSuperBlocks(t *testing.T) {
	defer func(b int) { blockBytes = b }(blockBytes)
	defer SetQuantIntLoops(QuantIntLoops())
	L := 700
	if raceEnabled || asanEnabled || testing.Short() {
		L = 230
	}
	def := blockBytes
	n := 0
	for _, bt := range []int{16, 48, 100, 0} { // tokens per block, head dim 64; 0: the default
		for _, f := range quantFormats {
			for _, ax := range kAxes {
				for _, ql := range []int{1, 5, 16} {
					n++
					blockBytes = def
					if bt > 0 {
						blockBytes = bt * 4 * 64
					}
					c := quantCase{elem: cache.Float16, qHeads: 8, kvh: 2, dk: 64, dv: 64, lens: []int{L, L/3 + 7},
						qLen: ql, page: 16, cfg: cache.QuantConfig{Format: f, Group: 32, KAxis: ax, Residual: 20}}
					switch n % 3 {
					case 1:
						c.opts.Softcap, c.qScale = 4, 3
					case 2:
						c.opts.Window = L / 3
					}
					intOn := intDotsUsed(f, ax, c.dk, c.dv, c.cfg.Group) && n%2 == 0
					if intOn {
						c.tol = intDotsTol
					}
					t.Run(fmt.Sprintf("bt%d/%s/%s/q%d/int%v", bt, f, ax, ql, intOn), func(t *testing.T) {
						SetQuantIntDots(intOn)
						checkQuantPaths(t, c, []int{1, 2})
					})
				}
			}
		}
	}
}

// quantVariants are the changes to the quantized decode that can be set
// off (set(false): the code before them) and back on (set(true)):
// TestQuantVariantsBitIdentical checks that each leaves every result bit
// for bit as it was, BenchmarkQuantPairedAB measures each.
var quantVariants = []struct {
	name string
	set  func(on bool)
}{
	{"partsloops", func(on bool) { quantPartsLoops = on }},
	{"scaleprefetch", func(on bool) { quantScalePrefetch = on }},
	{"kscaleahead", func(on bool) { quantKScaleAhead = map[bool]int{false: 0, true: 2}[on] }},
	{"prepaff", func(on bool) { quantPrepAff = on }},
	{"partprefetch", func(on bool) { quantPartPrefetch = on }},
}

// TestQuantVariantsBitIdentical runs every path with each quantVariants
// change off and on over formats, K axes, groups, head dims, q_len 1-16,
// lengths around the chunk and residual boundaries (one chunk, two, many,
// a last partial one), softcap, windows, fp32 and fp16 residual rows, both settings of the
// integer loops and non-finite scales, and requires bit-identical outputs.
func TestQuantVariantsBitIdentical(t *testing.T) {
	defer SetQuantIntLoops(QuantIntLoops())
	defer restoreKernel(t)
	defer SetThreads(Threads())
	_, paths := KernelPaths()
	type tc struct {
		c      quantCase
		poison bool
	}
	var cases []tc
	n := 0
	for _, f := range quantFormats {
		for _, ax := range kAxes {
			for _, g := range []int{32, 64} {
				for _, d := range []int{64, 128} {
					for _, ql := range []int{1, 3, 16} {
						n++
						lens := []int{g + 16 + 1, 5*g + 16 + 7, 20*g + 16}
						if raceEnabled || asanEnabled || testing.Short() {
							lens = lens[:2]
						}
						c := quantCase{elem: cache.Float16, qHeads: 8, kvh: 2, dk: d, dv: d, lens: lens, qLen: ql,
							cfg: cache.QuantConfig{Format: f, Group: g, KAxis: ax, Residual: 16}}
						switch n % 4 {
						case 1:
							c.opts.Softcap, c.qScale = 4, 3
						case 2:
							c.opts.Window = 3*g + 5
						case 3:
							c.elem = cache.Float32
						}
						cases = append(cases, tc{c: c, poison: n%5 == 0})
					}
				}
			}
		}
	}
	nan := float32(math.NaN())
	for _, k := range cases {
		c := k.c
		qv, q, rows := c.setup(uint64(c.dk + c.qLen))
		if k.poison {
			qv.vs[0][0][2] = nan
			qv.ks[1][0][1] = float32(math.Inf(1))
		}
		want := make([]float32, rows*c.dv)
		got := make([]float32, rows*c.dv)
		for _, vr := range quantVariants {
			for _, path := range paths {
				if err := SetKernel(path); err != nil {
					t.Fatal(err)
				}
				for _, intOn := range []bool{false, true} {
					SetQuantIntDots(intOn)
					SetThreads(1 + c.qLen%2)
					for i, on := range []bool{false, true} {
						vr.set(on)
						out := want
						if i == 1 {
							out = got
						}
						if err := Attention(out, q, c.qLen, c.qHeads, qv, c.opts); err != nil {
							t.Fatalf("%s %v path=%s: %v", vr.name, c, path, err)
						}
					}
					vr.set(true)
					for i := range want {
						if math.Float32bits(want[i]) != math.Float32bits(got[i]) && !(want[i] != want[i] && got[i] != got[i]) {
							t.Fatalf("%s %v path=%s int dots %v poison %v: element %d = %v on, %v off",
								vr.name, c, path, intOn, k.poison, i, got[i], want[i])
						}
					}
				}
			}
		}
	}
}
