package session

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// Scheduler runs many requests on one engine at once (continuous
// batching): every step computes one token of each request that is
// decoding, together with chunks of the prompts that wait, under a token
// budget, so a long prompt holds the streams already decoding for one
// chunk at a time, never for all of it. Each step reads every weight once
// for the whole batch: on the host, the products of many rows read each
// weight once; on the GPU, one launch serves every row.
//
// Requests take slots, at most Parallel at a time; each slot keeps the
// sequence of its last request in the KV cache until the room is needed,
// so the next turn of a conversation (or any request starting with the
// same tokens) reuses it, and full blocks of any sequence are shared by
// every prompt that starts with them (runtime/kvcache).
type Scheduler struct {
	e       *Engine
	tok     *tokenizer.Tokenizer
	nvocab  int
	budget  int // tokens a step computes, decode rows and prompt chunks together
	maxRows int // rows of logits a step returns

	mu      sync.Mutex
	wake    chan struct{}
	slots   []*slot
	waiting []*request
	tasks   []*task // Do's, run between steps
	closed  bool
	exited  chan struct{}
	step    uint64
	// observe, when set, hears of every step (metrics).
	observe func(StepInfo)
}

// StepInfo describes a step that ran: its rows, of which decode rows and
// prompt rows, the requests in it, and its wall time.
type StepInfo struct {
	Rows, DecodeRows, PromptRows, Requests int
	Wall                                   time.Duration
	// The cache after the step: positions held by sequences, kept for
	// reuse, and free (in whole blocks).
	CacheHeld, CacheKept, CacheFree int
}

// SlotInfo is a slot's state, as /slots shows it.
type SlotInfo struct {
	ID           int
	Busy         bool
	Cached       int // tokens of its sequence in the cache
	PromptTokens int // of the request it runs
	Prefilled    int // prompt tokens evaluated so far
	Generated    int
	Started      time.Time
}

type slot struct {
	id       int
	seq      *kvcache.Seq // the last request's sequence, kept for reuse (nil: none)
	req      *request     // the request it runs (nil: idle)
	lastUsed time.Time
	cached   atomic.Int64 // seq's length, for Slots
}

// request is one Generate call.
type request struct {
	ctx    context.Context
	prompt []int
	opt    GenerateOptions
	gen    *Generation
	slot   *slot
	todo   []int // prompt tokens still to evaluate
	next   int   // the token to evaluate next, when decoding
	start  time.Time
	// prefilled and generated count for Slots (and OnPrompt, once
	// admitted: the request has a slot).
	prefilled, generated atomic.Int64
	admitted             atomic.Bool

	// Delivery to the caller's goroutine: what the step produced since
	// the caller last looked.
	mu     sync.Mutex
	signal chan struct{}
	texts  []string
	toks   []int
	done   bool
	res    *GenerateResult
	err    error
}

// ErrClosed is returned by Generate once the scheduler is closed.
var ErrClosed = errors.New("the scheduler is closed")

// NewScheduler runs requests on e with the tokenizer tok, parallel slots
// at a time (at least 1).
func NewScheduler(e *Engine, tok *tokenizer.Tokenizer, parallel int) *Scheduler {
	s := &Scheduler{e: e, tok: tok, nvocab: e.Model.Hyper().NVocab, budget: e.Ctx.Batch(), maxRows: e.Ctx.LogitRows(),
		wake: make(chan struct{}, 1), exited: make(chan struct{})}
	for i := range max(parallel, 1) {
		s.slots = append(s.slots, &slot{id: i})
	}
	go s.loop()
	return s
}

// Parallel is the number of slots.
func (s *Scheduler) Parallel() int { return len(s.slots) }

// Engine is the scheduler's engine.
func (s *Scheduler) Engine() *Engine { return s.e }

// Observe sets what hears of every step (nil: nothing); call it before the
// first request.
func (s *Scheduler) Observe(f func(StepInfo)) {
	s.mu.Lock()
	s.observe = f
	s.mu.Unlock()
}

// Slots reports each slot's state.
func (s *Scheduler) Slots() []SlotInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]SlotInfo, len(s.slots))
	for i, sl := range s.slots {
		si := SlotInfo{ID: sl.id, Busy: sl.req != nil, Cached: int(sl.cached.Load())}
		if r := sl.req; r != nil {
			si.PromptTokens, si.Prefilled, si.Started = len(r.prompt), int(r.prefilled.Load()), r.start
			si.Generated = int(r.generated.Load())
		}
		out[i] = si
	}
	return out
}

