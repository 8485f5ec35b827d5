package plan

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const mib = 1 << 20

// bruteForce tries every assignment that respects the pins and ties.
func bruteForce(p Problem) (best float64, on []Backend) {
	n := len(p.Units)
	best = math.Inf(1)
	cand := make([]Backend, n)
	for mask := 0; mask < 1<<n; mask++ {
		for i := range cand {
			cand[i] = Backend(mask >> i & 1)
		}
		if !p.Feasible(cand) {
			continue
		}
		t, _, bytes := p.Cost(cand)
		if bytes <= p.Budget && t < best-1e-15 {
			best, on = t, append([]Backend(nil), cand...)
		}
	}
	return best, on
}

// randomProblem draws units with fused and unfused costs, per-unit switch
// costs, some pins and sometimes a tie.
func randomProblem(r *rand.Rand, n int) Problem {
	p := Problem{Bucket: mib, ToGPU: r.Float64() * 2e-4, ToCPU: r.Float64() * 2e-4}
	var total int64
	for i := 0; i < n; i++ {
		u := Unit{Name: "u", Bytes: int64(1+r.IntN(64)) * mib, CPU: r.Float64() * 1e-3}
		u.GPU = u.CPU * (0.05 + r.Float64()) // mostly faster on the GPU, sometimes not
		if r.IntN(3) == 0 {                  // a fusion with the unit before that a switch breaks
			u.CPUAlone, u.GPUAlone = u.CPU*(1+r.Float64()*0.3), u.GPU*(1+r.Float64()*0.5)
		}
		if r.IntN(3) == 0 {
			u.ToGPU, u.ToCPU = r.Float64()*3e-4, r.Float64()*3e-4
		}
		switch r.IntN(10) {
		case 0:
			u.Pin = OnlyCPU
		case 1:
			u.Pin = OnlyGPU
			u.Bytes = 0 // as when scheduling a batch: resident already
		}
		total += u.Bytes
		p.Units = append(p.Units, u)
	}
	if n >= 3 && r.IntN(4) == 0 {
		a, b := r.IntN(n), r.IntN(n)
		if a != b && p.Units[a].Pin == Free && p.Units[b].Pin == Free {
			p.Ties = [][]int{{min(a, b), max(a, b)}}
		}
	}
	p.Budget = int64(r.Float64() * float64(total))
	p.Start, p.End = Backend(r.IntN(2)), Backend(r.IntN(2))
	return p
}

// TestStaticIsOptimal compares the dynamic program with exhaustive search on
// random problems whose sizes are whole buckets (so rounding is exact).
func TestStaticIsOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 600; trial++ {
		p := randomProblem(r, 1+r.IntN(12))
		want, _ := bruteForce(p)
		pl, err := Static(p)
		if math.IsInf(want, 1) {
			if err == nil {
				t.Fatalf("trial %d: infeasible problem solved: %+v", trial, pl)
			}
			continue
		}
		if err != nil {
			t.Fatalf("trial %d: %v", trial, err)
		}
		if math.Abs(pl.Time-want) > 1e-12 {
			t.Fatalf("trial %d: DP time %g, exhaustive %g", trial, pl.Time, want)
		}
		if pl.GPUBytes > p.Budget || !p.Feasible(pl.On) {
			t.Fatalf("trial %d: %d bytes placed (budget %d), feasible %v", trial, pl.GPUBytes, p.Budget, p.Feasible(pl.On))
		}
		g, _ := Greedy(p)
		if _, _, gb := p.Cost(g.On); gb <= p.Budget && p.Feasible(g.On) && g.Time < pl.Time-1e-12 {
			t.Fatalf("trial %d: greedy %g beats the DP %g", trial, g.Time, pl.Time)
		}
	}
}

func TestStaticChargesSwitches(t *testing.T) {
	// The middle unit saves 1 ms on the GPU but moving there and back
	// costs 2 ms: it must stay on the CPU. Without switch costs it moves.
	p := Problem{
		Units: []Unit{
			{Name: "a", Bytes: 100 * mib, CPU: 5e-3, GPU: 5e-3},
			{Name: "b", Bytes: 10 * mib, CPU: 2e-3, GPU: 1e-3},
			{Name: "c", Bytes: 100 * mib, CPU: 5e-3, GPU: 5e-3},
		},
		Budget: 50 * mib, ToGPU: 1e-3, ToCPU: 1e-3,
	}
	pl, err := Static(p)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Backend{CPU, CPU, CPU}, pl.On); diff != "" {
		t.Fatalf("with switch costs (-want +got):\n%s", diff)
	}
	p.ToGPU, p.ToCPU = 0, 0
	pl, _ = Static(p)
	if diff := cmp.Diff([]Backend{CPU, GPU, CPU}, pl.On); diff != "" {
		t.Fatalf("free switches (-want +got):\n%s", diff)
	}
	if pl.Switches != 2 || pl.GPUBytes != 10*mib {
		t.Errorf("switches %d, bytes %d", pl.Switches, pl.GPUBytes)
	}
}

