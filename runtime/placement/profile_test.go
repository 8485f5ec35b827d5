package placement

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

// canRepack reports whether this CPU level has kernels for repacked
// weights (not with -tags noasm, nor off amd64).
func canRepack(t *testing.T, m *model.Model) bool {
	w := hostWeights(t, m)
	for i := range m.Prog.Ops {
		if op := &m.Prog.Ops[i]; op.Kind == ir.OpMatMul && w.Repackable(op.W) {
			return true
		}
	}
	return false
}

// assertUnrepacked fails when w holds repacked copies.
func assertUnrepacked(t *testing.T, w *cpu.Weights) {
	t.Helper()
	if n := w.RepackedBytes(); n != 0 {
		t.Errorf("the weights hold %d bytes of repacked copies", n)
	}
	for _, x := range w.Program().Weights {
		if w.Repacked(x) {
			t.Errorf("%s was repacked", x.Name)
		}
	}
}

// The profile's CPU weights (its own) read the matrices in the layout
// being timed: repacked copies of every matrix a hybrid context may
// repack (never the embedding), or the file's blocks; restore goes back to
// the file's, and the planner's own weights are never changed.
func TestProfileLayouts(t *testing.T) {
	for _, name := range []string{"tiny-qwen3-q4_k_m", "tiny-qwen3moe-q4_k_m"} {
		t.Run(name, func(t *testing.T) {
			m := openOracle(t, name)
			if !canRepack(t, m) {
				t.Skip("this CPU level has no kernels for repacked weights (noasm, or not amd64)")
			}
			p := m.Prog
			planner, profW := hostWeights(t, m), hostWeights(t, m)
			r := &profileRun{m: m, cw: profW}
			all := [][2]int{{0, len(p.Ops)}}
			mats := func(op *ir.Op) []*ir.Weight {
				var out []*ir.Weight
				for _, w := range []*ir.Weight{op.W, op.Gate, op.Up, op.Down} {
					if w != nil && len(w.Dims) > 1 {
						out = append(out, w)
					}
				}
				return out
			}
			r.layout(all, true)
			packed := 0
			for i := range p.Ops {
				op := &p.Ops[i]
				for _, w := range mats(op) {
					m := profW.Of(w)
					switch {
					case op.Class().Lookup:
						if m.RepackedBytes() > 0 {
							t.Errorf("op %d: the embedding %s was given a copy", i, w.Name)
						}
					case !planner.Repackable(w):
						if m.RepackedBytes() > 0 {
							t.Errorf("op %d: %s has no repacked layout but was replaced", i, w.Name)
						}
					default:
						if m.RepackedBytes() == 0 {
							t.Errorf("op %d: %s is not read from a repacked copy", i, w.Name)
						}
						for e, s := range m.Stack {
							if s.RepackedBytes() == 0 {
								t.Errorf("op %d: expert %d of %s is not read from the copy", i, e, w.Name)
							}
						}
						packed++
					}
				}
			}
			if packed == 0 {
				t.Fatal("no matrix timed repacked")
			}
			r.restore()
			for i := range p.Ops {
				for _, w := range mats(&p.Ops[i]) {
					m := profW.Of(w)
					if m.RepackedBytes() > 0 || slices.ContainsFunc(m.Stack, func(s ops.Matrix) bool { return s.RepackedBytes() > 0 }) {
						t.Fatalf("op %d: restore left %s repacked", i, w.Name)
					}
				}
			}
			assertUnrepacked(t, planner)
		})
	}
}

