package runtime

import (
	"fmt"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// subgraph is a compiled graph attribute. It runs in a child context of the
// calling run, so it reads outer values and caches without copies.
type subgraph struct {
	plan *Plan
}

// NumOutputs returns the number of graph outputs.
func (s *subgraph) NumOutputs() int { return len(s.plan.Outputs) }

// OutputType returns output i's declared element type (ok false when it
// has none) and its shape when every dimension is fixed (else nil).
func (s *subgraph) OutputType(i int) (tensor.DType, tensor.Shape, bool) {
	if i < 0 || i >= len(s.plan.Outputs) {
		return 0, nil, false
	}
	o := s.plan.Outputs[i]
	if !o.DType.Valid() {
		return 0, nil, false
	}
	if o.Shape == nil {
		return o.DType, nil, true
	}
	shape := make(tensor.Shape, len(o.Shape))
	for k, d := range o.Shape {
		if d.Value < 0 {
			return o.DType, nil, true
		}
		shape[k] = int(d.Value)
	}
	return o.DType, shape, true
}

// Run executes the subgraph with its formal inputs bound to inputs.
func (s *subgraph) Run(parent ops.Scope, inputs []*tensor.Tensor) ([]*tensor.Tensor, error) {
	ps, ok := parent.(*runScope)
	if !ok || ps == nil {
		return nil, fmt.Errorf("%w: subgraph run outside of a session run", errs.ErrInvalidArgument)
	}
	if len(inputs) != len(s.plan.Inputs) {
		return nil, fmt.Errorf("%w: subgraph takes %d inputs, got %d", errs.ErrInvalidArgument, len(s.plan.Inputs), len(inputs))
	}
	child := ps.ctx.NewChild()
	child.SetInitializers(s.plan.Initializers)
	fr := newFrame(s.plan)
	fr.sub = true
	for i, in := range s.plan.Inputs {
		fr.vals[s.plan.slots[in.Name]].t = inputs[i]
		ps.mem.retain(inputs[i]) // the body's plan releases its inputs after their last use
	}
	for k, c := range s.plan.Captures {
		if t, ok := child.Tensor(c); ok {
			fr.vals[s.plan.captureSlots[k]].t = t
		}
	}
	// No pool inside subgraphs: a body's values may be carried into the
	// next iteration or returned by the calling kernel, past what the
	// body's release schedule sees.
	sc := &runScope{ctx: child, threads: ps.threads, profile: ps.profile, mem: ps.mem, stats: ps.stats, fr: fr}
	if err := s.plan.execute(sc); err != nil {
		return nil, err
	}
	out := make([]*tensor.Tensor, len(s.plan.Outputs))
	for i, o := range s.plan.Outputs {
		t := fr.value(s.plan, s.plan.outSlots[i])
		if t == nil {
			return nil, fmt.Errorf("%w: subgraph output %q was not produced", errs.ErrMissingInput, o.Name)
		}
		out[i] = t
	}
	// The body's frame ends here: drop its references (retained inputs
	// included, captured values excluded; initializers are never in the
	// frame's own slots) so the calling node accounts for the outputs it
	// keeps.
	captured := make(map[int32]bool, len(s.plan.captureSlots))
	for _, c := range s.plan.captureSlots {
		captured[c] = true
	}
	for k, v := range fr.vals {
		if v.t != nil && !captured[int32(k)] {
			sc.mem.released(v.t)
		}
	}
	return out, nil
}
