package placement

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"sync"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

// Planning: from the profile to a placement. The residency (what lives in
// VRAM) is chosen by plan.Static for the workload it is optimised for;
// then, for each profiled prefill batch, a second run of the same dynamic
// program without a budget decides which CPU units stream to the GPU.

// planWith places units under budget: every unit on the GPU when the
// model fits, else the dynamic program over the model's profile.
func (p *Planner) planWith(units []model.Unit, opt Options, budget int64) (*Placement, error) {
	m := p.m
	all := newPlacement(m, units, executor.BackendGPU)
	all.Budget = budget
	arena, weights := p.needBytes(all, opt)
	if arena+weights <= budget && !opt.HybridAlways {
		all.Note = "the model fits the budget: every unit on the GPU"
		all.FixedBytes = max(arena+weights-all.GPUBytes, 0)
		return all, nil
	}
	ring := ringWanted(opt, budget)
	fixed := p.fixedBytes(units, opt, ring)
	if budget < fixed {
		return nil, fmt.Errorf("--vram-budget %s is below the %s ats needs on the GPU before any weight (activations for batches of %d tokens, scratch, the staging ring, norms): give at least that, a smaller batch (-b), or --vram-budget 0 to run on the CPU",
			executor.FormatBytes(budget), executor.FormatBytes(fixed), opt.Batch)
	}
	prof, err := p.profile(units, opt, false)
	if err != nil {
		return nil, err
	}
	return p.placeWithRing(prof, units, opt, budget, ring)
}

// placeWithRing places with a staging ring of ring bytes for dynamic
// promotion; when the placement leaves less on the CPU that promotion
// could move than half the ring (an MoE model's CPU units are mostly
// expert stacks, which do not pay to promote), it places again with a ring
// of twice what could move, so that the VRAM goes to resident units.
//
// (A larger ring would let prefill batches stream further ahead while the
// CPU takes expert stacks, prefillStreams. On the GPU machine a ring of two
// 30B-A3B stacks, 782 MiB, did not pay: the CPU's 18 ms for a stack of a
// 512-token batch is more than the 11 ms of copies it lets run ahead, and
// the 30B-A3B's prefill fell by 4% with the residency the ring took.)
func (p *Planner) placeWithRing(prof *plan.Profile, units []model.Unit, opt Options, budget, ring int64) (*Placement, error) {
	pl, err := p.placeByProfile(prof, units, opt, budget, p.fixedBytes(units, opt, ring), ring)
	if err != nil || ring == 0 || !pl.Dynamic {
		return pl, err
	}
	var movable int64
	for i, u := range units {
		if !pl.resident(i) && u.Streamable && u.Bytes <= 2*u.DecodeBytes {
			movable += u.Bytes
		}
	}
	if 2*movable >= ring {
		return pl, nil
	}
	smaller, o := 2*movable, opt
	o.StaticOnly = movable == 0 // and nothing kept in the ring
	if pl, err = p.placeByProfile(prof, units, o, budget, p.fixedBytes(units, opt, smaller), smaller); err == nil && movable == 0 {
		pl.Note = "nothing on the CPU that a decode step could promote: the staging ring only streams prefill"
	}
	return pl, err
}

// ringWanted is the staging ring a hybrid context asks for: with dynamic
// promotion a thirty-second of the budget; without, the least (twice the
// largest streamed matrix, for prefill). Every byte of the ring is a byte
// less of residency, which an idle machine pays on every step: on the GPU
// machine the 14B at 4.5 GiB decoded 18.3-19.6 t/s with an eighth (0.4 GiB
// less resident than static placement, which decoded 22.2-23.5), and 23.4
// and 21.9 with a thirty-second, whose placement is static's. Under the
// CPU load the thirty-second still cut the slowdown by 71% (an eighth:
// 67%): the copy engine streams promoted units back to back, and two
// matrices in flight keep it busy.
func ringWanted(opt Options, budget int64) int64 {
	if opt.StaticOnly {
		return 0
	}
	return budget / 32
}

