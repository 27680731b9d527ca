//go:build amd64

package cpu

import (
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/internal/asmsync"
)

// TestAsmgenInSync checks that each generated assembly file is what its
// generator script writes (run `go generate ./golib/cpu` after editing one).
func TestAsmgenInSync(t *testing.T) {
	asmsync.Check(t, "./golib/cpu",
		asmsync.Pair{Script: "asmgen_half.py", File: "kern_avx512_h_amd64.s"},
		asmsync.Pair{Script: "asmgen_avx2.py", File: "kern_avx2_amd64.s"},
		asmsync.Pair{Script: "asmgen_quant.py", File: "kern_quant_amd64.s"})
}
