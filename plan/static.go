// Package plan decides where each weight tensor of a model runs. It is pure
// logic over measured numbers (times in seconds, sizes in bytes): no GPU, no
// model file, so tests drive it with made-up figures.
//
// The static placement follows the ATSInfer paper: rank tensors by
// performance density, the time a tensor saves on the GPU per byte of VRAM
// it occupies, and choose the set to keep in VRAM with a dynamic program
// over the tensors in execution order that also charges every switch
// between CPU and GPU (the activations have to cross the link).
package plan

import (
	"errors"
	"fmt"
	"math"
)

// Backend is where a unit runs.
type Backend uint8

const (
	CPU Backend = iota
	GPU
)

func (b Backend) String() string {
	if b == GPU {
		return "gpu"
	}
	return "cpu"
}

// Unit is one weight tensor together with the op that consumes it, with its
// measured cost on each backend for the workload being planned (decode at
// batch 1, or a prefill batch).
type Unit struct {
	Name  string
	Bytes int64   // VRAM the tensor needs when resident
	CPU   float64 // seconds on the CPU
	GPU   float64 // seconds on the GPU, weights resident
}

// Density is the paper's empirical performance density: time saved on the
// GPU per byte of VRAM. Units that are not faster on the GPU have density
// <= 0 and are never worth VRAM on their own.
func (u Unit) Density() float64 {
	if u.Bytes <= 0 {
		return math.Inf(1)
	}
	return (u.CPU - u.GPU) / float64(u.Bytes)
}

// Problem is a static placement to solve.
type Problem struct {
	Units  []Unit // in execution order
	Budget int64  // VRAM available for weights, bytes
	// Bucket is the granularity of the VRAM axis of the dynamic program in
	// bytes (0: Budget/4096, at least 1 MiB). Each unit's size is rounded
	// up to whole buckets, so the plan never exceeds the budget.
	Bucket int64
	// ToGPU and ToCPU are the costs, in seconds, of moving the activations
	// across the link when consecutive units sit on different backends.
	ToGPU, ToCPU float64
	// Start and End are where the activations are before the first unit
	// and must be after the last (the embedding lookup and the sampler run
	// on the CPU, so both are usually CPU).
	Start, End Backend
}

// Placement is a solved problem.
type Placement struct {
	On       []Backend // per unit
	GPUBytes int64     // VRAM used by the units placed on the GPU
	Time     float64   // predicted seconds: unit times plus switches
	Switches int       // CPU<->GPU transitions, including to Start and End
}

// Cost evaluates an assignment of units to backends under p.
func (p *Problem) Cost(on []Backend) (time float64, switches int, bytes int64) {
	prev := p.Start
	for i, u := range p.Units {
		b := on[i]
		if b != prev {
			switches++
			time += p.switchCost(b)
		}
		if b == GPU {
			time += u.GPU
			bytes += u.Bytes
		} else {
			time += u.CPU
		}
		prev = b
	}
	if prev != p.End {
		switches++
		time += p.switchCost(p.End)
	}
	return time, switches, bytes
}

func (p *Problem) switchCost(to Backend) float64 {
	if to == GPU {
		return p.ToGPU
	}
	return p.ToCPU
}

func (p *Problem) check() error {
	if p.Budget < 0 {
		return fmt.Errorf("plan: negative VRAM budget %d", p.Budget)
	}
	for i, u := range p.Units {
		if u.Bytes < 0 || u.CPU < 0 || u.GPU < 0 || math.IsNaN(u.CPU) || math.IsNaN(u.GPU) {
			return fmt.Errorf("plan: unit %d (%s) has invalid figures: %d bytes, cpu %g s, gpu %g s", i, u.Name, u.Bytes, u.CPU, u.GPU)
		}
	}
	if p.ToGPU < 0 || p.ToCPU < 0 {
		return errors.New("plan: negative switch cost")
	}
	return nil
}

// Static solves p exactly (up to the bucket rounding of sizes) with a
// dynamic program over (unit, VRAM buckets used, backend of the previous
// unit). Its cost is O(units × buckets).
func Static(p Problem) (Placement, error) {
	if err := p.check(); err != nil {
		return Placement{}, err
	}
	n := len(p.Units)
	bucket := p.Bucket
	if bucket <= 0 {
		bucket = max(p.Budget/4096, 1<<20)
	}
	capB := int(p.Budget / bucket)
	need := make([]int, n)
	for i, u := range p.Units {
		need[i] = int((u.Bytes + bucket - 1) / bucket)
	}
	// cost[b][j]: least time so far with j buckets used and the last unit
	// on backend b. choice records the backend each state took per unit.
	inf := math.Inf(1)
	width := capB + 1
	cur := [2][]float64{make([]float64, width), make([]float64, width)}
	next := [2][]float64{make([]float64, width), make([]float64, width)}
	for b := range cur {
		for j := range cur[b] {
			cur[b][j] = inf
		}
	}
	cur[p.Start][0] = 0
	// from[i][b][j] is the backend of unit i-1 in the best path reaching
	// state (b, j) after unit i.
	from := make([][2][]int8, n)
	for i, u := range p.Units {
		for b := range next {
			for j := range next[b] {
				next[b][j] = inf
			}
		}
		from[i] = [2][]int8{make([]int8, width), make([]int8, width)}
		for pb := Backend(0); pb < 2; pb++ {
			for j, c := range cur[pb] {
				if c == inf {
					continue
				}
				// Unit i on the CPU.
				t := c + u.CPU
				if pb != CPU {
					t += p.ToCPU
				}
				if t < next[CPU][j] {
					next[CPU][j] = t
					from[i][CPU][j] = int8(pb)
				}
				// Unit i on the GPU, if it fits.
				if j+need[i] <= capB {
					t := c + u.GPU
					if pb != GPU {
						t += p.ToGPU
					}
					if jj := j + need[i]; t < next[GPU][jj] {
						next[GPU][jj] = t
						from[i][GPU][jj] = int8(pb)
					}
				}
			}
		}
		cur, next = next, cur
	}
	// Close with the move to End, pick the best final state.
	best, bestB, bestJ := inf, CPU, 0
	for b := Backend(0); b < 2; b++ {
		for j, c := range cur[b] {
			if c == inf {
				continue
			}
			if b != p.End {
				c += p.switchCost(p.End)
			}
			if c < best {
				best, bestB, bestJ = c, b, j
			}
		}
	}
	on := make([]Backend, n)
	b, j := bestB, bestJ
	for i := n - 1; i >= 0; i-- {
		on[i] = b
		pb := Backend(from[i][b][j])
		if b == GPU {
			j -= need[i]
		}
		b = pb
	}
	pl := Placement{On: on}
	pl.Time, pl.Switches, pl.GPUBytes = p.Cost(on)
	return pl, nil
}

// Greedy fills the budget by descending performance density, ignoring the
// cost of switches: the paper's ranking on its own, kept as a baseline that
// Static must never lose to.
func Greedy(p Problem) (Placement, error) {
	if err := p.check(); err != nil {
		return Placement{}, err
	}
	order := make([]int, len(p.Units))
	for i := range order {
		order[i] = i
	}
	sortByDensity(order, p.Units)
	on := make([]Backend, len(p.Units))
	var used int64
	for _, i := range order {
		u := p.Units[i]
		if u.Density() > 0 && used+u.Bytes <= p.Budget {
			on[i] = GPU
			used += u.Bytes
		}
	}
	pl := Placement{On: on}
	pl.Time, pl.Switches, pl.GPUBytes = p.Cost(on)
	return pl, nil
}