// fixedBytes is the device memory a hybrid context needs beside its
// resident units: activations and scratch for every op, the staging ring
// for the largest streamable matrix, and the always-resident vectors.
func (p *Planner) fixedBytes(units []model.Unit, opt Options, ring int64) int64 {
	prog := p.m.Prog
	streamable := map[*ir.Weight]bool{}
	var kv int64
	for _, u := range units {
		if u.Streamable {
			for _, w := range u.Mats {
				streamable[w] = true
			}
		}
		if u.Anchor == ir.AnchorCache {
			kv += u.Bytes
		}
	}
	runs := make([]bool, len(prog.Ops))
	for i := range runs {
		runs[i] = true
	}
	eo := opt.ExecOptions()
	cfg := backend.ExecConfig{Batch: opt.Batch, LogitRows: min(opt.Batch, executor.MaxLogitRows), KV: opt.KV, RingBytes: ring,
		Runs: runs, Streams: streamable, Options: eo.Device}
	arena, vectors := p.acc.Need(prog, cfg)
	// Need rounds each allocation up; the arena and the weight set of a
	// placement round up by at most one granule each beyond their parts.
	return arena - kv + vectors + 2*allocGranularity
}

// allocGranularity is what a device rounds an allocation up to (the CUDA
// driver's 2 MiB): budgets count allocations at that size.
const allocGranularity = 2 << 20

// Plan is the placement a context of opt would get (Backend "auto"),
// with the profile it was planned from (nil when none was needed); fresh
// measures the profile again even when one is cached.
func (p *Planner) Plan(opt Options, fresh bool) (*Placement, *plan.Profile, error) {
	o := opt.withDefaults(p.m)
	if p.acc == nil {
		return nil, nil, errors.New("no GPU is open")
	}
	units := p.units(o)
	budget, inUse, err := p.budgetFor(o)
	if err != nil {
		return nil, nil, err
	}
	var prof *plan.Profile
	if fresh {
		if prof, err = p.profile(units, o, true); err != nil {
			return nil, nil, err
		}
	}
	var pl *Placement
	if prof != nil {
		ring := ringWanted(o, budget)
		fixed := p.fixedBytes(units, o, ring)
		if budget < fixed {
			return nil, nil, fmt.Errorf("--vram-budget %s is below the %s needed before any weight", executor.FormatBytes(budget), executor.FormatBytes(fixed))
		}
		pl, err = p.placeWithRing(prof, units, o, budget, ring)
	} else {
		pl, err = p.planWith(units, o, budget)
	}
	if err != nil {
		return nil, nil, err
	}
	pl.Budget, pl.ContextBytes = budget, inUse
	if err := p.checkBudget(pl, o); err != nil {
		return nil, nil, err
	}
	if pl.OptimizedFor != "" && prof == nil {
		prof, _ = p.profile(units, o, false) // cached by planWith
	}
	return pl, prof, nil
}

// problem is the static placement problem of units at profiled batch bi
// (n tokens): the measured times, each unit's bytes, and the switch
// costs of the activations that cross before it.
func problem(prof *plan.Profile, units []model.Unit, bi, n int, budget int64, hyper ir.Hyper) plan.Problem {
	sw := prof.Switch[bi]
	pr := plan.Problem{Budget: max(budget, 0), Start: plan.CPU, End: plan.CPU,
		ToGPU: sw.Latency, ToCPU: sw.Latency}
	for i, u := range units {
		t := prof.Units[i]
		cross := sw.Time(u.InBytes * int64(max(n, 1)))
		pu := plan.Unit{Name: u.Name, Bytes: u.Bytes, CPU: t.CPU[bi], GPU: t.GPU[bi],
			CPUAlone: t.CPUAlone[bi], GPUAlone: t.GPUAlone[bi], ToGPU: cross, ToCPU: cross}
		if u.Experts > 0 {
			pu.Group = "expert"
		}
		pr.Units = append(pr.Units, pu)
	}
	// The logits cross back at the end (one row).
	pr.ToCPU = sw.Time(4 * int64(hyper.NVocab))
	for i := range units {
		var tie []int
		for j := i + 1; j < len(units); j++ {
			if sharesMat(units[i], units[j]) {
				tie = append(tie, j)
			}
		}
		if len(tie) > 0 {
			pr.Ties = append(pr.Ties, append([]int{i}, tie...))
		}
	}
	return pr
}

