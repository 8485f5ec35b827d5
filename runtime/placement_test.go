package runtime

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/ir"
)

func openOracle(t *testing.T, name string) *Model {
	t.Helper()
	path := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", name+".gguf")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	m, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// TestUnitsPartitionOps checks the units of every oracle: each op in
// exactly one unit, units in order, every matrix in a unit, attention
// units sized by the KV cache.
func TestUnitsPartitionOps(t *testing.T) {
	for _, path := range oracleFiles(t) {
		name := strings.TrimSuffix(filepath.Base(path), ".gguf")
		t.Run(name, func(t *testing.T) {
			m := openOracle(t, name)
			const ctx = 100
			units := programUnits(m.Prog, ctx, nil)
			next := 0
			mats := map[*ir.Weight]int{}
			for i, u := range units {
				if u.Index != i || u.Lo != next || u.Hi <= u.Lo {
					t.Fatalf("unit %d (%s) covers ops [%d,%d), want to start at %d", i, u.Name, u.Lo, u.Hi, next)
				}
				next = u.Hi
				for _, w := range u.Mats {
					mats[w]++
				}
				if u.Op == ir.OpAttention {
					a := m.Prog.Ops[u.Hi-1].Attn
					if want := int64(4 * ctx * a.NKVHeads * a.HeadSize); u.Bytes != want {
						t.Errorf("%s: %d bytes, want the KV cache's %d", u.Name, u.Bytes, want)
					}
				}
			}
			if next != len(m.Prog.Ops) {
				t.Fatalf("units end at op %d of %d", next, len(m.Prog.Ops))
			}
			for i := range m.Prog.Ops {
				for _, w := range m.Prog.Ops[i].Weights() {
					if len(w.Dims) > 1 && mats[w] == 0 {
						t.Errorf("matrix %s is in no unit", w.Name)
					}
				}
			}
			// Roles of layer 1.
			var roles []string
			for _, u := range units {
				if u.Layer == 1 {
					roles = append(roles, u.Role)
				}
			}
			t.Logf("%d ops, %d units; layer 1: %s", len(m.Prog.Ops), len(units), strings.Join(roles, " "))
		})
	}
}

func TestUnitsRoles(t *testing.T) {
	for name, want := range map[string]string{
		"tiny-qwen3-q4_k_m":    "attn_q attn_k attn_v attention attn_output ffn_gate ffn_up ffn_down",
		"tiny-qwen3moe-q4_k_m": "attn_q attn_k attn_v attention attn_output ffn_moe",
		"tiny-glm4-q4_k_m":     "attn_q attn_k attn_v attention attn_output ffn_up ffn_down",
	} {
		t.Run(name, func(t *testing.T) {
			m := openOracle(t, name)
			var roles []string
			for _, u := range programUnits(m.Prog, 64, nil) {
				if u.Layer == 1 {
					roles = append(roles, u.Role)
				}
				if u.Role == "ffn_moe" && len(u.Mats) != 4 {
					t.Errorf("%s: %d matrices, want the router and three stacks", u.Name, len(u.Mats))
				}
			}
			if got := strings.Join(roles, " "); got != want {
				t.Errorf("layer 1 roles %q, want %q", got, want)
			}
		})
	}
}

// TestTransfers checks the executor's coherence walk: with units
// alternating between the backends, every read sees the rows written last,
// on its own backend or moved there just before.
func TestTransfers(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	p := m.Prog
	dev := make([]plan.Backend, len(p.Ops))
	for _, u := range units {
		for i := u.Lo; i < u.Hi; i++ {
			dev[i] = plan.Backend(u.Index % 2)
		}
	}
	moves := transfers(p, dev)
	if len(moves) == 0 {
		t.Fatal("no transfers for alternating units")
	}
	// Replay: where is each buffer valid?
	valid := map[ir.BufID]map[plan.Backend]bool{}
	k := 0
	for i := range p.Ops {
		for k < len(moves) && moves[k].before == i {
			mv := moves[k]
			if valid[mv.buf] == nil || valid[mv.buf][mv.to] {
				t.Fatalf("op %d: move of %s to %s, which is unwritten or already there", i, p.Bufs[mv.buf].Name, mv.to)
			}
			valid[mv.buf][mv.to] = true
			k++
		}
		op := &p.Ops[i]
		for _, r := range op.Reads() {
			if !valid[r][dev[i]] {
				t.Fatalf("op %d (%s on %s) reads %s, not valid there", i, op.Kind, dev[i], p.Bufs[r].Name)
			}
		}
		for _, w := range op.Writes() {
			valid[w] = map[plan.Backend]bool{dev[i]: true}
		}
	}
	// All on one backend: nothing moves.
	for i := range dev {
		dev[i] = plan.GPU
	}
	if moves := transfers(p, dev); len(moves) != 0 {
		t.Errorf("all on the GPU: %d transfers", len(moves))
	}
}

// TestPlacementJSON writes a placement, reads it back and binds it; and
// checks the errors of a hand-edited file.
func TestPlacementJSON(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, BackendCPU)
	for i := range pl.Units {
		if i%3 == 0 {
			pl.Units[i].Backend = BackendGPU
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
	b, err := pl.JSON()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "p.json")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	read, err := ReadPlacement(path)
	if err != nil {
		t.Fatal(err)
	}
	bound, err := read.bind(m, units)
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
		_, err := q.bind(m, units)
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
		p.Units[0].Backend = BackendGPU
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

// TestSchedules checks that a placement's schedules run resident units on
// the GPU, streamed ones on the GPU from their batch size on, and the
// rest on the CPU.
func TestSchedules(t *testing.T) {
	m := openOracle(t, "tiny-qwen3-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, BackendCPU)
	pl.Units[1].Backend = BackendGPU
	pl.Prefill = []PrefillSchedule{{MinBatch: 32, Stream: []string{units[2].Name}}, {MinBatch: 128, Stream: []string{}}}
	ss := pl.schedules(512)
	if len(ss) != 3 || ss[0].minBatch != 1 || ss[1].minBatch != 32 || ss[2].minBatch != 128 {
		t.Fatalf("schedules %+v", ss)
	}
	at := func(s *schedule, u int) plan.Backend { return s.dev[units[u].Lo] }
	if at(ss[0], 1) != plan.GPU || at(ss[0], 2) != plan.CPU || at(ss[1], 2) != plan.GPU || at(ss[2], 2) != plan.CPU {
		t.Errorf("unit 1 (resident) and 2 (streamed at 32..127) on %v %v %v %v", at(ss[0], 1), at(ss[0], 2), at(ss[1], 2), at(ss[2], 2))
	}
	if !ss[1].stream[2] || ss[0].stream[2] || !ss[1].streams(units, units[2].Mats[0]) {
		t.Error("unit 2 should stream in the second schedule only")
	}
	if got := pl.schedules(64); len(got) != 2 {
		t.Errorf("batches of 64: %d schedules, want 2", len(got))
	}
}

// TestHyperChecks covers hostile hyperparameters: non-finite or
// non-positive norm epsilon and rope base, and a block_count past the
// file's blocks.
func TestHyperChecks(t *testing.T) {
	src := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-qwen3-q4_k_m.gguf")
	if _, err := os.Stat(src); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		key  string
		val  any
		want string
	}{
		{"qwen3.attention.layer_norm_rms_epsilon", float32(0), "layer_norm_rms_epsilon is 0"},
		{"qwen3.attention.layer_norm_rms_epsilon", float32(-1e-6), "must be a finite number above 0"},
		{"qwen3.attention.layer_norm_rms_epsilon", nan32(), "NaN"},
		{"qwen3.rope.freq_base", inf32(), "+Inf"},
		{"qwen3.rope.freq_base", float32(0), "rope.freq_base is 0"},
		{"qwen3.block_count", uint32(1_000_000), "block_count is 1000000 but the file's tensors stop at block 2"},
	} {
		path := rewriteKV(t, src, c.key, c.val)
		_, err := Open(path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s = %v: error %v, want one saying %q", c.key, c.val, err, c.want)
		}
	}
}

// rewriteKV copies an oracle model with one metadata value replaced.
func rewriteKV(t *testing.T, src, key string, val any) string {
	t.Helper()
	return rewrite(t, src, func(kv map[string]gguf.Value, infos []gguf.TensorInfo) []gguf.TensorInfo {
		switch v := val.(type) {
		case float32:
			kv[key] = gguf.Float32(v)
		case uint32:
			kv[key] = gguf.Uint32(v)
		default:
			t.Fatalf("rewriteKV: %T", val)
		}
		return infos
	})
}

func nan32() float32 { return float32(math.NaN()) }
func inf32() float32 { return float32(math.Inf(1)) }

// TestDecodeBytes: a dense unit's decode reads all of it, an MoE layer's
// only the router and top-k of its experts.
func TestDecodeBytes(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	for _, u := range programUnits(m.Prog, 64, nil) {
		switch {
		case u.Op == ir.OpMoE:
			h := m.Prog.Hyper
			if u.DecodeBytes <= 0 || u.DecodeBytes*int64(h.NExpert) > u.Bytes*int64(h.NExpertUsed)+u.Bytes {
				t.Errorf("%s: decode reads %d of %d bytes; want about %d/%d of the stacks", u.Name, u.DecodeBytes, u.Bytes, h.NExpertUsed, h.NExpert)
			}
		case u.DecodeBytes != u.Bytes:
			t.Errorf("%s: decode reads %d of %d bytes", u.Name, u.DecodeBytes, u.Bytes)
		}
	}
}

// linkBoundPrefill is a profile of units at batches of 1 and 64 where
// the link (1 GB/s) is the bound: a product copies in 10 times its GPU
// time and computes on the CPU in 100 times its copy, an MoE layer on the
// CPU in moeCPU times its copy; attention and the embedding cost next to
// nothing. copies is the link's time for every unit that can stream.
func linkBoundPrefill(units []Unit, moeCPU float64) (prof *plan.Profile, copies float64) {
	const link = 1e9 // bytes/s
	prof = &plan.Profile{Batches: []int{1, 64}, Switch: []plan.Link{{Latency: 1e-6, BytesPerSec: 1e10}, {Latency: 1e-6, BytesPerSec: 1e10}},
		Stream: plan.Link{BytesPerSec: link}}
	for _, u := range units {
		copyT := float64(u.Bytes) / link
		cpuT, gpuT := 100*copyT, copyT/10
		switch {
		case !u.Streamable: // attention, the embedding: on the CPU either way
			cpuT, gpuT = 1e-7, 1e-7
		case u.Op == ir.OpMoE:
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
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	units := programUnits(m.Prog, 64, nil)
	pl := newPlacement(m, units, BackendCPU)
	prof, copies := linkBoundPrefill(units, 1.5) // the CPU is 1.5 times slower than the link on MoE layers, not 100
	var stacks int
	for _, u := range units {
		if u.Op == ir.OpMoE {
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
			stream, split, secs, err := prefillStreams(prof, units, pl, 1, 64, m.Prog.Hyper, c.ring, false)
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
				if u.Op == ir.OpMoE && !on[u.Name] {
					cpuStacks++
				}
				if u.Streamable && u.Op != ir.OpMoE && !on[u.Name] {
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
	pl := newPlacement(m, units, BackendCPU)
	prof, copies := linkBoundPrefill(units, 2) // the CPU is twice as slow as the link on MoE layers
	_, _, whole, err := prefillStreams(prof, units, pl, 1, 64, m.Prog.Hyper, 0, false)
	if err != nil {
		t.Fatal(err)
	}
	if _, split, _, err := prefillStreams(prof, units, pl, 1, 64, m.Prog.Hyper, 0, false); err != nil || split != nil {
		t.Errorf("split %v (%v) on a path that cannot split", split, err)
	}
	t.Setenv(EnvMoESplit, "")
	byDefault, splitByDefault, _, err := prefillStreams(prof, units, pl, 1, 64, m.Prog.Hyper, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvMoESplit, "auto")
	stream, split, secs, err := prefillStreams(prof, units, pl, 1, 64, m.Prog.Hyper, 0, true)
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

	t.Setenv(EnvMoESplit, "0")
	if _, split, _, err := prefillStreams(prof, units, pl, 1, 64, m.Prog.Hyper, 0, true); err != nil || split != nil {
		t.Errorf("%s=0: split %v (%v), want none", EnvMoESplit, split, err)
	}
	t.Setenv(EnvMoESplit, "0.25")
	_, split, _, err = prefillStreams(prof, units, pl, 1, 64, m.Prog.Hyper, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	for name, ks := range split {
		for _, u := range units {
			if u.Name == name {
				if ne := moeExperts(u); ks != int(math.Round(0.25*float64(ne))) {
					t.Errorf("%s=0.25: %s split at %d of %d", EnvMoESplit, name, ks, ne)
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
	base, cur, fast, faster, stale, few := &schedule{}, &schedule{}, &schedule{}, &schedule{}, &schedule{}, &schedule{}
	p := &promoter{stepTime: map[*schedule]*stepTimes{}, timedAt: map[*schedule]int{}, meta: map[*schedule]planMeta{}, steps: 500}
	timed := func(s *schedule, ms float64, n, at int, known bool) {
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
	if got := p.fasterFresh(&schedule{}); got != nil {
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
