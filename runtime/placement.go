package runtime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/gpu"
	"github.com/atsinfer/ats/runtime/ir"
)

// Backends a context can run on (ContextOptions.Backend).
const (
	BackendCPU    = "cpu"
	BackendGPU    = "gpu"
	BackendAuto   = "auto"
	BackendHybrid = "cpu+gpu" // what Context.Backend says of a mixed placement
)

// Placement says where every unit of a model lives: on the GPU (resident,
// its weights or KV cache in device memory) or on the CPU; and, for prefill
// batches, which CPU units stream through the staging ring to run on the
// GPU. `ats plan --json` prints it and `--placement FILE` reads it back.
type Placement struct {
	Model        string `json:"model"`
	Arch         string `json:"arch"`
	Layers       int    `json:"layers"`
	OptimizedFor string `json:"optimized_for"` // decode, prefill; "" when not planned by the DP
	Note         string `json:"note,omitempty"`
	Budget       int64  `json:"budget_bytes"`
	// FixedBytes is the device memory beside the units: activations,
	// scratch, the staging ring, norms and biases.
	FixedBytes int64 `json:"fixed_bytes"`
	GPUBytes   int64 `json:"weights_gpu_bytes"` // resident units (weights and KV caches)
	CPUBytes   int64 `json:"weights_cpu_bytes"`
	// ContextBytes is what the device had in use before ats allocated
	// anything (the CUDA context, other processes): not in the budget.
	ContextBytes int64 `json:"cuda_context_bytes,omitempty"`
	// RingBytes is the staging ring through which CPU units stream to the
	// GPU (prefill batches, and promoted units of decode steps).
	RingBytes int64 `json:"ring_bytes,omitempty"`
	// RepackedBytes is what of the CPU units' matrices the planner
	// expects the CPU to read from repacked copies (Model.repackHybrid),
	// timed so in the profile; the rest runs from the file's blocks.
	RepackedBytes int64 `json:"repacked_bytes,omitempty"`
	// Dynamic says whether decode steps promote CPU units to the GPU
	// (planned from the profile, re-planned as the machine's load
	// changes); false with --dynamic=false or without a profile.
	Dynamic   bool              `json:"dynamic"`
	Predicted *Prediction       `json:"predicted,omitempty"`
	Prefill   []PrefillSchedule `json:"prefill,omitempty"`
	Units     []UnitPlacement   `json:"units"`

	units   []Unit
	vectors []*ir.Weight  // the model's 1-D weights (norms, biases)
	prof    *plan.Profile // what it was planned from (nil: not planned)
	// ringKept, by unit: the CPU units dynamic promotion is expected to
	// keep in the staging ring on an idle machine (nil: none).
	ringKept []bool
	// packed, by unit: the fraction of its matrices the CPU reads from
	// repacked copies (Model.packedFractions); for an MoE unit, its
	// stacks' first experts (nil: not planned).
	packed []float64
}

// UnitPlacement is one unit's place, with its profiled decode figures
// when the placement was planned.
type UnitPlacement struct {
	Index   int    `json:"index"`
	Name    string `json:"name"`
	Layer   int    `json:"layer"`
	Role    string `json:"role"`
	Op      string `json:"op"`
	Type    string `json:"type"`
	Bytes   int64  `json:"bytes"`
	Backend string `json:"backend"`
	// KeptInRing: a CPU unit dynamic promotion is expected to keep in the
	// staging ring on an idle machine (so run on the GPU).
	KeptInRing bool    `json:"kept_in_ring,omitempty"`
	CPU        float64 `json:"cpu_s,omitempty"`
	GPU        float64 `json:"gpu_s,omitempty"`
	Density    float64 `json:"density,omitempty"`
}

// PrefillSchedule lists the CPU units that stream to the GPU in batches of
// at least MinBatch tokens.
type PrefillSchedule struct {
	MinBatch int      `json:"min_batch"`
	Stream   []string `json:"stream"`
	// Split maps streamed MoE units to the first expert the GPU computes:
	// the CPU computes the experts before it at the same time, and their
	// weights do not stream (gpu.SegmentSpec.Split).
	Split map[string]int `json:"split,omitempty"`
}