// placeByProfile solves the residency under budget-fixed bytes, then the
// prefill streaming of each profiled batch size.
func (p *Planner) placeByProfile(prof *plan.Profile, units []model.Unit, opt Options, budget, fixed, ring int64) (*Placement, error) {
	m := p.m
	if len(prof.Units) != len(units) {
		return nil, fmt.Errorf("plan: the profile has %d units, the model %d", len(prof.Units), len(units))
	}
	for i, u := range units {
		if prof.Units[i].Name != u.Name {
			return nil, fmt.Errorf("plan: profile unit %d is %s, the model's %s", i, prof.Units[i].Name, u.Name)
		}
	}
	// Attention's times at the depth planned for: at a long context its
	// work and its cache's reads dwarf what the profile's short one saw.
	// (The promoter shapes the profile to each step instead.)
	raw := prof
	prof = prof.AtDepth(opt.Depth)
	forPrefill := opt.PlanFor == "prefill"
	n := 1
	if forPrefill {
		n = opt.Batch
	}
	bi := prof.BatchIndex(n)
	// The CPU's times depend on the layout its matrices run in: a hybrid
	// context repacks its CPU units' matrices as far as host memory
	// allows, and the allowance grows with what lives on the GPU
	// (RepackHybrid). The residency is solved as if every CPU unit
	// were repacked (whichever units stay on the CPU, the allowance cuts
	// the same bytes); everything after it, the prefill streams, the
	// prediction and the promotion's figures, takes each unit's layout
	// under that residency.
	assumed, _ := packedFractions(p.w, m, units, func(int) bool { return true })
	solveWith := prof.Packed(assumed)
	pr := problem(solveWith, units, bi, solveWith.Batches[bi], budget-fixed, m.Prog.Hyper)
	var sol plan.Placement
	var err error
	if forPrefill {
		sol, err = solvePrefillResidency(solveWith, units, pr, bi)
	} else {
		if pb := solveWith.BatchIndex(opt.Batch); solveWith.Batches[pb] > 1 {
			blendPrefill(&pr, solveWith, units, pb, solveWith.Batches[pb], promptTokensPerReply, m.Prog.Hyper)
		}
		sol, err = plan.Static(pr)
	}
	if err != nil {
		return nil, fmt.Errorf("plan: %w", err)
	}
	pl := newPlacement(m, units, executor.BackendCPU)
	pl.OptimizedFor = "decode"
	if forPrefill {
		pl.OptimizedFor = "prefill"
	}
	streamable := map[*ir.Weight]bool{}
	for _, u := range units {
		if u.Streamable {
			for _, w := range u.Mats {
				streamable[w] = true
			}
		}
	}
	splitsMoE := false // the device's weight path can split an expert layer with the host
	if p.acc != nil {
		pl.RingBytes = p.acc.RingBytes(m.Prog, backend.ExecConfig{Streams: streamable, RingBytes: ring, Options: opt.Device})
		splitsMoE = p.acc.SplitsMoE()
	}
	resident := func(i int) bool { return sol.On[i] == plan.GPU }
	if !opt.StaticOnly {
		// What promotion will keep in the ring on an idle machine (decode
		// is predicted with them on the GPU).
		pl.ringKept = idleKept(solveWith, units, resident, pl.RingBytes, m.Prog.Hyper.NVocab)
	}
	// The units kept in the ring stay repacked: when the promoter does not
	// keep them (a loaded GPU, a probe of no promotion) the CPU runs them.
	// (Leaving them out to repack more of the others was measured: the
	// 30B-A3B's dynamic decode lost 5-10% on the GPU machine, the 14B
	// gained nothing.)
	frac, repacked := packedFractions(p.w, m, units, resident)
	prof = prof.Packed(frac)
	pl.packed = frac
	pl.FixedBytes, pl.RepackedBytes = fixed, repacked
	pl.prof, pl.Dynamic = prof, !opt.StaticOnly
	pl.stepProf, pl.Depth = raw.Packed(frac), opt.Depth
	d0 := prof.BatchIndex(1)
	for i := range units {
		if sol.On[i] == plan.GPU {
			pl.Units[i].Backend = executor.BackendGPU
		}
		pl.Units[i].KeptInRing = pl.keptAtIdle(i)
		t := prof.Units[i]
		pl.Units[i].CPU, pl.Units[i].GPU = t.CPU[d0], t.GPU[d0]
		if units[i].Bytes > 0 {
			pl.Units[i].Density = (t.CPU[d0] - t.GPU[d0]) / float64(units[i].Bytes)
		}
	}
	pl.sum()
	// Prefill: which CPU units stream, per profiled batch size.
	pred := &Prediction{}
	var last []string
	var lastSplit map[string]int
	for b, size := range prof.Batches {
		if size <= 1 || size > opt.Batch {
			continue
		}
		stream, split, t, err := prefillStreams(p.w, prof, units, pl, b, size, m.Prog.Hyper, max(pl.RingBytes, ring), splitsMoE, opt)
		if err != nil {
			return nil, err
		}
		if len(stream) > 0 && (!slices.Equal(stream, last) || !maps.Equal(split, lastSplit)) {
			pl.Prefill = append(pl.Prefill, PrefillSchedule{MinBatch: size, Stream: stream, Split: split})
			last, lastSplit = stream, split
		} else if len(stream) == 0 && len(last) > 0 {
			pl.Prefill = append(pl.Prefill, PrefillSchedule{MinBatch: size, Stream: []string{}})
			last, lastSplit = nil, nil
		}
		pred.PrefillBatch, pred.PrefillStepSeconds = size, t
	}
	if pred.PrefillStepSeconds > 0 {
		pred.PrefillTokensPerS = float64(pred.PrefillBatch) / pred.PrefillStepSeconds
	}
	// Decode as an idle machine runs it: the kept units from the ring.
	dec := problem(prof, units, d0, 1, 0, m.Prog.Hyper)
	on := make([]plan.Backend, len(units))
	for i := range units {
		if pl.resident(i) || pl.keptAtIdle(i) {
			on[i] = plan.GPU
		}
	}
	pred.DecodeStepSeconds, _, _ = dec.Cost(on)
	if splitsMoE {
		saved := p.routeExperts(pl, units, prof, d0, on, budget, opt)
		pred.DecodeStepSeconds -= saved
	}
	if pred.DecodeStepSeconds > 0 {
		pred.DecodeTokensPerS = 1 / pred.DecodeStepSeconds
	}
	pl.Predicted = pred
	return pl, nil
}

