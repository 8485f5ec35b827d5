package plan

import (
	"math"
	"math/rand/v2"
	"testing"
)

// bruteForcePromote tries every choice of promoted units.
func bruteForcePromote(p PromoteProblem) (best float64, choice []bool) {
	var free []int
	for i, u := range p.Units {
		if !u.Resident && !u.Fixed && u.Copy > 0 {
			free = append(free, i)
		}
	}
	best = math.Inf(1)
	cand := make([]bool, len(p.Units))
	for mask := 0; mask < 1<<len(free); mask++ {
		for k, i := range free {
			cand[i] = mask>>k&1 == 1
		}
		if t, _ := p.Timeline(cand); t < best-1e-12 {
			best, choice = t, append([]bool(nil), cand...)
		}
	}
	return best, choice
}

// randomPromote draws a step whose times are whole multiples of the slack
// bucket, so the dynamic program's bucketing is exact.
func randomPromote(r *rand.Rand, n int) PromoteProblem {
	const q = 1e-4 // the bucket
	nb := 64
	p := PromoteProblem{MaxSlack: q * float64(nb), Buckets: nb, EndToCPU: q * float64(r.IntN(3))}
	tick := func(lo, hi int) float64 { return q * float64(lo+r.IntN(hi-lo+1)) }
	for i := 0; i < n; i++ {
		u := PromoteUnit{Name: "u", CPU: tick(1, 40), GPU: tick(0, 3), Copy: tick(1, 30), ToGPU: tick(0, 2), ToCPU: tick(0, 2)}
		switch r.IntN(6) {
		case 0:
			u.Resident = true
		case 1:
			u.Fixed = true
		}
		p.Units = append(p.Units, u)
	}
	return p
}

// TestPromoteIsOptimal compares the promotion DP with exhaustive search.
func TestPromoteIsOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for trial := 0; trial < 400; trial++ {
		p := randomPromote(r, 1+r.IntN(12))
		want, _ := bruteForcePromote(p)
		got, err := Promote(p)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(got.Time-want) > 1e-9 {
			t.Fatalf("trial %d: DP %g s, exhaustive %g s", trial, got.Time, want)
		}
		for i, u := range p.Units {
			if got.Promote[i] && (u.Resident || u.Fixed) {
				t.Fatalf("trial %d: promoted unit %d that is resident or fixed", trial, i)
			}
		}
	}
}

// TestPromoteHidesCopies: copies that fit behind the CPU work before them
// are taken; with no ring nothing is hidden and a slow link promotes
// nothing.
func TestPromoteHidesCopies(t *testing.T) {
	// A CPU unit of 15 ms, then two units each 5 ms on the CPU, 0.1 ms on
	// the GPU and 6 ms to copy: with room for 15 ms of copies in the ring
	// both hide behind the first unit; without, each copy would cost more
	// than the CPU.
	p := PromoteProblem{MaxSlack: 15e-3, Units: []PromoteUnit{
		{Name: "a", CPU: 15e-3, Fixed: true},
		{Name: "b", CPU: 5e-3, GPU: 1e-4, Copy: 6e-3},
		{Name: "c", CPU: 5e-3, GPU: 1e-4, Copy: 6e-3},
	}}
	got, err := Promote(p)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Promote[1] || !got.Promote[2] || got.Exposed > 1e-9 {
		t.Fatalf("promotion %v, exposed %g", got.Promote, got.Exposed)
	}
	p.MaxSlack = 0 // no ring to copy ahead into: every copy is exposed
	if got, _ = Promote(p); got.Promote[1] || got.Promote[2] {
		t.Errorf("without a ring: promoted %v", got.Promote)
	}
	p.MaxSlack = 15e-3
	p.Units[1].Copy, p.Units[2].Copy = 40e-3, 40e-3 // a slow link
	if got, _ = Promote(p); got.Promote[1] || got.Promote[2] {
		t.Errorf("slow link: promoted %v", got.Promote)
	}
}

func TestReplanner(t *testing.T) {
	var r Replanner
	e := Estimates{CPU: 1, GPU: 1, Link: 50e9, Overlap: 1}
	if !r.Step(e) {
		t.Fatal("no plan yet: should plan")
	}
	r.Planned(e)
	moved := e
	moved.CPU = 1.2 // 20%
	for step := 1; step < 5; step++ {
		if r.Step(moved) {
			t.Fatalf("step %d: re-planned before the plan is 5 steps old", step)
		}
	}
	if !r.Step(moved) {
		t.Fatal("a 20% move after 5 steps: should re-plan")
	}
	r.Planned(moved)
	small := moved
	small.Link *= 1.1 // 10%
	for step := 0; step < 20; step++ {
		if r.Step(small) {
			t.Fatalf("a 10%% move re-planned at step %d", step)
		}
	}
	var est Estimator
	got := est.Observe(Estimates{CPU: 1, GPU: 2, Link: 10})
	got = est.Observe(Estimates{CPU: 2, Link: 0})
	if math.Abs(got.CPU-1.3) > 1e-12 || got.GPU != 2 || got.Link != 10 {
		t.Errorf("estimates %+v", got)
	}
}

// Waiting for a copy does not let the copy engine run ahead: it was busy
// with that copy. Two units whose copies take ten times their compute
// cost their copies back to back, plus the last one's compute.
func TestTimelineWaitIsNotSlack(t *testing.T) {
	p := PromoteProblem{MaxSlack: 100, Units: []PromoteUnit{
		{Name: "a", CPU: 50, GPU: 1, Copy: 10},
		{Name: "b", CPU: 50, GPU: 1, Copy: 10},
	}}
	got, exposed := p.Timeline([]bool{true, true})
	if got != 21 || exposed != 19 {
		t.Errorf("two copies of 10 with compute 1: %g s (%g waiting), want 21 (19)", got, exposed)
	}
	sol, err := Promote(p)
	if err != nil {
		t.Fatal(err)
	}
	if sol.Time != 21 {
		t.Errorf("Promote: %g s, want 21 (both promoted)", sol.Time)
	}
}