// Close stops taking requests, ends those running as cancelled, and frees
// the slots' sequences. The engine is the caller's.
func (s *Scheduler) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.poke()
	<-s.exited
}

func (s *Scheduler) poke() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Generate runs prompt as one request among the others: it waits for a
// slot, reuses the longest prefix of the prompt already in the cache,
// evaluates the rest in chunks between other requests' decode steps, and
// samples until end of generation, a stop string, MaxTokens, a full
// context, or cancellation. OnText and OnToken are called on the caller's
// goroutine; OnLogits on the scheduler's, during the step (its slice is
// the step's).
func (s *Scheduler) Generate(ctx context.Context, prompt []int, opt GenerateOptions) (*GenerateResult, error) {
	start := time.Now()
	if len(prompt) == 0 {
		return nil, errors.New("generate: empty prompt")
	}
	for i, t := range prompt {
		if t < 0 || t >= s.nvocab {
			return nil, fmt.Errorf("generate: token %d (at %d) is outside the vocabulary of %d", t, i, s.nvocab)
		}
	}
	if limit := s.e.CtxSize(); len(prompt) >= limit {
		return nil, fmt.Errorf("%w: the prompt has %d tokens, the context holds %d", ErrContextFull, len(prompt), limit)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	onText, onToken, onPrompt := opt.OnText, opt.OnToken, opt.OnPrompt
	r := &request{ctx: ctx, prompt: prompt, opt: opt, start: start, signal: make(chan struct{}, 1)}
	r.opt.OnPrompt = nil // delivered from r.prefilled below
	// The step produces; the caller's goroutine delivers, so a slow client
	// never holds the others' steps.
	r.opt.OnText = func(piece string) error {
		r.mu.Lock()
		r.texts = append(r.texts, piece)
		r.mu.Unlock()
		r.notify()
		return nil
	}
	r.opt.OnToken = func(tok int) {
		r.mu.Lock()
		r.toks = append(r.toks, tok)
		r.mu.Unlock()
		r.notify()
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, ErrClosed
	}
	s.waiting = append(s.waiting, r)
	s.mu.Unlock()
	s.poke()
	var deliverErr error
	told := -1 // prompt tokens OnPrompt last heard of
	for {
		<-r.signal
		r.mu.Lock()
		texts, toks, done := r.texts, r.toks, r.done
		r.texts, r.toks = nil, nil
		r.mu.Unlock()
		if n := int(r.prefilled.Load()); onPrompt != nil && r.admitted.Load() && n != told && deliverErr == nil {
			onPrompt(n, len(prompt))
			told = n
		}
		for _, t := range toks {
			if onToken != nil && deliverErr == nil {
				onToken(t)
			}
		}
		for _, piece := range texts {
			if onText != nil && deliverErr == nil {
				if err := onText(piece); err != nil {
					deliverErr = err
					cancel() // the step drops the request
				}
			}
		}
		if done {
			if deliverErr != nil {
				return r.res, deliverErr
			}
			return r.res, r.err
		}
	}
}

func (r *request) notify() {
	select {
	case r.signal <- struct{}{}:
	default:
	}
}

// finish ends a request with its result.
func (r *request) finish(res *GenerateResult, err error) {
	r.mu.Lock()
	r.res, r.err, r.done = res, err, true
	r.mu.Unlock()
	r.notify()
}

// task is a Do call: f runs on the scheduler's goroutine between steps.
type task struct {
	ctx  context.Context
	f    func(*Engine) error
	err  error
	done chan struct{}
}

// Do runs f with the engine to itself, between two steps of the running
// requests (embeddings, which evaluate sequences of their own). It waits
// for its turn unless ctx ends first. When f fails with ErrContextFull
// while idle slots keep earlier prompts in the cache, those are dropped
// and f runs once more.
func (s *Scheduler) Do(ctx context.Context, f func(*Engine) error) error {
	t := &task{ctx: ctx, f: f, done: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return ErrClosed
	}
	s.tasks = append(s.tasks, t)
	s.mu.Unlock()
	s.poke()
	select {
	case <-t.done:
		return t.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	if i := slices.Index(s.tasks, t); i >= 0 { // not started: it never will
		s.tasks = slices.Delete(s.tasks, i, i+1)
		s.mu.Unlock()
		return ctx.Err()
	}
	s.mu.Unlock()
	<-t.done
	return t.err
}

// runTasks runs the Do calls waiting; it returns false when there were none.
func (s *Scheduler) runTasks() bool {
	s.mu.Lock()
	tasks := s.tasks
	s.tasks = nil
	s.mu.Unlock()
	for _, t := range tasks {
		if t.err = t.ctx.Err(); t.err == nil {
			t.err = runTask(t.f, s.e)
			if errors.Is(t.err, ErrContextFull) && s.dropIdle() > 0 && t.ctx.Err() == nil {
				// Idle slots' kept prompts held the cache: they go, as
				// they would for a request, and the task runs again.
				t.err = runTask(t.f, s.e)
			}
		}
		close(t.done)
	}
	return len(tasks) > 0
}

// runTask runs f, its panic an error: the requests of the other slots
// must not go down with it.
func runTask(f func(*Engine) error, e *Engine) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("scheduler task: panic: %v", r)
		}
	}()
	return f(e)
}

