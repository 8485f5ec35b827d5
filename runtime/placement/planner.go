// Package placement decides where a model runs: it profiles every unit on
// the host and the accelerator (profile.go), places them under the VRAM
// budget with the dynamic program of package plan (plan.go), chooses which
// host matrices get repacked copies (repack.go), and, step by step, which
// host units a decode step promotes to the device (promote.go, the
// executor's Policy). It produces the executor's Layout and never runs a
// step itself.
package placement

import (
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

// Options are what a placement is decided for.
type Options struct {
	// Backend is where the context computes: "cpu" (or ""), "gpu" (every
	// unit on the accelerator; an error when none is open or the model
	// does not fit) or "auto" (the accelerator when there is one:
	// everything on it when the model fits the budget, else a planned
	// host+device placement; the host alone without one, said once).
	Backend string
	// VRAMBudget bounds everything the context allocates on the device:
	// weights, KV caches, activations, scratch and the staging ring (0:
	// the device's free memory less a margin).
	VRAMBudget int64
	// Placement, when set, is used instead of planning.
	Placement *Placement
	// PlanFor is the workload the residency is optimised for: "decode"
	// (default) or "prefill".
	PlanFor string
	// StaticOnly turns off dynamic promotion.
	StaticOnly bool
	Batch      int      // most tokens a step computes
	Threads    int      // host threads (0: all cores)
	KV         model.KV // the cache: rows and type
	// Depth is the context the placement is planned for: the positions a
	// step's rows attend to, all together, on average (0: half the
	// cache). A cache half full is the mean of a conversation that fills
	// it, and the positions of all its sequences together: attention's
	// work per step (a decode row per sequence) is the same whether one
	// long conversation or several short ones fill the cache.
	Depth int
	// Progress, when set, hears of a profiling run.
	Progress func(done, total int, what string)
	// MoERouted says whether decode steps hand the GPU a share of the
	// experts their tokens chose in the CPU's expert layers
	// (Placement.Routed): "" or "auto" (the share the measured link and
	// CPU rates balance, where decode starts and then keeps pace), a
	// fraction ("0.25", held), or "0" (never).
	// ATS_MOE_ROUTED sets it.
	MoERouted string
	// MoESplit says how the streamed expert layers of prompt batches are
	// split with the host: "" or "auto" (the planner tries shares up to
	// three eighths and keeps the fastest by its cost model), a fraction
	// ("0.125"), or "0" (no split). ATS_MOE_SPLIT sets it.
	MoESplit string
	// PromoteLog has the promoter say every decode step it observes.
	PromoteLog bool
	// Device are the accelerator's switches (for needs computed here).
	Device backend.Options
	Notes  backend.Notes

	// HybridAlways places by the profile even when the whole model fits
	// the budget: the tiny oracle models fit any budget, and would never
	// reach the dynamic program and the promoter otherwise (tests).
	HybridAlways bool
	// PromoteEverything promotes every host unit that can stream on every
	// decode step, whatever it costs, with no profile needed: the
	// promotion path at its busiest, for checking results (tests).
	PromoteEverything bool
}

func (o Options) withDefaults(m *model.Model) Options {
	if o.KV.Rows <= 0 {
		o.KV.Rows = min(m.Hyper().NCtxTrain, 4096)
	}
	if o.Batch <= 0 {
		o.Batch = 512
	}
	o.Batch = min(o.Batch, o.KV.Rows)
	if o.Depth <= 0 {
		o.Depth = o.KV.Rows / 2
	}
	return o
}

// ExecOptions are the executor's options that follow from o.
func (o Options) ExecOptions() executor.Options {
	return executor.Options{Batch: o.Batch, KV: o.KV, Device: o.Device, Notes: o.Notes}
}

// Planner places one model: it holds the model's host weights and the
// accelerator (nil: none), and remembers, across the model's contexts,
// the promotion plans that measured slower than none.
type Planner struct {
	m   *model.Model
	w   *cpu.Weights
	acc backend.Accelerator

	rejectedMu sync.Mutex
	rejected   map[string]plan.Estimates
}

// New is the planner of model m, whose host weights are w, on accelerator
// acc (nil when there is none).
func New(m *model.Model, w *cpu.Weights, acc backend.Accelerator) *Planner {
	return &Planner{m: m, w: w, acc: acc}
}

// Weights are the model's host weights.
func (p *Planner) Weights() *cpu.Weights { return p.w }

// Accelerator is the planner's accelerator (nil: none).
func (p *Planner) Accelerator() backend.Accelerator { return p.acc }

// maxRejectedPlans bounds the verdicts a planner keeps.
const maxRejectedPlans = 256

// rejectPlan records that the promotion plan named key measured slower
// than no promotion under the estimates e.
func (p *Planner) rejectPlan(key string, e plan.Estimates) {
	p.rejectedMu.Lock()
	defer p.rejectedMu.Unlock()
	if p.rejected == nil {
		p.rejected = map[string]plan.Estimates{}
	}
	if len(p.rejected) >= maxRejectedPlans {
		clear(p.rejected) // a long-lived server under ever-changing load
	}
	p.rejected[key] = e
}

// rejectedPlan says whether the plan named key was rejected, and under
// which estimates.
func (p *Planner) rejectedPlan(key string) (plan.Estimates, bool) {
	p.rejectedMu.Lock()
	defer p.rejectedMu.Unlock()
	e, ok := p.rejected[key]
	return e, ok
}

// units cuts the model into units, sized for the device when there is one.
func (p *Planner) units(opt Options) []model.Unit {
	var deviceBytes func(*ir.Weight) int64
	if p.acc != nil {
		deviceBytes = p.acc.DeviceBytes
	}
	return model.Units(p.m.Prog, opt.KV, deviceBytes)
}

// Resolve decides the placement of a context of opt: the host alone, all
// on the accelerator, a given placement, or a planned one. The placement
// uses the device when Placement.UsesDevice says so.
func (p *Planner) Resolve(opt Options) (*Placement, error) {
	opt = opt.withDefaults(p.m)
	hostOnly := func() (*Placement, error) {
		return newPlacement(p.m, model.Units(p.m.Prog, opt.KV, nil), executor.BackendCPU), nil
	}
	switch opt.Backend {
	case "", executor.BackendCPU:
		if opt.Placement != nil {
			return nil, errors.New("backend cpu: a placement needs the GPU (use --backend auto)")
		}
		return hostOnly()
	case executor.BackendGPU, executor.BackendAuto:
	default:
		return nil, fmt.Errorf("backend %q: want cpu, gpu or auto", opt.Backend)
	}
	if p.acc == nil {
		if opt.Backend == executor.BackendGPU || opt.Placement != nil {
			return nil, errors.New("backend gpu: no GPU is open")
		}
		return hostOnly()
	}
	if !p.acc.SupportsKV(opt.KV.Type) {
		if opt.Backend == executor.BackendGPU || opt.Placement != nil {
			return nil, fmt.Errorf("backend gpu: the GPU does not keep a %s KV cache; it needs the CPU backend", opt.KV.Type)
		}
		opt.Notes.Note(fmt.Sprintf("running on the CPU: a %s KV cache is kept on the CPU only", opt.KV.Type))
		return hostOnly()
	}
	units := p.units(opt)
	budget, contextBytes, err := p.budgetFor(opt)
	if err != nil {
		return nil, err
	}
	var pl *Placement
	switch {
	case opt.Placement != nil:
		if pl, err = opt.Placement.bind(p.m, p.w, units); err != nil {
			return nil, err
		}
	case opt.Backend == executor.BackendGPU:
		pl = newPlacement(p.m, units, executor.BackendGPU)
		pl.Note = "--backend gpu: every unit on the GPU"
	default:
		if pl, err = p.planWith(units, opt, budget); err != nil {
			return nil, err
		}
	}
	pl.Budget, pl.ContextBytes = budget, contextBytes
	if err := p.checkBudget(pl, opt); err != nil {
		return nil, err
	}
	return pl, nil
}

// UsesDevice says whether a context of the placement runs any op on the
// device.
func (pl *Placement) UsesDevice(batch int) bool { return pl.Layout().UsesDevice(batch) }

// Layout is the executor's layout of the placement.
func (pl *Placement) Layout() *executor.Layout {
	l := &executor.Layout{Units: pl.units, Resident: make([]bool, len(pl.units)), RingBytes: pl.RingBytes}
	for i := range pl.units {
		l.Resident[i] = pl.resident(i)
	}
	for _, ps := range pl.Prefill {
		pf := executor.PrefillLayout{MinBatch: ps.MinBatch, Stream: make([]bool, len(pl.units)), Split: make([]int, len(pl.units))}
		for i, u := range pl.units {
			pf.Stream[i] = slices.Contains(ps.Stream, u.Name)
			pf.Split[i] = ps.Split[u.Name]
		}
		l.Prefill = append(l.Prefill, pf)
	}
	if len(pl.Routed) > 0 {
		l.Routed, l.RoutedShare, l.RoutedExperts, l.RoutedFixed = make([]bool, len(pl.units)), pl.RoutedShare, pl.RoutedExperts, pl.RoutedFixed
		for i, u := range pl.units {
			l.Routed[i] = slices.Contains(pl.Routed, u.Name) && !pl.resident(i)
		}
	}
	if pl.Dynamic {
		l.Promotable = make([]bool, len(pl.units))
		for i, u := range pl.units {
			l.Promotable[i] = u.Streamable && !pl.resident(i)
		}
	}
	return l
}

// budgetMargin is what the default budget leaves of the free memory: a
// sixteenth and 256 MiB, for the driver, kernel modules and other
// processes.
func budgetMargin(free int64) int64 { return free/16 + 256<<20 }

// budgetFor is the VRAM budget of a context: the option, or the device's
// free memory less a margin. It also reports the memory in use before
// ats allocates (the driver's context and other processes).
func (p *Planner) budgetFor(opt Options) (budget, inUse int64, err error) {
	free, total, err := p.acc.MemInfo()
	if err != nil {
		return 0, 0, fmt.Errorf("gpu: %w", err)
	}
	inUse = total - free
	if opt.VRAMBudget > 0 {
		return opt.VRAMBudget, inUse, nil
	}
	return max(free-budgetMargin(free), 0), inUse, nil
}

// needBytes is the device memory a context of pl would allocate.
func (p *Planner) needBytes(pl *Placement, opt Options) (arena, weights int64) {
	cfg, ok := executor.DeviceConfig(p.m, pl.Layout(), opt.ExecOptions())
	if !ok {
		return 0, 0
	}
	return p.acc.Need(p.m.Prog, cfg)
}

// checkBudget refuses a placement whose device memory exceeds the budget.
func (p *Planner) checkBudget(pl *Placement, opt Options) error {
	arena, weights := p.needBytes(pl, opt)
	if need := arena + weights; need > pl.Budget {
		return fmt.Errorf("the placement needs %s of GPU memory (%s weights, %s activations, KV caches and buffers); the budget is %s (--vram-budget)",
			executor.FormatBytes(need), executor.FormatBytes(weights), executor.FormatBytes(arena), executor.FormatBytes(pl.Budget))
	}
	return nil
}

// FixedBytes is the device memory a hybrid context of opt needs beside
// its resident units (activations, scratch, the least staging ring,
// norms): the least budget worth planning with.
func (p *Planner) FixedBytes(opt Options) int64 {
	opt = opt.withDefaults(p.m)
	return p.fixedBytes(p.units(opt), opt, ringWanted(Options{StaticOnly: true}, 0))
}

// FitsDevice says whether the auto backend would put every unit of a
// context of opt on the device (then host memory does not hold its
// cache).
func (p *Planner) FitsDevice(opt Options) bool {
	opt = opt.withDefaults(p.m)
	if p.acc == nil || !p.acc.SupportsKV(opt.KV.Type) {
		return false
	}
	budget, _, err := p.budgetFor(opt)
	if err != nil {
		return false
	}
	all := newPlacement(p.m, p.units(opt), executor.BackendGPU)
	arena, weights := p.needBytes(all, opt)
	return arena+weights <= budget
}