// The hand-over's estimate calls for a new plan only when it moved by the
// threshold and by switchMoved: a GPU another process shares (tens of
// microseconds more a stretch), not the microseconds between idle steps.
func TestReplannerSwitch(t *testing.T) {
	base := Estimates{CPU: 1, GPU: 1, Overlap: 1, Link: 5e10, Switch: 20e-6}
	cases := []struct {
		sw   float64
		want bool
	}{{24e-6, false}, {28e-6, false}, {35e-6, true}, {120e-6, true}, {5e-6, true}}
	for _, c := range cases {
		r := agedReplanner(base)
		e := base
		e.Switch = c.sw
		if got := r.Step(e); got != c.want {
			t.Errorf("hand-over %g µs after %g µs: re-plan %v, want %v", 1e6*c.sw, 1e6*base.Switch, got, c.want)
		}
	}
}

// agedReplanner is a Replanner that planned at base and has run five
// steps there, old enough to re-plan.
func agedReplanner(base Estimates) *Replanner {
	var r Replanner
	r.Planned(base)
	for range 5 {
		r.Step(base)
	}
	return &r
}

// StepBy scales the threshold: a move that re-plans at 1 does not at 3.
func TestReplannerStepBy(t *testing.T) {
	base := Estimates{CPU: 1, GPU: 1, Overlap: 1, Link: 5e10}
	for _, c := range []struct {
		cpu   float64
		scale float64
		want  bool
	}{{1.2, 1, true}, {1.2, 3, false}, {1.5, 3, true}, {0.5, 3, true}} {
		r := agedReplanner(base)
		e := base
		e.CPU = c.cpu
		if got := r.StepBy(e, c.scale); got != c.want {
			t.Errorf("CPU ×%g at scale %g: re-plan %v, want %v", c.cpu, c.scale, got, c.want)
		}
	}
}

// BenchmarkPromote14B solves a decode step's promotion at the Qwen3-14B
// shape: 322 units (40 layers of Q, K, V, attention, output, gate, up,
// down; the embedding and the head), half of the products resident, a
// ring of 144 MiB at 50 GB/s, the default 256 buckets. The promoter runs
// it at every re-plan, so its cost is the re-planning cost.
func BenchmarkPromote14B(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	const link = 50e9
	p := PromoteProblem{MaxSlack: 144 << 20 / link, EndToCPU: 2e-5}
	add := func(bytes float64, attention bool) {
		u := PromoteUnit{Name: "u", ToGPU: 1e-5, ToCPU: 1e-5}
		if attention {
			u.CPU, u.GPU, u.Fixed = 1e-4, 3e-5, r.IntN(2) == 0
			u.Resident = !u.Fixed
		} else {
			u.CPU, u.GPU, u.Copy = bytes/100e9, bytes/3e12+5e-6, bytes/link
			u.Resident = r.IntN(2) == 0
		}
		p.Units = append(p.Units, u)
	}
	p.Units = append(p.Units, PromoteUnit{Name: "embd", CPU: 1e-6, Fixed: true})
	for l := 0; l < 40; l++ {
		for _, mb := range []float64{14, 3, 3} { // q, k, v
			add(mb*1e6, false)
		}
		add(0, true)
		for _, mb := range []float64{14, 49, 49, 60} { // output, gate, up, down
			add(mb*1e6, false)
		}
	}
	add(500e6, false) // the head
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Promote(p); err != nil {
			b.Fatal(err)
		}
	}
}

// Weights the previous step's idle copy engine already uploaded (the
// executor's prefetch) hide a first unit's copy that a cold start could
// not: promoting it pays only with the start slack, and the timeline
// counts no wait for it.
func TestPromoteStartSlack(t *testing.T) {
	p := PromoteProblem{MaxSlack: 2, Units: []PromoteUnit{
		{Name: "a", CPU: 1, GPU: 0.1, Copy: 1.5, ToGPU: 0.01, ToCPU: 0.01},
		{Name: "b", CPU: 1, Fixed: true, ToGPU: 0.01, ToCPU: 0.01},
	}}
	cold, err := Promote(p)
	if err != nil {
		t.Fatal(err)
	}
	p.StartSlack = 1.5
	warm, err := Promote(p)
	if err != nil {
		t.Fatal(err)
	}
	if cold.Count != 0 || warm.Count != 1 || !warm.Promote[0] {
		t.Fatalf("promoted cold %v, with the start slack %v: want none, then the first unit", cold.Promote, warm.Promote)
	}
	if want := 0.1 + 0.01 + 1; math.Abs(warm.Time-want) > 1e-9 || warm.Exposed != 0 {
		t.Errorf("time %g (exposed %g), want %g with nothing exposed", warm.Time, warm.Exposed, want)
	}
	p.StartSlack = 5 // more than the ring holds counts as the ring
	if tl, _ := p.Timeline([]bool{true, false}); math.Abs(tl-warm.Time) > 1e-9 {
		t.Errorf("start slack beyond the ring: time %g, want %g", tl, warm.Time)
	}
	p.StartSlack = math.NaN()
	if _, err := Promote(p); err == nil {
		t.Error("a NaN start slack: no error")
	}
}
