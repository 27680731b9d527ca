package gemm

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// job is one parallel-for: indices are claimed from next until n is reached,
// so fast workers take more of them and no index runs twice.
type job struct {
	n    int64
	next atomic.Int64
	fn   func(i int)
	wg   sync.WaitGroup
}

func (j *job) drain() {
	for {
		i := j.next.Add(1) - 1
		if i >= j.n {
			return
		}
		j.fn(int(i))
	}
}

// pool is a fixed set of helper goroutines started on first use. The caller
// of For always works too, so a pool of T-1 helpers keeps T threads busy.
type pool struct {
	once    sync.Once
	tasks   chan *job
	helpers int
}

var (
	workers    pool
	maxThreads atomic.Int64 // 0: GOMAXPROCS
)

func (p *pool) start() {
	p.once.Do(func() {
		p.helpers = runtime.GOMAXPROCS(0) - 1
		p.tasks = make(chan *job) // unbuffered: a send succeeds only when a helper is idle
		for range p.helpers {
			go func() {
				for j := range p.tasks {
					j.drain()
					j.wg.Done()
				}
			}()
		}
	})
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
// Calls may nest: when every helper is busy the caller runs the work itself
// instead of waiting for one, so For never deadlocks. fn must not panic.
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
	j := &job{n: int64(n), fn: fn}
	for range helpers {
		j.wg.Add(1)
		select {
		case workers.tasks <- j:
		default:
			j.wg.Done() // pool saturated (nested call): do it here
		}
	}
	j.drain()
	j.wg.Wait()
}
