//go:build amd64

package gemm

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/internal/asmsync"
)

// TestAsmgenInSync checks that each generated assembly file of this
// package is what its generator script writes (run `go generate
// ./golib/cpu/gemm` after editing one).
func TestAsmgenInSync(t *testing.T) {
	asmsync.Check(t, "./golib/cpu/gemm",
		asmsync.Pair{Script: "asmgen_panel.py", File: "panel_avx2_amd64.s"},
		asmsync.Pair{Script: "asmgen_panel512.py", File: "panel_avx512_amd64.s"},
		asmsync.Pair{Script: "asmgen_tile.py", File: "tile_avx2_amd64.s"})
}
