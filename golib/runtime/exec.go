package runtime

import (
	"fmt"
	"time"
	"unsafe"

	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/rewrite"
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
	// Duration is the wall time of the run inside the executor (from the
	// checked feeds to the collected outputs); with Events it gives the
	// executor's own share of a run (Duration minus the kernels' time).
	Duration time.Duration
}

// runScope is the ops.Scope of a run: what a subgraph needs from the run
// that calls it.
type runScope struct {
	ctx     *Context
	threads int
	profile bool
	mem     *memTracker
	stats   *RunStats
	// alloc supplies kernel outputs (the state's pool; nil inside
	// subgraphs, whose values may outlive a body iteration in ways the
	// release schedule does not see).
	alloc ops.Allocator
	// binding is the generation state of a cache-path run (nil otherwise).
	binding rewrite.Binding
	// fr holds the run's values by slot.
	fr *frame
}

// CacheBinding returns the generation state of a cache-path run (nil for
// tensor-path runs); the rewritten cache kernels read it.
func (sc *runScope) CacheBinding() rewrite.Binding { return sc.binding }

// memTracker counts the references a run's values hold on kernel-allocated
// buffers, by buffer, so aliases (Reshape, Identity) are counted once, the
// peak of live bytes is known, and a pooled buffer goes back to its pool
// exactly when the last value referencing it is released.
//
// A state keeps its tracker between runs (begin resets it), so the maps
// and entries are reused rather than allocated per run.
type memTracker struct {
	// bufs holds the entries of buffers that are not pooled (a pooled
	// buffer's entry hangs off the buffer itself); all holds every live
	// entry.
	bufs map[*byte]*memEntry
	all  []*memEntry
	pool *bufferPool // nil: no pooled buffers
	live int64
	peak int64
	// spare entries (of unpooled buffers: a pooled buffer holds its own,
	// poolBuf.own).
	spare []*memEntry
}

type memEntry struct {
	key   *byte // the buffer's first byte
	bytes int64
	refs  int
	buf   *poolBuf // the pooled buffer, nil for other allocations
	idx   int      // position in memTracker.all
	// held lists the returned outputs viewing the buffer, kept whether a
	// persistent value does (settle's scratch; held keeps its capacity
	// from run to run).
	held []*tensor.Tensor
	kept bool
}

func newMemTracker(pool *bufferPool) *memTracker {
	return &memTracker{bufs: map[*byte]*memEntry{}, pool: pool}
}

// begin starts a run's tracking.
func (m *memTracker) begin() {
	for len(m.all) > 0 {
		m.remove(m.all[len(m.all)-1])
	}
	m.live, m.peak = 0, 0
}

// add tracks a new buffer with one reference.
func (m *memTracker) add(key *byte, bytes int64, buf *poolBuf) *memEntry {
	var e *memEntry
	switch n := len(m.spare); {
	case buf != nil:
		e = &buf.own // next to the buffer's fields the pool just touched
	case n > 0:
		e = m.spare[n-1]
		m.spare = m.spare[:n-1]
	default:
		e = &memEntry{}
	}
	*e = memEntry{key: key, bytes: bytes, refs: 1, buf: buf, idx: len(m.all), held: e.held[:0]}
	m.all = append(m.all, e)
	if buf != nil {
		buf.ent = e
	} else {
		m.bufs[key] = e
	}
	return e
}

// remove stops tracking e's buffer (without returning it to the pool).
func (m *memTracker) remove(e *memEntry) {
	last := m.all[len(m.all)-1]
	m.all[e.idx], last.idx = last, e.idx
	m.all[len(m.all)-1] = nil
	m.all = m.all[:len(m.all)-1]
	clear(e.held)
	if b := e.buf; b != nil {
		b.ent = nil
		*e = memEntry{held: e.held[:0]} // b.own
		return
	}
	delete(m.bufs, e.key)
	*e = memEntry{held: e.held[:0]}
	m.spare = append(m.spare, e)
}

func bufKey(t *tensor.Tensor) *byte {
	if t == nil || t.NumBytes() == 0 {
		return nil
	}
	return unsafe.SliceData(t.Bytes())
}

// entry finds the tracked buffer holding t's bytes: by its first byte, or,
// for a view into a pooled buffer, through the pool. It returns t's first
// byte and the pooled buffer, if any.
func (m *memTracker) entry(t *tensor.Tensor) (*byte, *memEntry, *poolBuf) {
	k := bufKey(t)
	if k == nil {
		return nil, nil, nil
	}
	if m.pool != nil {
		if b := m.pool.last; b != nil && k == &b.data[0] {
			return k, b.ent, b // the buffer the pool handed out last: a node's fresh output
		}
	}
	if len(m.bufs) > 0 {
		if e, ok := m.bufs[k]; ok {
			return k, e, nil
		}
	}
	if m.pool != nil {
		if b := m.pool.lookup(k); b != nil {
			return k, b.ent, b
		}
	}
	return k, nil, nil
}