// promptTokensPerReply is how many prompt tokens the decode placement
// counts per generated token: chat turns and retrieval prompts are several
// times longer than the replies they get.
const promptTokensPerReply = 8

// blendPrefill adds to a decode problem each unit's prefill cost for
// perReply prompt tokens (batches of n, profile batch pb). Decode still
// dominates, but where it is nearly indifferent the prefill decides:
// attention, whose KV cache costs little VRAM and saves little at decode
// between two switches, is twenty times faster on the GPU for a batch of
// 512, and a CPU-resident attention cannot stream. A CPU unit that can
// stream counts what streaming costs. Switches are not added: a prefill
// batch runs under its own schedule, where the streamed units put most of
// the model on the GPU, not at the decode placement's switches.
func blendPrefill(pr *plan.Problem, prof *plan.Profile, units []model.Unit, pb, n, perReply int, h ir.Hyper) {
	pre := problem(prof, units, pb, n, 0, h)
	w := float64(perReply) / float64(n)
	for i, u := range units {
		p, q := &pr.Units[i], pre.Units[i]
		cpu, cpuAlone := q.CPU, q.CPUAlone
		if u.Streamable { // a CPU unit streams to the GPU when that is faster
			st := max(prof.Stream.Time(u.Bytes), q.GPU)
			cpu, cpuAlone = min(cpu, st), min(cpuAlone, st)
		}
		p.CPU += w * cpu
		p.CPUAlone += w * cpuAlone
		p.GPU += w * q.GPU
		p.GPUAlone += w * q.GPUAlone
	}
}

// solvePrefillResidency places for prefill: the residency that makes the
// prefill batch fastest, given that CPU units may stream. Streaming makes
// a non-resident unit cost max(copy, compute) on the GPU, so the problem's
// GPU-versus-CPU trade is between residency (no copy) and the budget.
func solvePrefillResidency(prof *plan.Profile, units []model.Unit, pr plan.Problem, bi int) (plan.Placement, error) {
	// A unit's CPU option becomes "not resident": the better of the CPU
	// and streaming; the DP then spends VRAM where the copy is exposed.
	for i, u := range units {
		if !u.Streamable {
			continue
		}
		st := max(prof.Stream.Time(u.Bytes), pr.Units[i].GPU)
		if st < pr.Units[i].CPU {
			pr.Units[i].CPU, pr.Units[i].CPUAlone = st, st
		}
	}
	return plan.Static(pr)
}

