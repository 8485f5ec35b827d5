// Package session is the top of the engine, where text meets it: a model
// opened for generation (Engine: its host weights, its placement, the
// executor and its KV cache), a conversation (Session: a sequence of that
// cache with the tokenizer and chat template), and a request's decoding
// (Generation: sampling, stop strings, streamed text), which Session.Generate
// drives alone and the Scheduler drives many at a time, batched.
//
// Below it the engine knows nothing of text (runtime/model, exec,
// placement, kvcache, backend); beside it, runtime/text has no engine.
package session

import (
	"errors"
	"fmt"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/placement"
)

// Options configure an engine: what the command line's flags and the
// environment say. The zero value runs on the CPU with a context of the
// model's training length (at most 4096).
type Options struct {
	CtxSize int          // KV cache positions, all sequences together (0: the model's training context, at most 4096)
	KVType  kvcache.Type // the KV cache's type (f16 by default)
	Threads int          // host threads (0: all cores)
	Batch   int          // most tokens a step computes (0: 512)
	// Backend is where the engine computes: "cpu" (or ""), "gpu" or
	// "auto" (placement.Options.Backend).
	Backend string
	// Device is the opened accelerator (nil: none); its owner opens it
	// once per process.
	Device backend.Accelerator
	// VRAMBudget, Placement, PlanFor, StaticOnly, Progress: as
	// placement.Options.
	VRAMBudget int64
	Placement  *placement.Placement
	PlanFor    string
	StaticOnly bool
	Progress   func(done, total int, what string)
	// Trace, when set, receives the timeline of every step.
	Trace *executor.Trace
	// NoRepack keeps the host's matrices in the file's blocks.
	NoRepack bool
	// RepackAll repacks a hybrid context's host matrices whatever host
	// memory the copies take.
	RepackAll bool
	// HostProfile times every host op and reports at Close.
	HostProfile bool
	// MoESplit, MoERouted and PromoteLog: as placement.Options.
	MoESplit   string
	MoERouted  string
	PromoteLog bool
	// DeviceOptions are the accelerator's switches.
	DeviceOptions backend.Options
	// Notes receives what the engine has to tell the user (nil: nothing).
	Notes backend.Notes
	// Weights are the model's host weights when the caller keeps them
	// across engines, with the copies repacked for earlier ones (nil: made
	// anew).
	Weights *cpu.Weights

	// Test switches (placement.Options).
	HybridAlways, PromoteEverything bool
}

// resolved fills the defaults that depend on the model.
func (o Options) resolved(m *model.Model) Options {
	if o.CtxSize <= 0 {
		o.CtxSize = min(m.Hyper().NCtxTrain, 4096)
	}
	if o.Batch <= 0 {
		o.Batch = 512
	}
	o.Batch = min(o.Batch, o.CtxSize)
	o.DeviceOptions.Notes = o.Notes
	return o
}

func (o Options) placement() placement.Options {
	return placement.Options{Backend: o.Backend, VRAMBudget: o.VRAMBudget, Placement: o.Placement, PlanFor: o.PlanFor,
		StaticOnly: o.StaticOnly, Batch: o.Batch, Threads: o.Threads, KV: model.KV{Rows: o.CtxSize, Type: o.KVType},
		Progress: o.Progress, MoESplit: o.MoESplit, MoERouted: o.MoERouted, PromoteLog: o.PromoteLog, Device: o.DeviceOptions, Notes: o.Notes,
		HybridAlways: o.HybridAlways, PromoteEverything: o.PromoteEverything}
}

// NewPlanner is the planner of m for engines of opt (its host weights made
// anew), and the placement options opt comes to.
func NewPlanner(m *model.Model, opt Options) (*placement.Planner, placement.Options, error) {
	opt = opt.resolved(m)
	w := opt.Weights
	if w == nil || w.Program() != m.Prog {
		var err error
		if w, err = cpu.NewWeights(m.Prog); err != nil {
			return nil, placement.Options{}, fmt.Errorf("%s: %w", m.File.Path, err)
		}
	}
	w.NoRepack, w.RepackAll, w.Notes = opt.NoRepack, opt.RepackAll, opt.Notes
	if avail, ok := availableMemory(); ok {
		w.AvailableMemory = avail
	}
	return placement.New(m, w, opt.Device), opt.placement(), nil
}

// Engine is a model opened for generation: its host weights, its
// placement and the executor over its KV cache. Sequences of the cache are
// the engine's users: a Session has one, a Scheduler many. It is not safe
// for concurrent use.
type Engine struct {
	Model     *model.Model
	Weights   *cpu.Weights
	Planner   *placement.Planner
	Placement *placement.Placement
	Ctx       *executor.Context
	Promoter  *placement.Promoter // nil without dynamic promotion
	opt       Options
	pool      *ops.Pool
}

