package runtime

import (
	"fmt"
	goruntime "runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/errs"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/model"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/ops"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/rewrite"
	"github.com/onnx-light-kv/onnx-light-kv/golib/runtime/tensor"
)

// Options configure a Session.
type Options struct {
	// Threads is the number of goroutines a kernel may use (0: all CPUs).
	Threads int
	// Profile records one Event per executed node in RunStats.
	Profile bool
	// Model tunes loading (size limits, external data folder).
	Model model.Options
	// CacheBudget bounds the bytes of the session's persistent cache arena
	// (0: unlimited). Cache memory outlives runs and never uses the
	// per-run temporaries counted in RunStats.
	CacheBudget int64
	// CachePairs maps past input names to present output names for the
	// cache rewrite, where the model's names follow no exporter convention.
	CachePairs map[string]string
	// DisableFolding runs the graph as written: no constant folding, no
	// dropped Identity/Cast nodes and no shape cache (for differential
	// tests and debugging; onnxruntime's ORT_DISABLE_ALL).
	DisableFolding bool
}

// Session is a RuntimeSession: built once per model (kernels resolved and
// the plan scheduled once), then Run repeatedly. Each request's state (its
// Context with caches and persistent values) lives in a State; Run uses the
// session's default State. Runs on different States may proceed
// concurrently; runs on one State are serialized.
type Session struct {
	model   *model.Model
	plan    *Plan
	threads int
	profile bool

	arena *cache.Arena
	// cache is the cache-aware plan (rewrite verdicts, state-run plan).
	cache *cachePath

	mu     sync.Mutex
	def    *State
	closed bool
	// owned: the session loaded its model (NewSession, NewSessionFromBytes)
	// and gives back its file mappings when closed.
	owned bool
	// runs counts the runs under way (enter, leave): Close waits for them
	// before it unmaps the weights they read.
	runs sync.WaitGroup
}

// State is one request's runtime state: a root Context whose caches and
// persistent values survive between runs until Reset.
//
// A State also owns the buffer pool its runs allocate intermediate and
// output tensors from: a buffer is reused by later runs once the last value
// referencing it has been released (and, for an output, once the caller has
// handed it back with Release).
type State struct {
	mu   sync.Mutex
	ctx  *Context
	pool *bufferPool
	// plan and fr are the main plan last run on the state and its frame
	// (values by slot, per-node scratch, shape cache), kept between runs.
	plan *Plan
	fr   *frame
	mem  *memTracker
}

// frame returns the state's frame for p, making a new one (with an empty
// shape cache) when the state last ran another plan.
func (st *State) frame(p *Plan) *frame {
	if st.plan != p || st.fr == nil {
		st.plan, st.fr = p, newFrame(p)
		if p.main {
			st.fr.shapes = newShapeCache(p)
		}
	}
	return st.fr
}

// NewState returns an empty request state.
func NewState() *State {
	pool := newBufferPool()
	return &State{ctx: NewContext(), pool: pool, mem: newMemTracker(pool)}
}

// Context returns the state's root context (for cache management).
func (st *State) Context() *Context { return st.ctx }

// Reset releases every value and cache of the state and drops its free
// buffers.
func (st *State) Reset() error {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.pool.trim()
	st.plan, st.fr = nil, nil
	return st.ctx.ResetState()
}

// Release hands output tensors of earlier runs on st back to the state's
// buffer pool: a buffer is reused once every output tensor that shares it
// has been released. The caller must not touch the tensors (or anything
// aliasing their bytes) afterwards. Tensors that are not outputs of st's
// runs, were already released, or come from runs older than the last few
// (whose leases are forgotten; the GC frees those buffers) are ignored.
// Release is safe to call while a run on st is in progress.
func (st *State) Release(outputs ...*tensor.Tensor) { st.pool.release(outputs) }

