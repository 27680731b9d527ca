package runtime

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Event is one profiling record: a node's kernel call.
type Event struct {
	Node           string
	OpType         string
	Start          time.Time
	Duration       time.Duration
	BytesAllocated int64 // bytes of outputs the kernel allocated
}

// RunStats are the figures of one Run.
type RunStats struct {
	// PeakBytes is the largest total size of kernel-allocated tensors alive
	// at once during the run (feeds and initializers excluded; outputs
	// aliasing their inputs counted once).
	PeakBytes int64
	// AllocatedBytes is the total size of all kernel-allocated outputs.
	AllocatedBytes int64
	// Events holds one record per executed node when profiling is on.
	Events []Event
}

// runScope is the ops.Scope of a run: what a subgraph needs from the run
// that calls it.
type runScope struct {
	ctx     *Context
	threads int
	profile bool
	mem     *memTracker
	stats   *RunStats
}

// memTracker counts live kernel-allocated bytes by buffer, so aliases
// (Reshape, Identity) are not counted twice.
type memTracker struct {
	bufs map[*byte]*memEntry
	live int64
	peak int64
}

type memEntry struct {
	bytes int64
	refs  int
}

func newMemTracker() *memTracker { return &memTracker{bufs: map[*byte]*memEntry{}} }

func bufKey(t *tensor.Tensor) *byte {
	if t == nil || t.NumBytes() == 0 {
		return nil
	}
	return unsafe.SliceData(t.Bytes())
}

// produced records a node output; fresh says whether the kernel allocated it.
func (m *memTracker) produced(t *tensor.Tensor, inputs []*tensor.Tensor) {
	k := bufKey(t)
	if k == nil {
		return
	}
	if e, ok := m.bufs[k]; ok {
		e.refs++
		return
	}
	for _, in := range inputs {
		if bufKey(in) == k {
			return // aliases a feed, initializer or captured value
		}
	}
	m.bufs[k] = &memEntry{bytes: int64(t.NumBytes()), refs: 1}
	m.live += int64(t.NumBytes())
	if m.live > m.peak {
		m.peak = m.live
	}
}

func (m *memTracker) released(t *tensor.Tensor) {
	k := bufKey(t)
	if e, ok := m.bufs[k]; ok && k != nil {
		if e.refs--; e.refs == 0 {
			m.live -= e.bytes
			delete(m.bufs, k)
		}
	}
}

// execute runs p's actions on ctx.
func (p *Plan) execute(sc *runScope) (err error) {
	ctx := sc.ctx
	cur := -1
	defer func() {
		if r := recover(); r != nil {
			where := "plan"
			if cur >= 0 {
				where = withNode(p.Nodes[cur], fmt.Errorf("panic")).Error()
			}
			err = fmt.Errorf("runtime: internal error in %s: %v", where, r)
		}
	}()
	for _, a := range p.Actions {
		switch a.Kind {
		case ActExecute:
			cur = a.Node
			if err := p.executeNode(sc, p.Nodes[a.Node]); err != nil {
				return err
			}
		case ActRelease:
			for _, v := range a.Values {
				if t, ok := ctx.tensors[v]; ok {
					sc.mem.released(t)
					delete(ctx.tensors, v)
				}
			}
		case ActCacheDelete:
			if c, ok := ctx.RemoveCache(a.Cache); ok {
				c.Close()
			}
		case ActCacheCreate:
			return fmt.Errorf("%w: cache-create actions (the cache-aware rewrite)", errs.ErrNotImplemented)
		}
	}
	return nil
}

func (p *Plan) executeNode(sc *runScope, n *PlanNode) error {
	ctx := sc.ctx
	inputs := make([]*tensor.Tensor, len(n.Inputs))
	for i, name := range n.Inputs {
		if name == "" {
			continue
		}
		t, ok := ctx.Tensor(name)
		if !ok {
			if _, isSeq := ctx.Sequence(name); isSeq {
				return withNode(n, fmt.Errorf("%w: sequence input %q", errs.ErrNotImplemented, name))
			}
			return withNode(n, fmt.Errorf("%w: value %q is not available", errs.ErrMissingInput, name))
		}
		inputs[i] = t
	}
	wanted := n.Info.OutputPresent
	kctx := ops.NewContext(inputs, wanted, sc.threads, sc)
	var start time.Time
	if sc.profile {
		start = time.Now()
	}
	if err := n.Kernel.Compute(kctx); err != nil {
		return withNode(n, err)
	}
	if sc.profile {
		sc.stats.Events = append(sc.stats.Events, Event{Node: n.Name, OpType: n.OpType, Start: start,
			Duration: time.Since(start), BytesAllocated: kctx.Allocated})
	}
	sc.stats.AllocatedBytes += kctx.Allocated
	for i, name := range n.Outputs {
		if name == "" {
			continue
		}
		t := kctx.Output(i)
		if t == nil {
			return withNode(n, fmt.Errorf("runtime: kernel produced no value for output %d (%q)", i, name))
		}
		if old, ok := ctx.tensors[name]; ok {
			sc.mem.released(old)
		}
		ctx.tensors[name] = t
		sc.mem.produced(t, inputs)
	}
	return nil
}
