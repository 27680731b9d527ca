package ops

import (
	"errors"
	"strings"
	"testing"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

func TestCheckOpsets(t *testing.T) {
	cases := []struct {
		opsets map[string]int
		want   string // "" = accepted; else substrings of the message
	}{
		{map[string]int{"": 13}, ""},
		{map[string]int{"": 25, "com.microsoft": 1}, ""},
		{map[string]int{"ai.onnx.ml": 5, "custom.domain": 1000}, ""},
		{map[string]int{"": 99}, "opset 99 of domain ai.onnx; this runtime knows opsets up to 25"},
		{map[string]int{"ai.onnx": 26}, "opset 26 of domain ai.onnx"},
		{map[string]int{"": 17, "com.microsoft": 2}, "opset 2 of domain com.microsoft; this runtime knows opsets up to 1"},
		{map[string]int{"ai.onnx.ml": 6}, "opset 6 of domain ai.onnx.ml"},
	}
	for _, c := range cases {
		err := CheckOpsets(c.opsets)
		if c.want == "" {
			if err != nil {
				t.Errorf("%v: %v", c.opsets, err)
			}
			continue
		}
		if !errors.Is(err, errs.ErrNotImplemented) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want ErrNotImplemented with %q", c.opsets, err, c.want)
		}
	}
}

// TestRegistrationsWithinNewestOpsets: no kernel is registered for an opset
// newer than the runtime claims to know.
func TestRegistrationsWithinNewestOpsets(t *testing.T) {
	regMu.RLock()
	defer regMu.RUnlock()
	for k, es := range registry {
		domain := strings.SplitN(k, "\x00", 2)[0]
		newest, ok := NewestOpset(domain)
		if !ok {
			continue
		}
		for _, e := range es {
			if e.since > newest || e.until > newest {
				t.Errorf("%q registered for [%d, %d], newest known opset %d", k, e.since, e.until, newest)
			}
		}
	}
}
