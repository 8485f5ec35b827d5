package placement

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/ir"
)

// repackHybrid repacks only host units' matrices, never the embedding or a
// GPU-resident matrix, within what the resident matrices give back plus
// a thirty-second of the weights, dense products first.
func TestRepackHybrid(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	w := hostWeights(t, m)
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	var total, released int64
	for i, u := range units {
		for _, w := range u.Mats {
			total += w.Bytes()
		}
		if u.Layer%2 == 1 { // odd layers resident
			pl.Units[i].Backend = executor.BackendGPU
			for _, w := range u.Mats {
				released += w.Bytes()
			}
		}
	}
	got := RepackHybrid(w, m, pl)
	if !m.File.Mapped {
		released = 0
	}
	if limit := released + total/32; got > limit {
		t.Fatalf("repacked %d bytes, over the allowance %d", got, limit)
	}
	if got == 0 {
		if !w.Repackable(units[1].Mats[0]) {
			t.Skip("this CPU level has no kernels for repacked weights (noasm, or not amd64)")
		}
		t.Fatal("nothing repacked")
	}
	for i, u := range units {
		for _, x := range u.Mats {
			packed := w.Repacked(x)
			switch {
			case packed && pl.resident(i):
				t.Errorf("%s is GPU-resident but was repacked", x.Name)
			case packed && u.Lookup:
				t.Errorf("the embedding %s was repacked", x.Name)
			}
		}
	}
	if again := RepackHybrid(w, m, pl); again != got {
		t.Errorf("a second call repacked more: %d after %d", again, got)
	}
}

// keptPlan takes what fits the ring, best savings per byte first, never a
// resident unit, and predicts its time with no copies.
func TestKeptPlan(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	prof := &plan.Profile{Batches: []int{1}, Switch: []plan.Link{{Latency: 1e-6, BytesPerSec: 1e10}}, Stream: plan.Link{BytesPerSec: 1e10}}
	var ring, streamable int64
	for i, u := range units {
		// Matrices save CPU time in proportion to their bytes, the FFN
		// twice as much per byte as the rest; attention is resident.
		cpuT, gpuT := 1e-9*float64(u.Bytes), 1e-10*float64(u.Bytes)
		if strings.HasPrefix(u.Role, "ffn") {
			cpuT *= 2
		}
		prof.Units = append(prof.Units, plan.UnitTimes{Name: u.Name, CPU: []float64{cpuT}, GPU: []float64{gpuT}})
		if u.Anchor == ir.AnchorCache {
			pl.Units[i].Backend = executor.BackendGPU
		}
		if u.Streamable && u.Anchor != ir.AnchorCache {
			streamable += u.Bytes + 256*int64(len(u.Mats))
		}
	}
	ring = streamable / 3
	p := &promoter{prof: prof, ring: ring, units: units, resident: pl.resident, nvocab: m.Prog.Hyper.NVocab}
	sol := p.keptPlan(plan.Estimates{CPU: 1, GPU: 1, Link: 1e10, Overlap: 1})
	if sol.Count == 0 {
		t.Fatal("nothing kept")
	}
	var used int64
	for i, on := range sol.Promote {
		if !on {
			continue
		}
		u := units[i]
		if pl.resident(i) || !u.Streamable {
			t.Errorf("kept %s, which is resident or cannot stream", u.Name)
		}
		used += u.Bytes + 256*int64(len(u.Mats))
	}
	if used > ring {
		t.Errorf("kept %d bytes in a ring of %d", used, ring)
	}
	// An FFN unit (more saved per byte) is left out only when it does not
	// fit what is left.
	for i, u := range units {
		if b := u.Bytes + 256*int64(len(u.Mats)); strings.HasPrefix(u.Role, "ffn") && !sol.Promote[i] && b <= ring-used {
			t.Errorf("left out %s (%d bytes) with %d bytes of the ring free", u.Name, b, ring-used)
		}
	}
	pr := p.problemFor(plan.Estimates{CPU: 1, GPU: 1, Link: 1e10, Overlap: 1})
	none, _ := pr.Timeline(make([]bool, len(units)))
	if sol.Time >= none {
		t.Errorf("kept plan predicted %g s, no promotion %g s", sol.Time, none)
	}
}