// Leased reports whether t is an output of a recent run on st whose buffer
// comes from the state's pool and is waiting for Release.
func (st *State) Leased(t *tensor.Tensor) bool { return st.pool.leased(t) }

// PoolStats returns the counters of the state's buffer pool.
func (st *State) PoolStats() PoolStats { return st.pool.snapshot() }

// NewSession loads the model at path and builds its session. The session
// owns the model it loaded: the values of the weights its kernels packed
// are released once packed (see releaseConstants), so a packed weight is
// held once, as onnxruntime holds it, and Close unmaps the model's files
// (model.Model.Unmap).
func NewSession(path string, opt Options) (*Session, error) {
	m, err := model.Load(path, opt.Model)
	if err != nil {
		return nil, err
	}
	// The file's bytes are garbage now: collect them before the packs
	// are built, so the packs reuse their pages instead of adding to them.
	goruntime.GC()
	return ownSession(m, opt)
}

// ownSession builds the session of a model it loaded itself; where that
// fails, nothing else holds the model, so its files are unmapped now
// instead of when the process exits.
func ownSession(m *model.Model, opt Options) (*Session, error) {
	s, err := newSession(m, opt, true)
	if err != nil {
		m.Unmap()
		return nil, err
	}
	return s, nil
}

// NewSessionFromBytes decodes a serialized model and builds its session,
// which owns the decoded model as NewSession's does.
func NewSessionFromBytes(b []byte, opt Options) (*Session, error) {
	m, err := model.LoadBytes(b, opt.Model)
	if err != nil {
		return nil, err
	}
	return ownSession(m, opt)
}

// NewSessionFromModel builds a session for an already loaded model, which
// stays the caller's: m is not changed, so it may build more sessions, and
// the session holds its packed weights beside m's values. Closing the
// session leaves m's files mapped: m.Unmap gives them back once no session
// over m runs any more. Every node's
// kernel is resolved here: an unsupported op fails now, naming the op, its
// domain and opset version, and so does an opset import newer than the
// runtime knows (ops.CheckOpsets).
func NewSessionFromModel(m *model.Model, opt Options) (*Session, error) {
	return newSession(m, opt, false)
}

// newSession builds a session for m; owned says the session is m's only
// user, so the constants its kernels packed may be released.
func newSession(m *model.Model, opt Options, owned bool) (*Session, error) {
	if err := ops.CheckOpsets(m.Opsets); err != nil {
		return nil, err
	}
	packs := ops.NewPacks() // one pack per weight for the tensor path's and the cache path's plans
	p, err := buildPlan(m, !opt.DisableFolding, packs)
	if err != nil {
		return nil, err
	}
	for _, vi := range p.Inputs {
		if vi.Kind == model.KindTensor && vi.DType != tensor.Undefined && !vi.DType.Valid() {
			return nil, fmt.Errorf("%w: graph input %q has element type %d", errs.ErrNotImplemented, vi.Name, int32(vi.DType))
		}
		if vi.Kind != model.KindTensor {
			return nil, fmt.Errorf("%w: graph input %q is not a tensor", errs.ErrNotImplemented, vi.Name)
		}
	}
	threads := opt.Threads
	if threads <= 0 {
		threads = goruntime.NumCPU()
	}
	arena, err := cache.NewArena(opt.CacheBudget)
	if err != nil {
		return nil, err
	}
	cp, err := newCachePath(m, opt.CachePairs, packs)
	if err != nil {
		return nil, err
	}
	if owned && releaseConstants(m.Graph, p, cp.plan) > 0 {
		// Hand the released values (and the load's garbage, such as the
		// file's bytes) back to the system now: the collector would
		// otherwise keep the pages until the heap grew into them.
		debug.FreeOSMemory()
	}
	return &Session{model: m, plan: p, threads: threads, profile: opt.Profile, def: NewState(), arena: arena, cache: cp,
		owned: owned}, nil
}

