package session

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/backend/cuda"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/placement"
)

// Whole-model tests of the hybrid executor: every oracle under forced
// placements (all on the CPU, all on the GPU, units alternating, units at
// random, and the planner's own at several budgets), each with prefill
// batches that also stream the CPU units through the ring; the logits must
// match llama.cpp's within the oracle bound, and the process's device
// memory must stay within the budget. They skip without a GPU.

// programUnits is model.Units with an f16 cache of ctx rows.
func programUnits(p *ir.Program, ctx int, deviceBytes func(*ir.Weight) int64) []model.Unit {
	return model.Units(p, model.KV{Rows: ctx, Type: kvcache.F16}, deviceBytes)
}

// sharesMat says whether two units read a matrix in common (tied
// embeddings).
func sharesMat(a, b model.Unit) bool {
	for _, w := range a.Mats {
		if slices.Contains(b.Mats, w) {
			return true
		}
	}
	return false
}

// forcedPlacement places unit i on the GPU where gpuAt(i) says so, and has
// prefill batches of 2+ tokens stream every other streamable unit; decode
// may promote (with Options.PromoteEverything, every unit it can).
func forcedPlacement(t *testing.T, m *model.Model, ctxSize int, gpuAt func(i int, u model.Unit) bool) *placement.Placement {
	t.Helper()
	units := programUnits(m.Prog, ctxSize, nil)
	pl := &placement.Placement{Dynamic: true}
	for i, u := range units {
		b := executor.BackendCPU
		if gpuAt(i, u) {
			b = executor.BackendGPU
		}
		pl.Units = append(pl.Units, placement.UnitPlacement{Index: i, Name: u.Name, Backend: b})
	}
	// Tied units (embedding and output) live together.
	for i := range units {
		for j := i + 1; j < len(units); j++ {
			if sharesMat(units[i], units[j]) {
				pl.Units[j].Backend = pl.Units[i].Backend
			}
		}
	}
	var stream []string
	for i, u := range units {
		if u.Streamable && pl.Units[i].Backend == executor.BackendCPU {
			stream = append(stream, u.Name)
		}
	}
	pl.Prefill = []placement.PrefillSchedule{{MinBatch: 2, Stream: stream}}
	return pl
}

// splitPrefill has pl's prefill batches split every streamed MoE layer
// with the CPU at frac of its experts (at least one, at most all but one);
// nil when no MoE layer streams.
func splitPrefill(m *model.Model, pl *placement.Placement, frac float64) *placement.Placement {
	split := map[string]int{}
	units := programUnits(m.Prog, 64, nil)
	for _, ps := range pl.Prefill {
		for _, name := range ps.Stream {
			for _, u := range units {
				if ne := u.Experts; u.Name == name && ne > 1 {
					split[name] = min(max(int(frac*float64(ne)), 1), ne-1)
				}
			}
		}
	}
	if len(split) == 0 {
		return nil
	}
	for k := range pl.Prefill {
		pl.Prefill[k].Split = split
	}
	return pl
}

// routedDecode has pl's decode steps hand the GPU share of the experts
// their tokens choose in every expert layer on the CPU, with no promotion,
// the share held or, unless fixed, moved as the two sides keep pace; nil
// when none is on the CPU.
func routedDecode(m *model.Model, pl *placement.Placement, share float64, fixed bool) *placement.Placement {
	units := programUnits(m.Prog, 64, nil)
	most := 0
	for i, u := range units {
		if u.Experts > 1 && u.Streamable && pl.Units[i].Backend == executor.BackendCPU {
			pl.Routed = append(pl.Routed, u.Name)
			most = max(most, u.Experts)
		}
	}
	if len(pl.Routed) == 0 {
		return nil
	}
	pl.RoutedShare, pl.RoutedExperts, pl.Dynamic, pl.RoutedFixed = share, most, false, fixed
	return pl
}

