package session

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/text/sampler"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// forced is a constraint that allows one token at each step: the tokens of
// a run to compare with (teacher forcing), so that a near-tie can not send
// two runs down different paths.
type forced struct {
	toks []int
	at   int
	mask []uint64
}

func (f *forced) Allowed() ([]uint64, error) {
	clear(f.mask)
	if f.at < len(f.toks) {
		t := f.toks[f.at]
		f.mask[t/64] |= 1 << (t % 64)
	}
	return f.mask, nil
}

func (f *forced) Accept(tok int) error {
	if f.at >= len(f.toks) || tok != f.toks[f.at] {
		return fmt.Errorf("token %d at step %d, forced %v", tok, f.at, f.toks)
	}
	f.at++
	return nil
}

// schedPrompts are distinct prompts of the oracle's vocabulary, some
// sharing a prefix (a system prompt), of several lengths.
func schedPrompts(nvocab, n int) [][]int {
	rng := rand.New(rand.NewPCG(11, 12))
	shared := make([]int, 40)
	for i := range shared {
		shared[i] = 1 + rng.IntN(nvocab-1)
	}
	var out [][]int
	for i := range n {
		var p []int
		if i%2 == 0 {
			p = append(p, shared...)
		}
		for range 3 + rng.IntN(60) {
			p = append(p, 1+rng.IntN(nvocab-1))
		}
		out = append(out, p)
	}
	return out
}

// recordLogits collects a run's logits, step by step.
func recordLogits(into *[][]float32) func(int, []float32) {
	return func(_ int, l []float32) { *into = append(*into, slices.Clone(l)) }
}

// TestSchedulerMatchesAlone runs several requests at once, batched, each
// forced along the tokens it produced alone, and checks that every step's
// logits are those of the request run alone: no request sees another's
// keys and values, and batching changes nothing beyond rounding.
func TestSchedulerMatchesAlone(t *testing.T) {
	for _, name := range []string{"tiny-qwen3-q4_k_m", "tiny-qwen3moe-q4_k_m", "tiny-llama-q8_0"} {
		t.Run(name, func(t *testing.T) {
			schedulerMatchesAlone(t, openOracle(t, name), Options{Threads: 2}, 1e-4)
		})
	}
}

