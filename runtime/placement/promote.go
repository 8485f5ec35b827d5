package placement

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
)

// Dynamic promotion (decode). Before each decode step the promoter may
// re-plan which CPU-resident units to copy into the staging ring and run
// on the GPU for the step (plan.Promote), from the profile corrected by
// estimates of how the machine runs now: CPU and GPU speed against the
// profile, the link's speed, and how well copies hide behind compute. The
// estimates come from the steps themselves (device events around every
// GPU segment and weight upload, wall time of the CPU segments), and a new
// plan is made only when one moved by 15% and the plan is 5 steps old.
// Each plan is a schedule of the executor, compiled once and kept.

type promoter struct {
	ctx      *executor.Context
	base     *executor.Schedule // the layout's decode schedule: no promotion
	planner  *Planner
	units    []model.Unit
	resident func(i int) bool // by unit: lives on the device
	nvocab   int
	notes    backend.Notes
	prof     *plan.Profile // stepProf shaped to the current step (one batch)
	// stepProf is the placement's profile at the profile's own depth, and
	// shape the rows and positions prof is shaped for: each step's rows
	// (decode rows of several sequences) and depth change what the units
	// cost, attention most (reshape).
	stepProf *plan.Profile
	shape    stepShape
	reshaped bool  // the shape changed since the last plan: plan anew
	ring     int64 // the staging ring's bytes
	// everything: promote every host unit that can stream on every step
	// (Options.PromoteEverything).
	everything bool
	// est learns from steps that uploaded weights, idle from steps that
	// did not: weight copies read host memory too, so the CPU runs slower
	// while they go on, and a plan is only as good as its comparison with
	// no promotion at the CPU's unhindered speed.
	est, idle plan.Estimator
	rp        plan.Replanner
	cur       *executor.Schedule
	curPlan   plan.Promotion
	kept      bool // curPlan is a keptPlan: its weights stay in the ring
	byKey     map[string]*executor.Schedule

	// stepTime is the measured wall time of a decode step, by plan (the
	// median of its last steps, timeOf): a plan measured slower than no
	// promotion at all is not taken again, whatever the model predicts.
	stepTime map[*executor.Schedule]*stepTimes
	seen     map[*executor.Schedule]int // steps run by plan (the first is not timed)
	// timedAt is the step a plan's step time was last taken at, and meta
	// what it promotes: plans measured recently are compared with each
	// other, not only with no promotion (fastestFresh).
	timedAt  map[*executor.Schedule]int
	meta     map[*executor.Schedule]planMeta
	explored bool // no promotion has been measured for MinAge steps
	// The step time of no promotion goes stale while a plan runs (the
	// machine's load changes, and the first steps of a context are slow),
	// so every probeEvery steps of a promoting plan, probeSteps steps run
	// without promotion again and the two are compared afresh.
	sinceProbe, probing int
	probeFresh          bool               // the probe's first timed step replaces no promotion's step time
	last                *executor.Schedule // the schedule of the last observed step
	untimed             int                // steps since the last timed one (timeNext)
	// backoff counts down the steps after a plan measured slower than no
	// promotion was dropped, during which only a large move of the
	// estimates makes a new plan: otherwise a model that misjudges the
	// machine would try one mispredicted plan after another.
	backoff int
	drops   int // plans dropped so far (each doubles the next backoff)
	// doubt is the most a dropped plan's measured time exceeded its
	// prediction, relative to no promotion's (noneTime, the prediction at
	// the last re-plan): a new plan must beat none by that much more, so
	// that a model that misjudges this machine does not try one plan after
	// another. It is forgotten when the load moves a lot.
	doubt, noneTime float64
	// placeKey names the context's placement (its resident units and
	// ring), which a plan's verdict is kept for (Planner.rejectPlan).
	placeKey string
	log      bool // Options.PromoteLog

	// live is what metrics scrapes read from other goroutines.
	live struct {
		promoted, replans atomic.Int64
		link              atomic.Uint64 // float64 bits: the link estimate, bytes/s
	}

	// Statistics.
	replans   int
	planCost  time.Duration // the last re-planning (the DP and, when new, the compile)
	planTotal time.Duration
	dpCost    time.Duration // the last re-planning's DPs alone (what recurs; a compiled plan is kept)
	promoted  int64         // weight bytes the current plan promotes a step
	// ahead is the bytes of a copying plan's step that the step before
	// uploaded (backend.Exec.Prefetched), measured on the last step of such a
	// plan that followed one of its own: the copy time the next plan's
	// first promoted units find done (plan.PromoteProblem.StartSlack).
	ahead  int64
	steps  int   // decode steps observed
	copied int64 // weight bytes they uploaded (a kept plan: only its first step)
}