// Without a GPU the profile measures the CPU's side: every unit a hybrid
// context may repack in both layouts, the others (embedding, attention)
// in the file's; the model's weights stay as they were.
func TestMeasureProfileCPUOnly(t *testing.T) {
	for _, name := range []string{"tiny-qwen3-q4_k_m", "tiny-qwen3moe-q4_k_m", "tiny-llama-q8_0"} {
		t.Run(name, func(t *testing.T) {
			m := openOracle(t, name)
			units := programUnits(m.Prog, 64, nil)
			batches := []int{1, 4}
			w := hostWeights(t, m)
			prof, err := New(m, w, nil).MeasureProfile(units, Options{Threads: 2}, batches)
			if err != nil {
				t.Fatal(err)
			}
			if len(prof.Units) != len(units) || len(prof.Switch) != 0 || prof.Hardware.GPU != "" || prof.Hardware.CPULevel == "" {
				t.Fatalf("%d units of %d, %d switches, GPU %q, CPU level %q", len(prof.Units), len(units), len(prof.Switch), prof.Hardware.GPU, prof.Hardware.CPULevel)
			}
			finite := func(v []float64) bool {
				for _, x := range v {
					if !(x > 0) || math.IsInf(x, 0) {
						return false
					}
				}
				return len(v) == len(batches)
			}
			packedUnits, shares := 0, 0
			for i, u := range units {
				ut := prof.Units[i]
				if !finite(ut.CPU) || !finite(ut.CPUAlone) {
					t.Errorf("%s: CPU %v, alone %v", u.Name, ut.CPU, ut.CPUAlone)
				}
				if slices.ContainsFunc(ut.GPU, func(x float64) bool { return x != 0 }) {
					t.Errorf("%s: GPU times %v without a GPU", u.Name, ut.GPU)
				}
				switch {
				case repackable(w, u):
					packedUnits++
					if !finite(ut.CPUPacked) || !finite(ut.CPUPackedAlone) {
						t.Errorf("%s may be repacked, but its repacked times are %v, alone %v", u.Name, ut.CPUPacked, ut.CPUPackedAlone)
					}
				case len(ut.CPUPacked) > 0 || len(ut.CPUPackedAlone) > 0:
					t.Errorf("%s (%s) is never repacked, but has repacked times", u.Name, u.Op)
				}
				// An MoE unit the CPU may split has its share's times (the
				// quarter of the experts, no routing; how they compare with
				// the whole op's is a benchmark's business, not a test's).
				switch split := repackable(w, u) && moeExperts(u) > 0 && canSplitMoE(w, u); {
				case split && !finite(ut.CPUShare):
					t.Errorf("%s: the CPU's share %v", u.Name, ut.CPUShare)
				case split:
					shares++
				case len(ut.CPUShare) > 0:
					t.Errorf("%s (%s) is never split, but has share times", u.Name, u.Op)
				}
			}
			switch {
			case name == "tiny-llama-q8_0" && packedUnits > 0:
				t.Errorf("%d Q8_0 units timed repacked", packedUnits)
			case name != "tiny-llama-q8_0" && packedUnits == 0 && canRepack(t, m):
				t.Error("no unit timed repacked")
			case packedUnits == 0:
				t.Logf("no unit timed repacked: no repacked layout for these types at level %s", prof.Hardware.CPULevel)
			}
			if strings.Contains(name, "moe") && packedUnits > 0 && shares == 0 {
				t.Error("no MoE unit's share timed")
			}
			assertUnrepacked(t, w)
		})
	}
}

// packedFractions says beforehand what repackHybrid then repacks: the
// same matrices, the same bytes, for a placement whose allowance covers
// part of the CPU units and one that covers more; nothing with
// ATS_REPACK=0.
func TestPackedFractions(t *testing.T) {
	cases := []struct {
		name     string
		resident func(u model.Unit) bool
		off      bool
	}{
		{"all on the CPU", func(model.Unit) bool { return false }, false},
		{"odd layers resident", func(u model.Unit) bool { return u.Layer%2 == 1 }, false},
		{"attention resident", func(u model.Unit) bool { return u.Anchor == ir.AnchorCache }, false},
		{"repacking off", func(u model.Unit) bool { return u.Layer%2 == 1 }, true},
	}
	partial, ran := false, false
	for _, c := range cases {
		for _, name := range []string{"tiny-qwen3-q4_k_m", "tiny-qwen3moe-q4_k_m"} {
			t.Run(c.name+"/"+name, func(t *testing.T) {
				packedFractionsCase(t, name, c.resident, c.off, &partial, &ran)
			})
		}
	}
	if ran && !partial {
		t.Error("no case had the allowance cut the CPU units")
	}
}

