// Package exec is the executor. A context runs the model's program under a
// layout (layout.go): each unit on the host backend (runtime/backend/cpu)
// or on an accelerator (runtime/backend, runtime/backend/cuda). All-host
// and all-device are two layouts like any other.
//
// A layout becomes schedules: per batch size, the backend of every op. A
// schedule is cut into segments, maximal runs of ops on one backend; a
// device segment is compiled once into fused launches (and, for a decode
// step, replayed as a CUDA graph), a host segment runs op by op on the
// worker pool. Between segments only activations cross: the executor
// tracks which backend holds the current rows of every buffer and, where
// an op reads a buffer last written on the other side, has the device move
// it with a small copy kernel through the host's mapped pinned memory
// (zero-copy: it never waits behind weight traffic on the copy engine).
// Each layer's KV cache lives with the backend that runs its attention.
//
// Every step is a batch (ir.Batch): tokens of one or more sequences, each
// at its position, over the context's paged KV cache (runtime/kvcache).
// Decode steps run units where they are resident, or where the Policy
// promotes them; a prompt batch may also run host units on the device,
// their weights streamed through the staging ring, when the layout says
// streaming wins at that batch size.
package executor

import (
	"errors"
	"fmt"
	"time"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

// Options configure a context.
type Options struct {
	Batch int      // most tokens a step computes (0: 512)
	KV    model.KV // the cache: rows (positions of all sequences together) and type
	// Trace, when set, receives the timeline of every step (trace.go).
	Trace *Trace
	// HostProfile times every host op and reports at Close (to Notes).
	HostProfile bool
	// Device are the accelerator's switches.
	Device backend.Options
	Notes  backend.Notes
}

func (o Options) withDefaults() Options {
	if o.Batch <= 0 {
		o.Batch = 512
	}
	return o
}

// Context is the executor of one model over one KV cache: it runs steps of
// any of the cache's sequences. It is not safe for concurrent use.
type Context struct {
	m      *model.Model
	opt    Options
	pool   *ops.Pool
	layout *Layout
	units  []model.Unit
	host   *cpu.Backend
	dev    backend.Exec                    // nil when no op runs on the accelerator
	shared []backend.HostBuffer            // mapped pinned buffers of activations that cross
	hostOf map[ir.BufID]backend.HostBuffer // the mapped memory of buffers that cross
	scheds []*Schedule                     // by ascending minBatch; scheds[0] has minBatch 1
	policy Policy                          // decode steps' promotion (nil: none)
	kv     *kvcache.Cache
	unitOf []int     // by op: its unit (traces)
	logits []float32 // rows of logits read back from the device
	stats  Stats
}

// Stats are the executor's counters since the context was made.
type Stats struct {
	Steps       int           // steps run
	DecodeSteps int           // of them, decode steps (Batch.Decode)
	DecodeRows  int           // the decode steps' rows
	DecodeTime  time.Duration // wall time of the decode steps
	Streamed    int64         // weight bytes streamed through the ring
	Switches    int           // backend switches of the last step
	// DecodeHost and DecodeDevice split the decode steps' wall time: in
	// host segments, and in queuing device segments and waiting for them.
	DecodeHost, DecodeDevice time.Duration
	// Split counts the expert layers of prompt batches split between the
	// host and the device, and the host's time on them.
	Split backend.SplitStats
}

// MaxLogitRows bounds the rows of the logits buffer: a batch whose every
// logit is wanted must be cut to this many tokens (152k-token
// vocabularies would otherwise need 300 MB of logits for a batch of 512).
const MaxLogitRows = 64

// logitRows is the rows of the logits buffer of steps of batch tokens.
func logitRows(batch int) int { return min(batch, MaxLogitRows) }

// New makes the executor of model m under layout l: the host backend over
// the model's host weights w on pool, and, when the layout puts any op on
// it, an Exec on accelerator acc (nil: the host alone). policy, when set,
// chooses each decode step's promotion; it is attached with SetPolicy,
// since it needs the context.
func New(m *model.Model, w *cpu.Weights, pool *ops.Pool, acc backend.Accelerator, l *Layout, opt Options) (*Context, error) {
	opt = opt.withDefaults()
	if w.Program() != m.Prog {
		return nil, errors.New("executor: host weights of another program")
	}
	kv, err := kvcache.New(opt.KV.Rows, kvcache.DefaultBlock)
	if err != nil {
		return nil, err
	}
	opt.KV.Rows = kv.Rows() // whole blocks
	c := &Context{m: m, opt: opt, pool: pool, layout: l, units: l.Units, kv: kv}
	if err := c.init(w, acc); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

func (c *Context) init(w *cpu.Weights, acc backend.Accelerator) error {
	p := c.m.Prog
	scheds := c.layout.schedules(c.opt.Batch)
	onHost := make([]bool, len(p.Ops))
	for _, s := range scheds {
		for i, d := range s.dev {
			onHost[i] = onHost[i] || d == plan.CPU
		}
	}
	for i, u := range c.layout.Units {
		if c.layout.routed(i) { // the host computes its share of the experts
			for op := u.Lo; op < u.Hi; op++ {
				onHost[op] = true
			}
		}
	}
	cfg, onDevice := DeviceConfig(c.m, c.layout, c.opt)
	c.hostOf = map[ir.BufID]backend.HostBuffer{}
	shared := map[ir.BufID][]float32{}
	if onDevice {
		if acc == nil {
			return errors.New("the layout puts ops on the accelerator but none is open")
		}
		for id := range crossingBuffers(p, scheds, c.layout.Promotable != nil, onHost) {
			hb, err := acc.HostBuffer(c.opt.Batch * p.Bufs[id].Width)
			if err != nil {
				return err
			}
			c.shared = append(c.shared, hb)
			c.hostOf[id] = hb
			shared[id] = hb.Floats()
		}
	}
	var err error
	c.host, err = cpu.New(w, c.pool, cpu.Options{Batch: c.opt.Batch, LogitRows: logitRows(c.opt.Batch), KV: c.opt.KV,
		Runs: onHost, Shared: shared, Profile: c.opt.HostProfile, Notes: c.opt.Notes})
	if err != nil {
		return err
	}
	if onDevice {
		if c.dev, err = acc.NewExec(p, cfg, c.host.Host()); err != nil {
			return err
		}
		// The device has its own copy of the resident matrices now: their
		// mapped pages may leave the process (they come back from the
		// page cache if anything reads them again).
		for i, u := range c.units {
			if c.layout.Resident[i] {
				for _, w := range u.Mats {
					c.m.File.ReleasePages(w.Data)
				}
			}
		}
		if len(cfg.Streams) > 0 {
			switch ok, copied, why := c.dev.Pinned(); {
			case !ok:
				c.opt.Notes.Note(fmt.Sprintf("the model file could not be page-locked for the GPU (%s): streamed weights go through pageable copies, at about a third of the link's speed", why))
			case copied > 0:
				c.opt.Notes.Note(fmt.Sprintf("the model file could not be page-locked for the GPU (%s): the %s of weights that stream were copied into pinned memory", why, FormatBytes(copied)))
				// Copies read the pinned copy, the host its repacked
				// one: the file's own pages of those are not needed.
				for i, u := range c.units {
					for _, mw := range u.Mats {
						if !c.layout.Resident[i] && w.Repacked(mw) {
							c.m.File.ReleasePages(mw.Data)
						}
					}
				}
			}
		}
	}
	c.scheds = scheds
	for _, s := range scheds {
		if err := c.compile(s); err != nil {
			return err
		}
	}
	if c.dev != nil && c.opt.Trace != nil {
		c.dev.Measure(true)
	}
	return nil
}

// SetPolicy attaches the policy that promotes units for decode steps
// (nil: none); the context closes it.
func (c *Context) SetPolicy(p Policy) {
	if c.policy != nil {
		c.policy.Close()
	}
	c.policy = p
}

// Close stops using the backends and frees their device memory. The pool
// is the caller's.
func (c *Context) Close() {
	if c.host != nil {
		c.host.Close()
		c.host = nil
	}
	if c.policy != nil {
		c.policy.Close()
		c.policy = nil
	}
	for _, s := range c.scheds {
		s.release()
	}
	c.scheds = nil
	if c.dev != nil {
		_ = c.dev.Close()
		c.dev = nil
	}
	for _, hb := range c.shared {
		_ = hb.Free()
	}
	c.shared = nil
}

// Model is the context's model.
func (c *Context) Model() *model.Model { return c.m }

// KV is the book of the context's KV cache: sequences take their rows
// from it.
func (c *Context) KV() *kvcache.Cache { return c.kv }

// KVType is the cache's type.
func (c *Context) KVType() kvcache.Type { return c.opt.KV.Type }

// Batch is the most tokens a step computes.
func (c *Context) Batch() int { return c.opt.Batch }

// LogitRows is the most rows of logits a step returns.
func (c *Context) LogitRows() int { return logitRows(c.opt.Batch) }

// Threads is the number of host threads the context computes on.
func (c *Context) Threads() int { return c.pool.Threads() }

// Pool is the host's worker pool.
func (c *Context) Pool() *ops.Pool { return c.pool }

// Layout is the context's layout.
func (c *Context) Layout() *Layout { return c.layout }

// Units are the model's units.
func (c *Context) Units() []model.Unit { return c.units }

// Device is the accelerator's side of the context (nil: none).
func (c *Context) Device() backend.Exec { return c.dev }

// Host is the host backend, which runs the units placed on the CPU.
func (c *Context) Host() *cpu.Backend { return c.host }

// Streamed is the weight bytes streamed to the device so far; unlike the
// rest of a context, it may be read from any goroutine (metrics).
func (c *Context) Streamed() int64 {
	if c.dev == nil {
		return 0
	}
	return c.dev.Streamed()
}

// Stats are the executor's counters.
func (c *Context) Stats() Stats {
	s := c.stats
	if c.dev != nil {
		s.Streamed = c.dev.Streamed()
		s.Split = c.dev.Split()
	}
	return s
}

// HostKVBytes is the host memory of the KV caches the host keeps.
func (c *Context) HostKVBytes() int64 { return c.host.KVBytes() }

// ErrStep is wrapped by errors about a step's batch itself.
var ErrStep = errors.New("executor")

// Step computes batch b and returns the logits of its Logits rows, one row
// of NVocab each: a view of the context's memory, valid until the next
// step. Every token's keys and values are stored in the cache at its
// sequence's position (the cache rows must have been reserved).
func (c *Context) Step(b *ir.Batch) ([]float32, error) {
	h := c.m.Prog.Hyper
	if err := b.Check(h.NVocab, c.kv.Rows()); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrStep, err)
	}
	if b.Len() > c.opt.Batch {
		return nil, fmt.Errorf("%w: a step of %d tokens; this context computes at most %d together", ErrStep, b.Len(), c.opt.Batch)
	}
	if len(b.Logits) > c.LogitRows() && !b.Hidden {
		return nil, fmt.Errorf("%w: %d rows of logits wanted; a step returns at most %d", ErrStep, len(b.Logits), c.LogitRows())
	}
	return c.run(b)
}

