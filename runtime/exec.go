package runtime

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/cpu"
	"github.com/atsinfer/ats/runtime/gpu"
	"github.com/atsinfer/ats/runtime/ir"
)

// The executor. A context runs the model's program under a placement:
// each unit (units.go) on the CPU backend (runtime/cpu) or the GPU backend
// (runtime/gpu). All-CPU and all-GPU are two placements like any other.
//
// A placement becomes schedules: per batch size, the backend of every op.
// A schedule is cut into segments, maximal runs of ops on one backend; a
// GPU segment is compiled once into fused launches (and, for a decode
// step, replayed as a CUDA graph), a CPU segment runs op by op on the
// worker pool. Between segments only activations cross: the executor
// tracks which backend holds the current rows of every buffer and, where
// an op reads a buffer last written on the other side, has the GPU move it
// with a small copy kernel through the CPU backend's mapped pinned memory
// (zero-copy: it never waits behind weight traffic on the copy engine).
// Each layer's KV cache lives with the backend that runs its attention.
//
// Decode runs units where they are resident. A prefill batch may also
// run non-resident units on the GPU, their weights streamed through the
// staging ring, when the placement says streaming wins at that batch size.

// cacheType is the CPU KV cache's cell type the options ask for.
func (o ContextOptions) cacheType() ops.KVType {
	if o.KVF32 {
		return ops.KVF32
	}
	return o.KVType
}

// ContextOptions configure an inference context.
type ContextOptions struct {
	CtxSize int  // tokens the KV cache holds (0: the model's training context, at most 4096)
	KVF32   bool // keep the KV cache in f32 instead of f16 (CPU attention only)
	// KVType is the KV cache's cell type: f16 (the zero value), q8_0 or
	// q4_0 (CPU attention only; KVF32 overrides it).
	KVType  ops.KVType
	Threads int // CPU threads (0: all cores)
	Batch   int // most tokens computed together in prefill (0: 512)
	// Backend is where the context computes: "cpu" (or ""), "gpu" (every
	// op on the GPU; an error when CUDA or device memory is missing) or
	// "auto" (the GPU when usable: everything on it when the model fits
	// the budget, else a planned CPU+GPU placement; the CPU alone without
	// a usable GPU, said once on stderr).
	Backend string
	// VRAMBudget bounds everything the context allocates on the GPU:
	// weights, KV caches, activations, scratch and the staging ring
	// (0: the device's free memory less a margin). The CUDA context's own
	// memory is not counted.
	VRAMBudget int64
	// Placement, when set, is used instead of planning (Backend "auto" or
	// "gpu" then needs a GPU).
	Placement *Placement
	// PlanFor is the workload the planner optimises the residency for:
	// "decode" (default) or "prefill".
	PlanFor string
	// Progress, when set, hears of a profiling run (plan.go).
	Progress func(done, total int, what string)
	// StaticOnly turns off dynamic promotion: decode steps run every unit
	// where the placement keeps it.
	StaticOnly bool
	// Trace, when set, receives the timeline of every batch (trace.go).
	Trace *Trace
}

// Context is one sequence being evaluated: the KV caches, activation
// buffers and the position reached. It is not safe for concurrent use.
type Context struct {
	m      *Model
	opt    ContextOptions
	pool   *ops.Pool
	units  []Unit
	place  *Placement
	cpu    *cpu.Backend                  // nil when no op runs on the CPU
	gpu    *gpu.Exec                     // nil when no op runs on the GPU
	host   []*cudadrv.HostMem            // mapped pinned buffers of activations that cross
	scheds []*schedule                   // by ascending minBatch; scheds[0] has minBatch 1
	hostOf map[ir.BufID]*cudadrv.HostMem // the mapped host memory of buffers that cross
	prom   *promoter                     // dynamic promotion of decode steps (nil: off)
	unitOf []int                         // by op: its unit (traces)
	logits []float32                     // rows of logits read back from the GPU
	pos    int
	stats  ExecStats
	// entered: counted among the model's open contexts (Model.enterContext)
	// until Close.
	entered bool
}

// ExecStats are the executor's counters since the context was made.
type ExecStats struct {
	Steps         int           // batches evaluated
	DecodeSteps   int           // of them, single tokens
	DecodeTime    time.Duration // wall time of the decode steps
	StreamedBytes int64         // weight bytes streamed through the ring
	Switches      int           // backend switches of the last batch
	// DecodeCPU and DecodeGPU split the decode steps' wall time: in CPU
	// segments, and in queuing GPU segments and waiting for them.
	DecodeCPU, DecodeGPU time.Duration
	// Split counts the MoE layers of prefill batches split between the
	// CPU and the GPU, and the CPU's time on them (gpu.SplitStats).
	Split gpu.SplitStats
}