// produced records a node output and returns the entry of its buffer (nil
// when the run does not track it).
func (m *memTracker) produced(t *tensor.Tensor, inputs []*tensor.Tensor) *memEntry {
	k, e, b := m.entry(t)
	if k == nil {
		return nil
	}
	if e != nil {
		e.refs++
		return e
	}
	if b == nil {
		for _, in := range inputs {
			if bufKey(in) == k {
				return nil // aliases a feed, initializer or captured value
			}
		}
	}
	return m.track(k, t, b)
}

// track starts tracking t's buffer (first byte k; b: the pooled buffer, if
// any) with one reference.
func (m *memTracker) track(k *byte, t *tensor.Tensor, b *poolBuf) *memEntry {
	e := m.add(k, int64(t.NumBytes()), b)
	m.live += e.bytes
	if m.live > m.peak {
		m.peak = m.live
	}
	return e
}

// releasedEntry drops a reference to a tracked buffer; the last one frees
// the buffer's bytes from the live count and returns a pooled buffer to its
// pool.
func (m *memTracker) releasedEntry(e *memEntry) {
	if e.refs--; e.refs == 0 {
		m.live -= e.bytes
		if b := e.buf; b != nil {
			m.remove(e)
			m.pool.put(b)
			return
		}
		m.remove(e)
	}
}

// retain adds a reference to t's buffer if the run tracks it (a subgraph
// binding an outer value to a formal input, which its plan releases).
func (m *memTracker) retain(t *tensor.Tensor) {
	if _, e, _ := m.entry(t); e != nil {
		e.refs++
	}
}

// released drops a reference to t's buffer, found by lookup.
func (m *memTracker) released(t *tensor.Tensor) {
	if _, e, _ := m.entry(t); e != nil {
		m.releasedEntry(e)
	}
}

// settle ends a run's tracking: pooled buffers referenced by the returned
// outputs are leased to the caller, those referenced by persistent values
// stay with them, and every other pooled buffer still tracked (unrequested
// outputs, the values of a failed run) goes back to the pool.
func (m *memTracker) settle(outs []*tensor.Tensor, keep []*tensor.Tensor) {
	// Headers that outlive the run are never recycled (tensor.Recycle).
	for _, t := range outs {
		if t != nil {
			t.Pin()
		}
	}
	for _, t := range keep {
		t.Pin()
	}
	for _, t := range outs {
		if _, e, _ := m.entry(t); e != nil && e.buf != nil {
			e.held = append(e.held, t)
		}
	}
	for _, t := range keep {
		if _, e, _ := m.entry(t); e != nil && e.buf != nil {
			e.kept = true
		}
	}
	for len(m.all) > 0 {
		e := m.all[len(m.all)-1]
		switch b := e.buf; {
		case b == nil:
		case e.kept: // stays with the persistent value
		case len(e.held) > 0:
			m.pool.lend(b, e.held)
		default:
			m.pool.put(b)
		}
		m.remove(e)
	}
}

// execute runs p's actions on the values of sc.fr.
func (p *Plan) execute(sc *runScope) (err error) {
	fr := sc.fr
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
	if fr.shapes != nil {
		fr.shapes.begin()
	}
	if p.linear {
		for _, s := range p.startRel {
			fr.drop(sc.mem, s)
		}
		sh := fr.shapes
		for i := range p.run {
			if sh != nil {
				if rd := sh.ready[i]; rd != 0 && !sh.dirty[i] {
					// kept geometry outputs that hold, still in their slots
					if rd == readyRel {
						for _, s := range p.run[i].rel {
							fr.drop(sc.mem, s)
						}
					}
					continue
				}
			}
			cur = i
			if err := p.executeNode(sc, i); err != nil {
				return err
			}
			for _, s := range p.run[i].rel {
				fr.drop(sc.mem, s)
			}
		}
		return nil
	}
	for i := range p.Actions {
		a := &p.Actions[i]
		switch a.Kind {
		case ActExecute:
			cur = a.Node
			if err := p.executeNode(sc, a.Node); err != nil {
				return err
			}
		case ActRelease:
			for _, s := range a.slots {
				fr.drop(sc.mem, s)
			}
		case ActCacheDelete:
			if c, ok := sc.ctx.RemoveCache(a.Cache); ok {
				c.Close()
			}
		case ActCacheCreate:
			return fmt.Errorf("%w: cache-create actions (the cache-aware rewrite)", errs.ErrNotImplemented)
		}
	}
	return nil
}

// drop releases the value in slot s; a detached value stays (the shape
// cache holds it; a later store replaces it).
func (f *frame) drop(mem *memTracker, s int32) {
	v := &f.vals[s]
	if v.detached {
		return
	}
	if v.t != nil {
		if v.e != nil {
			mem.releasedEntry(v.e)
		} else if f.sub {
			mem.released(v.t) // placed without store: a subgraph input
		}
		v.t, v.e = nil, nil
	}
}

