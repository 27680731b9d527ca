//go:build amd64

package gemm

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// TestAsmgenInSync checks that each generated assembly file of this
// package is what its generator script writes (run `go generate
// ./golib/cpu/gemm` after editing one).
func TestAsmgenInSync(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	for _, tc := range []struct{ script, file string }{
		{"asmgen_panel.py", "panel_avx2_amd64.s"},
	} {
		got, err := exec.Command(py, tc.script).Output()
		if err != nil {
			t.Errorf("%s: %v", tc.script, err)
			continue
		}
		want, err := os.ReadFile(tc.file)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the output of %s: run go generate ./golib/cpu/gemm", tc.file, tc.script)
		}
	}
}