// loop runs steps while there is work, and sleeps otherwise.
func (s *Scheduler) loop() {
	defer close(s.exited)
	debug.SetPanicOnFault(true) // see stepRecovered
	for {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed {
			s.shutdown()
			return
		}
		ran := s.runTasks()
		if !s.runStep() && !ran {
			<-s.wake
		}
	}
}

// shutdown ends every request as cancelled and frees the sequences.
func (s *Scheduler) shutdown() {
	s.mu.Lock()
	waiting := s.waiting
	s.waiting = nil
	s.mu.Unlock()
	for _, r := range waiting {
		r.finish(nil, ErrClosed)
	}
	s.mu.Lock()
	tasks := s.tasks
	s.tasks = nil
	s.mu.Unlock()
	for _, t := range tasks {
		t.err = ErrClosed
		close(t.done)
	}
	for _, sl := range s.slots {
		if r := sl.req; r != nil {
			s.end(r, StopCancelled, ErrClosed)
		}
		if sl.seq != nil {
			sl.seq.Close()
			sl.seq = nil
		}
	}
}

// admit gives waiting requests free slots, oldest first: the idle slot
// whose kept sequence shares the longest prefix with the prompt, else the
// one idle longest. A request whose context ended while it waited ends.
func (s *Scheduler) admit() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(s.waiting) > 0 {
		r := s.waiting[0]
		if r.ctx.Err() != nil {
			s.waiting = s.waiting[1:]
			r.finish(&GenerateResult{PromptTokens: len(r.prompt), StopReason: StopCancelled}, r.ctx.Err())
			continue
		}
		var best *slot
		bestShared := -1
		for _, sl := range s.slots {
			if sl.req != nil {
				continue
			}
			shared := 0
			if sl.seq != nil {
				shared = commonPrefix(sl.seq.Tokens(), r.prompt)
			}
			if shared > bestShared || (shared == bestShared && sl.lastUsed.Before(best.lastUsed)) {
				best, bestShared = sl, shared
			}
		}
		if best == nil {
			return
		}
		s.waiting = s.waiting[1:]
		s.start(best, r)
	}
}

// commonPrefix is the length of the common prefix of a cached sequence
// and a prompt.
func commonPrefix(cached []int32, prompt []int) int {
	n := 0
	for n < len(cached) && n < len(prompt) && int(cached[n]) == prompt[n] {
		n++
	}
	return n
}

// start puts request r on slot sl: its sequence reuses what it can of the
// slot's and of the cache's index.
func (s *Scheduler) start(sl *slot, r *request) {
	if sl.seq == nil {
		sl.seq = s.e.Ctx.KV().NewSeq()
	}
	keep := sl.seq.Reuse(tokensOf(r.prompt))
	gen, err := NewGeneration(s.tok, s.nvocab, r.prompt, keep, r.opt, r.start)
	if err != nil {
		r.finish(nil, err)
		return
	}
	sl.req, r.slot, r.gen = r, sl, gen
	r.todo = r.prompt[keep:]
	r.prefilled.Store(int64(keep))
	sl.cached.Store(int64(keep))
	r.admitted.Store(true)
	r.notify()
}