// Arena returns the session's persistent-state arena: KVCache values of the
// session's states are allocated from it, so their pages outlive single runs
// and are accounted apart from run temporaries.
func (s *Session) Arena() *cache.Arena { return s.arena }

// DefaultState returns the state Run uses.
func (s *Session) DefaultState() *State { return s.def }

// Inputs returns the graph inputs a caller feeds (initializer-backed
// inputs excluded).
func (s *Session) Inputs() []model.ValueInfo { return s.plan.Inputs }

// Outputs returns the graph outputs.
func (s *Session) Outputs() []model.ValueInfo { return s.plan.Outputs }

// Plan returns the session's execution plan (read-only).
func (s *Session) Plan() *Plan { return s.plan }

// Model returns the loaded model.
func (s *Session) Model() *model.Model { return s.model }

// Threads returns the kernel thread count.
func (s *Session) Threads() int { return s.threads }

// Close releases the default state's values and caches, after the runs
// under way (on any state) have finished. A session that loaded its own
// model (NewSession, NewSessionFromBytes) also gives back the model's file
// mappings (model.Model.Unmap): the files' address space, and the disk
// space of a file deleted meanwhile, return to the system. Later calls
// fail with errs.ErrClosed; closing twice does nothing.
func (s *Session) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	s.mu.Unlock()
	s.runs.Wait()
	err := s.def.Reset()
	s.def.pool.close()
	if s.cache != nil {
		s.cache.closePrefixes()
	}
	s.arena.Trim()
	if s.owned {
		var consts []*tensor.Tensor
		add := func(t *tensor.Tensor) { consts = append(consts, t) }
		s.plan.eachConstant(add)
		if s.cache != nil {
			s.cache.plan.eachConstant(add)
		}
		s.model.Unmap(consts...)
	}
	return err
}

// Run executes the graph on the session's default state. feeds maps input
// names to tensors (borrowed for the call); outputNames selects outputs in
// order (nil: all graph outputs).
func (s *Session) Run(feeds map[string]*tensor.Tensor, outputNames []string) ([]*tensor.Tensor, *RunStats, error) {
	return s.RunState(s.def, feeds, outputNames)
}

// RunState executes the graph on st. The state's values from the previous
// run are cleared first (ClearValues); its caches and persistent values are
// kept. Feeds are not copied: the caller keeps them alive and unmodified
// until the returned outputs have been consumed (an output may alias a feed).
// Outputs belong to the caller; handing them back with st.Release when done
// lets later runs reuse their buffers instead of allocating (outputs never
// released are simply left to the garbage collector).
func (s *Session) RunState(st *State, feeds map[string]*tensor.Tensor, outputNames []string) ([]*tensor.Tensor, *RunStats, error) {
	if err := s.open(); err != nil {
		return nil, nil, err
	}
	sg, ts, err := s.prepareMap(false, feeds, outputNames)
	if err != nil {
		return nil, nil, err
	}
	return s.runOn(sg, st, ts, nil)
}

// open returns ErrClosed once the session is closed.
func (s *Session) open() error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return errs.ErrClosed
	}
	return nil
}

// enter counts a run in (ErrClosed once the session is closed); leave
// counts it out. Close waits for the runs counted in.
func (s *Session) enter() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return errs.ErrClosed
	}
	s.runs.Add(1)
	return nil
}

func (s *Session) leave() { s.runs.Done() }

