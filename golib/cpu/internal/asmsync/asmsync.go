// Package asmsync checks, in tests, that generated assembly files are what
// their generator scripts write.
package asmsync

import (
	"bytes"
	"os"
	"os/exec"
	"testing"
)

// Pair names a generator script and the file it writes, both relative to
// the package directory the test runs in.
type Pair struct{ Script, File string }

// Check runs each script with python3 and fails t when its output differs
// from the committed file; pkg is the package path named in the message
// (`go generate <pkg>` rewrites the files). It skips t when python3 is
// missing.
func Check(t *testing.T, pkg string, pairs ...Pair) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("python3 not found")
	}
	for _, p := range pairs {
		got, err := exec.Command(py, p.Script).Output()
		if err != nil {
			t.Errorf("%s: %v", p.Script, err)
			continue
		}
		want, err := os.ReadFile(p.File)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s differs from the output of %s: run go generate %s", p.File, p.Script, pkg)
		}
	}
}