// TestHostBound: the host memory's bound on a decode step counts the
// CPU's matrix bytes and the copied bytes at the profile's rate, less
// what copies do during the GPU's segments, plus those segments; a kept
// plan copies nothing; no rate, no bound.
func TestHostBound(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	const rate, gpuPerByte = 1e9, 1e-12
	prof := &plan.Profile{Batches: []int{1}, HostRead: rate}
	for _, u := range units {
		prof.Units = append(prof.Units, plan.UnitTimes{Name: u.Name, CPU: []float64{float64(u.Bytes) / rate}, GPU: []float64{gpuPerByte * float64(u.Bytes)}})
	}
	p := &promoter{prof: prof, units: units, resident: pl.resident, nvocab: m.Prog.Hyper.NVocab}
	e := plan.Estimates{CPU: 1, GPU: 1, Link: 1e10, Overlap: 1}
	var cpuBytes float64
	ffn := -1
	for i, u := range units {
		if u.Products() {
			cpuBytes += float64(u.DecodeBytes)
		}
		if ffn < 0 && u.Streamable && strings.HasPrefix(u.Role, "ffn") {
			ffn = i
		}
	}
	none := make([]bool, len(units))
	if got, want := p.hostBound(none, false, e), cpuBytes/rate; math.Abs(got-want) > 1e-12 {
		t.Errorf("nothing on the GPU: bound %g, want %g", got, want)
	}
	one := slices.Clone(none)
	one[ffn] = true
	u := units[ffn]
	tGPU := gpuPerByte * float64(u.Bytes)
	hidden := min(float64(u.Bytes), tGPU*e.Link)
	want := (cpuBytes-float64(u.DecodeBytes)+float64(u.Bytes)-hidden)/rate + tGPU
	if got := p.hostBound(one, false, e); math.Abs(got-want) > 1e-12 {
		t.Errorf("%s copied each step: bound %g, want %g", u.Name, got, want)
	}
	want = (cpuBytes-float64(u.DecodeBytes))/rate + tGPU
	if got := p.hostBound(one, true, e); math.Abs(got-want) > 1e-12 {
		t.Errorf("%s kept: bound %g, want %g", u.Name, got, want)
	}
	// Copying moves bytes from one reader of host memory to the other:
	// the copying plan's bound is no better than none's but for the
	// GPU's windows.
	if p.hostBound(one, false, e) < p.hostBound(none, false, e)-hidden/rate {
		t.Error("a copy counted as saving host memory")
	}
	p.prof.HostRead = 0
	if got := p.hostBound(one, false, e); got != 0 {
		t.Errorf("no rate: bound %g, want 0", got)
	}
}

// idleKept is what the promoter keeps in the ring on an idle machine: the
// units that save the most per byte, as many as the ring holds, and
// nothing when keeping them would not beat running them on the CPU.
func TestIdleKept(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	mk := func(cpuPerByte, gpuPerByte float64) *plan.Profile {
		prof := &plan.Profile{Batches: []int{1}, HostRead: 1e9, Switch: []plan.Link{{Latency: 1e-6, BytesPerSec: 1e10}}, Stream: plan.Link{BytesPerSec: 1e10}}
		for _, u := range units {
			prof.Units = append(prof.Units, plan.UnitTimes{Name: u.Name, CPU: []float64{cpuPerByte * float64(u.Bytes)}, GPU: []float64{gpuPerByte * float64(u.Bytes)}})
		}
		return prof
	}
	none := func(int) bool { return false }
	var ring, largest int64
	for _, u := range units {
		if u.Streamable {
			ring += u.Bytes / 3
			largest = max(largest, u.Bytes)
		}
	}
	ring = max(ring, 2*largest)
	kept := idleKept(mk(1e-9, 1e-12), units, none, ring, m.Prog.Hyper.NVocab)
	if kept == nil {
		t.Fatal("nothing kept where the GPU is a thousand times faster")
	}
	var bytes int64
	for i, on := range kept {
		if on {
			if !units[i].Streamable {
				t.Errorf("%s kept, but it cannot stream", units[i].Name)
			}
			bytes += units[i].Bytes + 256*int64(len(units[i].Mats))
		}
	}
	if bytes > ring || bytes == 0 {
		t.Errorf("kept %d bytes in a ring of %d", bytes, ring)
	}
	// A GPU as slow as the CPU: keeping saves nothing.
	if kept := idleKept(mk(1e-9, 1e-9), units, none, ring, m.Prog.Hyper.NVocab); kept != nil {
		t.Error("units kept on a GPU no faster than the CPU")
	}
	if kept := idleKept(mk(1e-9, 1e-12), units, none, 0, m.Prog.Hyper.NVocab); kept != nil {
		t.Error("units kept without a ring")
	}
}

