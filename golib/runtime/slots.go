package runtime

import (
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Values of a run live in a slice indexed by slot: every name a plan reads
// or writes is resolved to a slot when the plan is built, so the run path
// does no map lookups. Initializers are read from the plan's base slots
// when a run's own slot is empty (a feed overriding an initializer default
// fills it); feeds are placed by name once per run.

// slotIndex maps the names of a plan's values to slots.
type slotIndex struct {
	byName map[string]int32
	names  []string
}

func (x *slotIndex) slot(name string) int32 {
	if name == "" {
		return -1
	}
	if s, ok := x.byName[name]; ok {
		return s
	}
	s := int32(len(x.names))
	x.byName[name] = s
	x.names = append(x.names, name)
	return s
}

// resolveSlots assigns slots to p's values and resolves every node's
// inputs and outputs, the release actions and the graph outputs to them.
func (p *Plan) resolveSlots() {
	x := &slotIndex{byName: map[string]int32{}}
	for _, in := range p.Inputs {
		x.slot(in.Name)
	}
	for _, c := range p.Captures {
		x.slot(c)
	}
	for _, n := range p.Nodes {
		if n.OpType == "Cast" && n.Domain == "" && len(n.Inputs) == 1 && len(n.Outputs) == 1 {
			if to, err := n.Info.Attrs.Int("to", 0); err == nil && tensor.DType(to).Valid() {
				n.castTo = tensor.DType(to)
			}
		}
		n.in = make([]int32, len(n.Inputs))
		for i, in := range n.Inputs {
			n.in[i] = x.slot(in)
		}
		n.out = make([]int32, len(n.Outputs))
		for i, o := range n.Outputs {
			n.out[i] = x.slot(o)
		}
	}
	for i := range p.Actions {
		a := &p.Actions[i]
		if a.Kind == ActRelease {
			a.slots = make([]int32, len(a.Values))
			for k, v := range a.Values {
				a.slots[k] = x.slot(v)
			}
		}
	}
	p.outSlots = make([]int32, len(p.Outputs))
	for i, o := range p.Outputs {
		p.outSlots[i] = x.slot(o.Name)
	}
	p.captureSlots = make([]int32, len(p.Captures))
	for i, c := range p.Captures {
		p.captureSlots[i] = x.slot(c)
	}
	// Initializers nobody reads need no slot; the others start each run
	// in theirs.
	p.base = make([]*tensor.Tensor, len(x.names))
	for name, t := range p.Initializers {
		if s, ok := x.byName[name]; ok {
			p.base[s] = t
		}
	}
	p.slots = x.byName
}

// frame is the storage of one run of a plan: the values by slot and, per
// node, the input slice and kernel context its calls reuse. A state keeps
// the frame of its session's main plan between runs; subgraph runs use a
// fresh one.
type frame struct {
	// vals holds the values by slot, each with its tracking in one record
	// (the run loop reads a slot's value, entry and mark together).
	vals   []slotVal
	inputs [][]*tensor.Tensor
	kctx   []ops.Context
	shapes *shapeCache // nil: no shape cache (subgraphs)
	// sub marks a subgraph run's frame, whose formal inputs hold a
	// reference on the caller's values (released when dropped); a main
	// plan's untracked values (feeds, views of feeds and initializers)
	// hold none, so dropping them needs no lookup.
	sub bool
}

// slotVal is a frame slot: its value, the memTracker entry of a tracked
// value, and whether the value is detached (not the run's to release:
// a cached shape value, whose buffer belongs to the shape cache).
type slotVal struct {
	t        *tensor.Tensor
	e        *memEntry
	detached bool
}

func newFrame(p *Plan) *frame {
	f := &frame{vals: make([]slotVal, len(p.base)),
		inputs: make([][]*tensor.Tensor, len(p.Nodes)), kctx: make([]ops.Context, len(p.Nodes))}
	total := 0
	for _, n := range p.Nodes {
		total += len(n.Inputs)
	}
	slab := make([]*tensor.Tensor, total) // the nodes' input slices side by side, in run order
	for i, n := range p.Nodes {
		f.inputs[i], slab = slab[:len(n.Inputs):len(n.Inputs)], slab[len(n.Inputs):]
	}
	return f
}

// value returns the value of slot s in this run: the run's own, or the
// initializer.
func (f *frame) value(p *Plan, s int32) *tensor.Tensor {
	if t := f.vals[s].t; t != nil {
		return t
	}
	return p.base[s]
}

// clear ends a run: it drops the references the value slots hold (so
// borrowed feeds and outputs handed to the caller are not kept alive by
// the frame) and their tracking. The per-node input slices and kernel
// contexts keep theirs until the node's next call overwrites them:
// clearing hundreds of small slices costs more than the rest of the
// executor's per-run work, and nothing reads them. Detached values (the
// shape cache's kept values, which it holds anyway) stay in their slots,
// so a geometry node whose kept outputs hold in the next run has nothing
// to store (forgetDetached drops them too).
func (f *frame) clear() {
	if f.shapes == nil {
		clear(f.vals)
		return
	}
	for s := range f.vals {
		v := &f.vals[s]
		if !v.detached {
			v.t = nil
		}
		v.e = nil
	}
}

// forgetDetached makes the next clear drop the detached values too (after
// a failed run, when the shape cache forgets them).
func (f *frame) forgetDetached() {
	for s := range f.vals {
		f.vals[s].detached = false
	}
}