// Prediction is what the cost model expects of a placement.
type Prediction struct {
	DecodeStepSeconds  float64 `json:"decode_step_s"`
	DecodeTokensPerS   float64 `json:"decode_tokens_per_s"`
	PrefillBatch       int     `json:"prefill_batch"`
	PrefillStepSeconds float64 `json:"prefill_step_s"`
	PrefillTokensPerS  float64 `json:"prefill_tokens_per_s"`
}

func (pl *Placement) resident(i int) bool { return pl.Units[i].Backend == BackendGPU }

// keptAtIdle says whether unit i is expected to stay in the staging ring
// of an idle machine (ringKept).
func (pl *Placement) keptAtIdle(i int) bool { return pl.ringKept != nil && pl.ringKept[i] }

// packedAt is the fraction of unit i's matrices the CPU reads repacked
// (Placement.packed; 0 when not planned).
func (pl *Placement) packedAt(i int) float64 {
	if i < len(pl.packed) {
		return pl.packed[i]
	}
	return 0
}

func (pl *Placement) allGPU() bool {
	for i := range pl.Units {
		if !pl.resident(i) {
			return false
		}
	}
	return len(pl.Units) > 0
}

// newPlacement places every unit on one backend.
func newPlacement(m *Model, units []Unit, on string) *Placement {
	pl := &Placement{Model: m.File.Path, Arch: m.Prog.Hyper.Arch, Layers: m.Prog.Hyper.NLayer, units: units}
	seen := map[*ir.Weight]bool{}
	for i := range m.Prog.Ops {
		for _, w := range m.Prog.Ops[i].Weights() {
			if len(w.Dims) == 1 && !seen[w] {
				seen[w] = true
				pl.vectors = append(pl.vectors, w)
			}
		}
	}
	for _, u := range units {
		pl.Units = append(pl.Units, UnitPlacement{Index: u.Index, Name: u.Name, Layer: u.Layer, Role: u.Role,
			Op: u.Op.String(), Type: u.Type, Bytes: u.Bytes, Backend: on})
	}
	pl.sum()
	return pl
}

// sum recomputes the byte totals from the units (ties counted once).
func (pl *Placement) sum() {
	pl.GPUBytes, pl.CPUBytes = 0, 0
	seen := map[*ir.Weight]bool{}
	for i, u := range pl.units {
		b := u.Bytes
		for _, w := range u.Mats {
			if seen[w] {
				b -= w.Bytes()
			}
			seen[w] = true
		}
		if pl.resident(i) {
			pl.GPUBytes += b
		} else {
			pl.CPUBytes += b
		}
	}
}

// WeightBytes splits the model's weights between the backends: matrices
// where their unit lives, vectors (norms, biases) on the GPU whenever it
// is used (they are uploaded whole), KV caches not counted.
func (pl *Placement) WeightBytes() (cpu, gpu int64) {
	seen := map[*ir.Weight]bool{}
	var vectors int64
	anyGPU := false
	for i, u := range pl.units {
		anyGPU = anyGPU || pl.resident(i)
		for _, w := range u.Mats {
			if seen[w] {
				continue
			}
			seen[w] = true
			if pl.resident(i) {
				gpu += w.Bytes()
			} else {
				cpu += w.Bytes()
			}
		}
	}
	for _, w := range pl.vectors {
		vectors += w.Bytes()
	}
	if anyGPU {
		return cpu, gpu + vectors
	}
	return cpu + vectors, gpu
}

// JSON is the placement with its units, indented.
func (pl *Placement) JSON() ([]byte, error) { return json.MarshalIndent(pl, "", "  ") }

// ReadPlacement reads a placement written by `ats plan --json` (possibly
// edited) for m: units are matched by name; every unit must be named.
func ReadPlacement(path string) (*Placement, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pl Placement
	if err := json.Unmarshal(b, &pl); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	for _, u := range pl.Units {
		if u.Backend != BackendCPU && u.Backend != BackendGPU {
			return nil, fmt.Errorf("%s: unit %s: backend %q, want cpu or gpu", path, u.Name, u.Backend)
		}
	}
	return &pl, nil
}