// store puts output t of a node reading inputs (from slots in) in slot s;
// detached values are not tracked (the shape cache owns them). An output
// starting at a tracked input's first byte (Reshape, Squeeze, Identity)
// shares that input's entry without a lookup.
func (f *frame) store(mem *memTracker, s int32, t *tensor.Tensor, inputs []*tensor.Tensor, in []int32, detached bool) {
	f.drop(mem, s)
	v := &f.vals[s]
	*v = slotVal{t: t, detached: detached}
	if detached {
		return
	}
	if k := bufKey(t); k != nil {
		if b := mem.pool; b != nil && b.last != nil && k == &b.last.data[0] && b.last.ent == nil {
			// the buffer the pool handed out last, tracked by no value:
			// the node's fresh output, aliasing none of its inputs
			v.e = mem.track(k, t, b.last)
			return
		}
		for j, x := range inputs {
			if e := f.vals[max(in[j], 0)].e; x != nil && e != nil && bufKey(x) == k {
				e.refs++
				v.e = e
				return
			}
		}
	}
	v.e = mem.produced(t, inputs)
}

// reuse puts a geometry node's kept outputs in their slots (out), where
// they are not still there from the last run; kept values are detached, so
// storing one needs no inputs.
func (f *frame) reuse(mem *memTracker, kept []*tensor.Tensor, out []int32) {
	for k, s := range out {
		if s >= 0 && (f.vals[s].t != kept[k] || !f.vals[s].detached) { // else still in its slot
			f.store(mem, s, kept[k], nil, nil, true)
		}
	}
}

func (p *Plan) executeNode(sc *runScope, i int) error {
	r := &p.run[i] // the node's hot fields; p.Nodes[i] only for errors and rare paths
	fr := sc.fr
	sh := fr.shapes
	geometry := sh != nil && r.geometry
	if geometry && r.shapeRead < 0 && sh.ready[i] != 0 && (!sh.dirty[i] || r.dimRead >= 0 && sh.sameDims(r)) {
		// A geometry node other than a shape read decides reuse from its
		// kept outputs (ready) and the changed marks of its geometry inputs
		// (dirty: one of them changed; a dimension read's one input may
		// change in dimensions it does not read) alone: its inputs are not
		// gathered. This is what shapeCache.reusable decides, without the
		// walk over the inputs.
		fr.reuse(sc.mem, sh.outs[i], r.out)
		return nil
	}
	inputs := fr.inputs[i]
	for k, s := range r.in {
		if s < 0 {
			continue
		}
		t := fr.value(p, s)
		if t == nil {
			n := r.node
			name := n.Inputs[k]
			if _, isSeq := sc.ctx.Sequence(name); isSeq {
				return withNode(n, fmt.Errorf("%w: sequence input %q", errs.ErrNotImplemented, name))
			}
			return withNode(n, fmt.Errorf("%w: value %q is not available", errs.ErrMissingInput, name))
		}
		inputs[k] = t
	}
	if r.castTo != tensor.Undefined && !geometry && inputs[0] != nil && inputs[0].DType() == r.castTo && r.out[0] >= 0 {
		fr.store(sc.mem, r.out[0], inputs[0], inputs, r.in, false) // a Cast to the type it has: the input itself
		return nil
	}
	if geometry && r.shapeRead >= 0 && sh.reusable(i, r, inputs) {
		fr.reuse(sc.mem, sh.outs[i], r.out)
		return nil
	}
	if r.captures {
		for _, name := range r.node.Captures {
			if s, ok := p.slots[name]; ok && fr.vals[s].t != nil {
				sc.ctx.PutTensor(name, fr.vals[s].t) // subgraphs read outer values by name
			}
		}
	}
	var alloc ops.Allocator
	if sc.alloc != nil && !geometry { // cached values must not come from the pool
		alloc = sc.alloc
	}
	kctx := &fr.kctx[i]
	kctx.Reset(inputs, r.wanted, sc.threads, sc, alloc)
	if geometry && r.spares {
		sh.offer(i, r, kctx)
	}
	var start time.Time
	if sc.profile {
		start = time.Now()
	}
	if err := r.kernel.Compute(kctx); err != nil {
		return withNode(r.node, err)
	}
	if sc.profile {
		n := r.node
		sc.stats.Events = append(sc.stats.Events, Event{Node: n.Name, OpType: n.OpType, Start: start,
			Duration: time.Since(start), BytesAllocated: kctx.Allocated})
	}
	sc.stats.AllocatedBytes += kctx.Allocated
	if geometry {
		sh.update(i, r, kctx) // before storing: an unchanged output is replaced by the kept one
	}
	kept := geometry && sh.outs[i] != nil
	for k, s := range r.out {
		if s < 0 {
			continue
		}
		t := kctx.Output(k)
		if t == nil {
			return withNode(r.node, fmt.Errorf("%w: the node declares output %d (%q), which %s does not produce",
				errs.ErrInvalidModel, k, r.node.Outputs[k], r.node.OpType))
		}
		fr.store(sc.mem, s, t, inputs, r.in, kept)
	}
	return nil
}