// oracleVariant is one way to run an oracle model: context options, and
// whether the streamed weights must sit in pinned copies.
type oracleVariant struct {
	name   string
	opt    Options
	copies bool // the driver may not register the file: pinned copies
	// promoteAll has decode promote every CPU unit it may, whatever the
	// promoter's estimates say (TestOraclesPlacements sets it for all).
	promoteAll bool
	// hybridPlan has the planner place by its profile even where the
	// whole model fits the budget (Options.HybridAlways).
	hybridPlan bool
	// routed: decode steps must have routed expert layers
	// (Placement.Routed).
	routed bool
}

func TestOraclesPlacements(t *testing.T) {
	dev := needGPUDevice(t)
	const ctx = 128
	checkOracleVariants(t, dev, ctx, func(m *model.Model, name string) []oracleVariant {
		rng := rand.New(rand.NewPCG(7, uint64(len(name))))
		variants := []oracleVariant{
			{name: "all-cpu", opt: Options{Backend: executor.BackendCPU}, promoteAll: true},
			{name: "all-gpu", opt: Options{Backend: executor.BackendGPU}, promoteAll: true},
			{name: "alternating", opt: Options{Backend: executor.BackendAuto, Placement: forcedPlacement(t, m, ctx, func(i int, _ model.Unit) bool { return i%2 == 1 })}, promoteAll: true},
			{name: "alternating-odd", opt: Options{Backend: executor.BackendAuto, Placement: forcedPlacement(t, m, ctx, func(i int, _ model.Unit) bool { return i%2 == 0 })}, promoteAll: true},
			{name: "random", opt: Options{Backend: executor.BackendAuto, Placement: forcedPlacement(t, m, ctx, func(int, model.Unit) bool { return rng.IntN(2) == 0 })}, promoteAll: true},
			{name: "attention-cpu", opt: Options{Backend: executor.BackendAuto, Placement: forcedPlacement(t, m, ctx, func(_ int, u model.Unit) bool { return u.Role != "attention" })}, promoteAll: true},
			{name: "alternating-pinned-copies", opt: Options{Backend: executor.BackendAuto, Placement: forcedPlacement(t, m, ctx, func(i int, _ model.Unit) bool { return i%2 == 1 })}, copies: true, promoteAll: true},
		}
		// Prefill batches that split each streamed MoE layer with the CPU
		// (the CPU computes the first experts while the GPU computes the
		// others from the ring).
		for _, c := range []struct {
			name  string
			frac  float64
			gpuAt func(int, model.Unit) bool
		}{
			{"all-cpu-split-half", 0.5, func(int, model.Unit) bool { return false }},
			{"alternating-split-quarter", 0.25, func(i int, _ model.Unit) bool { return i%2 == 1 }},
			{"attention-gpu-split-one", 0, func(_ int, u model.Unit) bool { return u.Role == "attention" }},
		} {
			if pl := splitPrefill(m, forcedPlacement(t, m, ctx, c.gpuAt), c.frac); pl != nil {
				variants = append(variants, oracleVariant{name: c.name, opt: Options{Backend: executor.BackendAuto, Placement: pl}, promoteAll: true})
			}
		}
		// Decode steps that hand the GPU a share of the experts their
		// tokens chose in the CPU's expert layers (Placement.Routed):
		// none of them, a quarter, half, and all (the scratch and the
		// slots' remapping alone), held there, and a share that starts at
		// half and moves each layer as the two sides keep pace; with no
		// promotion to take the layers whole.
		for _, c := range []struct {
			name  string
			share float64
			fixed bool
			gpuAt func(int, model.Unit) bool
		}{
			{"attention-gpu-routed-none", 0, true, func(_ int, u model.Unit) bool { return u.Role == "attention" }},
			{"attention-gpu-routed-quarter", 0.25, true, func(_ int, u model.Unit) bool { return u.Role == "attention" }},
			{"all-cpu-routed-half", 0.5, true, func(int, model.Unit) bool { return false }},
			{"alternating-routed-all", 1, true, func(i int, _ model.Unit) bool { return i%2 == 1 }},
			{"attention-gpu-routed-paced", 0.5, false, func(_ int, u model.Unit) bool { return u.Role == "attention" }},
		} {
			if pl := routedDecode(m, forcedPlacement(t, m, ctx, c.gpuAt), c.share, c.fixed); pl != nil {
				variants = append(variants, oracleVariant{name: c.name, opt: Options{Backend: executor.BackendAuto, Placement: pl}, routed: true})
			}
		}
		need := m.WeightBytes()
		// The planner's own, at budgets from just above its fixed
		// buffers to everything; below 75% by its profile even though
		// the tiny models would fit (planHybridAlways).
		for _, frac := range []float64{0.25, 0.5, 0.75} {
			variants = append(variants, oracleVariant{name: fmt.Sprintf("planned-%.0f%%", 100*frac),
				opt:        Options{Backend: executor.BackendAuto, VRAMBudget: int64(frac*float64(need)) + fixedBytesFor(t, m, dev, ctx)},
				promoteAll: true, hybridPlan: frac < 0.7})
		}
		return variants
	})
}

