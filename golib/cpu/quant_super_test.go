package cpu

import (
	"fmt"
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
	defer SetQuantIntDots(QuantIntDots())
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