// schedule is where every op runs for batches of at least minBatch tokens.
type schedule struct {
	minBatch int
	dev      []plan.Backend // by op
	stream   []bool         // by unit: runs on the GPU, its weights streamed
	split    []int          // by unit: an MoE layer split with the CPU at this expert (0: none; gpu.SegmentSpec.Split)
	segs     []segment
	gpu      *gpu.Schedule
}

// segment is a maximal run of ops on one backend.
type segment struct {
	onGPU  bool
	lo, hi int
	g      *gpu.Segment // onGPU: the compiled segment
}

// pageableNote says once that streamed weights are not page-locked.
var pageableNote sync.Once

// ErrContextFull is returned when a sequence outgrows the KV cache.
var ErrContextFull = errors.New("context is full")

// maxLogitRows bounds the rows of the logits buffer: a batch whose every
// logit is wanted is cut to this many tokens (152k-token vocabularies
// would otherwise need 300 MB of logits for a batch of 512).
const maxLogitRows = 64

// NewContext allocates a context for the model: it resolves the
// placement (planning it when needed), then makes the backends.
func (m *Model) NewContext(opt ContextOptions) (*Context, error) {
	h := m.Prog.Hyper
	if opt.CtxSize <= 0 {
		opt.CtxSize = min(h.NCtxTrain, 4096)
	}
	if opt.Batch <= 0 {
		opt.Batch = 512
	}
	opt.Batch = min(opt.Batch, opt.CtxSize)
	if err := checkContextOptions(m, opt); err != nil { // limits.go
		return nil, fmt.Errorf("%s: %w", m.File.Path, err)
	}
	c := &Context{m: m, opt: opt, pool: ops.NewPool(opt.Threads), entered: true}
	m.enterContext()
	if err := c.init(); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Context) init() error {
	pl, dev, err := c.m.resolvePlacement(c.opt)
	if err != nil {
		return err
	}
	switch {
	case dev == nil:
		c.m.repackForCPU()
	case !pl.allGPU():
		c.m.repackHybrid(pl)
	}
	c.place = pl
	c.units = pl.units
	p := c.m.Prog
	scheds := pl.schedules(c.opt.Batch)
	onCPU, onGPU := make([]bool, len(p.Ops)), pl.gpuOps(scheds)
	for _, s := range scheds {
		for i, d := range s.dev {
			onCPU[i] = onCPU[i] || d == plan.CPU
		}
	}
	cross := crossingBuffers(p, scheds)
	if pl.Dynamic {
		// Promotion makes new schedules as the load changes: every buffer
		// the CPU touches may cross.
		for i := range p.Ops {
			if onCPU[i] {
				for _, b := range p.Ops[i].Buffers() {
					cross[b] = true
				}
			}
		}
	}
	logitRows := min(c.opt.Batch, maxLogitRows)
	anyGPU := false
	for _, g := range onGPU {
		anyGPU = anyGPU || g
	}
	if anyGPU {
		if dev == nil {
			return errors.New("placement puts ops on the GPU but no GPU is open")
		}
		cfg := pl.gpuConfig(c.m, c.opt, onGPU, logitRows, scheds)
		if c.gpu, err = gpu.New(dev, dev.Weights(), p, cfg); err != nil {
			return err
		}
		// The GPU has its own copy of the resident matrices now: their
		// mapped pages may leave the process (they come back from the
		// page cache if anything reads them again).
		for i, u := range c.units {
			if pl.resident(i) {
				for _, w := range u.Mats {
					c.m.File.ReleasePages(w.Data)
				}
			}
		}
		if cfg.Streams != nil {
			switch ok, copied, why := c.gpu.Pinned(); {
			case !ok:
				pageableNote.Do(func() {
					fmt.Fprintf(os.Stderr, "ats: the model file could not be page-locked for the GPU (%s): streamed weights go through pageable copies, at about a third of the link's speed\n", why)
				})
			case copied > 0:
				pageableNote.Do(func() {
					fmt.Fprintf(os.Stderr, "ats: the model file could not be page-locked for the GPU (%s): the %s of weights that stream were copied into pinned memory\n", why, FormatBytes(copied))
				})
				// Copies read the pinned copy, the CPU its repacked
				// one: the file's own pages of those are not needed.
				for i, u := range c.units {
					for _, w := range u.Mats {
						if !pl.resident(i) && w.Mat.RepackedBytes() > 0 {
							c.m.File.ReleasePages(w.Data)
						}
					}
				}
			}
		}
	}
	hostOf := map[ir.BufID]*cudadrv.HostMem{}
	c.hostOf = hostOf
	c.cpu, err = cpu.New(p, c.pool, cpu.Options{
		Batch: c.opt.Batch, CtxSize: c.opt.CtxSize, KVType: c.opt.cacheType(), LogitRows: logitRows,
		Runs: func(i int) bool { return onCPU[i] },
		Alloc: func(id ir.BufID, n int) ([]float32, error) {
			if !cross[id] {
				return make([]float32, n), nil
			}
			hm, err := c.gpu.HostBuffer(n)
			if err != nil {
				return nil, err
			}
			c.host = append(c.host, hm)
			hostOf[id] = hm
			return hostFloats(hm, n), nil
		},
	})
	if err != nil {
		return err
	}
	if c.gpu != nil {
		// The CPU's share of MoE layers split with the GPU (prefill); the
		// pool's workers spin from when a split is queued, through the
		// wait for its routing (about 1 ms, rarely over 3 on the GPU
		// machine), so that the share starts on every thread at once, and
		// through the share, so that none parks between its dispatches
		// (each parked worker took 0.1-0.8 ms to run again there).
		c.gpu.SetHostMoE(func(op *ir.Op, n, ks int, x []float32, ids []int32, w []float32, out []float32) error {
			c.pool.Expect(splitShareSpin)
			return c.cpu.MoEPartial(op, n, 0, ks, x, ids, w, out)
		}, func() { c.pool.Expect(splitRoutingWait) })
	}
	for _, s := range scheds {
		if err := c.compile(s, hostOf); err != nil {
			return err
		}
	}
	c.scheds = scheds
	c.prom = c.newPromoter(scheds[0])
	if c.gpu != nil && c.opt.Trace != nil {
		c.gpu.Measure(true) // with a promoter, run decides step by step (timeNext)
	}
	return nil
}

