package plan

import "math"

// Estimates correct the profile for how the machine runs now: CPU and GPU
// are the ratios of measured to profiled compute time (above 1: slower
// than profiled, say because another program took cores), Link is the
// measured speed of weight copies in bytes per second, and Overlap the
// ratio of the measured step time to the time the plan predicted once
// those are accounted for (above 1: copies hide behind compute less well
// than modelled; the promotion plan then assumes less room to hide them).
type Estimates struct {
	CPU, GPU, Overlap float64
	Link              float64
	// Switch is the seconds a hand-over between the CPU and the GPU takes
	// now, as steps measure it (0: not measured; the profile's then). A GPU
	// shared with another process makes each of a step's GPU stretches
	// wait for its turn, a cost per stretch, not per byte.
	Switch float64
}

// Estimator keeps moving averages of the measurements of recent decode
// steps.
type Estimator struct {
	// Weight is the weight of the newest step (0: 0.3).
	Weight float64
	cur    Estimates
	seen   bool
}

// Observe folds in one step's measurements; a zero field (not measured
// this step) leaves its estimate as it was.
func (e *Estimator) Observe(m Estimates) Estimates {
	w := e.Weight
	if w <= 0 {
		w = 0.3
	}
	mix := func(old, v float64) float64 {
		switch {
		case v <= 0 || math.IsNaN(v) || math.IsInf(v, 0):
			return old
		case old <= 0:
			return v
		}
		return old + w*(v-old)
	}
	e.cur = Estimates{CPU: mix(e.cur.CPU, m.CPU), GPU: mix(e.cur.GPU, m.GPU), Overlap: mix(e.cur.Overlap, m.Overlap), Link: mix(e.cur.Link, m.Link),
		Switch: mix(e.cur.Switch, m.Switch)}
	e.seen = true
	return e.cur
}

// Current is the estimates so far (zeros before any step).
func (e *Estimator) Current() Estimates { return e.cur }

// Replanner is the re-planning policy: a new promotion plan only when an
// estimate moved by Threshold (relative) since the current plan was made
// and the plan is at least MinAge decode steps old, so the planning cost
// is paid only when the machine's load changed.
type Replanner struct {
	Threshold float64 // 0: 0.15
	MinAge    int     // 0: 5
	planned   Estimates
	age       int
	has       bool
}

// Step counts a decode step under the current plan and says whether to
// plan again given the estimates e.
func (r *Replanner) Step(e Estimates) bool { return r.StepBy(e, 1) }

// StepBy is Step with the threshold scaled by scale: a plan again only
// for moves that much larger.
func (r *Replanner) StepBy(e Estimates, scale float64) bool {
	r.age++
	if !r.has {
		return true
	}
	th, minAge := r.Threshold, r.MinAge
	if th <= 0 {
		th = 0.15
	}
	if minAge <= 0 {
		minAge = 5
	}
	if r.age < minAge {
		return false
	}
	return Moved(e, r.planned, th, scale)
}

// Moved says whether an estimate of e moved from was by th (relative) or
// more, the threshold scaled by scale; the hand-over only when it also
// moved by switchMoved times scale.
func Moved(e, was Estimates, th, scale float64) bool {
	th *= max(scale, 1)
	moved := func(a, b float64) bool {
		if a <= 0 || b <= 0 {
			return a != b
		}
		return math.Abs(a-b)/b >= th
	}
	// The hand-over moves by microseconds between steps: only a move of
	// switchMoved as well counts.
	switched := moved(e.Switch, was.Switch) && math.Abs(e.Switch-was.Switch) >= switchMoved*max(scale, 1)
	return moved(e.CPU, was.CPU) || moved(e.GPU, was.GPU) || moved(e.Link, was.Link) || moved(e.Overlap, was.Overlap) || switched
}

// switchMoved is the least change of the hand-over's estimate that calls
// for a new plan.
const switchMoved = 10e-6

// Age is how many steps the current plan has run.
func (r *Replanner) Age() int { return r.age }

// Planned records that a plan was made under e.
func (r *Replanner) Planned(e Estimates) {
	r.planned, r.age, r.has = e, 0, true
}
