//go:build amd64

package cpu

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// TestAsmgenInSync checks that each generated assembly file is what its
// generator script writes (run `go generate ./golib/cpu` after editing one).
func TestAsmgenInSync(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	for _, tc := range []struct{ script, file string }{
		{"asmgen_half.py", "kern_avx512_h_amd64.s"},
		{"asmgen_avx2.py", "kern_avx2_amd64.s"},
		{"asmgen_quant.py", "kern_quant_amd64.s"},
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
			t.Errorf("%s differs from the output of %s: run go generate ./golib/cpu", tc.file, tc.script)
		}
	}
}