// prefillStreams decides, for batches of size (profile batch b), which
// non-resident units stream, and returns their names and the predicted
// seconds of the batch. It is the promotion problem of a decode step
// (plan.Promote) with a prefill batch's figures: the copy engine streams
// the chosen units back to back through the ring while the GPU and the
// CPU compute the units before them, as far ahead as the ring holds
// (ring bytes, less the largest matrix, which is read while the next
// ones arrive). So a unit the CPU computes is time during which later
// units arrive: when the link is the bound (an MoE model's expert stacks
// are many times the compute they carry), the CPU takes some of them and
// the batch gets shorter by what they would have cost the link.
// Attention and the embedding of CPU layers stay on the CPU.
//
// A streamed MoE layer may also be split (when splitsMoE, unless
// EnvMoESplit is "0"): the CPU computes its first experts while the GPU
// computes the others, whose weights alone stream (gpu moeSplit). split
// maps those units to the first expert the GPU computes. The fraction of
// experts the CPU takes is the same for every layer: the one whose plan
// the cost model finds fastest, none included, or EnvMoESplit's
// (moeSplitFractions).
func prefillStreams(w *cpu.Weights, prof *plan.Profile, units []model.Unit, pl *Placement, b, size int, h ir.Hyper, ring int64, splitsMoE bool, opt Options) (stream []string, split map[string]int, secs float64, err error) {
	sw := prof.Switch[b]
	var largest int64
	for i, u := range units {
		if u.Streamable && !pl.resident(i) {
			for _, w := range u.Mats {
				largest = max(largest, w.Bytes())
			}
		}
	}
	ring = max(ring, 2*largest) // as gpu.RingBytes sizes it
	pr := plan.PromoteProblem{EndToCPU: sw.Time(4 * int64(h.NVocab))}
	if link := prof.Stream.BytesPerSec; link > 0 {
		pr.MaxSlack = float64(max(ring-largest, 0)) / link
	}
	all := func(model.Unit) bool { return true }
	pr.Units = streamUnits(prof, units, pl.resident, b, size, plan.Estimates{CPU: 1, GPU: 1}, prof.Stream, all)
	base, baseSlack := pr.Units, pr.MaxSlack
	best, bestKs := plan.Promotion{Time: math.Inf(1)}, 0
	for _, f := range moeSplitFractions(splitsMoE, opt) {
		pr.Units, pr.MaxSlack = slices.Clone(base), baseSlack
		if f > 0 && prof.Stream.BytesPerSec > 0 {
			// A split layer's GPU share is done long before the CPU's, and
			// its regions of the ring are free again: the copy engine may
			// fill the whole ring while the CPU computes.
			pr.MaxSlack = float64(ring) / prof.Stream.BytesPerSec
		}
		ks := 0
		for i, u := range units {
			if ne := moeExperts(u); ne > 0 && !pl.resident(i) && canSplitMoE(w, u) {
				ks = min(int(math.Round(f*float64(ne))), ne-1)
				if ks > 0 {
					share := float64(ks) / float64(ne)
					splitUnit(&pr.Units[i], share, splitCPU(prof.Units[i], b, share, pl.packedAt(i)), sw.Time(2*u.InBytes*int64(size)))
				}
			}
		}
		if f > 0 && ks == 0 {
			continue // no expert at this fraction (or no MoE layer to split)
		}
		sol, err := plan.Promote(pr)
		if err != nil {
			return nil, nil, 0, fmt.Errorf("plan: prefill at %d tokens: %w", size, err)
		}
		if sol.Time < best.Time {
			best, bestKs = sol, ks
		}
	}
	for i, u := range units {
		if !best.Promote[i] {
			continue
		}
		stream = append(stream, u.Name)
		if ne := moeExperts(u); bestKs > 0 && ne > 0 && canSplitMoE(w, u) {
			if split == nil {
				split = map[string]int{}
			}
			split[u.Name] = min(bestKs, ne-1)
		}
	}
	return stream, split, best.Time, nil
}