// splitRoutingWait bounds how long the pool's workers spin for the CPU's
// share of a split MoE layer (ops.Pool.Expect): past it they park, as
// they would anyway.
const splitRoutingWait = 5 * time.Millisecond

// splitShareSpin bounds how long the pool's workers spin once the CPU's
// share of a split layer starts: the shares take 1-12 ms on the GPU
// machine.
const splitShareSpin = 15 * time.Millisecond

// crossingBuffers marks the buffers some schedule moves between backends:
// the CPU backend keeps those in mapped pinned memory.
func crossingBuffers(p *ir.Program, scheds []*schedule) map[ir.BufID]bool {
	cross := map[ir.BufID]bool{}
	for _, s := range scheds {
		for _, t := range transfers(p, s.dev) {
			cross[t.buf] = true
		}
	}
	return cross
}

// transfer is one buffer moved before op `before` to backend `to`.
type transfer struct {
	buf    ir.BufID
	before int
	to     plan.Backend
}

// transfers walks a schedule's ops and lists every read of a buffer whose
// current rows the other backend wrote: those move first. Every batch
// starts with no buffer valid anywhere (the embedding writes the first).
func transfers(p *ir.Program, dev []plan.Backend) []transfer {
	var out []transfer
	const cpuValid, gpuValid = 1, 2
	valid := make([]uint8, len(p.Bufs))
	bit := func(d plan.Backend) uint8 {
		if d == plan.GPU {
			return gpuValid
		}
		return cpuValid
	}
	for i := range p.Ops {
		op := &p.Ops[i]
		b := bit(dev[i])
		for _, r := range op.Reads() {
			if valid[r] != 0 && valid[r]&b == 0 {
				out = append(out, transfer{buf: r, before: i, to: dev[i]})
				valid[r] |= b
			}
		}
		for _, w := range op.Writes() {
			valid[w] = b
		}
	}
	return out
}