// bind matches a read placement to the model's units.
func (pl *Placement) bind(m *Model, units []Unit) (*Placement, error) {
	byName := map[string]UnitPlacement{}
	for _, u := range pl.Units {
		byName[u.Name] = u
	}
	out := newPlacement(m, units, BackendCPU)
	out.OptimizedFor, out.Note, out.Prefill, out.Budget, out.Dynamic = pl.OptimizedFor, pl.Note, pl.Prefill, pl.Budget, pl.Dynamic
	if pl.RingBytes < 0 {
		return nil, fmt.Errorf("placement: ring_bytes %d is negative", pl.RingBytes)
	}
	out.RingBytes = pl.RingBytes // at least twice the largest streamed matrix, whatever it says (gpu.RingBytes)
	var missing []string
	for i, u := range units {
		got, ok := byName[u.Name]
		if !ok {
			missing = append(missing, u.Name)
			continue
		}
		out.Units[i].Backend = got.Backend
		delete(byName, u.Name)
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("placement: %d units of %s are not placed (first: %s)", len(missing), m.File.Path, missing[0])
	}
	if len(byName) > 0 {
		var extra []string
		for n := range byName {
			extra = append(extra, n)
		}
		sort.Strings(extra)
		return nil, fmt.Errorf("placement: %s has no unit %s", m.File.Path, extra[0])
	}
	for _, s := range out.Prefill {
		for _, n := range s.Stream {
			i := unitIndex(units, n)
			if i < 0 {
				return nil, fmt.Errorf("placement: prefill streams %s, not a unit of %s", n, m.File.Path)
			}
			if !units[i].Streamable || out.resident(i) {
				return nil, fmt.Errorf("placement: prefill streams %s, which is resident or cannot stream", n)
			}
		}
		for n, ks := range s.Split {
			i := unitIndex(units, n)
			if i < 0 || !slices.Contains(s.Stream, n) {
				return nil, fmt.Errorf("placement: prefill splits %s, not a unit of %s that the batches stream", n, m.File.Path)
			}
			if ne := moeExperts(units[i]); ne == 0 || !canSplitMoE(units[i]) || ks < 1 || ks >= ne {
				return nil, fmt.Errorf("placement: prefill splits %s at expert %d: want an MoE layer the CPU can share, and 1 to %d", n, ks, max(ne-1, 1))
			}
		}
	}
	// Units sharing a tensor (tied embeddings) live together.
	for i, u := range units {
		for j := i + 1; j < len(units); j++ {
			if sharesMat(u, units[j]) && out.Units[i].Backend != out.Units[j].Backend {
				return nil, fmt.Errorf("placement: %s and %s share a tensor and must be on the same backend", u.Name, units[j].Name)
			}
		}
	}
	out.sum()
	return out, nil
}

func unitIndex(units []Unit, name string) int {
	for i, u := range units {
		if u.Name == name {
			return i
		}
	}
	return -1
}

func sharesMat(a, b Unit) bool {
	for _, w := range a.Mats {
		for _, v := range b.Mats {
			if w == v {
				return true
			}
		}
	}
	return false
}

// schedules turns the placement into the executor's schedules for batches
// up to batch tokens: decode (and any batch below the first prefill
// schedule) runs units where they are resident; a prefill schedule also
// runs its streamed units on the GPU.
func (pl *Placement) schedules(batch int) []*schedule {
	units := pl.units
	nOps := 0
	if len(units) > 0 {
		nOps = units[len(units)-1].Hi
	}
	mk := func(minBatch int, stream map[string]bool, split map[string]int) *schedule {
		s := &schedule{minBatch: minBatch, dev: make([]plan.Backend, nOps), stream: make([]bool, len(units)), split: make([]int, len(units))}
		for i, u := range units {
			d := plan.CPU
			if pl.resident(i) || stream[u.Name] {
				d = plan.GPU
			}
			s.stream[i] = stream[u.Name] && !pl.resident(i)
			if s.stream[i] && u.Op == ir.OpMoE {
				s.split[i] = split[u.Name]
			}
			for op := u.Lo; op < u.Hi; op++ {
				s.dev[op] = d
			}
		}
		return s
	}
	out := []*schedule{mk(1, nil, nil)}
	for _, ps := range pl.Prefill {
		if ps.MinBatch <= 1 || ps.MinBatch > batch {
			continue
		}
		set := map[string]bool{}
		for _, n := range ps.Stream {
			set[n] = true
		}
		out = append(out, mk(ps.MinBatch, set, ps.Split))
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].minBatch < out[b].minBatch })
	return out
}

