package cpu

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/onnx-light-kv/onnx-light-kv/golib/cache"
	"github.com/onnx-light-kv/onnx-light-kv/golib/cpu/gemm"
)

// Tuning of the attention calls' parallelism.
const (
	// serialBytes: calls that read fewer K/V bytes than this run on the
	// calling goroutine alone; waking helpers would cost more than it saves.
	serialBytes = 96 << 10
	// minSplitTokens is the smallest token range a split-KV task gets.
	minSplitTokens = 128
)

// MaxThreads is the largest thread count SetThreads accepts; more is
// clamped.
const MaxThreads = 1024

// SetThreads sets the number of threads (the calling goroutine plus worker
// pool helpers) that Attention and the matrix products (package gemm) use:
// they share one pool of persistent workers, gemm's, started on first use
// with GOMAXPROCS-1 helpers. n <= 0 restores the default, runtime.NumCPU();
// n > MaxThreads is clamped to MaxThreads. A setting above the pool's size
// still decides how Attention splits its work (the results never depend on
// it), but no more threads run than the pool has.
func SetThreads(n int) {
	if n <= 0 {
		n = runtime.NumCPU()
		gemm.SetThreads(0)
	} else {
		n = min(n, MaxThreads)
		gemm.SetThreads(n)
	}
	thePool.mu.Lock()
	thePool.threads = n
	thePool.mu.Unlock()
}

// Threads returns the number of threads Attention uses (as set; see
// SetThreads).
func Threads() int {
	thePool.mu.Lock()
	defer thePool.mu.Unlock()
	return thePool.threads
}

// pool holds the state of one attention call. One call runs at a time (mu);
// its tasks (units of (sequence, KV head, token range)) are claimed with an
// atomic counter by the calling goroutine and the helpers of the shared
// worker pool (package gemm), each worker with a scratch of its own.
type pool struct {
	mu      sync.Mutex
	threads int
	states  []unitState // one per worker index of the call
	workFn  func(int)   // p.workSafe, bound once (a method value allocates)

	next atomic.Int64

	// The job, written by the caller before the tasks start.
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
		p.parts = grow(p.parts, p.ntasks*rows*(s.dv+2))
	}
	if len(p.states) < threads {
		p.states = append(p.states, make([]unitState, threads-len(p.states))...)
	}
	for i := range p.states {
		p.states[i].read = 0
	}
	if p.workFn == nil {
		p.workFn = p.workSafe
	}
	p.next.Store(0)
	if threads == 1 {
		p.work(0)
	} else {
		// Worker index i runs work(i), which claims tasks until none is
		// left; gemm's pool runs the indices on its helpers and the caller.
		gemm.ForThreads(threads, threads, p.workFn)
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

// workSafe is work for a worker of the shared pool: a panic becomes the
// call's error instead of ending the process (gemm's workers must not
// panic).
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