// runOn runs the plan of signature sg (the session's plan, or its cache
// path's) on st, with feeds in the order of sg's names. bind, when not
// nil, is called under the state's lock and returns the run's cache
// binding and the function that commits (true) or rolls back (false) the
// generation state's changes.
func (s *Session) runOn(sg *Signature, st *State, feeds []*tensor.Tensor,
	bind func() (rewrite.Binding, func(bool) error, error)) ([]*tensor.Tensor, *RunStats, error) {
	if err := s.enter(); err != nil {
		return nil, nil, err
	}
	defer s.leave()
	if st == nil {
		return nil, nil, fmt.Errorf("%w: nil state", errs.ErrInvalidArgument)
	}
	if err := sg.check(s, feeds); err != nil {
		return nil, nil, err
	}
	p, outIdx := sg.plan, sg.outIdx
	st.mu.Lock()
	defer st.mu.Unlock()
	var binding rewrite.Binding
	end := func(bool) error { return nil }
	if bind != nil {
		var err error
		if binding, end, err = bind(); err != nil {
			return nil, nil, err
		}
	}
	start := time.Now()
	ctx := st.ctx
	ctx.ClearValues()
	defer ctx.ClearValues()             // drop references to borrowed feeds and temporaries
	ctx.SetInitializers(p.Initializers) // read by subgraphs through their contexts
	fr := st.frame(p)
	defer fr.clear()
	for i, t := range feeds {
		if slot := sg.slots[i]; slot >= 0 { // an unread initializer default has none
			fr.vals[slot].t = t
		}
	}
	stats := &RunStats{}
	if s.profile {
		stats.Events = make([]Event, 0, len(p.Nodes))
	}
	st.pool.beginRun()
	mem := st.mem
	mem.begin()
	sc := &runScope{ctx: ctx, threads: s.threads, profile: s.profile, mem: mem, stats: stats, alloc: st.pool, fr: fr, binding: binding}
	if err := p.execute(sc); err != nil {
		if fr.shapes != nil {
			fr.shapes.forget()
			fr.forgetDetached()
		}
		mem.settle(nil, persistentTensors(ctx))
		if e := end(false); e != nil {
			err = fmt.Errorf("%w (restoring the state also failed: %v)", err, e)
		}
		return nil, nil, err
	}
	stats.PeakBytes = mem.peak
	outs := make([]*tensor.Tensor, len(outIdx))
	for i, k := range outIdx {
		t := fr.value(p, p.outSlots[k])
		if t == nil {
			mem.settle(nil, persistentTensors(ctx))
			_ = end(false)
			return nil, nil, fmt.Errorf("%w: output %q was not produced", errs.ErrNotFound, p.Outputs[k].Name)
		}
		if o := p.Outputs[k]; o.Kind == model.KindTensor && o.DType != 0 && t.DType() != o.DType {
			mem.settle(nil, persistentTensors(ctx))
			_ = end(false)
			return nil, nil, fmt.Errorf("%w: output %q is %v, the model declares %v", errs.ErrType, o.Name, t.DType(), o.DType)
		}
		outs[i] = t
	}
	mem.settle(outs, persistentTensors(ctx))
	if err := end(true); err != nil {
		return nil, nil, err
	}
	stats.Duration = time.Since(start)
	return outs, stats, nil
}

// persistentTensors returns the tensors of ctx's declared persistent values,
// which outlive the run (their buffers never return to the pool).
func persistentTensors(ctx *Context) []*tensor.Tensor {
	var ts []*tensor.Tensor
	for name := range ctx.persistent {
		if t, ok := ctx.tensors[name]; ok {
			ts = append(ts, t)
		}
	}
	return ts
}

func (s *Session) resolveOutputs(names []string) ([]int, error) {
	if len(names) == 0 {
		idx := make([]int, len(s.plan.Outputs))
		for i := range idx {
			idx[i] = i
		}
		return idx, nil
	}
	idx := make([]int, len(names))
	for i, n := range names {
		k := -1
		for j, o := range s.plan.Outputs {
			if o.Name == n {
				k = j
				break
			}
		}
		if k < 0 {
			return nil, fmt.Errorf("%w: invalid output name %q (outputs: %s)", errs.ErrNotFound, n, s.outputList())
		}
		idx[i] = k
	}
	return idx, nil
}

func (s *Session) outputList() string {
	names := make([]string, len(s.plan.Outputs))
	for i, o := range s.plan.Outputs {
		names[i] = o.Name
	}
	return strings.Join(names, ", ")
}
