// Package plan decides where each weight tensor of a model runs. It is pure
// logic over measured numbers (times in seconds, sizes in bytes): no GPU, no
// model file, so tests drive it with made-up figures.
//
// The static placement follows the ATSInfer paper: rank tensors by
// performance density, the time a tensor saves on the GPU per byte of VRAM
// it occupies, and choose the set to keep in VRAM with a dynamic program
// over the tensors in execution order that also charges every switch
// between CPU and GPU (the activations have to cross the link) and the
// fusions a switch breaks.
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

// Pin restricts a unit to one backend.
type Pin uint8

const (
	Free    Pin = iota // either backend
	OnlyCPU            // e.g. attention whose KV cache is on the host
	OnlyGPU            // e.g. a resident unit when scheduling a batch
)

// Unit is one weight tensor together with the op that consumes it (see
// runtime.Unit), with its measured cost on each backend for the workload
// being planned (decode at batch 1, or a prefill batch).
type Unit struct {
	Name  string
	Group string // "expert" for MoE expert stacks, else "" (reporting)
	Bytes int64  // VRAM the unit needs when resident
	// CPU and GPU are the seconds the unit takes when the unit before it
	// runs on the same backend, so the fusions across that boundary hold
	// (shared quantization of an input, a fused add and norm).
	CPU, GPU float64
	// CPUAlone and GPUAlone are the seconds when the unit before it runs
	// on the other backend and those fusions break (0: as CPU and GPU).
	CPUAlone, GPUAlone float64
	// ToGPU and ToCPU are the cost of switching backend just before the
	// unit: its input activations cross the link (0: the Problem's).
	ToGPU, ToCPU float64
	Pin          Pin
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
	Budget int64  // VRAM available for units, bytes
	// Bucket is the granularity of the VRAM axis of the dynamic program in
	// bytes (0: Budget/4096, at least 1 MiB). Each unit's size is rounded
	// up to whole buckets, so the plan never exceeds the budget.
	Bucket int64
	// ToGPU and ToCPU are the default switch costs (a unit's own replace
	// them), and the cost of reaching End after the last unit.
	ToGPU, ToCPU float64
	// Start and End are where the activations are before the first unit
	// and must be after the last.
	Start, End Backend
	// Ties are groups of units that share one tensor (a tied embedding and
	// output matrix): they are placed on the same backend and its bytes
	// count once (the first unit's Bytes; the others' are ignored).
	Ties [][]int
}

// Placement is a solved problem.
type Placement struct {
	On       []Backend // per unit
	GPUBytes int64     // VRAM used by the units placed on the GPU
	Time     float64   // predicted seconds: unit times plus switches
	Switches int       // CPU<->GPU transitions, including to Start and End
}

// step is the cost of unit u on b after a unit on prev.
func (p *Problem) step(u *Unit, prev, b Backend) float64 {
	t := u.CPU
	alone := u.CPUAlone
	if b == GPU {
		t, alone = u.GPU, u.GPUAlone
	}
	if prev == b {
		return t
	}
	if alone > 0 {
		t = alone
	}
	return t + p.switchCost(u, b)
}

func (p *Problem) switchCost(u *Unit, to Backend) float64 {
	c := p.ToCPU
	if to == GPU {
		c = p.ToGPU
		if u != nil && u.ToGPU > 0 {
			c = u.ToGPU
		}
	} else if u != nil && u.ToCPU > 0 {
		c = u.ToCPU
	}
	return c
}

// tiedSkip marks the units of ties whose bytes do not count (all but the
// first of each group).
func (p *Problem) tiedSkip() []bool {
	skip := make([]bool, len(p.Units))
	for _, t := range p.Ties {
		for _, i := range t[1:] {
			skip[i] = true
		}
	}
	return skip
}

// Cost evaluates an assignment of units to backends under p.
func (p *Problem) Cost(on []Backend) (time float64, switches int, bytes int64) {
	prev := p.Start
	skip := p.tiedSkip()
	for i := range p.Units {
		u := &p.Units[i]
		b := on[i]
		if b != prev {
			switches++
		}
		time += p.step(u, prev, b)
		if b == GPU && !skip[i] {
			bytes += u.Bytes
		}
		prev = b
	}
	if prev != p.End {
		switches++
		time += p.switchCost(nil, p.End)
	}
	return time, switches, bytes
}

// Feasible says whether on respects the pins and ties.
func (p *Problem) Feasible(on []Backend) bool {
	for i, u := range p.Units {
		if (u.Pin == OnlyCPU && on[i] != CPU) || (u.Pin == OnlyGPU && on[i] != GPU) {
			return false
		}
	}
	for _, t := range p.Ties {
		for _, i := range t[1:] {
			if on[i] != on[t[0]] {
				return false
			}
		}
	}
	return true
}