// Promoter is the policy that promotes host units for the decode steps of
// context c under placement pl (its Policy); nil when promotion is off for
// it (no device, no profile, nothing to promote, Options.StaticOnly).
func (p *Planner) Promoter(c *executor.Context, pl *Placement, opt Options) *Promoter {
	if !pl.Dynamic || c.Device() == nil || (pl.prof == nil && !opt.PromoteEverything) {
		return nil
	}
	any := false
	for i, u := range pl.units {
		any = any || (u.Streamable && !pl.resident(i) && (u.Bytes <= 2*u.DecodeBytes || opt.PromoteEverything))
	}
	if !any {
		return nil
	}
	base := c.Base()
	pr := &promoter{ctx: c, base: base, planner: p, units: pl.units, resident: pl.resident, nvocab: p.m.Hyper().NVocab, notes: opt.Notes, everything: opt.PromoteEverything,
		stepProf: pl.stepProf, ring: pl.RingBytes, cur: base, byKey: map[string]*executor.Schedule{"": base}, stepTime: map[*executor.Schedule]*stepTimes{}, seen: map[*executor.Schedule]int{},
		timedAt: map[*executor.Schedule]int{}, meta: map[*executor.Schedule]planMeta{}}
	pr.init(pl, opt)
	return &Promoter{pr}
}

// Promoter is dynamic promotion, as the executor's Policy.
type Promoter struct{ p *promoter }

func (pp *Promoter) Next(s executor.Step) (*executor.Schedule, error) {
	pp.p.reshape(s)
	return pp.p.schedule()
}
func (pp *Promoter) TimeNext() bool                { return pp.p.timeNext() }
func (pp *Promoter) Observe(r executor.StepReport) { pp.p.observe(r) }
func (pp *Promoter) Close()                        { pp.p.release() }

// stepShape is a class of decode steps the promoter plans for: its rows
// (exact up to 4, then powers of two) and its rows' mean depth beyond the
// profile's decode position (two classes an octave from 512 on; 0 below).
type stepShape struct{ rows, depth int }

func shapeOf(s executor.Step, decodePos int) stepShape {
	rows := max(s.Rows, 1)
	d := s.Positions/rows - decodePos
	if rows > 4 {
		rows = 1 << bits.Len(uint(rows-1))
	}
	if d < 512 {
		d = 0
	} else {
		half := 1 << (bits.Len(uint(d)) - 2) // half the octave d is in
		d = d / half * half
	}
	return stepShape{rows: rows, depth: d}
}

// reshape shapes the profile to step s's class; a new class plans anew,
// and the wall times measured in the last one no longer compare.
func (p *promoter) reshape(s executor.Step) {
	if p.stepProf == nil {
		return
	}
	sh := shapeOf(s, p.stepProf.DecodePos)
	if p.prof != nil && sh == p.shape {
		return
	}
	first := p.prof == nil
	p.shape, p.prof = sh, p.stepProf.Shaped(sh.rows, sh.depth)
	if !first {
		p.reshaped = true
		clear(p.stepTime)
		clear(p.timedAt)
	}
}

func (p *promoter) init(pl *Placement, opt Options) {
	p.log = opt.PromoteLog
	p.reshape(executor.Step{Rows: 1}) // until the first step says otherwise
	resident := make([]bool, len(p.units))
	for i := range p.units {
		resident[i] = pl.resident(i)
	}
	p.placeKey = fmt.Sprintf("ring %d, resident %s: ", pl.RingBytes, planKey(resident))
	if p.prof != nil {
		p.idle.Observe(plan.Estimates{CPU: 1, GPU: 1, Overlap: 1, Link: pl.prof.Stream.BytesPerSec})
		e := p.est.Observe(plan.Estimates{CPU: 1, GPU: 1, Overlap: 1, Link: pl.prof.Stream.BytesPerSec})
		// The first steps run without promotion: they measure the machine
		// and the static placement the plans are checked against.
		p.rp.Planned(e)
	}
}

// minPlanAge is how many decode steps run without promotion before the
// first plan (the Replanner's MinAge).
const minPlanAge = 5

// backoffSteps is how long, after a plan measured slower than no
// promotion was dropped, a new plan waits for estimates that moved by
// three times the Replanner's threshold.
const backoffSteps = 32

// probeEvery and probeSteps: how often a promoting plan is checked
// against no promotion, and for how many steps (the first of them is not
// timed: it follows a change of schedule).
const probeEvery, probeSteps = 48, 3

// problem is the promotion problem of the next decode step under the
// estimates of steps that copy weights, the copy engine starting with the
// weights the executor prefetched in the last step of a copying plan.
func (p *promoter) problem(e plan.Estimates) plan.PromoteProblem {
	pr := p.problemFor(e)
	if e.Link > 0 {
		pr.StartSlack = min(float64(p.ahead)/e.Link, pr.MaxSlack)
	}
	return pr
}