// packedFractionsCase is one case of TestPackedFractions: model, with the
// units resident says on the GPU, repacking off or not; partial is set
// when the allowance cut the CPU units, ran when the case could run.
func packedFractionsCase(t *testing.T, name string, resident func(model.Unit) bool, off bool, partial, ran *bool) {
	m := openOracle(t, name)
	w := hostWeights(t, m)
	w.NoRepack = off
	if !canRepack(t, m) {
		t.Skip("this CPU level has no kernels for repacked weights (noasm, or not amd64)")
	}
	*ran = true
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, executor.BackendCPU)
	for i, u := range units {
		if resident(u) {
			pl.Units[i].Backend = executor.BackendGPU
		}
	}
	frac, bytes := packedFractions(w, m, units, pl.resident)
	got := RepackHybrid(w, m, pl)
	if got != bytes {
		t.Errorf("predicted %d bytes repacked, repackHybrid made %d", bytes, got)
	}
	cut := false
	for i, u := range units {
		if pl.resident(i) || !repackable(w, u) {
			continue
		}
		var all, packed int64
		for _, x := range u.Mats {
			if w.Repackable(x) || w.Repacked(x) || w.PackedExperts(x) > 0 {
				all += x.Bytes()
				packed += int64(w.PackedShare(x) * float64(x.Bytes()))
			}
		}
		if want := float64(packed) / float64(all); math.Abs(frac[i]-want) > 1e-9 {
			t.Errorf("%s: predicted %.2f repacked, repackHybrid made %.2f", u.Name, frac[i], want)
		}
		cut = cut || frac[i] < 1
	}
	if off && got != 0 {
		t.Errorf("repacked %d bytes with repacking off", got)
	}
	*partial = *partial || (cut && got > 0)
}

// The planner solves with the repacked times and then describes the
// placement with each CPU unit's times in the layout repackHybrid will
// give it: repacked where the allowance reaches, the file's beyond (all
// of them at a CPU level without repacked kernels).
func TestPlacementUsesRepackedTimes(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	w := hostWeights(t, m)
	units := programUnits(m.Prog, 64, nil)
	prof := &plan.Profile{Batches: []int{1}, Switch: []plan.Link{{Latency: 1e-6, BytesPerSec: 1e10}}, Stream: plan.Link{BytesPerSec: 1e10}}
	var total int64
	for _, u := range units {
		total += u.Bytes
		cpuT, gpuT := 1e-9*float64(u.Bytes)+1e-6, 1e-10*float64(u.Bytes)+1e-6
		ut := plan.UnitTimes{Name: u.Name, Sig: u.Sig, CPU: []float64{cpuT}, CPUAlone: []float64{cpuT}, GPU: []float64{gpuT}, GPUAlone: []float64{gpuT}}
		if repackable(w, u) {
			ut.CPUPacked, ut.CPUPackedAlone = []float64{cpuT / 2}, []float64{cpuT / 2}
		}
		prof.Units = append(prof.Units, ut)
	}
	opt := Options{Batch: 1, KV: model.KV{Rows: 64}, StaticOnly: true}
	pl, err := New(m, w, nil).placeByProfile(prof, units, opt, total/8, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	frac, bytes := packedFractions(w, m, units, pl.resident)
	if !canRepack(t, m) {
		for i := range units {
			if got, want := pl.prof.Units[i].CPU[0], prof.Units[i].CPU[0]; !pl.resident(i) && got != want {
				t.Errorf("%s: %.3g s on the CPU without repacked kernels, want the file's layout's %.3g", units[i].Name, got, want)
			}
		}
		if pl.RepackedBytes != 0 {
			t.Errorf("%d bytes counted repacked without repacked kernels", pl.RepackedBytes)
		}
		return
	}
	if pl.RepackedBytes != bytes || bytes == 0 {
		t.Errorf("the placement counts %d bytes repacked, repackHybrid would make %d", pl.RepackedBytes, bytes)
	}
	var packed, plain int
	for i, u := range units {
		if pl.resident(i) || !repackable(w, u) {
			continue
		}
		want := prof.Units[i].CPU[0] * (1 - frac[i]/2)
		if got := pl.prof.Units[i].CPU[0]; math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: %.3g s on the CPU, want %.3g (%.2f repacked)", u.Name, got, want, frac[i])
		}
		if got := pl.Units[i].CPU; math.Abs(got-want) > 1e-12 {
			t.Errorf("%s: the placement shows %.3g s on the CPU, want %.3g", u.Name, got, want)
		}
		if frac[i] == 1 {
			packed++
		} else {
			plain++
		}
	}
	if packed == 0 || plain == 0 {
		t.Fatalf("%d CPU units repacked, %d not: the test wants both", packed, plain)
	}
	// The prediction is that of the layouts the units will run in.
	on := make([]plan.Backend, len(units))
	for i := range units {
		if pl.resident(i) {
			on[i] = plan.GPU
		}
	}
	dec := problem(pl.prof, units, 0, 1, 0, m.Prog.Hyper)
	if want, _, _ := dec.Cost(on); math.Abs(pl.Predicted.DecodeStepSeconds-want) > 1e-12 {
		t.Errorf("predicted %.4g s a token, the placement's layouts cost %.4g", pl.Predicted.DecodeStepSeconds, want)
	}
	plainDec := problem(prof, units, 0, 1, 0, m.Prog.Hyper)
	if slow, _, _ := plainDec.Cost(on); !(pl.Predicted.DecodeStepSeconds < slow) {
		t.Errorf("predicted %.4g s a token, no faster than the file's layout (%.4g)", pl.Predicted.DecodeStepSeconds, slow)
	}
	assertUnrepacked(t, w)
}

