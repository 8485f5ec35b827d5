package server

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"time"
)

// A Session evaluates one sequence at a time, so requests take turns: the
// handlers put jobs in a queue and one worker goroutine, the only one that
// touches the session, runs them in order. A full queue turns requests
// away (503) before anything is promised; once a job is accepted it runs,
// unless its client leaves first.
//
// Admission comes before any work that grows with the request: a job is
// queued before its prompt is rendered and tokenized (see Server.prepare),
// and it becomes ready to run only then. So --queue bounds every
// request's work, not only its turn on the model.

var (
	errQueueFull    = errors.New("queue full")
	errShuttingDown = errors.New("server is shutting down")
)

// job is one request's turn on the session.
type job struct {
	ctx      context.Context
	run      func() // called on the worker goroutine
	done     chan struct{}
	enqueued time.Time
	started  time.Time
	ready    bool // prepared: the worker may run it (guarded by queue.mu)
}

// queue holds the jobs waiting for the worker.
type queue struct {
	mu      sync.Mutex
	waiting []*job
	busy    bool // the worker is running a job
	limit   int  // jobs that may wait while one runs
	closed  bool
	wake    chan struct{} // a job arrived, or the queue closed
	exited  chan struct{} // the worker has returned
	onLen   func(waiting int, busy bool)
	onPanic func(any)
}

func newQueue(limit int, onLen func(waiting int, busy bool)) *queue {
	if onLen == nil {
		onLen = func(int, bool) {}
	}
	q := &queue{limit: limit, wake: make(chan struct{}, 1), exited: make(chan struct{}), onLen: onLen}
	go q.work()
	return q
}

// submit accepts j or says why not.
func (q *queue) submit(j *job) error {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return errShuttingDown
	}
	// With limit 0 a request is accepted only when the worker is idle.
	if len(q.waiting) >= q.limit && (q.busy || len(q.waiting) > 0) {
		return errQueueFull
	}
	j.done = make(chan struct{})
	j.enqueued = time.Now()
	q.waiting = append(q.waiting, j)
	q.onLen(len(q.waiting), q.busy)
	if j.ready {
		q.signal()
	}
	return nil
}

// signal wakes the worker.
func (q *queue) signal() {
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// markReady lets the worker run j, which submit accepted unprepared.
func (q *queue) markReady(j *job) {
	q.mu.Lock()
	j.ready = true
	q.mu.Unlock()
	q.signal()
}

// withdraw takes j, accepted but never to run (its preparation failed or
// its client left), out of the queue. It reports whether j was there.
func (q *queue) withdraw(j *job) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for i, w := range q.waiting {
		if w == j {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			q.onLen(len(q.waiting), q.busy)
			// A closed queue's worker may be waiting for this job to
			// become ready before it returns.
			q.signal()
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
// the mapped model file (truncated while served) panics here rather than
// killing the process, and the job reports it (modelfile.go).
func (q *queue) work() {
	defer close(q.exited)
	debug.SetPanicOnFault(true)
	for {
		q.mu.Lock()
		next := -1
		for i, w := range q.waiting {
			if w.ready {
				next = i
				break
			}
		}
		if next < 0 {
			closed := q.closed && len(q.waiting) == 0
			q.mu.Unlock()
			if closed {
				return
			}
			<-q.wake
			continue
		}
		j := q.waiting[next]
		q.waiting = append(q.waiting[:next], q.waiting[next+1:]...)
		q.busy = true
		q.onLen(len(q.waiting), q.busy)
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

		// Idle before the handler learns the job is done: a client that
		// sends its next request as soon as it has the answer must find
		// the model free, not a full queue.
		q.mu.Lock()
		q.busy = false
		q.onLen(len(q.waiting), q.busy)
		q.mu.Unlock()
		close(j.done)
	}
}

// close stops accepting jobs; the worker finishes those accepted and
// returns. done is closed when it has.
func (q *queue) close() (done <-chan struct{}) {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return q.exited
}

// length reports the jobs waiting and whether one runs.
func (q *queue) length() (int, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting), q.busy
}