// problemFor is the promotion problem of a decode step under e.
func (p *promoter) problemFor(e plan.Estimates) plan.PromoteProblem {
	return promoteProblem(p.prof, p.units, p.resident, p.ring, p.nvocab, e)
}

// promoteProblem is the promotion problem of a decode step under e, for
// units where resident(i) says which live on the GPU, with a staging ring
// of ring bytes and a vocabulary of nvocab logits to bring back.
func promoteProblem(prof *plan.Profile, units []model.Unit, resident func(int) bool, ring int64, nvocab int, e plan.Estimates) plan.PromoteProblem {
	d := prof.BatchIndex(1)
	pr := plan.PromoteProblem{MaxSlack: float64(ring) / e.Link / max(e.Overlap, 1), EndToCPU: max(prof.Switch[d].Time(4*int64(nvocab)), e.Switch)}
	// Promotion pays when the link moves what the CPU would read anyway;
	// an MoE layer's stacks are many times what a token reads of them, and
	// copying them all would take the host memory the CPU needs.
	copyable := func(u model.Unit) bool { return u.Bytes <= 2*u.DecodeBytes }
	pr.Units = streamUnits(prof, units, resident, d, 1, e, plan.Link{BytesPerSec: e.Link}, copyable)
	return pr
}

// streamUnits are the units of a step of n tokens (profile batch b) for
// the promotion DP: their times under the estimates e, a switch to or from
// them moving their input (at least e.Switch), and for a non-resident unit
// its copy over link where it can stream and copyable says so, else fixed
// on the CPU. A decode step's promotion and a prefill batch's streaming
// (prefillStreams) are the same problem.
func streamUnits(prof *plan.Profile, units []model.Unit, resident func(int) bool, b, n int, e plan.Estimates, link plan.Link, copyable func(model.Unit) bool) []plan.PromoteUnit {
	sw := prof.Switch[b]
	out := make([]plan.PromoteUnit, 0, len(units))
	for i, u := range units {
		t := prof.Units[i]
		cross := max(sw.Time(u.InBytes*int64(n)), e.Switch)
		pu := plan.PromoteUnit{Name: u.Name, CPU: t.CPU[b] * e.CPU, GPU: t.GPU[b] * e.GPU, ToGPU: cross, ToCPU: cross, Resident: resident(i)}
		if !pu.Resident {
			if u.Streamable && copyable(u) {
				pu.Copy = link.Time(u.Bytes)
			} else {
				pu.Fixed = true
			}
		}
		out = append(out, pu)
	}
	return out
}

