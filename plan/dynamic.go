package plan

import (
	"errors"
	"fmt"
	"math"
)

// Dynamic promotion. Before a decode step, some CPU-resident units can be
// copied into the GPU's staging ring and run there for this step. The copy
// engine starts at the beginning of the step and copies the promoted units
// back to back, in execution order, while the CPU and the GPU compute the
// units before them; a promoted unit waits only for the part of its copy
// that this compute did not hide (the exposed transfer time).
//
// The dynamic program walks the units in order keeping the slack: how
// much compute has run since the copy engine last caught up, the time
// still available to hide copies. Computing a unit adds its time to the
// slack; promoting one spends its copy time out of it (waiting for the
// rest). The ring bounds the slack: the copy engine cannot run further
// ahead of the compute than the ring holds, Ring/LinkBytesPerSec seconds.

// PromoteUnit is one unit in a promotion problem.
type PromoteUnit struct {
	Name string
	// CPU and GPU are its seconds on each backend (GPU: weights in device
	// memory, resident or promoted); Copy is the seconds to copy its
	// weights to the GPU (0 when it cannot be promoted).
	CPU, GPU, Copy float64
	// ToGPU and ToCPU are the cost of switching backend just before it.
	ToGPU, ToCPU float64
	// Resident units run on the GPU, Fixed ones on the CPU (attention
	// whose cache is on the host, the embedding); the others may be
	// promoted.
	Resident, Fixed bool
}

// PromoteProblem is one decode step's promotion choice.
type PromoteProblem struct {
	Units []PromoteUnit
	// MaxSlack is the most copy time the ring lets the copy engine run
	// ahead (ring bytes over link bytes per second).
	MaxSlack float64
	// Buckets is the resolution of the slack axis (0: 256).
	Buckets int
	// EndToCPU is the cost of bringing the logits back after the last unit
	// when it runs on the GPU.
	EndToCPU float64
	// StartSlack is the copy time already done when the step starts (at
	// most MaxSlack): the previous step's idle copy engine uploaded this
	// step's first promoted weights (the executor's prefetch).
	StartSlack float64
}

// Promotion is a solved problem: the units promoted this step.
type Promotion struct {
	Promote []bool  // by unit
	Time    float64 // predicted seconds of the step
	Exposed float64 // of which waiting for copies
	Count   int     // units promoted
}

// Timeline replays a choice exactly (slack not bucketed) and returns the
// step's time and the part spent waiting for copies.
func (p *PromoteProblem) Timeline(promote []bool) (time, exposed float64) {
	slack := min(p.StartSlack, p.MaxSlack)
	prev := CPU
	for i, u := range p.Units {
		on := CPU
		if u.Resident || promote[i] {
			on = GPU
		}
		dt := 0.0 // compute and switching: time the copy engine runs ahead
		if on != prev && i > 0 {
			if on == GPU {
				dt += u.ToGPU
			} else {
				dt += u.ToCPU
			}
		}
		wait := 0.0
		if promote[i] && !u.Resident {
			// The copy engine has run slack ahead; waiting for the rest
			// of this copy lets it run no further ahead.
			wait = max(u.Copy-slack, 0)
			exposed += wait
			slack = max(slack-u.Copy, 0)
		}
		if on == GPU {
			dt += u.GPU
		} else {
			dt += u.CPU
		}
		slack = min(slack+dt, p.MaxSlack)
		time += wait + dt
		prev = on
	}
	if prev == GPU {
		time += p.EndToCPU
	}
	return time, exposed
}

