package ops

import (
	"fmt"
	"sort"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
)

// newestOpsets is the newest opset version of each standard domain whose
// operator definitions the kernels were written against. A model importing
// a newer version may rely on semantics this runtime does not know, so it is
// refused at session creation (CheckOpsets) rather than run with the older
// meaning. Domains not listed here (custom ones, the runtime's internal
// domain) are checked per node by Lookup.
var newestOpsets = map[string]int{
	"":              25,
	"ai.onnx.ml":    5,
	"com.microsoft": 1,
}

// NewestOpset returns the newest opset version of domain ("ai.onnx" or ""
// for the default domain) the runtime knows, and false for a domain it does
// not version.
func NewestOpset(domain string) (int, bool) {
	v, ok := newestOpsets[NormDomain(domain)]
	return v, ok
}

// NewestOpsets returns a copy of the newest known opset of every versioned
// standard domain ("" is the default domain).
func NewestOpsets() map[string]int {
	out := make(map[string]int, len(newestOpsets))
	for d, v := range newestOpsets {
		out[d] = v
	}
	return out
}

// CheckOpsets returns an error wrapping errs.ErrNotImplemented, naming the
// domain and both versions, when an opset import of a standard domain is
// newer than NewestOpset.
func CheckOpsets(opsets map[string]int) error {
	domains := make([]string, 0, len(opsets))
	for d := range opsets {
		domains = append(domains, d)
	}
	sort.Strings(domains)
	for _, d := range domains {
		newest, ok := NewestOpset(d)
		if !ok || opsets[d] <= newest {
			continue
		}
		name := NormDomain(d)
		if name == "" {
			name = "ai.onnx"
		}
		return fmt.Errorf("%w: the model imports opset %d of domain %s; this runtime knows opsets up to %d of that domain",
			errs.ErrNotImplemented, opsets[d], name, newest)
	}
	return nil
}