// NewEngine resolves the model's placement (planning it when needed),
// repacks the host's matrices as it says, and makes the executor.
func NewEngine(m *model.Model, opt Options) (*Engine, error) {
	opt = opt.resolved(m)
	if err := checkOptions(m, opt); err != nil { // limits.go
		return nil, fmt.Errorf("%s: %w", m.File.Path, err)
	}
	if err := opt.KVType.CheckWidth(m.Hyper().NKVHead * m.Hyper().HeadK); err != nil {
		return nil, fmt.Errorf("%s: %w", m.File.Path, err)
	}
	pln, po, err := NewPlanner(m, opt)
	if err != nil {
		return nil, err
	}
	w := pln.Weights()
	pl, err := pln.Resolve(po)
	if err != nil {
		return nil, err
	}
	var acc backend.Accelerator
	switch {
	case !pl.UsesDevice(opt.Batch):
		placement.RepackHost(w)
	case !pl.Layout().AllResident():
		acc = opt.Device
		placement.RepackHybrid(w, m, pl)
	default:
		acc = opt.Device
	}
	pool := ops.NewPool(opt.Threads)
	eo := po.ExecOptions()
	eo.Trace, eo.HostProfile = opt.Trace, opt.HostProfile
	ctx, err := executor.New(m, w, pool, acc, pl.Layout(), eo)
	if err != nil {
		pool.Close()
		return nil, err
	}
	e := &Engine{Model: m, Weights: w, Planner: pln, Placement: pl, Ctx: ctx, opt: opt, pool: pool}
	if acc != nil {
		if pr := pln.Promoter(ctx, pl, po); pr != nil {
			e.Promoter = pr
			ctx.SetPolicy(pr)
		}
	}
	return e, nil
}

// Close frees the executor and its worker threads.
func (e *Engine) Close() {
	if e.Ctx != nil {
		e.Ctx.Close()
		e.Ctx = nil
	}
	if e.pool != nil {
		e.pool.Close()
		e.pool = nil
	}
}

// CtxSize is the most positions a sequence may hold: the context asked
// for (the cache holds it in whole blocks, shared by all sequences).
func (e *Engine) CtxSize() int { return e.Ctx.KV().Limit() }

// Threads is the host's threads.
func (e *Engine) Threads() int { return e.Ctx.Threads() }

// Backend says where the engine computes: "cpu", "gpu" or "cpu+gpu".
func (e *Engine) Backend() string { return e.Ctx.Backend() }

// MultiSequence says whether a step may hold tokens of several sequences
// (the host always takes them; a device when its kernels do).
func (e *Engine) MultiSequence() bool {
	return e.Ctx.Device() == nil || e.opt.Device.MultiSequence()
}

// Options are the engine's options, defaults filled in.
func (e *Engine) Options() Options { return e.opt }

// ErrContextFull is returned when a sequence outgrows the KV cache.
var ErrContextFull = errors.New("context is full")

// Eval computes tokens at the end of seq (reserving their cache rows) and
// returns logits: one row of NVocab per token when all is set, else only
// the last token's row. Tokens are cut into steps of at most the engine's
// batch (and its logits rows, when all is set). The returned slice is the
// executor's memory when one step computed it, valid until the next step.
func (e *Engine) Eval(seq *kvcache.Seq, tokens []int, all bool) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, errors.New("eval: no tokens")
	}
	if err := seq.Reserve(len(tokens)); err != nil {
		return nil, fmt.Errorf("%w: %d tokens in the cache + %d new: %w", ErrContextFull, seq.Len(), len(tokens), err)
	}
	step := e.Ctx.Batch()
	if all {
		step = min(step, e.Ctx.LogitRows())
	}
	var out []float32
	for start := 0; start < len(tokens); start += step {
		chunk := tokens[start:min(len(tokens), start+step)]
		last := start+len(chunk) == len(tokens)
		want := 0
		switch {
		case all:
			want = len(chunk)
		case last:
			want = 1
		}
		l, err := e.step(seq, chunk, want)
		if err != nil {
			return nil, err
		}
		switch {
		case all && len(tokens) > step:
			out = append(out, l...) // a copy: the next step reuses l
		case all || last:
			out = l
		}
	}
	return out, nil
}

// step runs chunk at the end of seq, the logits of its last want rows
// wanted, and records the chunk in the cache.
func (e *Engine) step(seq *kvcache.Seq, chunk []int, want int) ([]float32, error) {
	b := SingleBatch(seq, chunk, want)
	l, err := e.Ctx.Step(b)
	if err != nil {
		return nil, err
	}
	return l, seq.Append(b.Tokens)
}

