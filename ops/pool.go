package ops

import (
	"runtime"
	"sync"
)

// Pool is a persistent set of worker goroutines that split a loop of n
// independent items into contiguous ranges. Each item is computed by
// exactly one worker with the same arithmetic whatever the thread count, so
// results do not depend on the number of threads.
type Pool struct {
	n    int
	jobs []chan job
	wg   sync.WaitGroup
	mu   sync.Mutex // one Run at a time
}

type job struct {
	fn     func(lo, hi int)
	lo, hi int
	done   *sync.WaitGroup
}

// DefaultThreads is the number of threads used when none is asked for: the
// number of CPUs the process may use.
func DefaultThreads() int { return max(1, runtime.GOMAXPROCS(0)) }

// NewPool starts threads-1 workers; the caller's goroutine is the last one.
// threads <= 0 means DefaultThreads().
func NewPool(threads int) *Pool {
	if threads <= 0 {
		threads = DefaultThreads()
	}
	p := &Pool{n: threads}
	for i := 1; i < threads; i++ {
		ch := make(chan job)
		p.jobs = append(p.jobs, ch)
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for j := range ch {
				j.fn(j.lo, j.hi)
				j.done.Done()
			}
		}()
	}
	return p
}

// Threads is the number of threads the pool runs on.
func (p *Pool) Threads() int { return p.n }

// Run calls fn over [0, n) split into at most Threads() contiguous ranges
// whose bounds are multiples of grain (except the last), and returns when all
// are done. A nil pool runs fn(0, n) on the caller.
func (p *Pool) Run(n, grain int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	if grain < 1 {
		grain = 1
	}
	if p == nil || p.n == 1 || n <= grain {
		fn(0, n)
		return
	}
	chunks := (n + grain - 1) / grain
	parts := min(p.n, chunks)
	p.mu.Lock()
	defer p.mu.Unlock()
	var done sync.WaitGroup
	done.Add(parts - 1)
	bound := func(i int) int { return min(n, (chunks*i/parts)*grain) }
	for i := 1; i < parts; i++ {
		p.jobs[i-1] <- job{fn: fn, lo: bound(i), hi: bound(i + 1), done: &done}
	}
	fn(0, bound(1))
	done.Wait()
}

// Close stops the workers.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	for _, ch := range p.jobs {
		close(ch)
	}
	p.jobs = nil
	p.wg.Wait()
}