// checkOracleVariants runs every oracle model under each of its variants:
// a prompt in the oracle's batches, its decode steps, and the prompt again
// in one batch; the logits must match llama.cpp's within the oracle bound
// and the device memory a context allocates must stay within its budget.
func checkOracleVariants(t *testing.T, dev *cuda.Device, ctx int, variantsOf func(m *model.Model, name string) []oracleVariant) {
	base, baseHow, haveNVML := dev.ProcessMemory()
	t.Logf("device memory in use before the tests (%s): %s", baseHow, executor.FormatBytes(base))
	eachOracleModel(t, func(t *testing.T, name string, m *model.Model, want *oracleLogits) {
		ref := flatOracle(want)
		// An MoE model runs with the CPU backend's expert choice imposed
		// on every token and layer, on both backends (as
		// TestOraclesGPUWithCPURouting): the GPU's rounding flips a few
		// near-tied choices (TestOraclesGPU counts them), and a flipped
		// token's logits then say nothing of the placement's arithmetic.
		// The inspector runs decode steps without graphs;
		// TestGPUGraphMatchesEager checks an MoE model's graphs.
		var cpuRoutes [][]tokenRoute
		if len(moeOps(m.Prog)) > 0 {
			cpuRoutes, _, _ = cpuOracleRoutes(t, m.File.Path, want)
		}
		for _, v := range variantsOf(m, name) {
			t.Run(v.name, func(t *testing.T) {
				v.opt.CtxSize, v.opt.Threads = ctx, 2
				v.opt.DeviceOptions.NoRegister = v.copies
				v.opt.PromoteEverything = v.promoteAll
				v.opt.HybridAlways = v.hybridPlan
				if v.opt.Backend != executor.BackendCPU {
					v.opt.Device = dev
				}
				// What the context allocates, against what was in use
				// before it: the CUDA context and the kernel modules
				// earlier variants loaded (modules load at their first
				// launch; their code is the CUDA context's, not the
				// budget's).
				base, _, _ := dev.ProcessMemory()
				c, err := newCtx(m, v.opt)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				var own [][]tokenRoute
				if cpuRoutes != nil {
					own = inspectRoutes(t, c.Engine, len(want.Prompt)+len(want.Generated), cpuRoutes)
				}
				if v.copies {
					if ok, copied, why := c.Ctx.Device().Pinned(); !ok || copied == 0 {
						t.Fatalf("streamed weights not in pinned copies (registration: %s)", why)
					}
				}
				prefill, err := c.Eval(want.Prompt, true)
				if err != nil {
					t.Fatal(err)
				}
				var decode [][]float32
				for _, tok := range want.Generated {
					l, err := c.Eval([]int{tok}, false)
					if err != nil {
						t.Fatal(err)
					}
					decode = append(decode, l)
				}
				prom := c.Promoter.Stats()
				// A prompt in one batch of the streaming schedule too.
				if err := c.Truncate(0); err != nil {
					t.Fatal(err)
				}
				last, err := c.Eval(want.Prompt, false)
				if err != nil {
					t.Fatal(err)
				}
				sp := c.Ctx.Stats().Split
				if v.routed {
					pl := v.opt.Placement
					if sp.RoutedLayers == 0 || (pl.RoutedShare > 0) != (sp.DeviceExperts > 0) || (sp.DeviceExperts > 0) != (sp.CopiedBytes > 0) {
						t.Errorf("routed stats at share %g: %d layers, %d experts on the device, %d bytes copied", pl.RoutedShare, sp.RoutedLayers, sp.DeviceExperts, sp.CopiedBytes)
					}
					t.Logf("routed: %d layers, %d experts on the device (%d bytes), %d on the host", sp.RoutedLayers, sp.DeviceExperts, sp.CopiedBytes, sp.RoutedHostExperts)
				}
				if sp.Layers > 0 {
					// The bytes of the host's experts that had a slot: some
					// when any did, at most every expert of every split layer.
					var most int64
					for i := range m.Prog.Ops {
						if op := &m.Prog.Ops[i]; op.Class().Experts {
							most = max(most, op.Gate.Bytes()+op.Up.Bytes()+op.Down.Bytes())
						}
					}
					if (sp.HostRouted > 0) != (sp.HostBytes > 0) || sp.HostBytes > int64(sp.Layers)*most {
						t.Errorf("split stats: %d of the host's experts routed over %d layers, %d bytes of them", sp.HostRouted, sp.Layers, sp.HostBytes)
					}
				}
				e, tol := nmse(flatLogits(prefill, decode), ref), oracleTolerance(name)
				nv := want.NVocab
				eLast := nmse(last, want.PrefillLogits[len(want.PrefillLogits)-1][:nv])
				pl := c.Placement
				used := "-"
				if haveNVML && c.Backend() != executor.BackendCPU {
					now, how, _ := dev.ProcessMemory()
					used = fmt.Sprintf("%s (%s, less %s before)", executor.FormatBytes(now-base), how, executor.FormatBytes(base))
					if pl.Budget > 0 && now-base > pl.Budget {
						t.Errorf("device memory %s over the budget %s", executor.FormatBytes(now-base), executor.FormatBytes(pl.Budget))
					}
				}
				promoted := "no promotion"
				if prom.On {
					promoted = fmt.Sprintf("promotion: %d units, %d re-plans", prom.PromotedUnits, prom.Replans)
				}
				t.Logf("%s %s: NMSE %.3g (bound %.0e), last row of one batch %.3g; %s; %s; %s; VRAM %s",
					name, v.name, e, tol, eLast, c.Backend(), pl.Describe(), promoted, used)
				if cpuRoutes != nil {
					flips, _ := routeFlips(cpuRoutes, own)
					t.Logf("%s %s: with the CPU's expert choice imposed; the placement's own choice would differ at %d token x layer pairs", name, v.name, len(flips))
				}
				gpu := c.Backend() != executor.BackendCPU
				checkOracleNMSE(t, name, name+" "+v.name, gpu, e, tol)
				checkOracleNMSE(t, name, name+" "+v.name+", last row of one batch", gpu, eLast, tol)
			})
		}
	})
}