// schedule is the decode schedule of the next step, re-planned first when
// the estimates call for it.
func (p *promoter) schedule() (*executor.Schedule, error) {
	base := p.base
	if p.probing > 0 {
		if p.probing--; p.probing > 0 {
			return base, nil
		}
		p.sinceProbe = 0
		if p.slowerThanNone(p.cur, base) {
			p.drop()
		}
		return p.cur, nil
	}
	if p.cur != base && p.prof != nil {
		// A plan measured slower than no promotion, once it has run
		// long enough to tell, is dropped at once.
		if p.seen[p.cur] > minPlanAge && p.slowerThanNone(p.cur, base) {
			p.drop()
			return p.cur, nil
		}
		if p.seen[p.cur] > minPlanAge {
			if b := p.fasterFresh(p.cur); b != nil {
				// Another plan ran clearly faster a short while ago: back to it.
				p.adopt(b)
				return b, nil
			}
		}
		if p.sinceProbe++; p.sinceProbe >= probeEvery {
			p.probing, p.probeFresh = probeSteps, true
			return base, nil
		}
	}
	if p.cur == base && p.prof != nil {
		// No promotion runs (the model chose it, or a plan was dropped)
		// while a plan ran clearly faster than it a short while ago: on a
		// noisy machine a mispredicted plan's drop made the model's margin
		// hold a 14B context on none, 42-50 ms a step, for 80 steps after
		// a plan had run at 36-38.
		if b := p.betterMeasured(base, base); b != nil {
			p.adopt(b)
			return b, nil
		}
	}
	e := p.est.Current()
	trig := e // the estimates of the current plan's kind of step
	if p.curPlan.Count == 0 || p.kept {
		trig = p.idle.Current()
	}
	first := !p.explored && p.rp.Age() >= minPlanAge
	if p.backoff > 0 {
		p.backoff--
		if !p.rp.StepBy(trig, 3) {
			return p.cur, nil
		}
		p.backoff, p.doubt = 0, 1 // the load moved a lot: the model's misses were another machine's
	} else if !p.rp.Step(trig) && !first && !p.reshaped && p.prof != nil {
		return p.cur, nil
	}
	p.reshaped = false
	if p.prof == nil && p.replans > 0 {
		return p.cur, nil // everything: planned once
	}
	p.explored = true
	start := time.Now()
	p.kept = false
	var sol plan.Promotion
	if p.prof == nil { // everything
		sol.Promote = make([]bool, len(p.units))
		for i, u := range p.units {
			if sol.Promote[i] = u.Streamable && !p.resident(i); sol.Promote[i] {
				sol.Count++
			}
		}
	} else {
		var err error
		if sol, err = plan.Promote(p.problem(e)); err != nil {
			return nil, err
		}
		idle := p.idle.Current()
		idle.Link = e.Link
		kept := p.keptPlan(idle)
		// Each plan at the later of its timeline and the host memory's
		// bound: the DPs count a promoted unit's CPU time saved, but its
		// copy reads host memory as the CPU's products would have.
		tSol := max(sol.Time, p.hostBound(sol.Promote, false, e))
		if kept.Count > 0 {
			if tKept := max(kept.Time, p.hostBound(kept.Promote, true, idle)); tKept < tSol {
				sol, tSol, p.kept = kept, tKept, true
			}
		}
		// Against no promotion at the CPU's speed when nothing is copied.
		none := make([]bool, len(p.units))
		prNone := p.problemFor(idle)
		tNone, _ := prNone.Timeline(none)
		tNone = max(tNone, p.hostBound(none, false, idle))
		sol.Time = tSol
		p.noneTime = tNone
		if sol.Count > 0 && tSol*max(p.doubt, 1) > 0.97*tNone {
			sol, p.kept = plan.Promotion{Promote: none, Time: tNone}, false
		}
	}
	p.dpCost = time.Since(start)
	key := planKey(sol.Promote)
	var bytes int64
	for i, on := range sol.Promote {
		if on {
			bytes += p.units[i].Bytes
		}
	}
	if was, ok := p.planner.rejectedPlan(p.placeKey + key); ok && sol.Count > 0 && !plan.Moved(p.idle.Current(), was, replanThreshold, 3) {
		// Measured slower than no promotion on this machine, in this
		// context or an earlier one of the model, under much the same
		// load: not tried again.
		sol, bytes, p.kept, key = plan.Promotion{Promote: make([]bool, len(p.units))}, 0, false, ""
	}
	s := p.byKey[key]
	if s == nil {
		p.evict()
		var err error
		if s, err = p.ctx.Promotion(sol.Promote); err != nil {
			return nil, err
		}
		p.byKey[key] = s
	}
	if p.slowerThanNone(s, base) {
		// Measured slower than no promotion: the model misjudges this
		// machine (say, the copies slow the CPU's own memory reads).
		s, sol, bytes = base, plan.Promotion{Promote: make([]bool, len(p.units))}, 0
	}
	if b := p.betterMeasured(s, base); b != nil {
		// The model's choice (a plan, or none) was measured clearly slower
		// than another plan a short while ago: the measurement wins.
		m := p.meta[b]
		s, sol, bytes, p.kept = b, m.sol, m.bytes, m.kept
	}
	if s != base && s != p.cur && p.timeOf(s) == 0 {
		// A plan not yet measured is checked against no promotion soon,
		// measured afresh: the steps that measured it may be a context's
		// first, which run slow, or the load may have changed since.
		p.sinceProbe = probeEvery - (minPlanAge + 1)
	}
	p.cur, p.curPlan, p.promoted = s, sol, bytes
	p.kept = p.kept && sol.Count > 0
	if s != base {
		p.meta[s] = planMeta{sol: sol, kept: p.kept, bytes: bytes}
	}
	if sol.Count > 0 && !p.kept { // the next trigger compares estimates of the same kind of step
		p.rp.Planned(p.est.Current())
	} else {
		p.rp.Planned(p.idle.Current())
	}
	p.replans++
	p.live.replans.Store(int64(p.replans))
	p.live.promoted.Store(bytes)
	p.planCost = time.Since(start)
	p.planTotal += p.planCost
	return s, nil
}

// dropToBase goes back to no promotion after the current plan measured
// slower than it, and holds off new plans for backoffSteps unless the
// estimates move by much more than the Replanner's threshold.
//
// A clear verdict is kept with the model (rejectPlan), so that its other
// contexts, and this one after the backoff, do not try the plan again
// under much the same load, and raises the margin by which new plans must
// beat none (doubt); each drop doubles the next backoff (up to
// eight times), so an idle machine whose estimates wander by noise does
// not cycle through mispredicted plans.
func (p *promoter) dropToBase() {
	base := p.base
	// A clear miss (not the steps' noise) is remembered: with the model,
	// and as how much the model over-promised (the plan's measured time
	// against its prediction, relative to no promotion's).
	if t, tb := p.timeOf(p.cur), p.timeOf(base); t > rememberSlower*tb && tb > 0 {
		p.planner.rejectPlan(p.placeKey+planKey(p.curPlan.Promote), p.idle.Current())
		if p.curPlan.Time > 0 && p.noneTime > 0 {
			p.doubt = max(p.doubt, (t/p.curPlan.Time)/(tb/p.noneTime))
		}
	}
	p.cur, p.curPlan, p.promoted, p.kept = base, plan.Promotion{Promote: make([]bool, len(p.units))}, 0, false
	p.live.promoted.Store(0)
	p.backoff = backoffSteps << min(p.drops, 3)
	p.drops++
	p.rp.Planned(p.idle.Current())
}

