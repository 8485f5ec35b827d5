package plan

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const mib = 1 << 20

// bruteForce tries every assignment.
func bruteForce(p Problem) (best float64, on []Backend) {
	n := len(p.Units)
	best = math.Inf(1)
	cand := make([]Backend, n)
	for mask := 0; mask < 1<<n; mask++ {
		for i := range cand {
			cand[i] = Backend(mask >> i & 1)
		}
		t, _, bytes := p.Cost(cand)
		if bytes <= p.Budget && t < best-1e-15 {
			best, on = t, append([]Backend(nil), cand...)
		}
	}
	return best, on
}

func randomProblem(r *rand.Rand, n int) Problem {
	p := Problem{Bucket: mib, ToGPU: r.Float64() * 2e-4, ToCPU: r.Float64() * 2e-4}
	var total int64
	for i := 0; i < n; i++ {
		u := Unit{Name: "u", Bytes: int64(1+r.IntN(64)) * mib, CPU: r.Float64() * 1e-3}
		u.GPU = u.CPU * (0.05 + r.Float64()) // mostly faster on the GPU, sometimes not
		total += u.Bytes
		p.Units = append(p.Units, u)
	}
	p.Budget = int64(r.Float64() * float64(total))
	p.Start, p.End = Backend(r.IntN(2)), Backend(r.IntN(2))
	return p
}

// TestStaticIsOptimal compares the dynamic program with exhaustive search on
// random problems whose sizes are whole buckets (so rounding is exact).
func TestStaticIsOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for trial := 0; trial < 300; trial++ {
		p := randomProblem(r, 1+r.IntN(12))
		pl, err := Static(p)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := bruteForce(p)
		if math.Abs(pl.Time-want) > 1e-12 {
			t.Fatalf("trial %d: DP time %g, exhaustive %g", trial, pl.Time, want)
		}
		if pl.GPUBytes > p.Budget {
			t.Fatalf("trial %d: %d bytes placed over the budget %d", trial, pl.GPUBytes, p.Budget)
		}
		g, _ := Greedy(p)
		if g.Time < pl.Time-1e-12 {
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
