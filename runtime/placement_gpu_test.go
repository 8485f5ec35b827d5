package runtime

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/gpu"
)

// Whole-model tests of the hybrid executor: every oracle under forced
// placements (all on the CPU, all on the GPU, units alternating, units at
// random, and the planner's own at several budgets), each with prefill
// batches that also stream the CPU units through the ring; the logits must
// match llama.cpp's within the oracle bound, and the process's device
// memory must stay within the budget. They skip without a GPU.

// forcedPlacement places unit i on the GPU where gpuAt(i) says so, and has
// prefill batches of 2+ tokens stream every other streamable unit.
func forcedPlacement(t *testing.T, m *Model, ctxSize int, gpuAt func(i int, u Unit) bool) *Placement {
	t.Helper()
	units := programUnits(m.Prog, ctxSize, nil)
	pl := newPlacement(m, units, BackendCPU)
	for i, u := range units {
		if gpuAt(i, u) {
			pl.Units[i].Backend = BackendGPU
		}
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
		if u.Streamable && pl.Units[i].Backend == BackendCPU {
			stream = append(stream, u.Name)
		}
	}
	pl.Prefill = []PrefillSchedule{{MinBatch: 2, Stream: stream}}
	pl.Dynamic = true // with promoteEverything, decode promotes them all
	pl.sum()
	return pl
}

func TestOraclesPlacements(t *testing.T) {
	dev := needGPUDevice(t)
	promoteEverything = true
	defer func() { promoteEverything = false }()
	files := oracleFiles(t)
	const ctx = 128
	base, baseHow, haveNVML := dev.ProcessMemory()
	t.Logf("device memory in use before the tests (%s): %s", baseHow, FormatBytes(base))
	for _, path := range files {
		name := strings.TrimSuffix(filepath.Base(path), ".gguf")
		t.Run(name, func(t *testing.T) {
			want := loadOracle(t, strings.TrimSuffix(path, ".gguf")+".logits.json")
			m, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			ref := flatOracle(want)
			rng := rand.New(rand.NewPCG(7, uint64(len(name))))
			type variant struct {
				name   string
				opt    ContextOptions
				copies bool // the driver may not register the file: pinned copies
			}
			variants := []variant{
				{"all-cpu", ContextOptions{Backend: BackendCPU}, false},
				{"all-gpu", ContextOptions{Backend: BackendGPU}, false},
				{"alternating", ContextOptions{Backend: BackendAuto, Placement: forcedPlacement(t, m, ctx, func(i int, _ Unit) bool { return i%2 == 1 })}, false},
				{"alternating-odd", ContextOptions{Backend: BackendAuto, Placement: forcedPlacement(t, m, ctx, func(i int, _ Unit) bool { return i%2 == 0 })}, false},
				{"random", ContextOptions{Backend: BackendAuto, Placement: forcedPlacement(t, m, ctx, func(int, Unit) bool { return rng.IntN(2) == 0 })}, false},
				{"attention-cpu", ContextOptions{Backend: BackendAuto, Placement: forcedPlacement(t, m, ctx, func(_ int, u Unit) bool { return u.Role != "attention" })}, false},
				{"alternating-pinned-copies", ContextOptions{Backend: BackendAuto, Placement: forcedPlacement(t, m, ctx, func(i int, _ Unit) bool { return i%2 == 1 })}, true},
			}
			// The planner's own, at budgets from just above its fixed
			// buffers to everything.
			need := m.WeightBytes()
			for _, frac := range []float64{0.25, 0.5, 0.75} {
				variants = append(variants, variant{fmt.Sprintf("planned-%.0f%%", 100*frac),
					ContextOptions{Backend: BackendAuto, VRAMBudget: int64(frac*float64(need)) + m.fixedBytesFor(t, dev, ctx)}, false})
			}
			for _, v := range variants {
				t.Run(v.name, func(t *testing.T) {
					v.opt.CtxSize, v.opt.Threads = ctx, 2
					if v.copies {
						t.Setenv(gpu.EnvGPURegister, "0")
					}
					// What the context allocates, against what was in use
					// before it: the CUDA context and the kernel modules
					// earlier variants loaded (modules load at their first
					// launch; their code is the CUDA context's, not the
					// budget's).
					base, _, _ := dev.ProcessMemory()
					c, err := m.NewContext(v.opt)
					if err != nil {
						t.Fatal(err)
					}
					defer c.Close()
					if v.copies {
						if ok, copied, why := c.gpu.Pinned(); !ok || copied == 0 {
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
					// A prompt in one batch of the streaming schedule too.
					if err := c.Truncate(0); err != nil {
						t.Fatal(err)
					}
					last, err := c.Eval(want.Prompt, false)
					if err != nil {
						t.Fatal(err)
					}
					e, tol := nmse(flatLogits(prefill, decode), ref), oracleTolerance(name)
					nv := want.NVocab
					eLast := nmse(last, want.PrefillLogits[len(want.PrefillLogits)-1][:nv])
					pl := c.Placement()
					used := "-"
					if haveNVML && c.Backend() != BackendCPU {
						now, how, _ := dev.ProcessMemory()
						used = fmt.Sprintf("%s (%s, less %s before)", FormatBytes(now-base), how, FormatBytes(base))
						if pl.Budget > 0 && now-base > pl.Budget {
							t.Errorf("device memory %s over the budget %s", FormatBytes(now-base), FormatBytes(pl.Budget))
						}
					}
					t.Logf("%s %s: NMSE %.3g (bound %.0e), last row of one batch %.3g; %s; %s; VRAM %s",
						name, v.name, e, tol, eLast, c.Backend(), pl.Describe(), used)
					if e > tol || eLast > tol {
						t.Errorf("NMSE %.3g / %.3g over the bound %.0e", e, eLast, tol)
					}
				})
			}
		})
	}
}

// fixedBytesFor is the planner's fixed device memory for contexts of ctx.
func (m *Model) fixedBytesFor(t *testing.T, dev *gpu.Device, ctx int) int64 {
	opt := ContextOptions{CtxSize: ctx, Batch: min(512, ctx)}
	return m.fixedBytes(dev, programUnits(m.Prog, ctx, dev.Weights().DeviceBytes), opt, ringWanted(opt, 0))
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