// compile cuts a schedule into segments, attaches its transfers and
// compiles the GPU segments.
func (c *Context) compile(s *schedule, hostOf map[ir.BufID]*cudadrv.HostMem) error {
	p := c.m.Prog
	for i := 0; i < len(p.Ops); {
		j := i + 1
		for j < len(p.Ops) && s.dev[j] == s.dev[i] {
			j++
		}
		s.segs = append(s.segs, segment{onGPU: s.dev[i] == plan.GPU, lo: i, hi: j})
		i = j
	}
	var specs []gpu.SegmentSpec
	gpuIndex := make([]int, len(s.segs)) // segment -> its spec
	lastGPU := -1                        // spec of the last GPU segment before the current one
	segOf := func(op int) int {
		for k, sg := range s.segs {
			if op >= sg.lo && op < sg.hi {
				return k
			}
		}
		return -1
	}
	for k, sg := range s.segs {
		if sg.onGPU {
			gpuIndex[k] = len(specs)
			specs = append(specs, gpu.SegmentSpec{Lo: sg.lo, Hi: sg.hi, Logits: sg.hi == len(p.Ops), Split: c.splits(s, sg.lo, sg.hi)})
		}
	}
	for _, t := range transfers(p, s.dev) {
		k := segOf(t.before)
		hm := hostOf[t.buf]
		if hm == nil {
			return fmt.Errorf("executor: buffer %s crosses but has no mapped host memory", p.Bufs[t.buf].Name)
		}
		tr := gpu.Transfer{Buf: t.buf, Host: hm.DevicePtr()}
		if t.to == plan.GPU {
			specs[gpuIndex[k]].In = append(specs[gpuIndex[k]].In, tr)
			continue
		}
		// To the CPU: the last GPU segment before sends it back.
		lastGPU = -1
		for q := k - 1; q >= 0; q-- {
			if s.segs[q].onGPU {
				lastGPU = q
				break
			}
		}
		if lastGPU < 0 {
			return fmt.Errorf("executor: buffer %s moves to the CPU before op %d but no GPU segment wrote it", p.Bufs[t.buf].Name, t.before)
		}
		specs[gpuIndex[lastGPU]].Out = append(specs[gpuIndex[lastGPU]].Out, tr)
	}
	if len(specs) == 0 {
		return nil
	}
	streams := func(w *ir.Weight) bool { return s.streams(c.units, w) }
	gs, err := c.gpu.Compile(specs, streams)
	if err != nil {
		return err
	}
	s.gpu = gs
	for k := range s.segs {
		if s.segs[k].onGPU {
			s.segs[k].g = gs.Segs[gpuIndex[k]]
		}
	}
	return nil
}

// splits is the split MoE ops (gpu.SegmentSpec.Split) of schedule s among
// ops [lo, hi), nil when none.
func (c *Context) splits(s *schedule, lo, hi int) map[int]int {
	var out map[int]int
	for i, u := range c.units {
		if i >= len(s.split) || s.split[i] == 0 || u.Hi <= lo || u.Lo >= hi {
			continue
		}
		for op := max(u.Lo, lo); op < min(u.Hi, hi); op++ {
			if c.m.Prog.Ops[op].Kind == ir.OpMoE {
				if out == nil {
					out = map[int]int{}
				}
				out[op] = s.split[i]
			}
		}
	}
	return out
}

// Close stops the context's worker threads and frees its GPU memory.
func (c *Context) Close() {
	if c.entered {
		c.entered = false
		c.m.leaveContext()
	}
	if c.cpu != nil {
		c.cpu.Report(os.Stderr) // ATS_CPU_OPS_PROFILE
	}
	c.pool.Close()
	if c.prom != nil {
		c.prom.release(c)
		c.prom = nil
	}
	for _, s := range c.scheds {
		if s.gpu != nil {
			_ = s.gpu.Release()
		}
	}
	if c.gpu != nil {
		_ = c.gpu.Close()
		c.gpu = nil
	}
	for _, hm := range c.host {
		_ = hm.Free()
	}
	c.host = nil
}

// Pos is the number of tokens in the cache.
func (c *Context) Pos() int { return c.pos }

// CtxSize is the capacity of the cache in tokens.
func (c *Context) CtxSize() int { return c.opt.CtxSize }

// Threads is the number of CPU threads the context computes on.
func (c *Context) Threads() int { return c.pool.Threads() }

// Placement is the context's placement.
func (c *Context) Placement() *Placement { return c.place }

// StreamedBytes is the weight bytes streamed to the GPU so far; unlike the
// rest of a context, it may be read from any goroutine (metrics).
func (c *Context) StreamedBytes() int64 {
	if c.gpu == nil {
		return 0
	}
	return c.gpu.StreamedBytes()
}