func TestStaticEdges(t *testing.T) {
	units := []Unit{{Name: "a", Bytes: mib, CPU: 1, GPU: 0.1}, {Name: "b", Bytes: mib, CPU: 1, GPU: 0.1}}
	pl, err := Static(Problem{Units: units, Budget: 0, Bucket: mib})
	if err != nil {
		t.Fatal(err)
	}
	if pl.GPUBytes != 0 || pl.On[0] != CPU || pl.On[1] != CPU {
		t.Errorf("zero budget placed %v", pl.On)
	}
	pl, _ = Static(Problem{Units: units, Budget: 1 << 40, Bucket: mib})
	if pl.On[0] != GPU || pl.On[1] != GPU || pl.Time != 0.2 {
		t.Errorf("ample budget: %+v", pl)
	}
	pl, _ = Static(Problem{Units: nil, Budget: 10, Start: CPU, End: CPU})
	if len(pl.On) != 0 || pl.Time != 0 {
		t.Errorf("no units: %+v", pl)
	}
	if _, err := Static(Problem{Units: units, Budget: -1}); err == nil {
		t.Error("negative budget accepted")
	}
	if _, err := Static(Problem{Units: []Unit{{CPU: math.NaN()}}}); err == nil {
		t.Error("NaN time accepted")
	}
	// A size that is not a whole bucket is rounded up, never over budget.
	pl, _ = Static(Problem{Units: []Unit{{Bytes: mib + 1, CPU: 1, GPU: 0}}, Budget: mib + 1, Bucket: mib})
	if pl.GPUBytes > mib+1 {
		t.Errorf("over budget: %d", pl.GPUBytes)
	}
}

// layeredProblem is a model-like problem: layers of the same units
// (attention projections, the cache, an FFN) with realistic ratios.
func layeredProblem(r *rand.Rand, layers int) (Problem, int) {
	p := Problem{Bucket: mib, ToGPU: 20e-6, ToCPU: 20e-6}
	shape := []struct {
		bytes int64
		cpu   float64
	}{{14, 200e-6}, {3, 45e-6}, {3, 45e-6}, {2, 30e-6}, {14, 200e-6}, {50, 700e-6}, {50, 700e-6}, {70, 950e-6}}
	var total int64
	for l := 0; l < layers; l++ {
		for _, s := range shape {
			jitter := 0.8 + 0.4*r.Float64()
			u := Unit{Name: "u", Bytes: s.bytes * mib, CPU: s.cpu * jitter, GPU: s.cpu * jitter / (20 + 20*r.Float64())}
			u.CPUAlone, u.GPUAlone = u.CPU*1.05, u.GPU*1.2
			total += u.Bytes
			p.Units = append(p.Units, u)
		}
	}
	p.Budget = total / 2
	return p, len(shape)
}

// TestStaticBeatsSplits checks the DP against the greedy density ranking
// and against every layer split (the first k layers on the GPU, or the
// last k, or only the FFNs of some) on the same cost model.
func TestStaticBeatsSplits(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := 0; trial < 20; trial++ {
		p, per := layeredProblem(r, 4+r.IntN(20))
		layers := len(p.Units) / per
		p.Budget = int64(r.Float64() * float64(p.Budget) * 2)
		pl, err := Static(p)
		if err != nil {
			t.Fatal(err)
		}
		if pl.GPUBytes > p.Budget {
			t.Fatalf("over budget: %d > %d", pl.GPUBytes, p.Budget)
		}
		g, _ := Greedy(p)
		if g.Time < pl.Time-1e-12 {
			t.Fatalf("greedy %g beats the DP %g", g.Time, pl.Time)
		}
		try := func(name string, on []Backend) {
			if tm, _, b := p.Cost(on); b <= p.Budget && tm < pl.Time-1e-12 {
				t.Fatalf("trial %d: %s (%g s, %d bytes) beats the DP (%g s)", trial, name, tm, b, pl.Time)
			}
		}
		for k := 0; k <= layers; k++ {
			first, last, ffn := make([]Backend, len(p.Units)), make([]Backend, len(p.Units)), make([]Backend, len(p.Units))
			for i := range p.Units {
				l := i / per
				if l < k {
					first[i] = GPU
					ffn[i] = GPU
				}
				if l >= layers-k {
					last[i] = GPU
				}
				if l >= k && i%per < 5 { // attention of the other layers
					ffn[i] = GPU
				}
			}
			try("first layers", first)
			try("last layers", last)
			try("attention everywhere, FFN of the first layers", ffn)
		}
	}
}