// TestFloorDecodeByHostRead: matrix units' decode times on the CPU are
// raised to their weights at the host memory's rate, in both layouts;
// other batches, the alone figures, the embedding and attention are left.
func TestFloorDecodeByHostRead(t *testing.T) {
	units := []model.Unit{
		{Op: ir.OpEmbed, Anchor: ir.AnchorWeights, Lookup: true, DecodeBytes: 1 << 30},
		{Op: ir.OpMatMul, Anchor: ir.AnchorWeights, DecodeBytes: 100e6},
		{Op: ir.OpMoE, Anchor: ir.AnchorWeights, Experts: 8, DecodeBytes: 10e6},
		{Op: ir.OpAttention, Anchor: ir.AnchorCache, DecodeBytes: 1 << 30},
	}
	prof := &plan.Profile{Batches: []int{1, 32}}
	for range units {
		prof.Units = append(prof.Units, plan.UnitTimes{CPU: []float64{1e-4, 1}, CPUAlone: []float64{1e-4, 1}, CPUPacked: []float64{1e-4, 1}})
	}
	floorDecodeByHostRead(prof, units, 100e9) // 100 GB/s: 1 ms for 100 MB, 0.1 ms for 10 MB
	want := []float64{1e-4, 1e-3, 1e-4, 1e-4}
	for i, u := range prof.Units {
		if math.Abs(u.CPU[0]-want[i]) > 1e-12 || math.Abs(u.CPUPacked[0]-want[i]) > 1e-12 {
			t.Errorf("unit %d (%v): decode %g / packed %g, want %g", i, units[i].Op, u.CPU[0], u.CPUPacked[0], want[i])
		}
		if u.CPU[1] != 1 || u.CPUAlone[0] != 1e-4 {
			t.Errorf("unit %d: a batch of 32 or the alone figure changed", i)
		}
	}
	if prof.HostRead != 100e9 {
		t.Errorf("HostRead %g, want the rate used", prof.HostRead)
	}
}

func TestHostReadRate(t *testing.T) {
	pool := ops.NewPool(2)
	defer pool.Close()
	r := hostReadRate(pool)
	t.Logf("host memory read by 2 threads: %.1f GB/s", r/1e9)
	if r < 1e8 || r > 1e13 {
		t.Fatalf("host read rate %g bytes/s is not plausible", r)
	}
}