// scheduleFor picks the schedule of a step of n tokens.
func (c *Context) scheduleFor(n int) *Schedule {
	s := c.scheds[0]
	for _, t := range c.scheds[1:] {
		if n >= t.minBatch {
			s = t
		}
	}
	return s
}

// run computes one step.
func (c *Context) run(b *ir.Batch) ([]float32, error) {
	start := time.Now()
	n := b.Len()
	decode := b.Decode()
	s := c.scheduleFor(n)
	if decode && c.policy != nil {
		var err error
		positions := 0
		for _, p := range b.Pos {
			positions += int(p)
		}
		if s, err = c.policy.Next(Step{Rows: n, Positions: positions}); err != nil {
			return nil, err
		}
	}
	var streamed0 int64
	var captures0 int
	c.host.Begin()
	if s.acc != nil {
		if c.policy != nil && c.opt.Trace == nil {
			c.dev.Measure(decode && c.policy.TimeNext())
		}
		streamed0, captures0 = c.dev.Streamed(), c.dev.Captured()
		if err := c.dev.Begin(s.acc, b); err != nil {
			return nil, err
		}
	}
	rows, pending, switches := n, false, 0
	var onHost time.Duration
	var hostSpans []hostSpan
	for k, sg := range s.segs {
		if k > 0 {
			switches++
		}
		if rows == 0 {
			break // the output head was skipped (no logits wanted)
		}
		if sg.onDevice {
			var err error
			if rows, err = c.dev.Run(sg.compiled, rows); err != nil {
				return nil, err
			}
			pending = true
			continue
		}
		if pending {
			// The host reads what the device sent back, and may overwrite
			// host buffers that queued transfers have yet to read.
			if err := c.dev.Sync(); err != nil {
				return nil, err
			}
			pending = false
		}
		t1 := time.Now()
		var err error
		if rows, err = c.host.Run(sg.lo, sg.hi, b, rows); err != nil {
			return nil, err
		}
		t0 := time.Now()
		onHost += t0.Sub(t1)
		if c.opt.Trace != nil {
			hostSpans = append(hostSpans, hostSpan{lo: sg.lo, hi: sg.hi, start: t1, end: t0})
		}
	}
	if pending {
		if err := c.dev.Sync(); err != nil {
			return nil, err
		}
	}
	c.stats.Steps++
	c.stats.Switches = switches
	c.host.CountBatch(n)
	wall := time.Since(start)
	if decode {
		c.stats.DecodeSteps++
		c.stats.DecodeRows += n
		c.stats.DecodeTime += wall
		c.stats.DecodeHost += onHost
		c.stats.DecodeDevice += wall - onHost
	}
	if c.dev != nil && (c.policy != nil || c.opt.Trace != nil) && s.acc != nil {
		t, err := c.dev.Times()
		if err != nil {
			return nil, fmt.Errorf("executor: step timing: %w", err)
		}
		if decode && c.policy != nil {
			c.policy.Observe(StepReport{Schedule: s, Rows: n, Wall: wall, OnHost: onHost, Times: t,
				Copied: c.dev.Streamed() - streamed0, Captured: c.dev.Captured() != captures0})
		}
		if c.opt.Trace != nil {
			c.opt.Trace.step(c, n, start, hostSpans, t)
		}
	}
	if len(b.Logits) == 0 || rows == 0 {
		return nil, nil
	}
	if b.Hidden {
		return c.hiddenRows(s, rows)
	}
	nv := c.m.Prog.Hyper.NVocab
	if last := s.segs[len(s.segs)-1]; !last.onDevice {
		return c.host.Buf(c.m.Prog.Logits)[:rows*nv], nil
	}
	if cap(c.logits) < rows*nv {
		c.logits = make([]float32, rows*nv)
	}
	return c.dev.Logits(c.logits, rows)
}

