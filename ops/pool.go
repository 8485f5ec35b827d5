package ops

import (
	"runtime"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/cpuid/v2"
)

// Pool is a persistent set of worker goroutines that split a loop of n
// independent items into contiguous chunks. Each item is computed by exactly
// one call with the same arithmetic whatever the thread count and whichever
// thread takes it, so results do not depend on the number of threads.
//
// A decode step of a model calls Run a few hundred times, each for tens of
// microseconds of work, so waking a parked goroutine (a futex round trip,
// and on a busy machine a wait for the OS scheduler) would cost as much as
// the work. Workers therefore spin on the atomic job pointer for a while
// after each job (spinFor) before parking on a channel. Chunks are claimed
// through atomic counters, so a thread that is late (descheduled by another
// process) has its share taken by the others instead of holding everyone
// up; RunChunks makes them shrink as the work runs out, and the caller,
// waiting for the last ones, blocks rather than spins once they are late
// (waitDone).
type Pool struct {
	n       int
	workers []*poolWorker
	mu      sync.Mutex // one Run at a time

	cur  atomic.Pointer[poolJob] // the latest job; a new pointer means new work
	wg   sync.WaitGroup
	quit atomic.Bool
	done chan struct{} // buffered 1: the last chunk's finisher wakes a blocked Run
	// spinUntil (Unix nanoseconds) keeps idle workers spinning past
	// spinFor, up to then (Expect).
	spinUntil atomic.Int64
}

// poolJob is one Run over [0, n): a thread claims [next, next+size) (or a
// bigger share when guided), runs it and adds its length to done. Each Run
// gets a new poolJob, so a worker that wakes late can only find an old job
// whose items are all claimed, never claim items of a job it has not seen.
type poolJob struct {
	fn      func(lo, hi int)
	n       int64
	size    int64 // chunk size (guided: the smallest chunk and its multiple)
	guided  bool  // chunks shrink as the work runs out
	threads int64
	next    atomic.Int64 // first item not yet claimed
	done    atomic.Int64 // items finished
	// waiting is 1 while Run is blocked (or about to block) on wake for
	// the last chunks; whoever finishes the last one sends the token.
	waiting atomic.Int32
	wake    chan struct{}
	// panicked holds the first panic of a chunk, which Run raises again
	// on its caller: a worker goroutine has no one to recover it, so it
	// would take the process down.
	panicked atomic.Pointer[any]
}

type poolWorker struct {
	state atomic.Int32  // workerSpinning or workerParked
	wake  chan struct{} // buffered 1: the token that unparks it
}

const (
	workerSpinning int32 = iota
	workerParked
)

// spinFor is how long an idle worker polls for the next job before it
// parks. Between ops of a decode step the gaps are microseconds; between
// steps (sampling, the caller's own work) they can be long, and a parked
// worker costs nothing.
const spinFor = 200 * time.Microsecond

// DefaultThreads is the number of threads used when none is asked for: the
// physical cores (hyper-threads share a core's vector units, which the
// kernels saturate), at most the CPUs the process may use.
func DefaultThreads() int {
	n := runtime.GOMAXPROCS(0)
	if pc := cpuid.CPU.PhysicalCores; pc > 0 && pc < n {
		n = pc
	}
	return max(1, n)
}

// NewPool starts threads-1 workers; the caller's goroutine is the last one.
// threads <= 0 means DefaultThreads().
func NewPool(threads int) *Pool {
	if threads <= 0 {
		threads = DefaultThreads()
	}
	p := &Pool{n: threads, done: make(chan struct{}, 1)}
	for i := 1; i < threads; i++ {
		w := &poolWorker{wake: make(chan struct{}, 1)}
		p.workers = append(p.workers, w)
		p.wg.Add(1)
		go p.work(w)
	}
	return p
}

// work is a worker's loop: wait for a new generation, help with its chunks.
//
// The kernels read the weights from the mapped model file, and a file
// truncated while in use turns those reads into faults (SIGBUS): with
// SetPanicOnFault they panic instead of killing the process, and the panic
// reaches Run's caller, which can report it (the server does).
func (p *Pool) work(w *poolWorker) {
	defer p.wg.Done()
	debug.SetPanicOnFault(true)
	seen := p.cur.Load()
	for {
		j := p.waitJob(w, seen)
		if p.quit.Load() {
			return
		}
		seen = j
		j.help()
	}
}

// waitJob returns the new job once there is one past seen: spinning first,
// then parked until Run wakes it.
func (p *Pool) waitJob(w *poolWorker, seen *poolJob) *poolJob {
	deadline := time.Now().Add(spinFor)
	if until := time.Unix(0, p.spinUntil.Load()); until.After(deadline) {
		deadline = until
	}
	for i := 0; ; i++ {
		if j := p.cur.Load(); j != seen {
			return j
		}
		if i >= spinPolls && i&255 == 0 && time.Now().After(deadline) {
			break
		}
	}
	w.state.Store(workerParked)
	if j := p.cur.Load(); j != seen || p.quit.Load() {
		// A job (or Close) came in while parking: unless Run already saw
		// the parked state and sent the token, take it back ourselves.
		if !w.state.CompareAndSwap(workerParked, workerSpinning) {
			<-w.wake
		}
		return p.cur.Load()
	}
	<-w.wake
	return p.cur.Load()
}