// LinkRate is the rate at which the placement's profile measured weight
// copies into the staging ring (bytes/s; 0: not planned from a profile).
func (c *Context) LinkRate() float64 {
	if c.place == nil || c.place.prof == nil {
		return 0
	}
	return c.place.prof.Stream.BytesPerSec
}

// Stats are the executor's counters.
func (c *Context) Stats() ExecStats {
	s := c.stats
	if c.gpu != nil {
		s.StreamedBytes = c.gpu.StreamedBytes()
		s.Split = c.gpu.SplitStats()
	}
	return s
}

// Truncate forgets every token from position n on, so a sequence sharing
// its first n tokens can continue from there.
func (c *Context) Truncate(n int) error {
	if n < 0 || n > c.pos {
		return fmt.Errorf("truncate to %d: the context holds %d tokens", n, c.pos)
	}
	c.pos = n
	return nil
}

// Eval feeds tokens at the current position and returns logits: one row of
// NVocab per token when all is set, else only the last token's row.
func (c *Context) Eval(tokens []int, all bool) ([]float32, error) {
	if err := c.checkTokens(tokens); err != nil {
		return nil, err
	}
	step := c.opt.Batch
	if all {
		step = min(step, maxLogitRows)
	}
	var out []float32
	for start := 0; start < len(tokens); start += step {
		chunk := tokens[start:min(len(tokens), start+step)]
		last := start+len(chunk) == len(tokens)
		mode := ir.OutputLast
		switch {
		case all:
			mode = ir.OutputAll
		case !last:
			mode = ir.OutputNone // nobody reads these logits: skip the output head
		}
		l, err := c.run(chunk, mode)
		if err != nil {
			return nil, err
		}
		out = append(out, l...)
	}
	return out, nil
}

// EvalView is Eval for callers that read the logits before their next call:
// it returns the context's own logits buffer (the last token's row, or every
// row when all is set) instead of a copy, which saves allocating and
// copying NVocab floats per call (0.6 MB for a 152k vocabulary: with its
// page faults, milliseconds of a decode step). The next Eval or EvalView
// overwrites the slice. Batches longer than one batch get a copy as from
// Eval.
func (c *Context) EvalView(tokens []int, all bool) ([]float32, error) {
	if len(tokens) > c.opt.Batch || (all && len(tokens) > maxLogitRows) {
		return c.Eval(tokens, all)
	}
	if err := c.checkTokens(tokens); err != nil {
		return nil, err
	}
	mode := ir.OutputLast
	if all {
		mode = ir.OutputAll
	}
	return c.run(tokens, mode)
}

// checkTokens validates a batch for Eval: non-empty, in the vocabulary,
// and room in the cache.
func (c *Context) checkTokens(tokens []int) error {
	h := c.m.Prog.Hyper
	if len(tokens) == 0 {
		return errors.New("eval: no tokens")
	}
	for i, t := range tokens {
		if t < 0 || t >= h.NVocab {
			return fmt.Errorf("eval: token %d (at %d) is outside the vocabulary of %d", t, i, h.NVocab)
		}
	}
	if c.pos+len(tokens) > c.opt.CtxSize {
		return fmt.Errorf("%w: %d tokens in the cache + %d new > context size %d", ErrContextFull, c.pos, len(tokens), c.opt.CtxSize)
	}
	return nil
}

// scheduleFor picks the schedule of a batch of n tokens.
func (c *Context) scheduleFor(n int) *schedule {
	s := c.scheds[0]
	for _, t := range c.scheds[1:] {
		if n >= t.minBatch {
			s = t
		}
	}
	return s
}