// schedulerMatchesAlone is TestSchedulerMatchesAlone's check of model m
// with the engines' options opt (their context and batch sizes set here):
// every step's logits within bound (NMSE) of the request's alone.
func schedulerMatchesAlone(t *testing.T, m *model.Model, opt Options, bound float64) {
	t.Helper()
	nv := m.Hyper().NVocab
	prompts := schedPrompts(nv, 6)
	const gen = 8
	greedy := greedyConfig()
	alone := make([][][]float32, len(prompts))
	toks := make([][]int, len(prompts))
	for i, p := range prompts {
		o := opt
		o.CtxSize = 1024
		s, err := NewSession(m, o, nil)
		if err != nil {
			t.Fatal(err)
		}
		res, err := s.Generate(context.Background(), p, GenerateOptions{Sampler: greedy, MaxTokens: gen, OnLogits: recordLogits(&alone[i])})
		s.Close()
		if err != nil {
			t.Fatal(err)
		}
		toks[i] = res.Tokens
	}
	o := opt
	o.CtxSize, o.Batch = 1024, 64
	e, err := NewEngine(m, o)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	tok, err := LoadTokenizer(m, nil)
	if err != nil {
		t.Fatal(err)
	}
	sched := NewScheduler(e, tok, 4)
	defer sched.Close()
	var steps, batched int
	var mu sync.Mutex
	sched.Observe(func(si StepInfo) {
		mu.Lock()
		steps++
		if si.Requests > 1 {
			batched++
		}
		mu.Unlock()
	})
	// The engine is held until every request waits, so the first steps
	// batch them however slowly the requests arrive (a busy 2-core machine
	// once ran each to its end before the next came).
	release := holdScheduler(t, sched)
	defer release() // a failed wait must not leave the scheduler held (Close would hang)
	got := make([][][]float32, len(prompts))
	var wg sync.WaitGroup
	for i, p := range prompts {
		wg.Go(func() {
			f := &forced{toks: toks[i], mask: make([]uint64, (nv+63)/64)}
			res, err := sched.Generate(context.Background(), p, GenerateOptions{Sampler: greedy, MaxTokens: len(toks[i]), Constraint: f, OnLogits: recordLogits(&got[i])})
			if err != nil {
				t.Errorf("request %d: %v", i, err)
				return
			}
			if !slices.Equal(res.Tokens, toks[i]) {
				t.Errorf("request %d: tokens %v, alone %v", i, res.Tokens, toks[i])
			}
		})
	}
	waitQueued(t, sched, len(prompts))
	release()
	wg.Wait()
	worst := 0.0
	for i := range prompts {
		if len(got[i]) != len(alone[i]) {
			t.Fatalf("request %d: %d steps, alone %d", i, len(got[i]), len(alone[i]))
		}
		for s := range got[i] {
			e := nmse(got[i][s], alone[i][s])
			worst = max(worst, e)
			if e > bound {
				t.Errorf("request %d, step %d: NMSE %.3g against the request alone", i, s, e)
			}
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if batched == 0 {
		t.Errorf("no step held more than one request (%d steps)", steps)
	}
	t.Logf("%d steps, %d of them batched; worst NMSE against alone %.3g", steps, batched, worst)
}

// holdScheduler occupies the scheduler's goroutine with a task until the
// returned release is first called: requests queue meanwhile.
func holdScheduler(t *testing.T, sched *Scheduler) (release func()) {
	t.Helper()
	started, gate, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- sched.Do(context.Background(), func(*Engine) error {
			close(started)
			<-gate
			return nil
		})
	}()
	<-started
	var once sync.Once
	return func() {
		once.Do(func() {
			close(gate)
			if err := <-done; err != nil {
				t.Errorf("holding task: %v", err)
			}
		})
	}
}

// waitQueued waits until n requests wait for a slot (a condition, not a
// time: the deadline only turns a lost request into a failure).
func waitQueued(t *testing.T, sched *Scheduler, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		sched.mu.Lock()
		queued := len(sched.waiting)
		sched.mu.Unlock()
		if queued >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d requests queued after a minute", queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSchedulerCancellations runs 64 clients on 4 slots, cancelling some
// at random moments: every request that is not cancelled completes with
// its tokens, a cancelled one ends promptly, and the slots end idle.
func TestSchedulerCancellations(t *testing.T) {
	m, _, sched := newTestScheduler(t, Options{CtxSize: 2048, Threads: 2, Batch: 64}, 4)
	nv := m.Hyper().NVocab
	prompts := schedPrompts(nv, 64)
	rng := rand.New(rand.NewPCG(21, 22))
	cancelAt := make([]time.Duration, len(prompts))
	for i := range cancelAt {
		if rng.IntN(3) == 0 {
			cancelAt[i] = time.Duration(rng.IntN(40)) * time.Millisecond
		}
	}
	const gen = 6
	var wg sync.WaitGroup
	var mu sync.Mutex
	completed, cancelled := 0, 0
	for i, p := range prompts {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if d := cancelAt[i]; d > 0 {
				time.AfterFunc(d, cancel)
			}
			var text []string
			res, err := sched.Generate(ctx, p, GenerateOptions{Sampler: greedyConfig(), MaxTokens: gen,
				OnText: func(s string) error { text = append(text, s); return nil }})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case errors.Is(err, context.Canceled):
				cancelled++
				if cancelAt[i] == 0 {
					t.Errorf("request %d: cancelled, but nobody cancelled it", i)
				}
			case err != nil:
				t.Errorf("request %d: %v", i, err)
			default:
				completed++
				if len(res.Tokens) == 0 || len(res.Tokens) > gen || (res.StopReason != StopLength && res.StopReason != StopEOG) {
					t.Errorf("request %d: %d tokens, stop %q", i, len(res.Tokens), res.StopReason)
				}
			}
		})
	}
	wg.Wait()
	for _, si := range sched.Slots() {
		if si.Busy {
			t.Errorf("slot %d still busy", si.ID)
		}
	}
	t.Logf("%d completed, %d cancelled", completed, cancelled)
	if completed == 0 {
		t.Fatal("nothing completed")
	}
}