// end finishes the request on its slot, which keeps the sequence.
func (s *Scheduler) end(r *request, reason string, err error) {
	sl := r.slot
	res, ferr := r.gen.Finish(reason, sl.seq.Len())
	if err == nil {
		err = ferr
	}
	s.mu.Lock()
	sl.req, sl.lastUsed = nil, time.Now()
	s.mu.Unlock()
	r.finish(res, err)
}

// row is one request's part of a step: rows [lo, hi) of the batch.
type row struct {
	r      *request
	lo, hi int
	prompt bool // a prompt chunk (else a decode token)
	last   bool // the chunk ends the prompt: its last row's logits are wanted
}

// runStep admits waiting requests and runs one step of the running ones;
// it returns false when there was nothing to do.
func (s *Scheduler) runStep() bool {
	s.admit()
	s.mu.Lock()
	var decoding, prefilling []*request
	for _, sl := range s.slots {
		r := sl.req
		if r == nil {
			continue
		}
		if r.ctx.Err() != nil {
			s.mu.Unlock()
			s.end(r, StopCancelled, r.ctx.Err())
			s.mu.Lock()
			continue
		}
		if len(r.todo) > 0 {
			prefilling = append(prefilling, r)
		} else {
			decoding = append(decoding, r)
		}
	}
	observe := s.observe
	s.mu.Unlock()
	if len(decoding)+len(prefilling) == 0 {
		return false
	}
	// Decode rows first, then prompt chunks, oldest first, under the
	// budget; logits rows under maxRows.
	slices.SortFunc(prefilling, func(a, b *request) int { return a.start.Compare(b.start) })
	var rows []row
	n, logits := 0, 0
	for _, r := range decoding {
		if n >= s.budget || logits >= s.maxRows {
			break
		}
		if err := r.slot.seq.Reserve(1); err != nil {
			s.evictFor(r, 1)
			if err := r.slot.seq.Reserve(1); err != nil {
				s.end(r, StopLength, nil) // the cache is full: as a full context ends a generation
				continue
			}
		}
		rows = append(rows, row{r: r, lo: n, hi: n + 1})
		n, logits = n+1, logits+1
	}
	for _, r := range prefilling {
		room := s.budget - n
		if room <= 0 || logits >= s.maxRows {
			break
		}
		take := min(room, len(r.todo))
		if err := r.slot.seq.Reserve(take); err != nil {
			s.evictFor(r, take)
			if err := r.slot.seq.Reserve(take); err != nil {
				if len(decoding) == 0 && len(rows) == 0 {
					// Nothing else runs that could free room: it never fits.
					s.end(r, StopLength, fmt.Errorf("%w: %v", ErrContextFull, err))
				}
				continue
			}
		}
		last := take == len(r.todo)
		rows = append(rows, row{r: r, lo: n, hi: n + take, prompt: true, last: last})
		n += take
		if last {
			logits++
		}
	}
	if len(rows) == 0 {
		return true
	}
	if !s.e.MultiSequence() && len(rows) > 1 {
		// The device takes one sequence a step: run them one after the
		// other (still interleaved, not batched).
		for _, rw := range rows {
			one := rw
			one.hi, one.lo = rw.hi-rw.lo, 0
			s.runRows([]row{one}, observe)
		}
		return true
	}
	s.runRows(rows, observe)
	return true
}