// hiddenRows reads the hidden rows of a Batch.Hidden step from the
// backend that wrote them: the one of the output matrix's input.
func (c *Context) hiddenRows(s *Schedule, rows int) ([]float32, error) {
	p := c.m.Prog
	hid := p.Hidden()
	n := rows * p.Bufs[hid].Width
	writer := -1 // the last op before the output matrix that writes the buffer
	for i := p.LogitsOp() - 1; i >= 0 && writer < 0; i-- {
		for _, w := range p.Ops[i].Writes() {
			if w == hid {
				writer = i
			}
		}
	}
	if writer < 0 || !s.OnDevice(writer) {
		return c.host.Buf(hid)[:n], nil
	}
	if cap(c.logits) < n {
		c.logits = make([]float32, n)
	}
	out := c.logits[:n]
	if err := c.dev.ReadBuffer(hid, out); err != nil {
		return nil, err
	}
	return out, nil
}

// Backend says where the context computes: "cpu", "gpu" or "cpu+gpu".
func (c *Context) Backend() string {
	switch {
	case c.dev == nil:
		return BackendCPU
	case c.layout.AllResident():
		return BackendGPU
	}
	return BackendHybrid
}

// Backends a context can run on.
const (
	BackendCPU    = "cpu"
	BackendGPU    = "gpu"
	BackendAuto   = "auto"
	BackendHybrid = "cpu+gpu" // what Context.Backend says of a mixed layout
)

// FormatBytes writes a size the way --vram-budget takes it.
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}
