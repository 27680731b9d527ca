package runtime

import (
	"fmt"
	"sort"
	"strings"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Signature is a run's feed names and output names resolved once against
// a plan: the slot each feed goes to, its declared type and shape, and the
// index of each requested output. A caller that runs the same names again
// and again (a decode loop) prepares them once with Prepare or
// PrepareCache and then passes only the tensors, in the order of the feed
// names, to RunSignature or RunCacheSignature: no name is looked up while
// running. What depends only on the names (every required input fed, no
// unknown or duplicate name, no past fed on the cache path, the output
// names exist) is checked when preparing; what depends on the tensors
// (element type, rank, fixed dimensions) is checked at every run.
type Signature struct {
	sess  *Session
	plan  *Plan
	cache bool // prepared for the cache path (RunCacheSignature)
	names []string
	// slots holds each feed's value slot; -1 for an initializer default
	// the plan never reads.
	slots []int32
	// decl holds each feed's declared input (an initializer default's
	// too: a feed replacing it is checked like any other).
	decl []*model.ValueInfo
	// outIdx holds the index of each requested output in the plan's
	// outputs; outputs is the requested names (nil: all outputs).
	outIdx  []int
	outputs []string
	// tokens is the index of the prefix store's token feed, -1 if absent;
	// positions those of the feeds that place the tokens (position_ids,
	// cache_position), which must count on from the state's length for a
	// run to register its blocks.
	tokens    int
	positions []int
	// mask is the index of the attention_mask feed, -1 if absent: a run
	// whose mask has a 0 (left padding, which the caches do not store)
	// does not register.
	mask int
}

// FeedNames returns the feed names the signature takes, in order.
func (sg *Signature) FeedNames() []string { return sg.names }

// Outputs returns the number of outputs a run of the signature returns.
func (sg *Signature) Outputs() int { return len(sg.outIdx) }

// Prepare resolves feed and output names (nil outputNames: every graph
// output) for runs on the tensor path (RunSignature).
func (s *Session) Prepare(feedNames, outputNames []string) (*Signature, error) {
	return s.prepare(s.plan, false, feedNames, outputNames)
}

// PrepareCache resolves feed and output names for runs on the cache path
// (RunCacheSignature); feeding a past is an error naming it.
func (s *Session) PrepareCache(feedNames, outputNames []string) (*Signature, error) {
	if s.cache == nil || s.cache.plan == nil {
		return nil, fmt.Errorf("%w: the model has no cache path", errs.ErrNotImplemented)
	}
	var pasts []string
	for _, name := range feedNames {
		if s.cache.pasts[name] {
			pasts = append(pasts, name)
		}
	}
	if len(pasts) > 0 {
		sort.Strings(pasts)
		return nil, fmt.Errorf("%w: past input(s) %s must not be fed with a generation state (the state holds the caches)",
			errs.ErrInvalidArgument, strings.Join(pasts, ", "))
	}
	return s.prepare(s.cache.plan, true, feedNames, outputNames)
}

func (s *Session) prepare(p *Plan, cachePath bool, feedNames, outputNames []string) (*Signature, error) {
	outIdx, err := s.resolveOutputs(outputNames)
	if err != nil {
		return nil, err
	}
	sg := &Signature{sess: s, plan: p, cache: cachePath, names: append([]string(nil), feedNames...),
		slots: make([]int32, len(feedNames)), decl: make([]*model.ValueInfo, len(feedNames)), outIdx: outIdx, tokens: -1, mask: -1}
	if len(outputNames) > 0 {
		sg.outputs = append([]string(nil), outputNames...)
	}
	at := make(map[string]int, len(feedNames))
	for i, name := range feedNames {
		if _, dup := at[name]; dup {
			return nil, fmt.Errorf("%w: input %q fed twice", errs.ErrInvalidArgument, name)
		}
		at[name] = i
		if name == prefixInput {
			sg.tokens = i
		}
		if prefixPositionInputs[name] {
			sg.positions = append(sg.positions, i)
		}
		if name == prefixMaskInput {
			sg.mask = i
		}
	}
	var missing string
	for k := range p.Inputs {
		in := &p.Inputs[k]
		i, ok := at[in.Name]
		if !ok {
			if missing == "" {
				missing = in.Name
			}
			continue
		}
		sg.decl[i] = in
	}
	var unknown []string
	for i, name := range feedNames {
		if sg.decl[i] == nil {
			if sg.decl[i] = p.defaults[name]; sg.decl[i] == nil {
				unknown = append(unknown, name)
			}
		}
		sg.slots[i] = -1
		if slot, ok := p.slots[name]; ok { // an unread initializer default has none
			sg.slots[i] = slot
		}
	}
	sort.Strings(unknown)
	if missing != "" {
		// a misspelt name shows up as both: say which names were not inputs
		hint := ""
		if len(unknown) > 0 {
			hint = fmt.Sprintf(" (fed unknown input name(s) %s)", strings.Join(unknown, ", "))
		}
		return nil, fmt.Errorf("%w: input %q is required but was not fed%s", errs.ErrMissingInput, missing, hint)
	}
	if len(unknown) > 0 {
		return nil, fmt.Errorf("%w: unknown input name(s) %s", errs.ErrInvalidArgument, strings.Join(unknown, ", "))
	}
	return sg, nil
}

// check verifies a run's tensors against the signature: one per feed name,
// none nil, each of its input's declared element type, rank and fixed
// dimensions.
func (sg *Signature) check(s *Session, feeds []*tensor.Tensor) error {
	if sg.sess != s {
		return fmt.Errorf("%w: the signature was prepared on another session", errs.ErrInvalidArgument)
	}
	if len(feeds) != len(sg.names) {
		return fmt.Errorf("%w: %d tensors for %d feed names", errs.ErrInvalidArgument, len(feeds), len(sg.names))
	}
	for i, t := range feeds {
		name := sg.names[i]
		if t == nil {
			return fmt.Errorf("%w: input %q is nil", errs.ErrInvalidArgument, name)
		}
		vi := sg.decl[i]
		if vi == nil {
			continue
		}
		if vi.DType.Valid() && t.DType() != vi.DType {
			return fmt.Errorf("%w: input %q has type %v, the model expects %v", errs.ErrType, name, t.DType(), vi.DType)
		}
		if vi.Shape != nil {
			if len(vi.Shape) != t.Rank() {
				return fmt.Errorf("%w: input %q has rank %d (shape %v), the model expects rank %d", errs.ErrShape, name, t.Rank(), t.Shape(), len(vi.Shape))
			}
			for k, d := range vi.Shape {
				if d.Value >= 0 && int64(t.Shape()[k]) != d.Value {
					return fmt.Errorf("%w: input %q has shape %v, dimension %d must be %d", errs.ErrShape, name, t.Shape(), k, d.Value)
				}
			}
		}
	}
	return nil
}

// RunSignature runs the tensor path on st with feeds given in the order of
// the signature's feed names (see RunState for the ownership rules).
func (s *Session) RunSignature(st *State, sg *Signature, feeds []*tensor.Tensor) ([]*tensor.Tensor, *RunStats, error) {
	if sg == nil || sg.cache {
		return nil, nil, fmt.Errorf("%w: a tensor-path run needs a signature from Prepare", errs.ErrInvalidArgument)
	}
	return s.runOn(sg, st, feeds, nil)
}

// prepareMap resolves a map of feeds: the signature of its names and the
// tensors in that order.
func (s *Session) prepareMap(cachePath bool, feeds map[string]*tensor.Tensor, outputNames []string) (*Signature, []*tensor.Tensor, error) {
	names := make([]string, 0, len(feeds))
	for name := range feeds {
		names = append(names, name)
	}
	sort.Strings(names)
	var sg *Signature
	var err error
	if cachePath {
		sg, err = s.PrepareCache(names, outputNames)
	} else {
		sg, err = s.Prepare(names, outputNames)
	}
	if err != nil {
		return nil, nil, err
	}
	ts := make([]*tensor.Tensor, len(names))
	for i, name := range names {
		ts[i] = feeds[name]
	}
	return sg, ts, nil
}
