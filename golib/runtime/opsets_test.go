package runtime

import (
	"errors"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/internal/onnxtest"
)

// TestSessionRefusesNewerOpsets: a model whose standard-domain opset import
// is newer than the runtime knows fails at session creation, naming both
// versions; known versions load.
func TestSessionRefusesNewerOpsets(t *testing.T) {
	cases := []struct {
		opset int64
		extra map[string]int64
		want  string // "" = loads
	}{
		{17, nil, ""},
		{25, map[string]int64{"com.microsoft": 1}, ""},
		{99, nil, "opset 99 of domain ai.onnx; this runtime knows opsets up to 25"},
		{17, map[string]int64{"com.microsoft": 7}, "opset 7 of domain com.microsoft"},
	}
	for _, c := range cases {
		m := chain()
		m.OpsetImport = onnxtest.Model(c.opset, nil, c.extra).OpsetImport
		_, err := NewSessionFromBytes(onnxtest.Bytes(m), Options{})
		if c.want == "" {
			if err != nil {
				t.Errorf("opset %d %v: %v", c.opset, c.extra, err)
			}
			continue
		}
		if !errors.Is(err, errs.ErrNotImplemented) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("opset %d %v: error %v, want ErrNotImplemented with %q", c.opset, c.extra, err, c.want)
		}
	}
}