// Expect tells the pool that work comes within d: the parked workers wake
// now, and every idle worker spins until then rather than parking, so the
// next Run finds them all running. For a caller that knows it waits before
// its next Run for something else (a split prefill's CPU share, for the
// GPU's routing of the layer): parked workers wake one after another as
// the Go scheduler finds each an idle thread, and on the GPU machine's
// virtual CPUs that took 0.3 to 1.7 ms for the sixteenth, a fifth of the
// share's time (docs/bench/hybrid.md in the git history, eighth pass). The spinning costs
// CPU time the machine is not otherwise using then.
func (p *Pool) Expect(d time.Duration) {
	if p == nil || p.n == 1 {
		return
	}
	p.spinUntil.Store(time.Now().Add(d).UnixNano())
	for _, w := range p.workers {
		if w.state.Load() == workerParked && w.state.CompareAndSwap(workerParked, workerSpinning) {
			w.wake <- struct{}{}
		}
	}
}

// help claims and runs chunks of j until none are left. A guided job hands
// out half of an equal share of what is left (at least size items), so the
// first chunks are big (few hand-offs) and the last ones small (the threads
// finish together).
func (j *poolJob) help() {
	if j == nil {
		return
	}
	for {
		lo := j.next.Load()
		if lo >= j.n {
			return
		}
		sz := j.size
		if j.guided {
			sz = max(sz, (j.n-lo)/(2*j.threads)/j.size*j.size)
		}
		hi := min(j.n, lo+sz)
		if !j.next.CompareAndSwap(lo, hi) {
			continue
		}
		j.run(lo, hi)
	}
}

// run calls fn on a chunk and counts it done, even when fn panics (the
// panic is kept for Run to raise): Run must not wait forever.
func (j *poolJob) run(lo, hi int64) {
	defer func() {
		if r := recover(); r != nil {
			j.panicked.CompareAndSwap(nil, &r)
		}
		if j.done.Add(hi-lo) == j.n && j.waiting.CompareAndSwap(1, 0) {
			j.wake <- struct{}{}
		}
	}()
	j.fn(int(lo), int(hi))
}

// Threads is the number of threads the pool runs on.
func (p *Pool) Threads() int {
	if p == nil {
		return 1
	}
	return p.n
}

// chunksPerThread splits a job finer than one range per thread, so that
// a thread that is slow or late leaves work for the others.
const chunksPerThread = 4

// Run calls fn over [0, n) in contiguous chunks whose bounds are multiples
// of grain (except the last) and returns when all are done. Chunks may run
// concurrently on up to Threads() goroutines, the caller's included, and
// there may be more chunks than threads (a few per thread, so that a late
// thread's share is taken by the others). A nil pool runs fn(0, n) on the
// caller.
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
	units := (n + grain - 1) / grain
	chunks := min(units, p.n*chunksPerThread)
	p.run(n, (units+chunks-1)/chunks*grain, false, fn)
}

// RunChunks calls fn over [0, n) in chunks of at least size items and
// returns when all are done. Chunks are claimed in order; each is half of
// an equal share of the items left (a multiple of size), so they start big
// and end at size: few hand-offs, and the threads finish together. Callers
// that know the cost of an item use it to choose size: big enough to pay
// for the hand-off (about a microsecond), small enough to balance the end.
func (p *Pool) RunChunks(n, size int, fn func(lo, hi int)) {
	if n <= 0 {
		return
	}
	size = max(size, 1)
	if p == nil || p.n == 1 || n <= size {
		fn(0, n)
		return
	}
	p.run(n, size, true, fn)
}

func (p *Pool) run(n, size int, guided bool, fn func(lo, hi int)) {
	j := &poolJob{fn: fn, n: int64(n), size: int64(size), guided: guided, threads: int64(p.n), wake: p.done}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cur.Store(j) // publishes the job to the workers
	for _, w := range p.workers {
		if w.state.Load() == workerParked && w.state.CompareAndSwap(workerParked, workerSpinning) {
			w.wake <- struct{}{}
		}
	}
	j.help()
	p.waitDone(j)
	if r := j.panicked.Load(); r != nil {
		panic(*r)
	}
}

// waitDone returns when every chunk of j is finished. The helpers still on
// their last chunks normally finish within microseconds, so it spins; if
// they take longer, one of them has lost its core (another process took
// it), and spinning here would keep this core busy too: it then blocks, so
// that the OS can move the late thread onto the core it frees.
func (p *Pool) waitDone(j *poolJob) {
	var deadline time.Time
	for i := 0; j.done.Load() < j.n; i++ {
		if i < spinPolls || i&255 != 0 {
			continue
		}
		if deadline.IsZero() {
			deadline = time.Now().Add(blockAfter)
			continue
		}
		if time.Now().Before(deadline) {
			continue
		}
		j.waiting.Store(1)
		if j.done.Load() == j.n {
			if j.waiting.CompareAndSwap(1, 0) {
				return // finished meanwhile, and nobody will send
			}
		}
		<-j.wake // the last finisher's token
		return
	}
}

// spinPolls is how many times a waiting thread polls before it looks at
// the clock: about a microsecond of pure spinning.
const spinPolls = 1000

// blockAfter is how long Run spins for the last chunks before it blocks.
const blockAfter = 30 * time.Microsecond

// Close stops the workers.
func (p *Pool) Close() {
	if p == nil || p.quit.Load() {
		return
	}
	p.quit.Store(true)
	p.cur.Store(&poolJob{})
	for _, w := range p.workers {
		if w.state.CompareAndSwap(workerParked, workerSpinning) {
			w.wake <- struct{}{}
		}
	}
	p.wg.Wait()
	p.workers = nil
}