// A measured hand-over slower than the profile's (a GPU shared with
// another process) is what the promotion problem charges each switch.
func TestPromoteProblemSwitch(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	prof := &plan.Profile{Batches: []int{1}, Switch: []plan.Link{{Latency: 1e-6, BytesPerSec: 1e10}}, Stream: plan.Link{BytesPerSec: 1e10}}
	for _, u := range units {
		prof.Units = append(prof.Units, plan.UnitTimes{Name: u.Name, CPU: []float64{1e-3}, GPU: []float64{1e-4}})
	}
	none := func(int) bool { return false }
	e := plan.Estimates{CPU: 1, GPU: 1, Overlap: 1, Link: 1e10}
	idle := promoteProblem(prof, units, none, 1<<20, m.Prog.Hyper.NVocab, e)
	e.Switch = 200e-6
	loaded := promoteProblem(prof, units, none, 1<<20, m.Prog.Hyper.NVocab, e)
	for i := range units {
		if idle.Units[i].ToGPU >= 200e-6 || loaded.Units[i].ToGPU != 200e-6 || loaded.Units[i].ToCPU != 200e-6 {
			t.Fatalf("%s: hand-over %g s idle, %g/%g s with a measured 200 µs", units[i].Name, idle.Units[i].ToGPU, loaded.Units[i].ToGPU, loaded.Units[i].ToCPU)
		}
	}
	if loaded.EndToCPU < 200e-6 {
		t.Errorf("the logits' way back costs %g s with a measured hand-over of 200 µs", loaded.EndToCPU)
	}
}

// timeNext times every step of the first plan's warm-up and the first
// steps of a plan that copies weights, and one in timeEvery of the others.
func TestTimeNext(t *testing.T) {
	p := &promoter{prof: &plan.Profile{}}
	var got []bool
	for range minPlanAge + 1 + 2*timeEvery {
		got = append(got, p.timeNext())
		p.steps++
	}
	for i, on := range got {
		if want := i < minPlanAge+1 || (i-minPlanAge)%timeEvery == 0; on != want {
			t.Fatalf("no promotion, step %d: timed %v, want %v (all: %v)", i, on, want, got)
		}
	}
	p.curPlan, p.cur, p.seen = plan.Promotion{Count: 1}, &executor.Schedule{}, map[*executor.Schedule]int{}
	for i := range minPlanAge + 1 {
		if !p.timeNext() {
			t.Fatalf("a new plan that copies, step %d: not timed", i)
		}
		p.seen[p.cur]++
	}
	n := 0
	for range 4 * timeEvery {
		if p.timeNext() {
			n++
		}
		p.seen[p.cur]++
	}
	if n != 4 {
		t.Errorf("a plan that copies, after its first steps: %d of %d steps timed, want 4", n, 4*timeEvery)
	}
	p.kept = true // its weights stay in the ring: nothing copied
	n = 0
	for range 4 * timeEvery {
		if p.timeNext() {
			n++
		}
	}
	if n != 4 {
		t.Errorf("a kept plan: %d of %d steps timed, want 4", n, 4*timeEvery)
	}
}

// A plan's verdict is kept with the planner, bounded.
func TestRejectedPlans(t *testing.T) {
	m := &Planner{}
	if _, ok := m.rejectedPlan("a"); ok {
		t.Fatal("a plan rejected before any verdict")
	}
	e := plan.Estimates{CPU: 1.2, GPU: 2}
	m.rejectPlan("a", e)
	if got, ok := m.rejectedPlan("a"); !ok || got != e {
		t.Fatalf("rejectedPlan = %v, %v; want %v, true", got, ok, e)
	}
	for i := range 2 * maxRejectedPlans {
		m.rejectPlan(fmt.Sprint(i), e)
	}
	if n := len(m.rejected); n > maxRejectedPlans {
		t.Errorf("%d verdicts kept, at most %d wanted", n, maxRejectedPlans)
	}
}

// A plan's step time is the median of its last steps: one slow step does
// not move it.
func TestStepTimesMedian(t *testing.T) {
	var w stepTimes
	if w.median() != 0 {
		t.Fatal("median of nothing")
	}
	for _, v := range []float64{13, 12.5, 13.1, 12.9, 18.2} {
		w.add(v)
	}
	if got := w.median(); got != 13 {
		t.Errorf("median %v, want 13", got)
	}
	for range 10 {
		w.add(20)
	}
	if got := w.median(); got != 20 {
		t.Errorf("after 10 steps of 20: median %v (the window keeps the last %d)", got, len(w.v))
	}
	var two stepTimes
	two.add(1)
	two.add(2)
	if got := two.median(); got != 1.5 {
		t.Errorf("median of 1 and 2: %v", got)
	}
}