// gpuOps marks the ops that may run on the GPU: in some schedule, or in a
// decode step that promotes their unit.
func (pl *Placement) gpuOps(scheds []*schedule) []bool {
	nOps := 0
	if n := len(pl.units); n > 0 {
		nOps = pl.units[n-1].Hi
	}
	on := make([]bool, nOps)
	for _, s := range scheds {
		for i, d := range s.dev {
			on[i] = on[i] || d == plan.GPU
		}
	}
	if pl.Dynamic {
		for i, u := range pl.units {
			if u.Streamable && !pl.resident(i) {
				for op := u.Lo; op < u.Hi; op++ {
					on[op] = true
				}
			}
		}
	}
	return on
}

// streams says whether weight w streams in schedule s.
func (s *schedule) streams(units []Unit, w *ir.Weight) bool {
	for i, u := range units {
		if !s.stream[i] {
			continue
		}
		for _, m := range u.Mats {
			if m == w {
				return true
			}
		}
	}
	return false
}

// gpuConfig is the GPU backend's configuration for a context under pl.
func (pl *Placement) gpuConfig(m *Model, opt ContextOptions, onGPU []bool, logitRows int, scheds []*schedule) gpu.Config {
	resident := map[*ir.Weight]bool{}
	streamed := map[*ir.Weight]bool{}
	for i, u := range pl.units {
		for _, w := range u.Mats {
			if pl.resident(i) {
				resident[w] = true
			}
			for _, s := range scheds {
				if s.stream[i] {
					streamed[w] = true
				}
			}
			if pl.Dynamic && u.Streamable && !pl.resident(i) {
				streamed[w] = true // a decode step may promote it
			}
		}
	}
	var files [][]byte
	for _, part := range m.File.Parts {
		files = append(files, part.Data)
	}
	cfg := gpu.Config{Model: m, Batch: opt.Batch, CtxSize: opt.CtxSize, LogitRows: logitRows, RingBytes: pl.RingBytes,
		Runs:     func(op int) bool { return onGPU[op] },
		Resident: func(w *ir.Weight) bool { return resident[w] },
		Files:    files}
	if len(streamed) > 0 {
		cfg.Streams = func(w *ir.Weight) bool { return streamed[w] }
	}
	return cfg
}

// cpuNoteOnce makes "running on the CPU" said once per process.
var cpuNoteOnce sync.Once

// noteCPU tells the user once, on stderr, that ats computes on the CPU and why.
func noteCPU(reason string) {
	cpuNoteOnce.Do(func() { fmt.Fprintf(os.Stderr, "ats: running on the CPU: %s\n", reason) })
}

// resolvePlacement decides the context's placement from its options and
// opens the GPU when the placement uses it.
func (m *Model) resolvePlacement(opt ContextOptions) (*Placement, *gpu.Device, error) {
	cpuOnly := func() (*Placement, *gpu.Device, error) {
		return newPlacement(m, programUnits(m.Prog, opt.CtxSize, nil), BackendCPU), nil, nil
	}
	switch opt.Backend {
	case "", BackendCPU:
		if opt.Placement != nil {
			return nil, nil, errors.New("backend cpu: a placement needs the GPU (use --backend auto)")
		}
		return cpuOnly()
	case BackendGPU, BackendAuto:
	default:
		return nil, nil, fmt.Errorf("backend %q: want cpu, gpu or auto", opt.Backend)
	}
	if kt := opt.cacheType(); kt != ops.KVF16 {
		if opt.Backend == BackendGPU || opt.Placement != nil {
			return nil, nil, fmt.Errorf("backend gpu: the GPU keeps the KV cache in f16; a %s cache needs the CPU backend", kt)
		}
		noteCPU(fmt.Sprintf("a %s KV cache is kept on the CPU only", kt))
		return cpuOnly()
	}
	dev, err := gpu.Open()
	if err != nil {
		if opt.Backend == BackendGPU || opt.Placement != nil {
			return nil, nil, fmt.Errorf("backend gpu: %w", err)
		}
		noteCPU(err.Error())
		return cpuOnly()
	}
	units := programUnits(m.Prog, opt.CtxSize, dev.Weights().DeviceBytes)
	budget, contextBytes, err := budgetFor(dev, opt)
	if err != nil {
		return nil, nil, err
	}
	var pl *Placement
	switch {
	case opt.Placement != nil:
		if pl, err = opt.Placement.bind(m, units); err != nil {
			return nil, nil, err
		}
	case opt.Backend == BackendGPU:
		pl = newPlacement(m, units, BackendGPU)
		pl.Note = "--backend gpu: every unit on the GPU"
	default:
		if pl, err = m.planWith(dev, units, opt, budget); err != nil {
			return nil, nil, err
		}
	}
	pl.Budget, pl.ContextBytes = budget, contextBytes
	if err := m.checkBudget(dev, pl, opt); err != nil {
		return nil, nil, err
	}
	if !pl.usesGPU(opt.Batch) {
		return pl, nil, nil
	}
	return pl, dev, nil
}