// A prompt longer than the context is an error; a request on a closed
// scheduler too.
func TestSchedulerErrors(t *testing.T) {
	_, _, sched := newTestScheduler(t, Options{CtxSize: 64, Threads: 1}, 2)
	long := make([]int, 100)
	for i := range long {
		long[i] = 1
	}
	if _, err := sched.Generate(context.Background(), long, GenerateOptions{MaxTokens: 1}); !errors.Is(err, ErrContextFull) {
		t.Errorf("a prompt past the context: %v", err)
	}
	if _, err := sched.Generate(context.Background(), nil, GenerateOptions{MaxTokens: 1}); err == nil {
		t.Error("an empty prompt was taken")
	}
	sched.Close()
	if _, err := sched.Generate(context.Background(), []int{1, 2}, GenerateOptions{MaxTokens: 1}); !errors.Is(err, ErrClosed) {
		t.Errorf("after Close: %v", err)
	}
}

// greedyConfig samples the most likely token.
func greedyConfig() sampler.Config {
	c := sampler.DefaultConfig()
	c.Temperature = 0
	return c
}

// TestSchedulerMatchesAloneGPU is TestSchedulerMatchesAlone on the GPU:
// every unit there (f16, q8_0 and q4_0 caches, the paged decode kernel over
// several sequences a launch, prompt chunks beside decode rows), and with
// the attention on the CPU. The bound is looser than the CPU's, where a
// row's arithmetic does not depend on the batch: the decode kernel splits
// the positions by the number of decode rows, the products switch kernels
// with the batch size, and the tiny models amplify rounding (up to 3e-4
// here), and near-tied experts then flip (5e-3). A sequence reading
// another's cells, or a wrong position, is off by far more.
func TestSchedulerMatchesAloneGPU(t *testing.T) {
	dev := needGPUDevice(t)
	for _, name := range []string{"tiny-qwen3-q4_k_m", "tiny-qwen3moe-q4_k_m"} {
		t.Run(name, func(t *testing.T) {
			m := openOracle(t, name)
			attnCPU := forcedPlacement(t, m, 1024, func(_ int, u model.Unit) bool { return u.Role != "attention" })
			for _, v := range []struct {
				name string
				opt  Options
			}{
				{"all-gpu", Options{Backend: executor.BackendGPU}},
				{"all-gpu-q8_0", Options{Backend: executor.BackendGPU, KVType: kvcache.Q8_0}},
				{"all-gpu-q4_0", Options{Backend: executor.BackendGPU, KVType: kvcache.Q4_0}},
				{"attention-cpu", Options{Backend: executor.BackendAuto, Placement: attnCPU, PromoteEverything: true}},
			} {
				t.Run(v.name, func(t *testing.T) {
					v.opt.Device, v.opt.Threads = dev, 2
					schedulerMatchesAlone(t, m, v.opt, 1e-2)
				})
			}
		})
	}
}

// allowOnly is a constraint that allows a fixed set of tokens forever.
type allowOnly struct{ mask []uint64 }

func (a *allowOnly) Allowed() ([]uint64, error) { return a.mask, nil }
func (a *allowOnly) Accept(int) error           { return nil }

