package gemm

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// job is one parallel-for: indices are claimed from next until n is reached,
// so fast workers take more of them and no index runs twice.
//
// state counts the helpers working on the job; closedBit is set by the
// caller once every index is claimed, after which no helper may join. The
// helper that leaves a closed job last signals done.
type job struct {
	n     int64
	next  atomic.Int64
	fn    func(i int)
	state atomic.Int64
	done  chan struct{}
}

const closedBit = 1 << 62

func (j *job) drain() {
	for {
		i := j.next.Add(1) - 1
		if i >= j.n {
			return
		}
		j.fn(int(i))
	}
}

// help runs the job on a helper unless the caller has already closed it.
func (j *job) help() {
	for {
		s := j.state.Load()
		if s&closedBit != 0 {
			return
		}
		if j.state.CompareAndSwap(s, s+1) {
			break
		}
	}
	j.drain()
	if j.state.Add(-1) == closedBit {
		j.done <- struct{}{}
	}
}

// pool is a fixed set of helper goroutines started on first use. The caller
// of For always works too, so a pool of T-1 helpers keeps T threads busy.
// An idle helper polls the queue for a short while before parking: the
// parallel sections of one inference step come in quick succession, and
// waking a parked thread costs more than many of them take.
type pool struct {
	once    sync.Once
	tasks   chan *job
	helpers int
}

// spinFor is how long an idle helper keeps polling before it parks: the
// parallel sections of one decode step (products, normalizations,
// softmaxes, which all run on this pool) follow each other within tens of
// microseconds. Measured from Python, two threads, the demo decoder (4
// layers, hidden 512) at 512 tokens: 50 us 4.2-4.3 ms per step, 200 us
// 3.3-3.4 ms, 1 ms 3.2-3.4 ms. (A 1 ms poll was 2x slower while the element-
// wise ops still started goroutines of their own per call: the polling
// helpers held the processors those needed.)
const spinFor = 200 * time.Microsecond

// waitSpin is how long a caller polls for the helpers still running its
// job before it parks: they hold a share of the same product, so the wait
// is short. The caller never yields while polling: from Python it is a cgo
// callback goroutine, locked to its thread, and every yield or park of a
// locked goroutine hands its processor over and costs a thread wake-up to
// come back (with runtime.Gosched in this loop two threads ran a decode
// step slower than one).
const waitSpin = 200 * time.Microsecond

var (
	workers    pool
	maxThreads atomic.Int64 // 0: GOMAXPROCS
)

func (p *pool) start() {
	p.once.Do(func() {
		p.helpers = runtime.GOMAXPROCS(0) - 1
		p.tasks = make(chan *job, 4*(p.helpers+1))
		for range p.helpers {
			go p.loop()
		}
	})
}

func (p *pool) loop() {
	for {
		var j *job
		select {
		case j = <-p.tasks:
		default:
			deadline := time.Now().Add(spinFor)
			for j == nil && time.Now().Before(deadline) {
				select {
				case j = <-p.tasks:
				default:
					runtime.Gosched()
				}
			}
			if j == nil {
				j = <-p.tasks
			}
		}
		j.help()
	}
}

// SetThreads bounds the number of threads a call may use (the caller
// included); n <= 0 restores the default, GOMAXPROCS at first use.
func SetThreads(n int) {
	if n < 0 {
		n = 0
	}
	maxThreads.Store(int64(n))
}

// Threads reports how many threads a call may use.
func Threads() int {
	workers.start()
	t := workers.helpers + 1
	if m := int(maxThreads.Load()); m > 0 && m < t {
		t = m
	}
	return t
}

// For runs fn(i) for every i in [0, n), spreading the indices over the
// worker pool and the calling goroutine, and returns when all are done.
// Calls may nest: the caller claims indices itself and only waits for
// helpers that already started, so For never waits for a busy pool and
// never deadlocks. fn must not panic.
func For(n int, fn func(i int)) { ForThreads(0, n, fn) }

// ForThreads is For using at most threads threads (the caller included);
// threads <= 0 means Threads().
func ForThreads(threads, n int, fn func(i int)) {
	if n <= 0 {
		return
	}
	t := Threads()
	if threads > 0 && threads < t {
		t = threads
	}
	helpers := min(t-1, n-1)
	if helpers <= 0 {
		for i := range n {
			fn(i)
		}
		return
	}
	j := getJob(n, fn)
	for range helpers {
		select {
		case workers.tasks <- j:
		default: // queue full: the caller does the work
		}
	}
	j.drain()
	if j.state.Or(closedBit)&^closedBit != 0 {
		j.wait()
	}
	putJob(j)
}

// wait returns once every helper that joined the closed job has left it,
// and takes the done token the last of them sends (so a recycled job starts
// with an empty channel): it polls for a while, then parks until the token
// comes.
func (j *job) wait() {
	start := time.Now()
	for i := 1; ; i++ {
		select {
		case <-j.done:
			return
		default:
		}
		if i%256 == 0 && time.Since(start) > waitSpin {
			break
		}
	}
	<-j.done
}

// Jobs are recycled through a free list, so a parallel-for does not
// allocate once warm (the attention kernels promise zero allocations per
// decode step). A queued entry of a finished job may still reach a helper
// after the job was handed out again: the helper then joins the job's new
// incarnation through the same state protocol, which is as correct as any
// helper joining it (its fields are written before state is reset, and a
// helper reads them only after it joined).
var (
	jobMu   sync.Mutex
	jobFree []*job
)

func getJob(n int, fn func(i int)) *job {
	jobMu.Lock()
	var j *job
	if k := len(jobFree); k > 0 {
		j, jobFree = jobFree[k-1], jobFree[:k-1]
	}
	jobMu.Unlock()
	if j == nil {
		j = &job{done: make(chan struct{}, 1)}
		j.state.Store(closedBit)
	}
	j.n, j.fn = int64(n), fn
	j.next.Store(0)
	j.state.Store(0) // opens the job: last, after its fields
	return j
}

// putJob returns a closed job whose helpers have all left to the free list.
func putJob(j *job) {
	j.fn = nil
	jobMu.Lock()
	jobFree = append(jobFree, j)
	jobMu.Unlock()
}
