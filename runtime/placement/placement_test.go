package placement

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
)

// TestPlacementJSON writes a placement, reads it back and binds it; and
// checks the errors of a hand-edited file.
func TestPlacementJSON(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	for i := range pl.Units {
		if i%3 == 0 {
			pl.Units[i].Backend = executor.BackendGPU
		}
	}
	for i := range units {
		for j := i + 1; j < len(units); j++ {
			if sharesMat(units[i], units[j]) {
				pl.Units[j].Backend = pl.Units[i].Backend
			}
		}
	}
	pl.Prefill = []PrefillSchedule{{MinBatch: 32, Stream: []string{units[len(units)-2].Name}}}
	if pl.resident(len(units) - 2) {
		pl.Prefill[0].Stream = nil
	}
	pl.sum()
	read, path := writeAndRead(t, pl)
	bound, err := read.bind(m, hostWeights(t, m), units)
	if err != nil {
		t.Fatal(err)
	}
	backends := func(p *Placement) []string {
		var out []string
		for _, u := range p.Units {
			out = append(out, u.Backend)
		}
		return out
	}
	if diff := cmp.Diff(backends(pl), backends(bound)); diff != "" {
		t.Errorf("backends after a round trip (-want +got):\n%s", diff)
	}
	if bound.GPUBytes+bound.CPUBytes == 0 || bound.GPUBytes != pl.GPUBytes {
		t.Errorf("bytes %d/%d, want %d/%d", bound.GPUBytes, bound.CPUBytes, pl.GPUBytes, pl.CPUBytes)
	}
	// Hand edits gone wrong.
	bad := func(name string, edit func(p *Placement), wantErr string) {
		t.Helper()
		var q Placement
		q.Units = append([]UnitPlacement(nil), pl.Units...)
		q.Prefill = pl.Prefill
		edit(&q)
		_, err := q.bind(m, hostWeights(t, m), units)
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: error %v, want one saying %q", name, err, wantErr)
		}
	}
	bad("missing unit", func(p *Placement) { p.Units = p.Units[1:] }, "not placed")
	bad("unknown unit", func(p *Placement) {
		p.Units = append(p.Units, UnitPlacement{Name: "blk.99.attn_q.weight", Backend: "gpu"})
	}, "has no unit blk.99")
	bad("streams a resident unit", func(p *Placement) {
		p.Prefill = []PrefillSchedule{{MinBatch: 32, Stream: []string{p.Units[0].Name}}}
		p.Units[0].Backend = executor.BackendGPU
	}, "resident or cannot stream")
	bad("splits a unit the batches do not stream", func(p *Placement) {
		p.Prefill = []PrefillSchedule{{MinBatch: 32, Stream: []string{}, Split: map[string]int{units[1].Name: 1}}}
	}, "that the batches stream")
	if stream := pl.Prefill[0].Stream; len(stream) > 0 {
		bad("splits a dense unit", func(p *Placement) {
			p.Prefill = []PrefillSchedule{{MinBatch: 32, Stream: stream, Split: map[string]int{stream[0]: 1}}}
		}, "want an MoE layer")
	}
	if err := os.WriteFile(path, []byte(`{"units":[{"name":"x","backend":"tpu"}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPlacement(path); err == nil || !strings.Contains(err.Error(), `"tpu"`) {
		t.Errorf("backend tpu: error %v", err)
	}
}

// linkBoundPrefill is a profile of units at batches of 1 and 64 where
// the link (1 GB/s) is the bound: a product copies in 10 times its GPU
// time and computes on the CPU in 100 times its copy, an MoE layer on the
// CPU in moeCPU times its copy; attention and the embedding cost next to
// nothing. copies is the link's time for every unit that can stream.
func linkBoundPrefill(units []model.Unit, moeCPU float64) (prof *plan.Profile, copies float64) {
	const link = 1e9 // bytes/s
	prof = &plan.Profile{Batches: []int{1, 64}, Switch: []plan.Link{{Latency: 1e-6, BytesPerSec: 1e10}, {Latency: 1e-6, BytesPerSec: 1e10}},
		Stream: plan.Link{BytesPerSec: link}}
	for _, u := range units {
		copyT := float64(u.Bytes) / link
		cpuT, gpuT := 100*copyT, copyT/10
		switch {
		case !u.Streamable: // attention, the embedding: on the CPU either way
			cpuT, gpuT = 1e-7, 1e-7
		case u.Experts > 0:
			cpuT = moeCPU * copyT
		}
		if u.Streamable {
			copies += copyT
		}
		prof.Units = append(prof.Units, plan.UnitTimes{Name: u.Name, CPU: []float64{cpuT, cpuT}, GPU: []float64{gpuT, gpuT}})
	}
	return prof, copies
}

// A prefill batch bound by the link (the expert stacks of an MoE model
// cost several times more to copy than to compute on the GPU) hands some
// stacks to the CPU: the copy engine streams the later ones while the CPU
// computes, and the batch takes less than streaming everything. With a
// ring too small to run ahead, the CPU's time is not hidden and the plan
// is no better than the link's sum.
func TestPrefillStreamsUseTheCPUWhileTheLinkRuns(t *testing.T) {
	const moeSplit = ""
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	prof, copies := linkBoundPrefill(units, 1.5) // the CPU is 1.5 times slower than the link on MoE layers, not 100
	var stacks int
	for _, u := range units {
		if u.Experts > 0 {
			stacks++
		}
	}
	if stacks < 2 {
		t.Fatalf("%d MoE units in the oracle model", stacks)
	}
	cases := []struct {
		name     string
		ring     int64
		someCPU  bool
		fasterBy float64 // at least, against the link's sum
	}{
		{"a ring of the whole model", 1 << 40, true, 0.1},
		{"the smallest ring", 0, false, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			stream, split, secs, err := prefillStreams(hostWeights(t, m), prof, units, pl, 1, 64, m.Prog.Hyper, c.ring, false, Options{MoESplit: moeSplit})
			if split != nil {
				t.Errorf("split %v without a weight path that splits", split)
			}
			if err != nil {
				t.Fatal(err)
			}
			on := map[string]bool{}
			for _, n := range stream {
				on[n] = true
			}
			var cpuStacks int
			for _, u := range units {
				if u.Experts > 0 && !on[u.Name] {
					cpuStacks++
				}
				if u.Streamable && u.Experts == 0 && !on[u.Name] {
					t.Errorf("%s stays on the CPU, 100 times slower than streaming it", u.Name)
				}
			}
			if c.someCPU && (cpuStacks == 0 || cpuStacks == stacks) {
				t.Errorf("%d of %d expert stacks on the CPU, want some", cpuStacks, stacks)
			}
			if secs > copies*(1-c.fasterBy)+1e-3 {
				t.Errorf("predicted %.4f s, want at most %.0f%% below the link's %.4f s", secs, 100*c.fasterBy, copies)
			}
			t.Logf("%d of %d stacks on the CPU; %.4f s against %.4f s of copies", cpuStacks, stacks, secs, copies)
		})
	}
}

// With a weight path that splits MoE layers (ATS_MOE_SPLIT unset or
// auto), the same link-bound batch with the smallest ring (where whole
// stacks on the CPU do not pay) splits every streamed stack: the CPU
// computes a share of its experts while the link brings the rest, and the
// batch is predicted faster than without. "0" splits nothing; a fraction
// fixes the share; a path that cannot split never does.
func TestPrefillStreamsSplitMoELayers(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	prof, copies := linkBoundPrefill(units, 2) // the CPU is twice as slow as the link on MoE layers
	moeSplit := ""
	_, _, whole, err := prefillStreams(hostWeights(t, m), prof, units, pl, 1, 64, m.Prog.Hyper, 0, false, Options{MoESplit: moeSplit})
	if err != nil {
		t.Fatal(err)
	}
	if _, split, _, err := prefillStreams(hostWeights(t, m), prof, units, pl, 1, 64, m.Prog.Hyper, 0, false, Options{MoESplit: moeSplit}); err != nil || split != nil {
		t.Errorf("split %v (%v) on a path that cannot split", split, err)
	}
	moeSplit = ""
	byDefault, splitByDefault, _, err := prefillStreams(hostWeights(t, m), prof, units, pl, 1, 64, m.Prog.Hyper, 0, true, Options{MoESplit: moeSplit})
	if err != nil {
		t.Fatal(err)
	}
	moeSplit = "auto"
	stream, split, secs, err := prefillStreams(hostWeights(t, m), prof, units, pl, 1, 64, m.Prog.Hyper, 0, true, Options{MoESplit: moeSplit})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(byDefault, stream); d != "" {
		t.Errorf("streamed units by default and with auto (-default +auto):\n%s", d)
	}
	if d := cmp.Diff(splitByDefault, split); d != "" {
		t.Errorf("split units by default and with auto (-default +auto):\n%s", d)
	}
	on := map[string]bool{}
	for _, n := range stream {
		on[n] = true
	}
	for _, u := range units {
		ne := moeExperts(u)
		if ne == 0 {
			if _, ok := split[u.Name]; ok {
				t.Errorf("%s is split but is no MoE layer", u.Name)
			}
			continue
		}
		ks, ok := split[u.Name]
		switch {
		case !on[u.Name]:
			if ok {
				t.Errorf("%s is split but does not stream", u.Name)
			}
		case !ok || ks < 1 || ks >= ne:
			t.Errorf("%s streams split at %d of %d experts (present: %v), want a share on the CPU", u.Name, ks, ne, ok)
		}
	}
	if secs >= whole {
		t.Errorf("split predicted %.4f s, not below the %.4f s without", secs, whole)
	}
	t.Logf("split %v: %.4f s against %.4f s without, %.4f s of copies", split, secs, whole, copies)

	moeSplit = "0"
	if _, split, _, err := prefillStreams(hostWeights(t, m), prof, units, pl, 1, 64, m.Prog.Hyper, 0, true, Options{MoESplit: moeSplit}); err != nil || split != nil {
		t.Errorf("%s=0: split %v (%v), want none", "ATS_MOE_SPLIT", split, err)
	}
	moeSplit = "0.25"
	_, split, _, err = prefillStreams(hostWeights(t, m), prof, units, pl, 1, 64, m.Prog.Hyper, 0, true, Options{MoESplit: moeSplit})
	if err != nil {
		t.Fatal(err)
	}
	for name, ks := range split {
		for _, u := range units {
			if u.Name == name {
				if ne := moeExperts(u); ks != int(math.Round(0.25*float64(ne))) {
					t.Errorf("%s=0.25: %s split at %d of %d", "ATS_MOE_SPLIT", name, ks, ne)
				}
			}
		}
	}
}

// TestFasterFresh: the promoter goes back to a plan that ran clearly
// faster than the current one, if it ran recently and often enough to
// tell, and never counts no promotion (slowerThanNone's) or a plan it
// knows nothing of.
func TestFasterFresh(t *testing.T) {
	base, cur, fast, faster, stale, few := &executor.Schedule{}, &executor.Schedule{}, &executor.Schedule{}, &executor.Schedule{}, &executor.Schedule{}, &executor.Schedule{}
	p := &promoter{stepTime: map[*executor.Schedule]*stepTimes{}, timedAt: map[*executor.Schedule]int{}, meta: map[*executor.Schedule]planMeta{}, steps: 500}
	timed := func(s *executor.Schedule, ms float64, n, at int, known bool) {
		w := &stepTimes{}
		for i := 0; i < n; i++ {
			w.add(ms / 1e3)
		}
		p.stepTime[s], p.timedAt[s] = w, at
		if known {
			p.meta[s] = planMeta{bytes: int64(ms)}
		}
	}
	timed(cur, 38, 7, 500, true)
	if got := p.fasterFresh(cur); got != nil {
		t.Fatalf("no other plan measured, got one")
	}
	timed(base, 30, 7, 499, false)  // no promotion: not this check's
	timed(stale, 30, 7, 300, true)  // 200 steps ago
	timed(few, 30, 2, 499, true)    // two steps
	timed(fast, 37.5, 7, 480, true) // within the noise
	if got := p.fasterFresh(cur); got != nil {
		t.Errorf("went back to a plan with %d bytes: stale, too few steps, no promotion or within the noise", p.meta[got].bytes)
	}
	timed(faster, 36, 7, 470, true)
	if got := p.fasterFresh(cur); got != faster {
		t.Errorf("did not go back to the plan that ran 36 ms against 38")
	}
	if got := p.fasterFresh(&executor.Schedule{}); got != nil {
		t.Errorf("an unmeasured plan was compared")
	}
	if got := p.fastestFresh(cur, 35.5e-3); got != nil {
		t.Errorf("a plan of %d bytes counted as faster than 35.5 ms", p.meta[got].bytes)
	}
	if got := p.fastestFresh(faster, 38e-3); got != fast {
		t.Errorf("without the 36 ms plan, the fastest below 38 ms is the 37.5 ms one")
	}
	p.adopt(faster)
	if p.cur != faster || p.promoted != 36 {
		t.Errorf("adopt: current %p, promoted %d", p.cur, p.promoted)
	}
}

// The CPU's share of a split MoE layer is timed at the repacked speed when
// its experts are among the stacks' repacked first ones (from the measured
// quarter when the profile has it), at the file's layout's for those
// beyond, and from the mixed time when nothing says more.
func TestSplitCPUCountsRepackedExperts(t *testing.T) {
	// Half the experts repacked: the mixed time 3 is half of 4 (plain)
	// and half of 2 (repacked).
	ut := plan.UnitTimes{CPU: []float64{3}, CPUPacked: []float64{2}}
	for _, c := range []struct {
		share, packed, want float64
	}{
		{0.25, 0.5, 0.5},            // all repacked: 2 × 0.25
		{0.75, 0.5, 2*0.5 + 4*0.25}, // half of them beyond
		{0.25, 0, 0.75},             // no split view of the layout: the mix
		{0.25, 1, 0.5},              // repacked whole
	} {
		if got := splitCPU(ut, 0, c.share, c.packed); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("share %g with %g repacked: %g s, want %g", c.share, c.packed, got, c.want)
		}
	}
	if got := splitCPU(plan.UnitTimes{CPU: []float64{3}}, 0, 0.25, 0.5); got != 0.75 {
		t.Errorf("no repacked time profiled: %g s, want the mix's 0.75", got)
	}
	// A measured quarter's share (0.3, against the whole op's 2 × 0.25)
	// sets the repacked rate; the plain experts beyond keep the mix's.
	ut.CPUShare = []float64{0.3}
	for _, c := range []struct {
		share, packed, want float64
	}{
		{0.25, 0.5, 0.3},
		{0.75, 0.5, 1.2*0.5 + 4*0.25},
		{0.25, 1, 0.3},
	} {
		if got := splitCPU(ut, 0, c.share, c.packed); math.Abs(got-c.want) > 1e-12 {
			t.Errorf("quarter measured at 0.3 s: share %g with %g repacked: %g s, want %g", c.share, c.packed, got, c.want)
		}
	}
}

// writeAndRead writes pl as `ats plan --json` does and reads it back,
// as --placement does; path is the file.
func writeAndRead(t *testing.T, pl *Placement) (read *Placement, path string) {
	t.Helper()
	b, err := pl.JSON()
	if err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if read, err = ReadPlacement(path); err != nil {
		t.Fatal(err)
	}
	return read, path
}

// TestRoutedShare checks the GPU's share of a routed layer's experts: the
// balance of the link's and the CPU's rates, a forced fraction, none
// below one of a token's experts, and a clear error for a bad setting; a
// forced fraction holds (fixed), the balance is where decode starts.
func TestRoutedShare(t *testing.T) {
	for _, c := range []struct {
		link, cpu float64
		k         int
		forced    string
		want      float64
		fixed     bool
		err       bool
	}{
		{50e9, 50e9, 8, "", 0.5, false, false},
		{30e9, 90e9, 8, "auto", 0.25, false, false},
		{1e9, 99e9, 8, "", 0, false, false},     // 0.08 of an expert: none
		{1e9, 99e9, 8, "0.5", 0.5, true, false}, // forced
		{50e9, 50e9, 8, "0", 0, true, false},
		{50e9, 50e9, 8, "1", 1, true, false},
		{50e9, 50e9, 8, "1.5", 0, false, true},
		{50e9, 50e9, 8, "half", 0, false, true},
		{50e9, 50e9, 8, "NaN", 0, false, true},
	} {
		got, fixed, err := routedShare(c.link, c.cpu, c.k, c.forced)
		if got != c.want || fixed != c.fixed || (err != nil) != c.err {
			t.Errorf("routedShare(%g, %g, %d, %q) = %g, %v, %v; want %g, %v (error %v)", c.link, c.cpu, c.k, c.forced, got, fixed, err, c.want, c.fixed, c.err)
		}
	}
}

// The routed layers' time for one token: the CPU's share and the link's
// side by side, plus a wait a layer; floored, never under the bytes at
// host memory's rate, which both sides read.
func TestRoutedSeconds(t *testing.T) {
	const wait = routedLayerSeconds
	for _, c := range []struct {
		name                               string
		secs, bytes, link, hostRead, share float64
		layers                             int
		t, floored                         float64
	}{
		// The CPU computes 8 MB in 1 ms alone (8 GB/s); half over a 16 GB/s link.
		{"slow CPU", 1e-3, 8e6, 16e9, 80e9, 0.5, 2, 0.5e-3 + 2*wait, 0.5e-3 + 2*wait},
		{"the link longer", 1e-3, 8e6, 4e9, 80e9, 0.5, 1, 1e-3 + wait, 1e-3 + wait},
		// A CPU as fast as host memory: the share takes from the same memory.
		{"memory bound", 1e-4, 8e6, 80e9, 80e9, 0.5, 1, 0.5e-4 + wait, 1e-4 + wait},
		{"rate unknown", 1e-4, 8e6, 80e9, 0, 0.5, 1, 0.5e-4 + wait, 0.5e-4 + wait},
		{"no share", 1e-3, 8e6, 16e9, 8e9, 0, 3, 1e-3 + 3*wait, 1e-3 + 3*wait},
	} {
		gt, gf := routedSeconds(c.secs, c.bytes, c.link, c.hostRead, c.share, c.layers)
		if math.Abs(gt-c.t) > 1e-12 || math.Abs(gf-c.floored) > 1e-12 {
			t.Errorf("%s: routedSeconds = %g, %g; want %g, %g", c.name, gt, gf, c.t, c.floored)
		}
	}
}

// TestPlacementJSONRouted round-trips a placement whose decode steps route
// the CPU's expert layers (Placement.Routed), and rejects routing a dense
// unit, a resident one, or a share outside [0, 1].
func TestPlacementJSONRouted(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	dense := ""
	for i, u := range units {
		if u.Experts > 0 {
			pl.Routed = append(pl.Routed, u.Name)
		} else if u.Streamable && dense == "" {
			dense = units[i].Name
		}
	}
	if len(pl.Routed) == 0 || dense == "" {
		t.Fatalf("%d expert units, dense unit %q", len(pl.Routed), dense)
	}
	pl.RoutedShare, pl.RoutedExperts, pl.RoutedFixed = 0.375, 3, true
	pl.sum()
	read, _ := writeAndRead(t, pl)
	w := hostWeights(t, m)
	bound, err := read.bind(m, w, units)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(pl.Routed, bound.Routed); diff != "" || bound.RoutedShare != 0.375 || bound.RoutedExperts != 3 || !bound.RoutedFixed {
		t.Errorf("routed after a round trip: share %g, experts %d, fixed %v (-want +got):\n%s", bound.RoutedShare, bound.RoutedExperts, bound.RoutedFixed, diff)
	}
	l := bound.Layout()
	if !l.RoutedFixed || l.RoutedShare != 0.375 {
		t.Errorf("layout: routed share %g, fixed %v; want 0.375, held", l.RoutedShare, l.RoutedFixed)
	}
	for i, u := range units {
		if want := u.Experts > 0; l.Routed[i] != want {
			t.Errorf("layout: %s routed %v, want %v", u.Name, l.Routed[i], want)
		}
	}
	bad := func(name string, edit func(p *Placement), wantErr string) {
		t.Helper()
		q := *read
		q.Units = append([]UnitPlacement(nil), read.Units...)
		q.Routed = append([]string(nil), read.Routed...)
		edit(&q)
		if _, err := q.bind(m, w, units); err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: error %v, want one saying %q", name, err, wantErr)
		}
	}
	bad("routes a dense unit", func(p *Placement) { p.Routed = append(p.Routed, dense) }, "want an expert unit")
	bad("routes a resident unit", func(p *Placement) {
		for i := range p.Units {
			if p.Units[i].Name == p.Routed[0] {
				p.Units[i].Backend = executor.BackendGPU
			}
		}
	}, "want an expert unit")
	bad("share 1.5", func(p *Placement) { p.RoutedShare = 1.5 }, "routed_share")
	bad("no scratch", func(p *Placement) { p.RoutedExperts = 0 }, "at least one expert")
}
