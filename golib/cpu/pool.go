package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// Tuning of the worker pool.
const (
	// helperSpin is how long an idle helper polls for the next call before
	// it parks: decode steps come back to back, and a poll hand-off costs
	// far less than waking a parked goroutine. Measured from Python (each
	// call a cgo callback): with a 50 us poll the woken helper joined too
	// late to help and two threads ran no faster than one; with 1 ms they
	// ran 1.4-1.8x faster.
	helperSpin = time.Millisecond
	// serialBytes: calls that read fewer K/V bytes than this run on the
	// calling goroutine alone; waking helpers would cost more than it saves.
	serialBytes = 96 << 10
	// minSplitTokens is the smallest token range a split-KV task gets.
	minSplitTokens = 128
)

// MaxThreads is the largest thread count SetThreads accepts; more is
// clamped (each thread beyond the CPUs only adds a polling helper).
const MaxThreads = 1024

// SetThreads sets the number of threads (the calling goroutine plus pool
// helpers) that Attention uses. n <= 0 restores the default,
// runtime.NumCPU(); n > MaxThreads is clamped to MaxThreads.
func SetThreads(n int) {
	if n <= 0 {
		n = runtime.NumCPU()
	}
	n = min(n, MaxThreads)
	thePool.mu.Lock()
	thePool.threads = n
	thePool.mu.Unlock()
}

// Threads returns the number of threads Attention uses.
func Threads() int {
	thePool.mu.Lock()
	defer thePool.mu.Unlock()
	return thePool.threads
}

// pool is the persistent worker pool. One call runs at a time (mu); the
// calling goroutine works as thread 0 and up to threads-1 helpers join it.
// Hand-off: the caller publishes the job and bumps gen; helpers that are
// still polling see it at once, parked ones are woken through their channel.
// Tasks are claimed with an atomic counter. A helper joins a job through
// the join word (generation, closed bit, count of joined helpers); when the
// caller runs out of tasks it closes the job and waits only for the helpers
// that joined, so a helper the OS has not scheduled yet (a busy machine)
// never holds a call up: it finds the job closed and goes back to waiting.
type pool struct {
	mu      sync.Mutex
	threads int
	helpers []*helper
	states  []unitState // [0] is the caller's scratch, [i] helper i's

	gen      atomic.Uint64
	next     atomic.Int64
	join     atomic.Uint64 // gen<<32 | closedBit | joined helpers
	finished atomic.Int32  // joined helpers that are done

	// The job, written by the caller before gen is bumped.
	active atomic.Int32 // helpers allowed to join this job
	s      shape
	dst, q []float32
	view   cache.View
	ops    *kernelOps
	ntasks int
	nsplit int
	parts  []float32 // split-KV partial states, [units][nsplit][rows][dv+2]

	errMu sync.Mutex
	err   error
}

type helper struct {
	idx      int // 1-based: states[idx]
	sleeping atomic.Bool
	wake     chan struct{}
}

var thePool = pool{threads: runtime.NumCPU()}

// run executes one validated attention call.
func (p *pool) run(s *shape, dst, q []float32, v cache.View, ops *kernelOps) error {
	p.mu.Lock()
	defer p.mu.Unlock()

	units := s.batch * s.kvHeads
	rows := s.group * s.qLen
	var bytes int64
	maxLen := 0
	for b := 0; b < s.batch; b++ {
		L, ws := v.SeqLen(b), v.WindowStart(b)
		lo, _ := s.rowRange(L, ws, 0)
		bytes += int64(L - lo)
		maxLen = max(maxLen, L-lo)
	}
	bytes *= int64(s.kvHeads * (s.dk + s.dv) * s.elem.Size())

	threads := p.threads
	if s.threads > 0 {
		threads = min(threads, s.threads)
	}
	if bytes < serialBytes {
		threads = 1
	}
	nsplit := 1
	if threads > 1 && units%threads != 0 {
		nsplit = min((2*threads+units-1)/units, max(maxLen/minSplitTokens, 1))
	}
	threads = min(threads, units*nsplit)

	p.s, p.dst, p.q, p.view, p.ops = *s, dst, q, v, ops
	p.ntasks, p.nsplit = units*nsplit, nsplit
	p.err = nil
	if nsplit > 1 {
		p.parts = growF(p.parts, p.ntasks*rows*(s.dv+2))
	}
	if len(p.states) < threads {
		p.states = append(p.states, make([]unitState, threads-len(p.states))...)
	}
	for i := range p.states {
		p.states[i].read = 0
	}
	if s.threads > 0 && threads > 1 {
		// A call bounded by a session's threads runs its tasks on the
		// products' worker pool (package gemm), whose helpers are already
		// polling between the ops of a step: this pool's own helpers would
		// compete with them for the cores.
		p.next.Store(0)
		gemm.ForThreads(threads, threads, p.workSafe)
		return p.finish(s, dst, v)
	}
	for len(p.helpers) < threads-1 {
		h := &helper{idx: len(p.helpers) + 1, wake: make(chan struct{}, 1)}
		p.helpers = append(p.helpers, h)
		go p.helperLoop(h, p.gen.Load())
	}

	p.next.Store(0)
	p.active.Store(int32(threads - 1))
	p.finished.Store(0)
	gen := p.gen.Load() + 1
	p.join.Store(gen << 32)
	if threads > 1 {
		p.gen.Add(1)
		for _, h := range p.helpers[:threads-1] {
			if h.sleeping.CompareAndSwap(true, false) {
				h.wake <- struct{}{}
			}
		}
	}
	p.work(0)
	var joined int32
	for {
		j := p.join.Load()
		if p.join.CompareAndSwap(j, j|closedBit) {
			joined = int32(j & joinMask)
			break
		}
	}
	for i := 0; p.finished.Load() != joined; i++ {
		if i&15 == 15 {
			runtime.Gosched()
		}
	}

	return p.finish(s, dst, v)
}

