package placement

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"sort"
	"strings"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
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
	Dynamic bool `json:"dynamic"`
	// KV is where the KV cache lives: each layer's with its attention.
	KV *KVPlacement `json:"kv_cache,omitempty"`
	// Depth is the context the placement was planned for (Options.Depth).
	Depth     int               `json:"planned_depth,omitempty"`
	Predicted *Prediction       `json:"predicted,omitempty"`
	Prefill   []PrefillSchedule `json:"prefill,omitempty"`
	// Routed names the CPU's expert units whose decode steps hand the GPU
	// RoutedShare of the experts their tokens chose (their weights alone
	// cross the link) while the CPU computes the others; RoutedExperts is
	// the most a step hands it (the scratch they are copied into).
	// RoutedShare is where decode starts: each step size's share then
	// moves to where the CPU and the GPU finish a layer together, unless
	// RoutedFixed (ATS_MOE_ROUTED set to a share) holds it.
	Routed        []string        `json:"routed,omitempty"`
	RoutedShare   float64         `json:"routed_share,omitempty"`
	RoutedExperts int             `json:"routed_experts,omitempty"`
	RoutedFixed   bool            `json:"routed_fixed,omitempty"`
	Units         []UnitPlacement `json:"units"`

	units   []model.Unit
	vectors []*ir.Weight  // the model's 1-D weights (norms, biases)
	prof    *plan.Profile // what it was planned from, at Depth (nil: not planned)
	// stepProf is prof at the profile's own depth, which the promoter
	// shapes to each step's rows and positions.
	stepProf *plan.Profile
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

func (pl *Placement) resident(i int) bool { return pl.Units[i].Backend == executor.BackendGPU }

// LinkRate is the rate at which the profile measured weight copies into
// the staging ring (bytes/s; 0: not planned from a profile).
func (pl *Placement) LinkRate() float64 {
	if pl.prof == nil {
		return 0
	}
	return pl.prof.Stream.BytesPerSec
}

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
func newPlacement(m *model.Model, units []model.Unit, on string) *Placement {
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

// KVPlacement is where the KV cache's layers live, and their bytes.
type KVPlacement struct {
	Type      string `json:"type"`
	Positions int    `json:"positions"`
	GPULayers int    `json:"gpu_layers"`
	CPULayers int    `json:"cpu_layers"`
	GPUBytes  int64  `json:"gpu_bytes"`
	CPUBytes  int64  `json:"cpu_bytes"`
}

// String says it in a line: f16, 16384 positions, 2.50 GiB: 30 layers on
// the GPU (1.88 GiB), 10 on the CPU (640 MiB).
func (k *KVPlacement) String() string {
	s := fmt.Sprintf("%s, %d positions, %s: ", k.Type, k.Positions, executor.FormatBytes(k.GPUBytes+k.CPUBytes))
	switch {
	case k.CPULayers == 0:
		return s + "every layer's on the GPU"
	case k.GPULayers == 0:
		return s + "every layer's on the CPU"
	}
	return s + fmt.Sprintf("%d layers on the GPU (%s), %d on the CPU (%s)", k.GPULayers, executor.FormatBytes(k.GPUBytes), k.CPULayers, executor.FormatBytes(k.CPUBytes))
}

// sum recomputes the byte totals from the units (ties counted once), and
// the KV cache's placement.
func (pl *Placement) sum() {
	pl.KV = nil
	for i, u := range pl.units {
		if u.Anchor != ir.AnchorCache {
			continue
		}
		if pl.KV == nil {
			pl.KV = &KVPlacement{Type: strings.TrimPrefix(u.Type, "kv_"), Positions: u.KVRows}
		}
		if pl.resident(i) {
			pl.KV.GPULayers++
			pl.KV.GPUBytes += u.Bytes
		} else {
			pl.KV.CPULayers++
			pl.KV.CPUBytes += u.Bytes
		}
	}
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
		if u.Backend != executor.BackendCPU && u.Backend != executor.BackendGPU {
			return nil, fmt.Errorf("%s: unit %s: backend %q, want cpu or gpu", path, u.Name, u.Backend)
		}
	}
	return &pl, nil
}

// bind matches a read placement to the model's units.
func (pl *Placement) bind(m *model.Model, w *cpu.Weights, units []model.Unit) (*Placement, error) {
	byName := map[string]UnitPlacement{}
	for _, u := range pl.Units {
		byName[u.Name] = u
	}
	out := newPlacement(m, units, executor.BackendCPU)
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
			if ne := moeExperts(units[i]); ne == 0 || !canSplitMoE(w, units[i]) || ks < 1 || ks >= ne {
				return nil, fmt.Errorf("placement: prefill splits %s at expert %d: want an MoE layer the CPU can share, and 1 to %d", n, ks, max(ne-1, 1))
			}
		}
	}
	if pl.RoutedShare < 0 || pl.RoutedShare > 1 || pl.RoutedExperts < 0 || len(pl.Routed) > 0 && pl.RoutedExperts == 0 {
		return nil, fmt.Errorf("placement: routed_share %g and routed_experts %d: want a share in [0, 1] and, with routed units, at least one expert", pl.RoutedShare, pl.RoutedExperts)
	}
	for _, n := range pl.Routed {
		i := unitIndex(units, n)
		if i < 0 || moeExperts(units[i]) == 0 || !units[i].Streamable || !canSplitMoE(w, units[i]) || out.resident(i) {
			return nil, fmt.Errorf("placement: routes %s: want an expert unit of %s on the CPU that the GPU can share", n, m.File.Path)
		}
	}
	out.Routed, out.RoutedShare, out.RoutedExperts, out.RoutedFixed = pl.Routed, pl.RoutedShare, pl.RoutedExperts, pl.RoutedFixed
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

func unitIndex(units []model.Unit, name string) int {
	for i, u := range units {
		if u.Name == name {
			return i
		}
	}
	return -1
}

func sharesMat(a, b model.Unit) bool {
	for _, w := range a.Mats {
		for _, v := range b.Mats {
			if w == v {
				return true
			}
		}
	}
	return false
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
	fmt.Fprintf(&b, "%d of %d units on the GPU (%s resident, %s on the CPU)", gpuUnits, len(pl.Units), executor.FormatBytes(pl.GPUBytes), executor.FormatBytes(pl.CPUBytes))
	if pl.OptimizedFor != "" {
		fmt.Fprintf(&b, ", optimised for %s", pl.OptimizedFor)
	}
	if pl.Budget > 0 {
		fmt.Fprintf(&b, ", budget %s", executor.FormatBytes(pl.Budget))
	}
	if pl.KV != nil {
		fmt.Fprintf(&b, "; KV cache %s", pl.KV)
	}
	if len(pl.Routed) > 0 {
		fmt.Fprintf(&b, "; decode hands the GPU %.0f%% of the chosen experts of %d CPU MoE layers", 100*pl.RoutedShare, len(pl.Routed))
		if !pl.RoutedFixed {
			b.WriteString(" to start with (then as the two keep pace)")
		}
	}
	return b.String()
}