// routeExperts picks the CPU's expert units whose decode steps hand the
// GPU a share of the experts their tokens chose (Placement.Routed), and
// that share, and returns the decode step's predicted saving; by its own
// choice only where it predicts one. The GPU's
// share crosses the link while the CPU computes the rest, so the share
// that has both finish together is link / (link + CPU), the rates in
// bytes of chosen experts a second: the link's as the profile measured
// it, the CPU's its time for the units at one token over the bytes a token
// reads of them (model.Unit.DecodeBytes). The scratch the experts are
// copied into (RoutedExperts of them) comes out of the budget's slack.
func (p *Planner) routeExperts(pl *Placement, units []model.Unit, prof *plan.Profile, d0 int, on []plan.Backend, budget int64, opt Options) (saved float64) {
	if opt.MoERouted == "0" || prof.Stream.BytesPerSec <= 0 {
		return 0
	}
	var names []string
	var bytes, secs float64
	ne, k := 0, 0
	for i, u := range units {
		if u.Experts == 0 || pl.resident(i) || on[i] == plan.GPU || !u.Streamable || !canSplitMoE(p.w, u) {
			continue
		}
		names = append(names, u.Name)
		bytes += float64(u.DecodeBytes)
		secs += prof.Units[i].CPU[d0]
		ne = max(ne, u.Experts)
		for op := u.Lo; op < u.Hi; op++ {
			k = max(k, p.m.Prog.Ops[op].TopK)
		}
	}
	if len(names) == 0 || secs <= 0 || k == 0 {
		return 0
	}
	link := prof.Stream.BytesPerSec
	share, fixed, err := routedShare(link, bytes/secs, k, opt.MoERouted)
	if err != nil {
		badRoutedNote.Do(func() { opt.Notes.Note(err.Error()) })
		return 0
	}
	t, floored := routedSeconds(secs, bytes, link, prof.HostRead, share, len(names))
	if auto := opt.MoERouted == "" || opt.MoERouted == "auto"; share == 0 || auto && t >= secs {
		return 0
	}
	// Scratch for the share of what a step of up to routedRows tokens
	// chooses, less where the budget has no room.
	most := min(ne, int(math.Ceil(share*float64(min(ne, routedRows*k)))))
	pl.Routed, pl.RoutedShare, pl.RoutedExperts, pl.RoutedFixed = names, share, most, fixed
	for ; most > 0; most /= 2 {
		pl.RoutedExperts = most
		if arena, weights := p.needBytes(pl, opt); arena+weights <= budget {
			break
		}
	}
	if most == 0 {
		pl.Routed, pl.RoutedShare, pl.RoutedExperts, pl.RoutedFixed = nil, 0, 0, false
		return 0
	}
	return secs - floored // negative where the share is predicted slower for one token
}

// routedSeconds is what a decode step's routed layers take for one token,
// their CPU computing secs for all of a token's chosen experts (bytes of
// them) when not routed: the CPU computes 1-share of them while the link
// (bytes/s) brings the rest, and each of the layers also waits for its
// routing and queues its copies (routedLayerSeconds). floored also counts
// host memory: the CPU's experts and the link's copies are both read
// from it, at hostRead (bytes/s, 0: unknown) in all, so on a host whose
// CPU reads as fast as its memory serves, the share saves nothing for one
// token (on the GPU machine the CPU's 5 of 8 experts took 0.27 ms a layer
// while the link copied the other 3: 23.5 MB at 87 GB/s, where host
// memory reads at 91). The planner routes by t: a step of several tokens
// computes more on the CPU for each byte it reads, and there the share
// gains (four requests at once, greedy: 163.2 t/s routed against 99.0);
// floored is what it predicts for one.
func routedSeconds(secs, bytes, link, hostRead, share float64, layers int) (t, floored float64) {
	wait := float64(layers) * routedLayerSeconds
	experts := max(secs*(1-share), share*bytes/link)
	t = experts + wait
	if hostRead > 0 {
		experts = max(experts, bytes/hostRead)
	}
	return t, experts + wait
}

// routedShare is the GPU's share of a routed layer's chosen experts: the
// one that has the link (link bytes/s) and the CPU (cpuRate bytes of
// chosen experts a second) finish together, or forced's (a fraction;
// "" and "auto" leave the balance; "0" none); 0 when it is not one of a
// token's k experts. fixed says a forced share holds (Placement.RoutedFixed):
// decode then never moves it.
func routedShare(link, cpuRate float64, k int, forced string) (share float64, fixed bool, err error) {
	share = link / (link + cpuRate)
	if forced != "" && forced != "auto" {
		f, err := strconv.ParseFloat(forced, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return 0, false, fmt.Errorf("ATS_MOE_ROUTED=%q is neither a fraction in [0, 1] nor auto: ignored", forced)
		}
		share, fixed = f, true
	}
	if !(share*float64(k) >= 0.5) {
		return 0, fixed, nil
	}
	return share, fixed, nil
}