// usesGPU says whether any schedule runs an op on the GPU.
func (pl *Placement) usesGPU(batch int) bool {
	for _, s := range pl.schedules(batch) {
		for _, d := range s.dev {
			if d == plan.GPU {
				return true
			}
		}
	}
	return false
}

// budgetMargin is what the default budget leaves of the free memory: a
// sixteenth and 256 MiB, for the driver, kernel modules and other
// processes.
func budgetMargin(free int64) int64 { return free/16 + 256<<20 }

// budgetFor is the VRAM budget of a context: the option, or the device's
// free memory less a margin. It also reports the memory in use before
// ats allocates (the CUDA context and other processes).
func budgetFor(dev *gpu.Device, opt ContextOptions) (budget, inUse int64, err error) {
	free, total, err := dev.MemInfo()
	if err != nil {
		return 0, 0, fmt.Errorf("gpu: %w", err)
	}
	inUse = total - free
	if opt.VRAMBudget > 0 {
		return opt.VRAMBudget, inUse, nil
	}
	return max(free-budgetMargin(free), 0), inUse, nil
}

// needBytes is the device memory a context of pl would allocate.
func (m *Model) needBytes(dev *gpu.Device, pl *Placement, opt ContextOptions) (arena, weights int64) {
	scheds := pl.schedules(opt.Batch)
	onGPU := pl.gpuOps(scheds)
	any := false
	for _, g := range onGPU {
		any = any || g
	}
	if !any {
		return 0, 0
	}
	cfg := pl.gpuConfig(m, opt, onGPU, min(opt.Batch, maxLogitRows), scheds)
	return gpu.Need(dev, dev.Weights(), m.Prog, cfg)
}

// checkBudget refuses a placement whose device memory exceeds the budget.
func (m *Model) checkBudget(dev *gpu.Device, pl *Placement, opt ContextOptions) error {
	arena, weights := m.needBytes(dev, pl, opt)
	if need := arena + weights; need > pl.Budget {
		return fmt.Errorf("the placement needs %s of GPU memory (%s weights, %s activations, KV caches and buffers); the budget is %s (--vram-budget)",
			FormatBytes(need), FormatBytes(weights), FormatBytes(arena), FormatBytes(pl.Budget))
	}
	return nil
}

// FormatBytes writes a size the way --vram-budget takes it.
func FormatBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2fGiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.0fMiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.0fKiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%dB", n)
}

// Describe says in a line where the placement puts the model.
func (pl *Placement) Describe() string {
	gpuUnits := 0
	for i := range pl.Units {
		if pl.resident(i) {
			gpuUnits++
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d of %d units on the GPU (%s resident, %s on the CPU)", gpuUnits, len(pl.Units), FormatBytes(pl.GPUBytes), FormatBytes(pl.CPUBytes))
	if pl.OptimizedFor != "" {
		fmt.Fprintf(&b, ", optimised for %s", pl.OptimizedFor)
	}
	if pl.Budget > 0 {
		fmt.Fprintf(&b, ", budget %s", FormatBytes(pl.Budget))
	}
	return b.String()
}