// drop ends the current plan, measured slower than no promotion
// (dropToBase: its verdict and the backoff), and goes to the plan that ran
// fastest recently if that one beat no promotion clearly, else to none: a
// plan that mispredicts should not cost the context a plan that worked
// (on the GPU machine a 14B context fell back to none, 38-41 ms a step,
// from a plan it had run at 34-36 ms).
func (p *promoter) drop() {
	dropped := p.cur
	p.dropToBase()
	if tb := p.timeOf(p.base); tb > 0 {
		if b := p.fastestFresh(dropped, tb/fasterBy); b != nil {
			p.adopt(b)
		}
	}
}

// planMeta is what a compiled promotion plan promotes (promoter.meta).
type planMeta struct {
	sol   plan.Promotion
	kept  bool
	bytes int64
}

// freshSteps is how many decode steps a plan's measured time stays good
// for comparing it with the current plan (the load moves).
const freshSteps = 2 * probeEvery

// fasterBy is how much faster another plan must have run than s for the
// promoter to go back to it: more than the steps' noise.
const fasterBy = 1.03

// fasterFresh is the fastest promoting plan other than s measured within
// the last freshSteps steps (at least three timed steps), when it ran
// faster than s by fasterBy; nil when there is none or s is not measured.
// The model ranks plans by its estimates; where two plans have both run,
// their step times decide (on the GPU machine the 14B's model preferred a
// plan that kept 143 MiB in the ring, 37.5-39 ms a step, to one that
// copied 1.4 GiB a step and had run 35-36.5 ms).
func (p *promoter) fasterFresh(s *executor.Schedule) *executor.Schedule {
	ts := p.timeOf(s)
	if ts == 0 {
		return nil
	}
	return p.fastestFresh(s, ts/fasterBy)
}

// fastestFresh is the fastest promoting plan other than s measured within
// the last freshSteps steps (at least three timed steps) whose step time
// is below than; nil when there is none.
func (p *promoter) fastestFresh(s *executor.Schedule, than float64) *executor.Schedule {
	var best *executor.Schedule
	bestT := than
	for o, w := range p.stepTime {
		if o == s || w.n < 3 || p.steps-p.timedAt[o] > freshSteps {
			continue
		}
		if _, ok := p.meta[o]; !ok {
			continue // no promotion: slowerThanNone's, with its verdicts
		}
		if t := w.median(); t < bestT {
			best, bestT = o, t
		}
	}
	return best
}

// betterMeasured is the plan measured clearly faster than s in the last
// freshSteps steps (fasterFresh; for s no promotion, base, measured in
// that time too), or nil.
func (p *promoter) betterMeasured(s, base *executor.Schedule) *executor.Schedule {
	if s != base {
		return p.fasterFresh(s)
	}
	if tb := p.timeOf(base); tb > 0 && p.steps-p.timedAt[base] <= freshSteps {
		return p.fastestFresh(base, tb/fasterBy)
	}
	return nil
}

// adopt makes b, a plan compiled and measured before, the current plan,
// and the estimates of its kind of step the re-planning trigger's
// reference (as a re-plan that chose it would).
func (p *promoter) adopt(b *executor.Schedule) {
	m := p.meta[b]
	p.cur, p.curPlan, p.kept, p.promoted = b, m.sol, m.kept, m.bytes
	p.live.promoted.Store(m.bytes)
	if m.sol.Count > 0 && !m.kept {
		p.rp.Planned(p.est.Current())
	} else {
		p.rp.Planned(p.idle.Current())
	}
}

// rememberSlower: a plan dropped as measured this much slower than none
// is remembered with the model; one dropped by less (the steps' noise is
// a few percent) only backs off in its context.
const rememberSlower = 1.08

// planKey names a promotion plan: the promoted units' indices.
func planKey(promote []bool) string {
	var key strings.Builder
	for i, on := range promote {
		if on {
			fmt.Fprintf(&key, "%d,", i)
		}
	}
	return key.String()
}

// replanThreshold is the Replanner's threshold (its default).
const replanThreshold = 0.15

// hostBound is hostBoundOf for the context's units and placement.
func (p *promoter) hostBound(promote []bool, kept bool, e plan.Estimates) float64 {
	return hostBoundOf(p.prof, p.units, p.resident, promote, kept, e)
}

