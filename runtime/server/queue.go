package server

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"time"
)

// Requests run on the session's scheduler, up to --parallel at once (one
// a slot); the handlers put jobs in a queue and that many worker
// goroutines take them in order. A full queue turns requests away (503)
// before anything is promised; once a job is accepted it runs, unless its
// client leaves first.
//
// Admission comes before any work that grows with the request: a job is
// queued before its prompt is rendered and tokenized (see Server.prepare),
// and it becomes ready to run only then. So --queue bounds every
// request's work, not only its turn on the model.

var (
	errQueueFull    = errors.New("queue full")
	errShuttingDown = errors.New("server is shutting down")
)

// job is one request's turn on a slot.
type job struct {
	ctx      context.Context
	run      func() // called on the worker goroutine
	done     chan struct{}
	enqueued time.Time
	started  time.Time
	ready    bool // prepared: the worker may run it (guarded by queue.mu)
}

// queue holds the jobs waiting for a worker.
type queue struct {
	mu      sync.Mutex
	waiting []*job
	running int // jobs the workers are running
	workers int
	limit   int // jobs that may wait while every worker runs one
	closed  bool
	wake    *sync.Cond // a job became ready, or the queue closed (on mu)
	exited  chan struct{}
	onLen   func(waiting, running int)
	onPanic func(any)
}

func newQueue(workers, limit int, onLen func(waiting, running int)) *queue {
	if onLen == nil {
		onLen = func(int, int) {}
	}
	q := &queue{workers: max(workers, 1), limit: limit, exited: make(chan struct{}), onLen: onLen}
	q.wake = sync.NewCond(&q.mu)
	var wg sync.WaitGroup
	for range q.workers {
		wg.Go(q.work)
	}
	go func() {
		wg.Wait()
		close(q.exited)
	}()
	return q
}

// submit accepts j or says why not.
func (q *queue) submit(j *job) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return errShuttingDown
	}
	// With limit 0 a request is accepted only when a worker is idle.
	if len(q.waiting) >= q.limit && q.running+len(q.waiting) >= q.workers {
		return errQueueFull
	}
	j.done = make(chan struct{})
	j.enqueued = time.Now()
	q.waiting = append(q.waiting, j)
	q.onLen(len(q.waiting), q.running)
	if j.ready {
		q.wake.Broadcast()
	}
	return nil
}

// markReady lets a worker run j, which submit accepted unprepared.
func (q *queue) markReady(j *job) {
	q.mu.Lock()
	j.ready = true
	q.mu.Unlock()
	q.wake.Broadcast()
}

// withdraw takes j, accepted but never to run (its preparation failed or
// its client left), out of the queue. It reports whether j was there.
func (q *queue) withdraw(j *job) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, w := range q.waiting {
		if w == j {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			q.onLen(len(q.waiting), q.running)
			// A closed queue's workers may be waiting for this job to
			// become ready before they return.
			q.wake.Broadcast()
			return true
		}
	}
	return false
}

// wait blocks until j has run. If j's context ends while it still waits,
// wait takes it out of the queue and returns false at once: the worker
// will never touch it.
func (q *queue) wait(j *job) bool {
	select {
	case <-j.done:
		return true
	case <-j.ctx.Done():
	}
	if q.withdraw(j) {
		return false
	}
	// The worker has it: it sees the cancelled context and ends soon.
	<-j.done
	return true
}

// work runs jobs until the queue is closed and empty. A fault reading
// the mapped model file (truncated while served) panics rather than
// killing the process, here and in the scheduler's step, and the job
// reports it (modelfile.go).
func (q *queue) work() {
	debug.SetPanicOnFault(true)
	for {
		q.mu.Lock()
		next := -1
		for next < 0 {
			for i, w := range q.waiting {
				if w.ready {
					next = i
					break
				}
			}
			if next >= 0 {
				break
			}
			if q.closed && len(q.waiting) == 0 {
				q.mu.Unlock()
				return
			}
			q.wake.Wait()
		}
		j := q.waiting[next]
		q.waiting = append(q.waiting[:next], q.waiting[next+1:]...)
		q.running++
		q.onLen(len(q.waiting), q.running)
		q.mu.Unlock()

		j.started = time.Now()
		func() {
			// A panic in a job must not take the worker, and with it
			// every later request, down; the job's own code reports it
			// to its client (see Server.runJob), this is the backstop.
			defer func() {
				if r := recover(); r != nil && q.onPanic != nil {
					q.onPanic(r)
				}
			}()
			j.run()
		}()

		// Free before the handler learns the job is done: a client that
		// sends its next request as soon as it has the answer must find
		// a slot, not a full queue.
		q.mu.Lock()
		q.running--
		q.onLen(len(q.waiting), q.running)
		q.mu.Unlock()
		close(j.done)
	}
}

// close stops accepting jobs; the workers finish those accepted and
// return. done is closed when they have.
func (q *queue) close() (done <-chan struct{}) {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	q.wake.Broadcast()
	return q.exited
}

// length reports the jobs waiting and those running.
func (q *queue) length() (waiting, running int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting), q.running
}