// Decode computes one decode step of several sequences: tokens[i] at the
// end of seqs[i], all in one batch, and returns every row's logits (row i
// is seqs[i]'s), a view valid until the next step. It is the step a
// server's slots take together; a sequence that cannot grow fails it
// before anything is computed.
func (e *Engine) Decode(seqs []*kvcache.Seq, tokens []int) ([]float32, error) {
	switch {
	case len(seqs) == 0 || len(seqs) != len(tokens):
		return nil, fmt.Errorf("decode: %d sequences and %d tokens: want one token for each of at least one sequence", len(seqs), len(tokens))
	case len(seqs) > 1 && !e.MultiSequence():
		return nil, fmt.Errorf("decode: %d sequences in one step: this backend computes one sequence a step", len(seqs))
	case len(seqs) > e.Ctx.LogitRows():
		return nil, fmt.Errorf("decode: %d sequences in one step: a step returns at most %d rows of logits", len(seqs), e.Ctx.LogitRows())
	}
	b := &ir.Batch{Block: kvcache.DefaultBlock}
	for i, seq := range seqs {
		if err := seq.Reserve(1); err != nil {
			return nil, fmt.Errorf("%w: sequence %d: %d tokens in the cache + 1: %w", ErrContextFull, i, seq.Len(), err)
		}
		b.Tables = append(b.Tables, seq.Table())
		b.Tokens = append(b.Tokens, int32(tokens[i]))
		b.Pos = append(b.Pos, int32(seq.Len()))
		b.Seq = append(b.Seq, int32(i))
		b.Logits = append(b.Logits, int32(i))
	}
	l, err := e.Ctx.Step(b)
	if err != nil {
		return nil, err
	}
	for i, seq := range seqs {
		if err := seq.Append(b.Tokens[i : i+1]); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// SingleBatch is the step of chunk at the end of seq (its rows reserved):
// the batch of one sequence, the logits of its last want rows wanted.
func SingleBatch(seq *kvcache.Seq, chunk []int, want int) *ir.Batch {
	n := len(chunk)
	b := &ir.Batch{Tokens: make([]int32, n), Pos: make([]int32, n), Seq: make([]int32, n),
		Tables: [][]int32{seq.Table()}, Block: kvcache.DefaultBlock}
	for t, tok := range chunk {
		b.Tokens[t], b.Pos[t] = int32(tok), int32(seq.Len()+t)
	}
	for r := n - want; r < n; r++ {
		b.Logits = append(b.Logits, int32(r))
	}
	return b
}

// VRAMUse is an engine's device memory.
type VRAMUse struct {
	Allocated int64  // what the executor allocated (its arena and its share of the weights), at the driver's granularity
	Budget    int64  // the placement's budget
	Process   int64  // what the device charges the process, less the driver context's own memory (Context); 0 when unknown
	Context   int64  // the driver context and kernel modules, reported apart
	How       string // where Process comes from
}

// VRAM reports the engine's device memory (zero on the CPU).
func (e *Engine) VRAM() VRAMUse {
	d := e.Ctx.Device()
	if d == nil {
		return VRAMUse{}
	}
	arena, weights := d.Bytes()
	u := VRAMUse{Allocated: arena + weights, Budget: e.Placement.Budget}
	if acc := e.opt.Device; acc != nil {
		if n, how, ok := acc.ProcessMemory(); ok {
			u.Context = acc.ContextBytes()
			u.Process, u.How = n-u.Context, how
		}
	}
	return u
}

// tokensOf converts ids to the cache's int32 tokens.
func tokensOf(ids []int) []int32 {
	out := make([]int32, len(ids))
	for i, t := range ids {
		out[i] = int32(t)
	}
	return out
}

// KVCacheInfo is the KV cache: its type, its rows (every sequence's
// positions together), and its bytes, all of them and where they live.
type KVCacheInfo struct {
	Type                          kvcache.Type
	Rows                          int
	Bytes, HostBytes, DeviceBytes int64
}

// KVCache describes the engine's KV cache.
func (e *Engine) KVCache() KVCacheInfo {
	h := e.Model.Hyper()
	rows := e.Ctx.KV().Rows()
	total := 2 * int64(h.NLayer) * e.opt.KVType.RowBytes(h.NKVHead*max(h.HeadK, h.HeadV)) * int64(rows)
	host := min(e.Ctx.HostKVBytes(), total)
	return KVCacheInfo{Type: e.opt.KVType, Rows: rows, Bytes: total, HostBytes: host, DeviceBytes: total - host}
}