// hostBoundOf is a lower bound on a decode step's time when the units of
// promote run on the GPU (kept: their weights already in the ring, nothing
// copied): host memory feeds the CPU's products and the copy engine alike,
// at the profile's HostRead in all, and a step's GPU segments, during which
// the CPU waits, are the only time copies do not take it from the CPU. On
// a machine whose CPU segments already read at that rate, promotion moves
// bytes from one reader to the other and wins only the GPU's windows; under
// a CPU load the CPU's own time, not this bound, decides. 0 without a rate.
func hostBoundOf(prof *plan.Profile, units []model.Unit, resident func(int) bool, promote []bool, kept bool, e plan.Estimates) float64 {
	rate := prof.HostRead
	if rate <= 0 {
		return 0
	}
	d := prof.BatchIndex(1)
	var cpuBytes, copied, tGPU float64
	for i, u := range units {
		if resident(i) || promote[i] {
			tGPU += prof.Units[i].GPU[d] * e.GPU
			if promote[i] && !kept {
				copied += float64(u.Bytes)
			}
			continue
		}
		if u.Products() {
			cpuBytes += float64(u.DecodeBytes)
		}
	}
	inWindows := min(copied, tGPU*e.Link)
	return (cpuBytes+copied-inWindows)/rate + tGPU
}

// slowerThanNone: promotion schedule s was measured more than 3% slower a
// step than no promotion (base), both having been timed.
func (p *promoter) slowerThanNone(s, base *executor.Schedule) bool {
	t, tb := p.timeOf(s), p.timeOf(base)
	return s != base && t > 0 && tb > 0 && t > 1.03*tb
}

// timeOf is the measured step time of schedule s (0: not measured).
func (p *promoter) timeOf(s *executor.Schedule) float64 {
	if w := p.stepTime[s]; w != nil {
		return w.median()
	}
	return 0
}

// stepTimes are the last step times of a plan. Plans are compared on
// their median: a single slow step (the machine's other work) moved a
// moving average enough to drop a plan that ran 5% faster than none on
// the 30B-A3B.
type stepTimes struct {
	v    [7]float64
	n, i int
}

func (w *stepTimes) add(t float64) {
	w.v[w.i] = t
	w.i = (w.i + 1) % len(w.v)
	w.n = min(w.n+1, len(w.v))
}

func (w *stepTimes) median() float64 {
	if w.n == 0 {
		return 0
	}
	v := slices.Clone(w.v[:w.n])
	slices.Sort(v)
	if w.n%2 == 1 {
		return v[w.n/2]
	}
	return (v[w.n/2-1] + v[w.n/2]) / 2
}

// maxPlans bounds the compiled promotion schedules a context keeps (each
// holds compiled segments and, for decode, CUDA graphs): a server whose load
// keeps changing would otherwise collect them without end.
const maxPlans = 8

// evict drops a kept schedule other than the base and the current one
// when there are maxPlans of them.
func (p *promoter) evict() {
	if len(p.byKey) < maxPlans {
		return
	}
	for k, s := range p.byKey {
		if s == p.base || s == p.cur {
			continue
		}
		p.ctx.Release(s)
		delete(p.byKey, k)
		delete(p.stepTime, s)
		delete(p.seen, s)
		delete(p.timedAt, s)
		delete(p.meta, s)
		return
	}
}

// release destroys the promotion schedules' graphs (the context closes
// the policy).
func (p *promoter) release() {
	for _, s := range p.byKey {
		p.ctx.Release(s)
	}
	p.byKey = nil
}