// dropToBase remembers a clear miss (with the model, and as the margin new
// plans must beat none by) but not a drop within the steps' noise.
func TestDropToBaseDoubt(t *testing.T) {
	base, planned := &executor.Schedule{}, &executor.Schedule{}
	planner := &Planner{}
	drop := func(planMs, noneMs float64) *promoter {
		p := &promoter{base: base, planner: planner, cur: planned, stepTime: map[*executor.Schedule]*stepTimes{base: {}, planned: {}}, noneTime: 0.012}
		p.curPlan = plan.Promotion{Promote: []bool{true}, Count: 1, Time: 0.010} // predicted 17% faster than none
		for range 3 {
			p.stepTime[base].add(noneMs / 1e3)
			p.stepTime[planned].add(planMs / 1e3)
		}
		p.dropToBase()
		if p.cur != base || p.backoff != backoffSteps {
			t.Fatalf("after the drop: on the base %v, backoff %d", p.cur == base, p.backoff)
		}
		return p
	}
	p := drop(12.5, 12) // 4% slower: noise
	if _, ok := planner.rejectedPlan(p.placeKey + "0,"); ok || p.doubt != 0 {
		t.Errorf("a drop within the noise was remembered (doubt %v)", p.doubt)
	}
	p = drop(13.5, 12) // 12.5% slower, predicted 17% faster
	if _, ok := planner.rejectedPlan(p.placeKey + "0,"); !ok {
		t.Error("a clear miss was not remembered with the model")
	}
	if want := (13.5 / 10) / (12.0 / 12); math.Abs(p.doubt-want) > 1e-9 {
		t.Errorf("doubt %v, want %v", p.doubt, want)
	}
}

// repackHybrid repacks the same first experts of every CPU stack.
func TestRepackHybridExpertsAlike(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	if !canRepack(t, m) {
		t.Skip("this CPU level has no kernels for repacked weights (noasm, or not amd64)")
	}
	w := hostWeights(t, m)
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	for i, u := range units {
		if u.Layer%2 == 1 {
			pl.Units[i].Backend = executor.BackendGPU
		}
	}
	RepackHybrid(w, m, pl)
	first := -1
	for i, u := range units {
		if u.Experts == 0 || pl.resident(i) {
			continue
		}
		for _, x := range u.Mats {
			mx := w.Of(x)
			if len(mx.Stack) == 0 || !w.Repackable(x) {
				continue
			}
			p := 0
			for p < len(mx.Stack) && mx.Stack[p].RepackedBytes() > 0 {
				p++
			}
			for e := p; e < len(mx.Stack); e++ {
				if mx.Stack[e].RepackedBytes() > 0 {
					t.Fatalf("%s: expert %d repacked after expert %d was not", x.Name, e, p)
				}
			}
			if first < 0 {
				first = p
			}
			if p != first {
				t.Errorf("%s: first %d experts repacked, another stack's %d", x.Name, p, first)
			}
		}
	}
	if first <= 0 {
		t.Errorf("no expert repacked (first %d)", first)
	}
	t.Logf("every CPU stack has its first %d experts repacked", first)
}

// On a host with memory to spare the allowance grows to half of what the
// host would have free with the weights in: all of it on a big host, as
// much as the old allowance on one without spare memory, and in between
// within the half.
func TestRepackHybridSpareMemory(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	if !canRepack(t, m) {
		t.Skip("this CPU level has no kernels for repacked weights (noasm, or not amd64)")
	}
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	var total, released, all int64
	probe := hostWeights(t, m)
	for i, u := range units {
		for _, x := range u.Mats {
			total += x.Bytes()
			if u.Layer%2 == 1 {
				released += x.Bytes()
			} else if !u.Lookup {
				all += probe.RepackSize(x)
			}
		}
		if u.Layer%2 == 1 {
			pl.Units[i].Backend = executor.BackendGPU
		}
	}
	if !m.File.Mapped {
		released = 0
	}
	held, old := total-released, released+total/32
	if all <= old {
		t.Fatalf("the old allowance (%d bytes) already takes every copy (%d): the test needs a model it cuts", old, all)
	}
	for _, c := range []struct {
		name  string
		avail int64
		all   bool // ATS_REPACK=all
		want  func(got int64) bool
	}{
		{"unknown", 0, false, func(got int64) bool { return got <= old && got > 0 }},
		{"none spare", held, false, func(got int64) bool { return got <= old && got > 0 }},
		{"plenty", held + 4*all, false, func(got int64) bool { return got == all }},
		{"some", held + 2*old + all/2, false, func(got int64) bool { return got > old && got <= old+all/4 }},
		{"asked for all", 0, true, func(got int64) bool { return got == all }},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := hostWeights(t, m)
			w.AvailableMemory, w.RepackAll = c.avail, c.all
			frac, predicted := packedFractions(w, m, units, pl.resident)
			got := RepackHybrid(w, m, pl)
			if !c.want(got) {
				t.Errorf("available %d (host weights %d, old allowance %d, every copy %d): repacked %d", c.avail, held, old, all, got)
			}
			if predicted != got {
				t.Errorf("packedFractions predicted %d bytes, RepackHybrid made %d", predicted, got)
			}
			for i := range units {
				if c.want(all) && !pl.resident(i) && repackable(w, units[i]) && frac[i] != 1 {
					t.Errorf("%s: %.2f repacked with plenty of memory", units[i].Name, frac[i])
				}
			}
		})
	}
}