// The placement weighs the KV cache against the weights at the depth it
// is planned for: attention that costs little on the CPU at the
// profile's short context stays there, its cache's bytes going to
// weights; deep in a long context, where every step reads the whole
// cache, attention and its cache take the GPU and weights leave.
func TestPlacementAtDepth(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	w := hostWeights(t, m)
	const rows = 8192
	units := programUnits(m.Prog, rows, nil)
	prof := &plan.Profile{Batches: []int{1}, DecodePos: 256, DepthPos: 2048,
		Switch: []plan.Link{{Latency: 1e-7, BytesPerSec: 1e10}}, Stream: plan.Link{BytesPerSec: 1e10}}
	var total, kv int64
	for _, u := range units {
		total += u.Bytes
		cpuT, gpuT := 1e-9*float64(u.Bytes)+1e-6, 1e-10*float64(u.Bytes)+1e-6
		ut := plan.UnitTimes{Name: u.Name, Sig: u.Sig}
		if u.Anchor == ir.AnchorCache {
			kv += u.Bytes
			// Cheap at the profile's depth, a cache read a position.
			cpuT, gpuT = 1e-6, 1e-6
			ut.CPUPerPos, ut.GPUPerPos = []float64{1e-5}, []float64{1e-8}
		}
		ut.CPU, ut.CPUAlone, ut.GPU, ut.GPUAlone = []float64{cpuT}, []float64{cpuT}, []float64{gpuT}, []float64{gpuT}
		prof.Units = append(prof.Units, ut)
	}
	attentionOnGPU := func(depth int) (on int, pl *Placement) {
		opt := Options{Batch: 1, KV: model.KV{Rows: rows}, StaticOnly: true, Depth: depth}
		pl, err := New(m, w, nil).placeByProfile(prof, units, opt, kv+(total-kv)/4, 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		for i, u := range units {
			if u.Anchor == ir.AnchorCache && pl.resident(i) {
				on++
			}
		}
		return on, pl
	}
	shallow, _ := attentionOnGPU(256)
	deep, pl := attentionOnGPU(rows / 2)
	if shallow != 0 || deep != m.Prog.Hyper.NLayer {
		t.Errorf("attention layers on the GPU: %d at the profile's depth (want none), %d at %d (want all %d)", shallow, deep, rows/2, m.Prog.Hyper.NLayer)
	}
	if pl.KV == nil || pl.KV.GPULayers != deep || pl.KV.Positions != rows || pl.KV.GPUBytes+pl.KV.CPUBytes != kv || pl.Depth != rows/2 {
		t.Errorf("KV placement %+v, depth %d", pl.KV, pl.Depth)
	}
	if !strings.Contains(pl.Describe(), "KV cache f16, 8192 positions") {
		t.Errorf("Describe: %s", pl.Describe())
	}
}

// The promoter plans for classes of decode steps: rows exact up to four,
// then powers of two; the rows' mean depth beyond the profile's decode
// position in two classes an octave.
func TestStepShapes(t *testing.T) {
	for _, c := range []struct {
		rows, positions int
		want            stepShape
	}{
		{1, 100, stepShape{1, 0}},
		{1, 256 + 700, stepShape{1, 512}},
		{1, 256 + 1000, stepShape{1, 768}},
		{1, 256 + 5000, stepShape{1, 4096}},
		{1, 256 + 7000, stepShape{1, 6144}},
		{3, 3 * 300, stepShape{3, 0}},
		{5, 5 * 256, stepShape{8, 0}},
		{8, 8 * (256 + 2048), stepShape{8, 2048}},
		{17, 17 * 10000, stepShape{32, 8192}},
	} {
		if got := shapeOf(executor.Step{Rows: c.rows, Positions: c.positions}, 256); got != c.want {
			t.Errorf("%d rows, %d positions: %+v, want %+v", c.rows, c.positions, got, c.want)
		}
	}
}