// TestStaticMoEGroups: on a MoE-shaped problem (dense attention units
// used by every token, expert stacks that a token reads an eighth of), the
// dense units go first and expert stacks are placed whole.
func TestStaticMoEGroups(t *testing.T) {
	p := Problem{Bucket: mib, ToGPU: 15e-6, ToCPU: 15e-6}
	const layers = 12
	var dense int64
	for l := 0; l < layers; l++ {
		for _, b := range []int64{8, 1, 1, 8} { // q, k, v, o: read whole each token
			p.Units = append(p.Units, Unit{Name: "attn", Bytes: b * mib, CPU: float64(b) * 14e-6, GPU: float64(b) * 0.5e-6})
			dense += b * mib
		}
		// 128 experts, 8 used: the CPU reads an eighth of the stack.
		p.Units = append(p.Units, Unit{Name: "experts", Group: "expert", Bytes: 330 * mib, CPU: 330.0 / 16 * 14e-6, GPU: 330.0 / 16 * 0.5e-6})
	}
	p.Budget = dense + 3*330*mib
	pl, err := Static(p)
	if err != nil {
		t.Fatal(err)
	}
	experts := 0
	for i, u := range p.Units {
		if u.Group == "" && pl.On[i] != GPU {
			t.Errorf("dense unit %d left on the CPU while expert stacks take VRAM", i)
		}
		if u.Group == "expert" && pl.On[i] == GPU {
			experts++
		}
	}
	if experts != 3 {
		t.Errorf("%d expert stacks on the GPU, want the 3 that fit", experts)
	}
}

// TestStaticTies: a tied embedding/output pair is placed together and its
// bytes count once.
func TestStaticTies(t *testing.T) {
	p := Problem{Bucket: mib, Budget: 100 * mib, ToGPU: 1e-3, ToCPU: 1e-3,
		Units: []Unit{
			{Name: "embed", Bytes: 100 * mib, CPU: 1e-6, GPU: 2e-6},
			{Name: "layer", Bytes: 0, CPU: 1, GPU: 0.1, Pin: OnlyGPU},
			{Name: "output", Bytes: 100 * mib, CPU: 9e-3, GPU: 1e-4},
		},
		Ties: [][]int{{0, 2}}}
	pl, err := Static(p)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]Backend{GPU, GPU, GPU}, pl.On); diff != "" {
		t.Errorf("tied pair (-want +got):\n%s", diff)
	}
	if pl.GPUBytes != 100*mib {
		t.Errorf("tied bytes counted %d, want once (%d)", pl.GPUBytes, 100*mib)
	}
	p.Budget = 99 * mib
	pl, err = Static(p)
	if err != nil {
		t.Fatal(err)
	}
	if pl.On[0] != CPU || pl.On[2] != CPU {
		t.Errorf("over budget: the pair must stay on the CPU, got %v", pl.On)
	}
	p.Units[1].Pin, p.Units[1].Bytes = OnlyGPU, 0
	p.Units[0].Pin, p.Units[2].Pin = OnlyCPU, OnlyGPU
	p.Budget = 1 << 30
	if _, err := Static(p); err == nil {
		t.Error("a tie whose units are pinned apart was solved")
	}
}

func TestDensity(t *testing.T) {
	u := Unit{Bytes: 2 * mib, CPU: 3e-3, GPU: 1e-3}
	if d := u.Density(); math.Abs(d-1e-3/mib) > 1e-18 {
		t.Errorf("density %g", d)
	}
	if d := (Unit{Bytes: mib, CPU: 1, GPU: 2}).Density(); d >= 0 {
		t.Errorf("slower on GPU but density %g", d)
	}
}

// BenchmarkStatic40Layers plans a 40-layer dense model (7 tensors a layer)
// against a 4.5 GiB budget at the default bucket size.
func BenchmarkStatic40Layers(b *testing.B) {
	r := rand.New(rand.NewPCG(3, 4))
	p := randomProblem(r, 280)
	p.Budget = 4608 * mib
	p.Bucket = 0
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := Static(p); err != nil {
			b.Fatal(err)
		}
	}
}