// Promote chooses the units to promote with a dynamic program over (unit,
// backend of the unit before, slack in buckets). Bucketing rounds the
// slack down, so the plan never counts on more hiding than it has; the
// reported time is the exact timeline of the choice.
func Promote(p PromoteProblem) (Promotion, error) {
	n := len(p.Units)
	if n == 0 {
		return Promotion{}, nil
	}
	bad := func(x float64) bool { return x < 0 || math.IsNaN(x) || math.IsInf(x, 0) }
	if bad(p.MaxSlack) || bad(p.EndToCPU) || bad(p.StartSlack) {
		return Promotion{}, errors.New("plan: invalid promotion bounds")
	}
	for i, u := range p.Units {
		if bad(u.CPU) || bad(u.GPU) || bad(u.Copy) || bad(u.ToGPU) || bad(u.ToCPU) || (u.Resident && u.Fixed) {
			return Promotion{}, fmt.Errorf("plan: promotion unit %d (%s) has invalid figures", i, u.Name)
		}
	}
	nb := p.Buckets
	if nb <= 0 {
		nb = 256
	}
	width := p.MaxSlack / float64(nb)
	// Slack beyond all the copies there are hides nothing more: a ring
	// much larger than the step's copies gets finer buckets (a whole
	// fraction of the width, so times on the coarse grid stay on it).
	var copies float64
	for _, u := range p.Units {
		if !u.Resident && !u.Fixed {
			copies += u.Copy
		}
	}
	if copies > 0 && copies < p.MaxSlack {
		width /= math.Floor(p.MaxSlack / copies)
		p.MaxSlack = width * float64(nb)
	}
	inv := 0.0
	if width > 0 {
		inv = 1 / width
	}
	bucket := func(s float64) int {
		return min(int(s*inv+1e-6), nb) // the epsilon absorbs rounding of sums
	}
	// The states of one unit, by backend*(nb+1) + bucket: the least time
	// to reach them (t), and in trail the state they came from and
	// whether the unit was promoted (from<<1 | promoted), for every unit:
	// one allocation, walked back once at the end.
	inf := math.Inf(1)
	states := nb + 1
	cur, next := make([]float64, 2*states), make([]float64, 2*states)
	for i := range cur {
		cur[i] = inf
	}
	cur[int(CPU)*states+bucket(min(p.StartSlack, p.MaxSlack))] = 0
	trail := make([]int32, n*2*states)
	for i, u := range p.Units {
		for j := range next {
			next[j] = inf
		}
		tr := trail[i*2*states : (i+1)*2*states]
		// The unit's options: where it runs and whether it is copied.
		var opts [2]struct {
			on      Backend
			promote bool
			run     float64 // its compute on that backend
			sw      float64 // the switch into it from the other backend
		}
		nopt := 0
		add := func(on Backend, promote bool) {
			o := &opts[nopt]
			o.on, o.promote = on, promote
			o.run, o.sw = u.CPU, u.ToCPU
			if on == GPU {
				o.run, o.sw = u.GPU, u.ToGPU
			}
			if i == 0 {
				o.sw = 0
			}
			nopt++
		}
		switch {
		case u.Resident:
			add(GPU, false)
		case u.Fixed || u.Copy <= 0:
			add(CPU, false)
		default:
			add(CPU, false)
			add(GPU, true)
		}
		for pb := 0; pb < 2; pb++ {
			for b := 0; b <= nb; b++ {
				from := pb*states + b
				t0 := cur[from]
				if t0 == inf {
					continue
				}
				slack := float64(b) * width
				for _, o := range opts[:nopt] {
					dt := o.run
					if Backend(pb) != o.on {
						dt += o.sw
					}
					s, wait := slack, 0.0
					if o.promote {
						wait = max(u.Copy-s, 0)
						s = max(s-u.Copy, 0)
					}
					s = min(s+dt, p.MaxSlack) // a wait adds no slack: the copy engine was busy
					k := int(o.on)*states + bucket(s)
					if t := t0 + wait + dt; t < next[k] {
						next[k] = t
						tr[k] = int32(from) << 1
						if o.promote {
							tr[k] |= 1
						}
					}
				}
			}
		}
		cur, next = next, cur
	}
	best, bk := inf, -1
	for k, t := range cur {
		if t == inf {
			continue
		}
		if k/states == int(GPU) {
			t += p.EndToCPU
		}
		if t < best {
			best, bk = t, k
		}
	}
	if bk < 0 {
		return Promotion{}, errors.New("plan: no promotion schedule")
	}
	pr := Promotion{Promote: make([]bool, n)}
	for i := n - 1; i >= 0; i-- {
		v := trail[i*2*states+bk]
		pr.Promote[i] = v&1 == 1
		bk = int(v >> 1)
	}
	for i := range p.Units {
		if pr.Promote[i] {
			pr.Count++
		}
	}
	pr.Time, pr.Exposed = p.Timeline(pr.Promote)
	return pr, nil
}