// run computes one batch (at most Batch tokens) and returns its logits:
// a view of the context's buffer, valid until the next run (nil when mode
// is OutputNone).
func (c *Context) run(tokens []int, mode ir.OutputMode) ([]float32, error) {
	start := time.Now()
	n := len(tokens)
	pos0 := c.pos
	s := c.scheduleFor(n)
	if n == 1 && c.prom != nil {
		var err error
		if s, err = c.prom.schedule(c); err != nil {
			return nil, err
		}
	}
	var streamed0 int64
	var captures0 int
	if s.gpu != nil {
		if c.prom != nil && c.opt.Trace == nil {
			c.gpu.Measure(n == 1 && c.prom.timeNext())
		}
		streamed0, captures0 = c.gpu.StreamedBytes(), c.gpu.Captures()
		if err := c.gpu.Begin(s.gpu, tokens, pos0); err != nil {
			return nil, err
		}
	}
	rows, pending, switches := n, false, 0
	var onCPU, onGPU time.Duration
	var cpuSpans []hostSpan
	t0 := start
	for k, sg := range s.segs {
		if k > 0 {
			switches++
		}
		if rows == 0 {
			break // the output head was skipped (OutputNone)
		}
		if sg.onGPU {
			var err error
			if rows, err = c.gpu.Run(sg.g, rows, mode); err != nil {
				return nil, err
			}
			pending = true
			continue
		}
		if pending {
			// The CPU reads what the GPU sent back, and may overwrite
			// host buffers that queued transfers have yet to read.
			if err := c.gpu.Sync(); err != nil {
				return nil, err
			}
			pending = false
		}
		t1 := time.Now()
		onGPU += t1.Sub(t0)
		rows = c.cpu.Run(sg.lo, sg.hi, tokens, rows, pos0, mode)
		t0 = time.Now()
		onCPU += t0.Sub(t1)
		if c.opt.Trace != nil {
			cpuSpans = append(cpuSpans, hostSpan{lo: sg.lo, hi: sg.hi, start: t1, end: t0})
		}
	}
	if pending {
		if err := c.gpu.Sync(); err != nil {
			return nil, err
		}
	}
	c.pos += n
	c.stats.Steps++
	c.stats.Switches = switches
	c.cpu.CountBatch(n)
	wall := time.Since(start)
	if n == 1 {
		c.stats.DecodeSteps++
		c.stats.DecodeTime += wall
		c.stats.DecodeCPU += onCPU
		c.stats.DecodeGPU += wall - onCPU
	}
	if c.gpu != nil && (c.prom != nil || c.opt.Trace != nil) && s.gpu != nil {
		t, err := c.gpu.Times()
		if err != nil {
			return nil, fmt.Errorf("executor: step timing: %w", err)
		}
		if n == 1 && c.prom != nil {
			c.prom.observe(c, s, wall, onCPU, t, c.gpu.StreamedBytes()-streamed0, c.gpu.Captures() != captures0)
		}
		if c.opt.Trace != nil {
			c.opt.Trace.batch(c, s, n, start, cpuSpans, t)
		}
	}
	if mode == ir.OutputNone || rows == 0 {
		return nil, nil
	}
	nv := c.m.Prog.Hyper.NVocab
	if last := s.segs[len(s.segs)-1]; !last.onGPU {
		return c.cpu.Buf(c.m.Prog.Logits)[:rows*nv], nil
	}
	if rows == 1 {
		return c.gpu.LogitsRow(), nil
	}
	if cap(c.logits) < rows*nv {
		c.logits = make([]float32, rows*nv)
	}
	l := c.logits[:rows*nv]
	if err := c.gpu.ReadLogits(l); err != nil {
		return nil, err
	}
	return l, nil
}

// hostFloats views n floats of mapped pinned memory.
func hostFloats(hm *cudadrv.HostMem, n int) []float32 {
	return unsafe.Slice((*float32)(hm.Pointer()), n)
}

// Backend says where the context computes: "cpu", "gpu" or "cpu+gpu".
func (c *Context) Backend() string {
	switch {
	case c.gpu == nil:
		return BackendCPU
	case c.place.allGPU():
		return BackendGPU
	}
	return BackendHybrid
}

// VRAMUse is a context's device memory.
type VRAMUse struct {
	Allocated int64  // what the context allocated (its arena and its share of the weights), at the driver's granularity
	Budget    int64  // the placement's budget
	Process   int64  // what NVML charges the process, less the CUDA context's own memory (Context); 0 without NVML
	Context   int64  // the CUDA context and kernel modules, reported apart
	How       string // where Process comes from
}

// VRAM reports the context's device memory (zero on the CPU).
func (c *Context) VRAM() VRAMUse {
	if c.gpu == nil {
		return VRAMUse{}
	}
	arena, weights := c.gpu.Bytes()
	u := VRAMUse{Allocated: arena + weights, Budget: c.place.Budget}
	if dev, err := gpu.Open(); err == nil {
		if n, how, ok := dev.ProcessMemory(); ok {
			u.Context = dev.ContextBytes()
			u.Process, u.How = n-u.Context, how
		}
	}
	return u
}