// routedRows is the decode batch the routed scratch is sized for: a step
// of more tokens hands the GPU only as many experts as fit.
const routedRows = 4

// routedLayerSeconds is what a routed layer costs beyond its experts: the
// host's wait for the routing and its copies' and launches' queueing.
const routedLayerSeconds = 40e-6

// badRoutedNote says once that ATS_MOE_ROUTED was not understood.
var badRoutedNote sync.Once

// moeSplitFractions are the shares of each streamed expert layer's
// experts the planner tries giving the host (Options.MoESplit): by default
// ("auto") none and every thirty-second up to three eighths (the CPU
// computes a 512-token batch's stack several times slower than the link
// brings it); a fraction splits every layer at that share, "0" none. On the
// GPU machine the 30B-A3B at 6 GiB ran pp512 about 1.2 times, pp256 1.6
// times as fast split. It was off until the CPU's share ran at its
// standalone speed: its chunks were cut by unit count, and a few hot
// experts held single threads (runtime/backend/cpu expertCosts).
func moeSplitFractions(splitsMoE bool, opt Options) []float64 {
	v := opt.MoESplit
	if !splitsMoE || v == "0" {
		return []float64{0}
	}
	if v != "" && v != "auto" {
		if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 && f < 1 {
			return []float64{f}
		}
		badSplitNote.Do(func() {
			opt.Notes.Note(fmt.Sprintf("ATS_MOE_SPLIT=%q is neither a fraction in [0, 1) nor auto: ignored", v))
		})
		return []float64{0}
	}
	out := make([]float64, 0, 13)
	for k := 0; k <= 12; k++ {
		out = append(out, float64(k)/32)
	}
	return out
}

// badSplitNote says once that EnvMoESplit was not understood (each
// prefill batch size's plan reads it).
var badSplitNote sync.Once

// moeExperts is the expert count of an expert unit (0 for other units).
func moeExperts(u model.Unit) int { return u.Experts }

// canSplitMoE says whether the host can take a share of expert unit u's
// experts (cpu.Backend.MoEPartial): its grouped path needs gate and up to
// read one activation type.
func canSplitMoE(w *cpu.Weights, u model.Unit) bool {
	var stacks []*ir.Weight
	for _, mw := range u.Mats {
		if mw.Experts() > 0 {
			stacks = append(stacks, mw)
		}
	}
	return len(stacks) == 3 && w.SharedActivations(stacks[0], stacks[1])
}

// splitUnit turns a streamed MoE unit's figures into those of the unit
// split at fraction f of its experts, whose share the CPU computes in cpu
// seconds: only the GPU's share is copied, and the unit takes the longer
// of the GPU's share of its compute and the CPU's (with the input's trip
// to the host and the sum's back, cross). While it runs, the copy engine
// brings the next units.
func splitUnit(u *plan.PromoteUnit, f, cpu, cross float64) {
	u.Copy *= 1 - f
	u.GPU = max(u.GPU*(1-f), cpu+cross)
}

// splitCPU is the CPU's time for the first share of an MoE unit's experts
// at profile batch b, when its stacks' first packed of them read repacked
// copies (hybridChoice) and the others the file's blocks. The
// repacked part is the measured quarter's (CPUShare) in proportion; the
// rest, and all of it for a profile without CPUShare, comes from the whole
// op's times: t's CPU time mixes the two layouts by packed
// (plan.Profile.Packed), CPUPacked is the repacked one. The whole op's
// times also route every token, group every slot and add them up, which
// the GPU does for a split layer: on the GPU machine the repacked 30B-A3B
// layers' 512-token ops took 14.4 and 18.5 ms (Q4_K and Q6_K down
// products), a quarter of their experts 3.4 and 4.2 (docs/bench/hybrid.md in the git history,
// ninth pass).
func splitCPU(t plan.UnitTimes, b int, share, packed float64) float64 {
	if len(t.CPUPacked) <= b || packed <= 0 {
		return t.CPU[b] * share
	}
	fast := t.CPUPacked[b]
	if len(t.CPUShare) > b && t.CPUShare[b] > 0 {
		fast = min(fast, shareProfiled*t.CPUShare[b])
	}
	if packed >= 1 {
		return fast * share
	}
	plain := max(t.CPU[b]-packed*t.CPUPacked[b], 0) / (1 - packed) // t.CPU[b] is the mix
	return fast*min(share, packed) + plain*max(share-packed, 0)
}