// runRows runs one step of rows and hands each request its logits.
func (s *Scheduler) runRows(rows []row, observe func(StepInfo)) {
	start := time.Now()
	b := &ir.Batch{Block: kvcache.DefaultBlock}
	var decodeRows, promptRows int
	for k, rw := range rows {
		seq := rw.r.slot.seq
		b.Tables = append(b.Tables, seq.Table())
		var toks []int
		if rw.prompt {
			toks = rw.r.todo[:rw.hi-rw.lo]
			promptRows += len(toks)
		} else {
			toks = []int{rw.r.next}
			decodeRows++
		}
		for t, tok := range toks {
			b.Tokens = append(b.Tokens, int32(tok))
			b.Pos = append(b.Pos, int32(seq.Len()+t))
			b.Seq = append(b.Seq, int32(k))
		}
		if !rw.prompt || rw.last {
			b.Logits = append(b.Logits, int32(rw.hi-1))
		}
	}
	logits, err := s.stepRecovered(b)
	s.step++
	if observe != nil {
		u, blk := s.e.Ctx.KV().Usage(), s.e.Ctx.KV().Block()
		observe(StepInfo{Rows: b.Len(), DecodeRows: decodeRows, PromptRows: promptRows, Requests: len(rows), Wall: time.Since(start),
			CacheHeld: u.Held * blk, CacheKept: u.Cached * blk, CacheFree: u.Free * blk})
	}
	if err != nil {
		for _, rw := range rows {
			s.end(rw.r, "", fmt.Errorf("step: %w", err))
		}
		return
	}
	// Bookkeeping first, in row order; then the draws, which are
	// independent per request, in parallel; then their outcomes.
	var draws []draw
	li := 0
	for _, rw := range rows {
		r := rw.r
		seq := r.slot.seq
		toks := b.Tokens[rw.lo:rw.hi]
		if err := seq.Append(toks); err != nil {
			s.end(r, "", err)
			if !rw.prompt || rw.last {
				li++
			}
			continue
		}
		r.slot.cached.Store(int64(seq.Len()))
		if rw.prompt {
			r.todo = r.todo[rw.hi-rw.lo:]
			r.prefilled.Store(int64(len(r.prompt) - len(r.todo)))
			r.notify()
			if !rw.last {
				continue
			}
			r.gen.Prefilled()
		}
		l := logits[li*s.nvocab : (li+1)*s.nvocab]
		li++
		if r.ctx.Err() != nil {
			s.end(r, StopCancelled, r.ctx.Err())
			continue
		}
		draws = append(draws, draw{r: r, logits: l, room: seq.Room()})
	}
	s.drawAll(draws)
	for i := range draws {
		d := &draws[i]
		switch {
		case d.err != nil:
			s.end(d.r, "", d.err)
		case d.done:
			s.end(d.r, "", nil)
		default:
			d.r.next = d.next
			d.r.generated.Store(int64(len(d.r.gen.res.Tokens)))
		}
	}
}

// draw is one request's sampling in a step: its logits row and outcome.
type draw struct {
	r      *request
	logits []float32
	room   int
	next   int
	done   bool
	err    error
}

// drawAll samples every draw. Each touches only its own request (sampler,
// grammar, stop matcher, callbacks that lock the request), so they run in
// parallel: at 32 rows of a 152k vocabulary, one after the other, the
// draws were a large part of an all-GPU step.
func (s *Scheduler) drawAll(draws []draw) {
	run := func(d *draw) {
		defer func() {
			if p := recover(); p != nil { // a bug in one request's draw ends that request only
				d.err = fmt.Errorf("sampling: %v\n%s", p, debug.Stack())
			}
		}()
		d.next, d.done, d.err = d.r.gen.Take(d.logits, d.room)
	}
	workers := min(len(draws), runtime.GOMAXPROCS(0))
	if workers <= 1 {
		for i := range draws {
			run(&draws[i])
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := int(next.Add(1)) - 1; i < len(draws); i = int(next.Add(1)) - 1 {
				run(&draws[i])
			}
		}()
	}
	wg.Wait()
}

// stepRecovered runs a step; a panic in it (a fault reading a model file
// truncated under the engine: the loop turns faults into panics) fails
// the step's requests instead of the process.
func (s *Scheduler) stepRecovered(b *ir.Batch) (logits []float32, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%w: %v", ErrStepPanicked, p)
		}
	}()
	return s.e.Ctx.Step(b)
}

// ErrStepPanicked is wrapped by the error of requests whose step panicked.
var ErrStepPanicked = errors.New("the step panicked")

// dropIdle frees the sequences idle slots keep for reuse and says how
// many it freed.
func (s *Scheduler) dropIdle() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, sl := range s.slots {
		if sl.req == nil && sl.seq != nil {
			sl.seq.Close()
			sl.seq = nil
			sl.cached.Store(0)
			n++
		}
	}
	return n
}

// evictFor frees room in the cache for n more positions of r's sequence:
// idle slots' kept sequences go, the longest idle first (their full blocks
// stay reusable until taken).
func (s *Scheduler) evictFor(r *request, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	idle := []*slot{}
	for _, sl := range s.slots {
		if sl.req == nil && sl.seq != nil {
			idle = append(idle, sl)
		}
	}
	slices.SortFunc(idle, func(a, b *slot) int { return a.lastUsed.Compare(b.lastUsed) })
	for _, sl := range idle {
		if r.slot.seq.Room() >= n {
			return
		}
		sl.seq.Close()
		sl.seq = nil
		sl.cached.Store(0)
	}
}