func (p *Problem) check() error {
	if p.Budget < 0 {
		return fmt.Errorf("plan: negative VRAM budget %d", p.Budget)
	}
	bad := func(x float64) bool { return x < 0 || math.IsNaN(x) || math.IsInf(x, 0) }
	for i, u := range p.Units {
		if u.Bytes < 0 || bad(u.CPU) || bad(u.GPU) || bad(u.CPUAlone) || bad(u.GPUAlone) || bad(u.ToGPU) || bad(u.ToCPU) {
			return fmt.Errorf("plan: unit %d (%s) has invalid figures: %d bytes, cpu %g s (alone %g), gpu %g s (alone %g), switch %g/%g s",
				i, u.Name, u.Bytes, u.CPU, u.CPUAlone, u.GPU, u.GPUAlone, u.ToGPU, u.ToCPU)
		}
	}
	if bad(p.ToGPU) || bad(p.ToCPU) {
		return errors.New("plan: invalid switch cost")
	}
	for _, t := range p.Ties {
		for _, i := range t {
			if i < 0 || i >= len(p.Units) {
				return fmt.Errorf("plan: tie names unit %d of %d", i, len(p.Units))
			}
		}
	}
	return nil
}

// ErrInfeasible is returned when the pins leave no placement within the
// budget.
var ErrInfeasible = errors.New("plan: no placement satisfies the pins within the budget")

// Static solves p exactly (up to the bucket rounding of sizes) with a
// dynamic program over (unit, VRAM buckets used, backend of the previous
// unit). Its cost is O(units × buckets). Ties are solved by trying each
// assignment of the tied groups (there is one at most in practice).
func Static(p Problem) (Placement, error) {
	if err := p.check(); err != nil {
		return Placement{}, err
	}
	if len(p.Ties) > 8 {
		return Placement{}, fmt.Errorf("plan: %d tied groups (at most 8)", len(p.Ties))
	}
	best := Placement{Time: math.Inf(1)}
	found := false
	for mask := 0; mask < 1<<len(p.Ties); mask++ {
		q := p
		q.Units = append([]Unit(nil), p.Units...)
		ok := true
		for k, t := range p.Ties {
			pin := OnlyCPU
			if mask>>k&1 == 1 {
				pin = OnlyGPU
			}
			for j, i := range t {
				if q.Units[i].Pin != Free && q.Units[i].Pin != pin {
					ok = false
				}
				q.Units[i].Pin = pin
				if j > 0 {
					q.Units[i].Bytes = 0
				}
			}
		}
		if !ok {
			continue
		}
		q.Ties = nil
		pl, err := solve(q)
		if errors.Is(err, ErrInfeasible) {
			continue
		}
		if err != nil {
			return Placement{}, err
		}
		if pl.Time < best.Time {
			best, found = pl, true
		}
	}
	if !found {
		return Placement{}, ErrInfeasible
	}
	best.Time, best.Switches, best.GPUBytes = p.Cost(best.On)
	return best, nil
}

// solve is the dynamic program of Static, without ties.
func solve(p Problem) (Placement, error) {
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
	// on backend b.
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
	for i := range p.Units {
		u := &p.Units[i]
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
				if u.Pin != OnlyGPU {
					if t := c + p.step(u, pb, CPU); t < next[CPU][j] {
						next[CPU][j] = t
						from[i][CPU][j] = int8(pb)
					}
				}
				if u.Pin != OnlyCPU && j+need[i] <= capB {
					if t, jj := c+p.step(u, pb, GPU), j+need[i]; t < next[GPU][jj] {
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
				c += p.switchCost(nil, p.End)
			}
			if c < best {
				best, bestB, bestJ = c, b, j
			}
		}
	}
	if best == inf {
		return Placement{}, ErrInfeasible
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
// Static must never lose to. Pins and ties are respected.
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
	tie := map[int][]int{}
	for _, t := range p.Ties {
		for _, i := range t {
			tie[i] = t
		}
	}
	var used int64
	for i, u := range p.Units {
		if u.Pin == OnlyGPU {
			on[i] = GPU
			used += u.Bytes
		}
	}
	for _, i := range order {
		u := p.Units[i]
		if on[i] == GPU || u.Pin == OnlyCPU || u.Density() <= 0 {
			continue
		}
		group := []int{i}
		if t := tie[i]; t != nil {
			group = t
		}
		ok := true
		for _, k := range group {
			ok = ok && p.Units[k].Pin != OnlyCPU
		}
		if ok && used+u.Bytes <= p.Budget {
			for _, k := range group {
				on[k] = GPU
			}
			used += u.Bytes
		}
	}
	pl := Placement{On: on}
	pl.Time, pl.Switches, pl.GPUBytes = p.Cost(on)
	return pl, nil
}