// finish merges split-KV partial states and ends the call.
func (p *pool) finish(s *shape, dst []float32, v cache.View) error {
	rows := s.group * s.qLen
	units := s.batch * s.kvHeads
	nsplit := p.nsplit
	if p.err == nil && nsplit > 1 {
		stride := nsplit * rows * (s.dv + 2)
		for u := 0; u < units; u++ {
			b, h := u/s.kvHeads, u%s.kvHeads
			q0 := (b*s.qHeads + h*s.group) * s.qLen
			if err := mergeParts(dst, p.parts[u*stride:(u+1)*stride], s, q0, nsplit, p.q, v, b, h); err != nil {
				p.err = err
				break
			}
		}
	}
	err := p.err
	p.dst, p.q, p.view = nil, nil, nil
	if err != nil {
		return err
	}
	// The units counted what they read (quantized rows and their scales
	// included); bytes, the native estimate, only chose the thread count.
	var read int64
	for i := range p.states {
		read += p.states[i].read
	}
	v.AddBytesRead(read)
	return nil
}

// work claims and runs tasks until none is left.
func (p *pool) work(idx int) {
	st := &p.states[idx]
	s := &p.s
	rows := s.group * s.qLen
	for {
		k := int(p.next.Add(1) - 1)
		if k >= p.ntasks {
			return
		}
		u, c := k/p.nsplit, k%p.nsplit
		b, h := u/s.kvHeads, u%s.kvHeads
		L, ws := p.view.SeqLen(b), p.view.WindowStart(b)
		lo, _ := s.rowRange(L, ws, 0)
		from := lo + (L-lo)*c/p.nsplit
		to := lo + (L-lo)*(c+1)/p.nsplit
		var err error
		if p.nsplit == 1 {
			err = st.runUnit(p.ops, s, p.q, p.view, b, h, from, to, p.dst, nil)
		} else {
			part := p.parts[k*rows*(s.dv+2) : (k+1)*rows*(s.dv+2)]
			err = st.runUnit(p.ops, s, p.q, p.view, b, h, from, to, nil, part)
		}
		if err != nil {
			p.errMu.Lock()
			if p.err == nil {
				p.err = err
			}
			p.errMu.Unlock()
		}
	}
}

// workSafe is work for a goroutine of another pool: a panic becomes the
// call's error instead of ending the process.
func (p *pool) workSafe(idx int) {
	defer func() {
		if r := recover(); r != nil {
			p.errMu.Lock()
			if p.err == nil {
				p.err = fmt.Errorf("cpu: internal error in attention task: %v", r)
			}
			p.errMu.Unlock()
		}
	}()
	p.work(idx)
}

// helperLoop is the body of one persistent helper goroutine.
func (p *pool) helperLoop(h *helper, seen uint64) {
	for {
		seen = p.waitJob(h, seen)
		if int32(h.idx) <= p.active.Load() && p.tryJoin(seen) {
			p.work(h.idx)
			p.finished.Add(1)
		}
	}
}

// Layout of the join word below the generation.
const (
	closedBit = 1 << 31
	joinMask  = closedBit - 1
)

// tryJoin adds the calling helper to job gen unless the job was closed (or
// already replaced by a newer one).
func (p *pool) tryJoin(gen uint64) bool {
	for {
		j := p.join.Load()
		if j>>32 != gen&0xffffffff || j&closedBit != 0 {
			return false
		}
		if p.join.CompareAndSwap(j, j+1) {
			return true
		}
	}
}

// waitJob polls for a generation newer than seen for helperSpin, then parks
// until the caller wakes it. It returns the new generation.
func (p *pool) waitJob(h *helper, seen uint64) uint64 {
	start := time.Now()
	for i := 0; ; i++ {
		if g := p.gen.Load(); g != seen {
			return g
		}
		if i&255 == 255 {
			if time.Since(start) > helperSpin {
				break
			}
			runtime.Gosched()
		}
	}
	h.sleeping.Store(true)
	if g := p.gen.Load(); g != seen {
		if !h.sleeping.CompareAndSwap(true, false) {
			<-h.wake // the caller saw us asleep and sent a token: take it
		}
		return g
	}
	<-h.wake
	return p.gen.Load()
}