// eachOracleModel runs fn as a subtest for each oracle model, opened, with
// its expected logits.
func eachOracleModel(t *testing.T, fn func(t *testing.T, name string, m *model.Model, want *oracleLogits)) {
	for _, path := range oracleFiles(t) {
		name := strings.TrimSuffix(filepath.Base(path), ".gguf")
		t.Run(name, func(t *testing.T) {
			want := loadOracle(t, strings.TrimSuffix(path, ".gguf")+".logits.json")
			m, err := model.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			fn(t, name, m, want)
		})
	}
}

// fixedBytesFor is the planner's fixed device memory for contexts of ctx.
func fixedBytesFor(t *testing.T, m *model.Model, dev *cuda.Device, ctx int) int64 {
	pln, po, err := NewPlanner(m, Options{CtxSize: ctx, Batch: min(512, ctx), Device: dev})
	if err != nil {
		t.Fatal(err)
	}
	return pln.FixedBytes(po)
}

// flatOracle joins the oracle's prefill and decode logits.
func flatOracle(o *oracleLogits) []float32 {
	var ref []float32
	for _, r := range o.PrefillLogits {
		ref = append(ref, r...)
	}
	for _, r := range o.DecodeLogits {
		ref = append(ref, r...)
	}
	return ref
}

// TestKeptRingGraphMatchesEager: a decode step that finds its promoted
// weights still in the staging ring (nothing to copy) replays CUDA graphs
// of the segments that read them; the logits must be those of eager
// launches, bit for bit, and the ring must indeed have kept the weights.
func TestKeptRingGraphMatchesEager(t *testing.T) {
	dev := needGPUDevice(t)
	const ctx = 128
	eachOracleModel(t, func(t *testing.T, _ string, m *model.Model, want *oracleLogits) {
		// One streamable product on the CPU, which the least ring holds.
		cpuUnit := -1
		for i, u := range programUnits(m.Prog, ctx, nil) {
			if u.Streamable && u.Layer > 0 && cpuUnit < 0 {
				cpuUnit = i
			}
		}
		if cpuUnit < 0 {
			t.Skip("no streamable unit past the first layer")
		}
		opt := Options{Backend: executor.BackendAuto, Device: dev, CtxSize: ctx, Threads: 2, PromoteEverything: true,
			Placement: forcedPlacement(t, m, ctx, func(i int, _ model.Unit) bool { return i != cpuUnit })}
		var streamed []int64 // bytes streamed so far, after each decode step
		_, graphs := evalOracle(t, m, want, opt, nil, func(c *Engine) { streamed = append(streamed, c.Ctx.Streamed()) })
		if n := len(streamed); n < 3 || streamed[0] == 0 || streamed[n-1] != streamed[n-2] || streamed[n-2] != streamed[n-3] {
			t.Fatalf("the promoted weights were copied again on the last decode steps or never (bytes streamed after each step: %v): the ring did not keep them", streamed)
		}
		opt.DeviceOptions.NoGraphs = true
		_, eager := evalOracle(t, m, want, opt, nil, nil)
		for s := range graphs {
			if !slices.Equal(graphs[s], eager[s]) {
				t.Fatalf("decode step %d: logits with the kept ring's graphs differ from eager launches (NMSE %.3g)", s, nmse(graphs[s], eager[s]))
			}
		}
	})
}