// TestSchedulerOptions: OnPrompt hears of the prompt's evaluation up to
// its end, IgnoreEOS never draws an end token (here the only other token
// a constraint allows), and Do runs between steps while requests run.
func TestSchedulerOptions(t *testing.T) {
	m, tok, sched := newTestScheduler(t, Options{CtxSize: 1024, Threads: 2, Batch: 16}, 2)
	nv := m.Hyper().NVocab
	eog := -1
	for id := range nv {
		if tok.IsEOG(id) {
			eog = id
			break
		}
	}
	if eog < 0 {
		t.Fatal("no end-of-generation token")
	}
	prompt := schedPrompts(nv, 1)[0]
	prompt = append(prompt, prompt...) // more than two steps' chunks of 16

	var wg sync.WaitGroup
	wg.Go(func() {
		var progress [][2]int
		res, err := sched.Generate(context.Background(), prompt, GenerateOptions{Sampler: greedyConfig(), MaxTokens: 4,
			OnPrompt: func(done, total int) { progress = append(progress, [2]int{done, total}) }})
		if err != nil {
			t.Error(err)
			return
		}
		// Delivery coalesces what the steps report while the caller's
		// goroutine is busy, so a loaded machine may see the last report
		// only; it must be the whole prompt, and the reports must grow.
		if len(progress) < 1 || progress[len(progress)-1] != [2]int{len(prompt), len(prompt)} {
			t.Errorf("prompt progress %v for %d tokens", progress, len(prompt))
		}
		for k := 1; k < len(progress); k++ {
			if progress[k][0] <= progress[k-1][0] {
				t.Errorf("prompt progress goes back: %v", progress)
			}
		}
		if res.Prefill <= 0 {
			t.Errorf("prefill time %v", res.Prefill)
		}
	})
	wg.Go(func() {
		other := 1 + (eog+1)%(nv-1)
		mask := make([]uint64, (nv+63)/64)
		mask[eog/64] |= 1 << (eog % 64)
		mask[other/64] |= 1 << (other % 64)
		res, err := sched.Generate(context.Background(), []int{1, 2, 3}, GenerateOptions{Sampler: greedyConfig(), MaxTokens: 6,
			IgnoreEOS: true, Constraint: &allowOnly{mask}})
		if err != nil {
			t.Error(err)
			return
		}
		if len(res.Tokens) != 6 || res.StopReason != StopLength || slices.Contains(res.Tokens, eog) {
			t.Errorf("ignore_eos: tokens %v, stop %q (end token %d)", res.Tokens, res.StopReason, eog)
		}
	})
	wg.Go(func() {
		err := sched.Do(context.Background(), func(e *Engine) error {
			seq := e.Ctx.KV().NewSeq()
			defer seq.Close()
			_, err := e.Eval(seq, []int{5, 6, 7}, false)
			return err
		})
		if err != nil {
			t.Errorf("Do: %v", err)
		}
		if err := sched.Do(context.Background(), func(*Engine) error { panic("boom") }); err == nil || !strings.Contains(err.Error(), "boom") {
			t.Errorf("a task's panic: %v", err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := sched.Do(ctx, func(*Engine) error { return nil }); !errors.Is(err, context.Canceled) {
			t.Errorf("Do with a cancelled context: %v", err)
		}
	})
	wg.Wait()
}

// A task that needs the cache (an embedding) gets the room idle slots
// keep for their last prompts, as a request would: a server that chatted
// before must still embed a text that fits its context.
func TestSchedulerDoFreesIdleSlots(t *testing.T) {
	m, _, sched := newTestScheduler(t, Options{CtxSize: 512, Threads: 1}, 2)
	nv := m.Hyper().NVocab
	prompts := schedPrompts(nv, 2)
	var wg sync.WaitGroup
	for _, p := range prompts {
		wg.Go(func() {
			if _, err := sched.Generate(context.Background(), p, GenerateOptions{Sampler: greedyConfig(), MaxTokens: 4, IgnoreEOS: true}); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	kept := 0
	for _, sl := range sched.Slots() {
		if sl.Cached > 0 {
			kept++
		}
	}
	if kept != 2 {
		t.Fatalf("%d slots keep their prompts, want 2 (the test needs both blocks held)", kept)
	}
	text := make([]int, 400) // more than one block of 256: both are needed
	for i := range text {
		text[i] = 1 + i%(nv-1)
	}
	var emb []float32
	err := sched.Do(context.Background(), func(e *Engine) error {
		var err error
		emb, err = e.Embed(context.Background(), text, PoolingLast, true)
		return err
	})
	if err != nil || len(emb) != m.Hyper().NEmbd {
		t.Fatalf("embedding beside idle slots: %d values, %v", len(emb), err)
	}
}

// newTestScheduler opens the tiny Qwen3 oracle model in an engine of opt
// and a scheduler of slots slots over it, both closed when the test ends.
func newTestScheduler(t *testing.T, opt Options, slots int) (*model.Model, *tokenizer.Tokenizer, *Scheduler) {
	t.Helper()
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	e, err := NewEngine(m, opt)
	if err != nil {
		t.Fatal(err)
	}
	tok, err := LoadTokenizer(m, nil)
	if err != nil {
		e.Close()
		t.Fatal(err)
	}
	sched := NewScheduler(e, tok, slots)
	t.Cleanup(func() {
		sched.Close()
		e.Close()
	})
	return m, tok, sched
}