// observe folds a decode step's measurements into the estimates: the CPU
// segments' wall time and the GPU segments' device time (those that did
// not wait for uploads) against the profile, the uploads' speed, and the
// step against the plan's prediction.
//
// copied is the weight bytes the step uploaded (the streamer's count,
// known whether or not the step was timed): t is empty for a step that
// was not (timeNext). captured says the step captured CUDA graphs.
func (p *promoter) observe(r executor.StepReport) {
	if p.prof == nil {
		return
	}
	s, wall, onCPU, t, copied, captured := r.Schedule, r.Wall, r.OnHost, r.Times, r.Copied, r.Captured
	base := p.base
	// The first step of a schedule (and the first after a switch back to
	// it) pays for the switch; so do a step that captured graphs (a plan
	// whose weights stay in the ring captures its segments' graphs on its
	// second step, which then ran twice as long as the next ones on the
	// 30B-A3B) and the step that refills the ring after a prefill batch
	// streamed through it. None of them says how fast the plan runs.
	refill := copied > 0 && s.Fits()
	if p.seen[s]++; p.seen[s] > 1 && s == p.last && !refill && !captured {
		w := p.stepTime[s]
		if w == nil || (p.probeFresh && s == base) {
			w = &stepTimes{}
			p.stepTime[s] = w
		}
		w.add(wall.Seconds())
		p.timedAt[s] = p.steps
		if s == base {
			p.probeFresh = false
		}
	}
	if s == p.last && s != base && !p.kept && copied > 0 {
		p.ahead = p.ctx.Device().Prefetched()
	}
	p.last = s
	d := p.prof.BatchIndex(1)
	var cpuPred, gpuPred, gpuMeas float64
	for i, u := range p.units {
		if !s.OnDevice(u.Lo) {
			cpuPred += p.prof.Units[i].CPU[d]
		}
	}
	for _, sp := range t.Segments {
		if sp.Streams {
			continue
		}
		gpuMeas += sp.End - sp.Start
		for i, u := range p.units {
			if u.Lo >= sp.Lo && u.Lo < sp.Hi {
				gpuPred += p.prof.Units[i].GPU[d]
			}
		}
	}
	var moved int64
	var busy float64
	for _, up := range t.Uploads {
		moved += up.Bytes
		busy += up.End - up.Start
	}
	p.steps++
	p.copied += copied
	if p.log {
		kind, n := "copies", p.curPlan.Count
		switch {
		case s == base:
			kind, n = "none", 0
		case p.kept:
			kind = "kept"
		}
		p.notes.Note(fmt.Sprintf("promote: step %d: %s plan of %d units; %.3f ms (CPU %.3f); copied %d bytes (%d prefetched); %d segments timed; estimates %+v",
			p.steps, kind, n, 1e3*wall.Seconds(), 1e3*onCPU.Seconds(), copied, p.ctx.Device().Prefetched(), len(t.Segments), p.idle.Current()))
	}
	m := plan.Estimates{}
	if cpuPred > 0 && onCPU > 0 {
		m.CPU = onCPU.Seconds() / cpuPred
	}
	if gpuPred > 0 && gpuMeas > 0 {
		m.GPU = gpuMeas / gpuPred
	}
	if moved > 0 && busy > 0 {
		m.Link = float64(moved) / busy
	}
	// The hand-over, from a step that waited for no copy: the time the CPU
	// spent on the GPU's stretches beyond the stretches' own device time,
	// two hand-overs each.
	if n := len(t.Segments); n > 0 && copied == 0 && wall > onCPU {
		var dev float64
		for _, sp := range t.Segments {
			dev += sp.End - sp.Start
		}
		if host := (wall - onCPU).Seconds(); host > dev {
			m.Switch = (host - dev) / float64(2*n)
		}
	}
	// How the step compares with the plan's model under the same speeds.
	cur := p.est.Current()
	if len(t.Uploads) > 0 && m.CPU > 0 && len(p.curPlan.Promote) == len(p.units) {
		e := cur
		e.CPU, e.Overlap = m.CPU, 1
		if m.GPU > 0 {
			e.GPU = m.GPU
		}
		if m.Link > 0 {
			e.Link = m.Link
		}
		pr := p.problem(e)
		if pred, _ := pr.Timeline(p.curPlan.Promote); pred > 0 {
			m.Overlap = wall.Seconds() / pred
		}
	}
	if copied > 0 {
		p.live.link.Store(math.Float64bits(p.est.Observe(m).Link))
	} else {
		p.idle.Observe(m)
	}
}

// timeNext says whether the next decode step should be timed on the
// device (events around every segment and upload, gpu.Exec.Measure).
// The first steps of a context, and of a plan that copies weights (for
// the link and the overlap), are; after them one step in timeEvery, for
// the GPU's speed, the link and the hand-over: the events cost a few
// microseconds at each of the dozens of hand-overs and reading them back
// as much again, a few percent of an idle machine's step (on the GPU
// machine a 14B copying plan's steps took 36.7 ms inside the executor and
// 37.7 ms a token in all, timed every step), and the wall time of every
// step (what plans are compared on) needs none.
func (p *promoter) timeNext() bool {
	if p.prof == nil || p.steps < minPlanAge+1 {
		return true // the first steps measure the machine for the first plan
	}
	if p.curPlan.Count > 0 && !p.kept && p.seen[p.cur] <= minPlanAge {
		return true // a new copying plan's first steps: the link and the overlap
	}
	p.untimed++
	if p.untimed >= timeEvery {
		p.untimed = 0
		return true
	}
	return false
}

// timeEvery: one step in timeEvery that copies nothing is timed.
const timeEvery = 4

// PromotionStats reports dynamic promotion.
type PromotionStats struct {
	On            bool
	Replans       int
	LastPlanCost  time.Duration // the last re-planning, compile included
	LastDPCost    time.Duration // the last re-planning's DPs alone
	PlanCost      time.Duration // all re-planning
	PromotedBytes int64         // weight bytes the current plan promotes each step
	PromotedUnits int
	Kept          bool    // the promoted units' weights stay in the ring from step to step
	CopiedPerStep int64   // weight bytes uploaded per decode step, on average over the context
	Predicted     float64 // seconds a step under the current plan and estimates
	Estimates     plan.Estimates
	// Switch is a hand-over between the CPU and the GPU as the steps that
	// copied nothing measured it (0: none measured).
	Switch time.Duration
}