// TestPrefetchMatchesCold: decode steps whose first promoted weights the
// step before uploaded (the executor's prefetch into a ring too small for
// all of them) give the logits of steps that upload everything
// themselves, bit for bit, and the prefetch does happen.
func TestPrefetchMatchesCold(t *testing.T) {
	dev := needGPUDevice(t)
	const ctx = 128
	eachOracleModel(t, func(t *testing.T, _ string, m *model.Model, want *oracleLogits) {
		opt := Options{Backend: executor.BackendAuto, Device: dev, CtxSize: ctx, Threads: 2, PromoteEverything: true,
			Placement: forcedPlacement(t, m, ctx, func(i int, _ model.Unit) bool { return i%2 == 1 })}
		var ahead []int64 // bytes each decode step found prefetched
		prefill, warm := evalOracle(t, m, want, opt, nil, func(c *Engine) { ahead = append(ahead, c.Ctx.Device().Prefetched()) })
		if len(ahead) < 2 || slices.Max(ahead) == 0 {
			t.Fatalf("no decode step found weights prefetched (bytes by step: %v)", ahead)
		}
		opt.DeviceOptions.NoPrefetch = true
		var none []int64
		prefillCold, cold := evalOracle(t, m, want, opt, nil, func(c *Engine) { none = append(none, c.Ctx.Device().Prefetched()) })
		if slices.Max(none) != 0 {
			t.Fatalf("with the prefetch off, still prefetched (bytes by step: %v)", none)
		}
		if !slices.Equal(prefill, prefillCold) {
			t.Fatalf("prompt logits differ (NMSE %.3g)", nmse(prefill, prefillCold))
		}
		for s := range warm {
			if !slices.Equal(warm[s], cold[s]) {
				t.Fatalf("decode step %d: logits with prefetched weights differ from cold uploads (NMSE %.3g)", s, nmse(warm[s], cold[s]))
			}
		}
		t.Logf("prefetched bytes by decode step: %v", ahead)
	})
}