// Stats reports the dynamic promotion (zero for a nil Promoter).
func (pp *Promoter) Stats() PromotionStats {
	if pp == nil {
		return PromotionStats{}
	}
	p := pp.p
	return PromotionStats{On: true, Replans: p.replans, LastPlanCost: p.planCost, LastDPCost: p.dpCost, PlanCost: p.planTotal,
		PromotedBytes: p.promoted, PromotedUnits: p.curPlan.Count, Kept: p.kept, CopiedPerStep: p.copied / int64(max(p.steps, 1)),
		Predicted: p.curPlan.Time, Estimates: p.est.Current(), Switch: time.Duration(p.idle.Current().Switch * 1e9)}
}

// Live is what a metrics scrape reads of promotion; unlike the rest of a
// context it may be called from any goroutine (zero for a nil Promoter).
func (pp *Promoter) Live() (promotedBytes, replans int64, linkBytesPerSec float64) {
	if pp == nil {
		return 0, 0, 0
	}
	p := pp.p
	return p.live.promoted.Load(), p.live.replans.Load(), math.Float64frombits(p.live.link.Load())
}

// keptPlan is the promotion that copies nothing after its first step
// (keptUnits) under the estimates e.
func (p *promoter) keptPlan(e plan.Estimates) plan.Promotion {
	return keptUnits(p.prof, p.units, p.resident, p.ring, p.problemFor(e), e)
}

// keptUnits is the promotion that copies nothing after its first step:
// units whose weights fit the ring together stay there from one decode
// step to the next (gpu.Schedule's fits), so each step runs them on the
// GPU without a copy, and the host memory the copies would read stays
// with the CPU, which needs it when its products are bound by memory
// bandwidth. It takes the units that save the most CPU time per byte,
// under the estimates e of steps that copy nothing, drops those whose
// switches cost more than they save, and returns the plan with its
// predicted time (pr: the step's promotion problem under e).
func keptUnits(prof *plan.Profile, units []model.Unit, resident func(int) bool, ring int64, pr plan.PromoteProblem, e plan.Estimates) plan.Promotion {
	d := prof.BatchIndex(1)
	type cand struct {
		i     int
		bytes int64
		gain  float64 // seconds saved per byte
	}
	var cands []cand
	for i, u := range units {
		if resident(i) || !u.Streamable {
			continue
		}
		t := prof.Units[i]
		b := u.Bytes + 256*int64(len(u.Mats)) // the ring aligns each matrix
		if saved := t.CPU[d]*e.CPU - t.GPU[d]*e.GPU; saved > 0 && b > 0 {
			cands = append(cands, cand{i, b, saved / float64(b)})
		}
	}
	slices.SortStableFunc(cands, func(a, b cand) int { return cmp.Compare(b.gain, a.gain) })
	promote := make([]bool, len(units))
	room := ring
	for _, k := range cands {
		if k.bytes <= room {
			promote[k.i], room = true, room-k.bytes
			pr.Units[k.i].Copy = 0
			pr.Units[k.i].Fixed = false
		}
	}
	best, _ := pr.Timeline(promote)
	for _, k := range cands { // an isolated unit may cost more in switches than it saves
		if promote[k.i] {
			promote[k.i] = false
			if t, _ := pr.Timeline(promote); t < best {
				best = t
				continue
			}
			promote[k.i] = true
		}
	}
	sol := plan.Promotion{Promote: promote, Time: best}
	for _, on := range promote {
		if on {
			sol.Count++
		}
	}
	return sol
}

// idleKept is the kept plan (keptUnits) the promoter is expected to take
// on an idle machine, by unit, or nil when it would promote nothing: the
// units that fit the ring and, with the host memory's bound, beat no
// promotion by the promoter's own 3% margin.
func idleKept(prof *plan.Profile, units []model.Unit, resident func(int) bool, ring int64, nvocab int) []bool {
	if prof == nil || ring <= 0 || prof.Stream.BytesPerSec <= 0 {
		return nil
	}
	e := plan.Estimates{CPU: 1, GPU: 1, Overlap: 1, Link: prof.Stream.BytesPerSec}
	pr := promoteProblem(prof, units, resident, ring, nvocab, e)
	kept := keptUnits(prof, units, resident, ring, pr, e)
	if kept.Count == 0 {
		return nil
	}
	none := make([]bool, len(units))
	prNone := promoteProblem(prof, units, resident, ring, nvocab, e)
	tNone, _ := prNone.Timeline(none)
	tNone = max(tNone, hostBoundOf(prof, units, resident, none, false, e))
	if max(kept.Time, hostBoundOf(prof, units, resident, kept.Promote, true, e)) >= 0.97*tNone {
		return nil
	}
	return kept.Promote
}
