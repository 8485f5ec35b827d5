package placement

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	goruntime "runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/klauspost/cpuid/v2"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

// The placement profile: every unit's time on the CPU and on the GPU at
// decode and at prefill batch sizes, measured on this machine. Units of one
// signature (the same ops over tensors of the same shapes and types, such
// as attn_q of every layer but the first) share one measurement, so a
// 40-layer model measures about twenty units and its layers' fusions.
//
// A decode step reads every weight once, from memory: so each timing runs
// on weights that are not in the caches, rotating among the units (and
// layers) of the same shape until the rotation is several times the size
// of the CPU's last-level cache or the GPU's L2.
//
// Each unit is timed by itself ("alone": its own segment, so fusions with
// the unit before are broken), and one layer of each kind is timed whole:
// the ratio of the whole to the sum of its units scales their "fused"
// times, the cost when the unit before runs on the same backend. The GPU
// is timed with device events (kernels only); what a switch of backend
// costs beyond that, the launch and the wait, is measured apart by moving
// activations through mapped memory and back. Streaming is timed by
// copying a weight from the mapped file to the device.
//
// The CPU is timed in the layouts it will read: a hybrid context repacks
// its CPU units' Q4_K and Q6_K matrices as far as host memory allows
// (RepackHybrid), and the repacked kernels are faster, at decode as well
// as prefill. So every unit that may be repacked (any but the embedding,
// of a type with a repacked layout at the CPU's level) and every layer
// holding one are timed twice: from the file's blocks and from repacked
// copies that the profile makes, on weights of its own, for the rotation
// it times and drops after (the model's own weights are not touched).
// Which units a placement will find repacked depends on what it keeps on
// the GPU; the planner works that out (packedFractions) and takes each
// unit's times in its layout (plan.Profile.Packed).

// ProfileBatches are the batch sizes a profile measures: decode, and
// prefill batches.
var ProfileBatches = []int{1, 32, 128, 512}

// profileDecodePos is the cache position at which decode attention is
// timed: a conversation a few turns in.
const profileDecodePos = 256

// profileDepth is how much further into the cache the units whose work
// grows with the context (attention) are timed again, for the seconds a
// position of context adds (plan.UnitTimes.CPUPerPos): deep enough that
// the growth stands well above the noise of a step, shallow enough for
// the cache of a few layers to stay small on a small GPU.
const profileDepth = 2048

// modelIdentity digests what makes a model file itself for a profile:
// its tensor table (names, types, shapes, offsets) and its size.
func modelIdentity(m *model.Model) string {
	h := sha256.New()
	for _, p := range m.File.Parts {
		fmt.Fprintf(h, "%d\n", len(p.Data))
	}
	for _, t := range m.File.Tensors {
		fmt.Fprintf(h, "%s %s %v %d\n", t.Name, t.Type, t.Dims, t.Offset)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// hardware is the fingerprint a profile is keyed by.
func hardware(acc backend.Accelerator, threads int) plan.Hardware {
	hw := plan.Hardware{CPU: strings.TrimSpace(cpuid.CPU.BrandName), Cores: cpuid.CPU.PhysicalCores, Threads: threads, CPULevel: ops.CPUKernels()}
	if acc != nil {
		info := acc.Info()
		hw.GPU, hw.VRAM, hw.Driver = info.Name, info.Memory, info.Driver
	}
	return hw
}

// profile returns the model's profile on this machine: cached, or
// measured now (and cached).
func (p *Planner) profile(units []model.Unit, opt Options, fresh bool) (*plan.Profile, error) {
	pool := ops.NewPool(opt.Threads)
	threads := pool.Threads()
	pool.Close()
	batches := ProfileBatches
	key := plan.ProfileKey(modelIdentity(p.m), hardware(p.acc, threads), batches)
	dir, err := plan.CacheDir()
	if err == nil && !fresh {
		if p, err := plan.LoadProfile(dir, key); err == nil && p != nil && len(p.Units) == len(units) {
			return p, nil
		}
	}
	prof, err := p.MeasureProfile(units, opt, batches)
	if err != nil {
		return nil, err
	}
	prof.Key = key
	if dir != "" {
		if err := plan.SaveProfile(dir, prof); err != nil {
			opt.Notes.Note(fmt.Sprintf("could not cache the profile: %v", err))
		}
	}
	return prof, nil
}

// Profile is the model's placement profile for contexts of opt on this
// machine, from the cache or measured now; fresh measures again even when
// one is cached.
func (p *Planner) Profile(opt Options, fresh bool) (*plan.Profile, error) {
	opt = opt.withDefaults(p.m)
	if p.acc == nil {
		return nil, errors.New("profile: no GPU is open")
	}
	return p.profile(p.units(opt), opt, fresh)
}

// ProfileHost measures the host's side of the profile alone (the device's
// figures left at zero), now: it needs no device, and is not cached, since
// no placement can be planned from it; it shows what the CPU does on a
// machine without one.
func (p *Planner) ProfileHost(opt Options) (*plan.Profile, error) {
	opt = opt.withDefaults(p.m)
	host := &Planner{m: p.m, w: p.w}
	return host.MeasureProfile(model.Units(p.m.Prog, opt.KV, nil), opt, ProfileBatches)
}

// profileRun is the state of one measurement.
type profileRun struct {
	m       *model.Model
	units   []model.Unit
	batches []int
	cb      *cpu.Backend
	pool    *ops.Pool    // cb's
	cw      *cpu.Weights // the CPU's weights: the model's, in the layout timed (of the profile's own)
	undo    func()       // restores cw's layout (nil: nothing to restore)
	copies  bool         // cw reads repacked copies made for it
	ge      backend.Exec
	tokens  []int32
	rows    int // the cache's rows
	depth   int // positions added to every timed batch's (profileDepth, or 0)
	done    int
	total   int
	note    func(done, total int, what string)
}

// MeasureProfile measures units on the host and the device at the batch
// sizes; without a device, on the host only: the device's times, the
// switches and the streaming are then left at zero.
func (pl *Planner) MeasureProfile(units []model.Unit, opt Options, batches []int) (*plan.Profile, error) {
	start := time.Now()
	m, dev := pl.m, pl.acc
	p := m.Prog
	// One unit of each signature, and one layer of each kind.
	rep := map[string]int{}
	var reps []int
	for _, u := range units {
		if _, ok := rep[u.Sig]; !ok {
			rep[u.Sig] = u.Index
			reps = append(reps, u.Index)
		}
	}
	type layer struct{ first, last int } // unit indices
	layers := map[int]*layer{}
	for _, u := range units {
		if u.Layer < 0 {
			continue
		}
		if l := layers[u.Layer]; l == nil {
			layers[u.Layer] = &layer{u.Index, u.Index}
		} else {
			l.last = u.Index
		}
	}
	// A layer's kind is the signatures of its units; the first layer of
	// each kind is timed whole.
	layerRep := map[string]*layer{}
	var layerKinds []*layer
	layerOf := map[int]*layer{} // unit -> its layer's representative
	for l := 0; l < p.Hyper.NLayer; l++ {
		ly := layers[l]
		if ly == nil {
			continue
		}
		var sig []string
		for i := ly.first; i <= ly.last; i++ {
			sig = append(sig, units[i].Sig)
		}
		k := strings.Join(sig, "|")
		if layerRep[k] == nil {
			layerRep[k] = ly
			layerKinds = append(layerKinds, ly)
		}
		for i := ly.first; i <= ly.last; i++ {
			layerOf[i] = layerRep[k]
		}
	}
	// Rotations: units (and layers) of one shape, enough of them that a
	// timing finds its weights in memory rather than in a cache.
	cpuCold, gpuCold := coldBytes(dev)
	sameSig := map[string][]int{}
	for _, u := range units {
		sameSig[u.Sig] = append(sameSig[u.Sig], u.Index)
	}
	rotation := func(list []int, bytes func(int) int64, target int64) []int {
		var out []int
		var sum int64
		for _, i := range list {
			if len(out) > 0 && sum >= target {
				break
			}
			out = append(out, i)
			sum += bytes(i)
		}
		return out
	}
	unitBytes := func(i int) int64 { return max(units[i].Bytes, 1) }
	sameLayer := map[*layer][]*layer{}
	for l := 0; l < p.Hyper.NLayer; l++ {
		if ly := layers[l]; ly != nil {
			r := layerOf[ly.first]
			sameLayer[r] = append(sameLayer[r], ly)
		}
	}
	layerBytes := func(ly *layer) int64 {
		var n int64
		for i := ly.first; i <= ly.last; i++ {
			n += unitBytes(i)
		}
		return n
	}
	layerRotation := func(r *layer, target int64) []*layer {
		var out []*layer
		var sum int64
		for _, ly := range sameLayer[r] {
			if len(out) > 0 && sum >= target {
				break
			}
			out = append(out, ly)
			sum += layerBytes(ly)
		}
		return out
	}
	// The ops the CPU side runs, the ops and weights the GPU side needs.
	cpuRuns, gpuRuns := make([]bool, len(p.Ops)), make([]bool, len(p.Ops))
	resident := map[*ir.Weight]bool{}
	mark := func(ui int, onGPU bool) {
		u := units[ui]
		for i := u.Lo; i < u.Hi; i++ {
			cpuRuns[i] = true
			if onGPU {
				gpuRuns[i] = true
			}
		}
		if onGPU {
			for _, w := range u.Mats {
				resident[w] = true
			}
		}
	}
	cpuRot, gpuRot := map[int][]int{}, map[int][]int{}
	for _, i := range reps {
		cpuRot[i] = rotation(sameSig[units[i].Sig], unitBytes, cpuCold)
		gpuRot[i] = rotation(sameSig[units[i].Sig], unitBytes, gpuCold)
		for _, j := range cpuRot[i] {
			mark(j, false)
		}
		for _, j := range gpuRot[i] {
			mark(j, true)
		}
	}
	cpuLayers, gpuLayers := map[*layer][]*layer{}, map[*layer][]*layer{}
	for _, ly := range layerKinds {
		cpuLayers[ly], gpuLayers[ly] = layerRotation(ly, cpuCold), layerRotation(ly, gpuCold)
		for _, l := range cpuLayers[ly] {
			for i := l.first; i <= l.last; i++ {
				mark(i, false)
			}
		}
		for _, l := range gpuLayers[ly] {
			for i := l.first; i <= l.last; i++ {
				mark(i, true)
			}
		}
	}
	maxB := batches[len(batches)-1]
	ctxSize := profileDepth + profileDecodePos + maxB + 1
	pool := ops.NewPool(opt.Threads)
	defer pool.Close()
	// The CPU runs on weights of its own, which each timing points at
	// the layout it times (profileRun.layout).
	cw, err := cpu.NewWeights(p)
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	kv := model.KV{Rows: ctxSize, Type: opt.KV.Type}
	cb, err := cpu.New(cw, pool, cpu.Options{Batch: maxB, LogitRows: 1, KV: kv, Runs: cpuRuns})
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	defer cb.Close()
	files := m.FileParts()
	var ge backend.Exec
	if dev != nil {
		ge, err = dev.NewExec(p, backend.ExecConfig{Batch: maxB, LogitRows: 1, KV: kv, Runs: gpuRuns, Resident: resident, Files: files, Options: opt.Device}, nil)
		if err != nil {
			return nil, fmt.Errorf("profile: %w", err)
		}
		defer ge.Close()
	}
	// Activations: random rows of a realistic scale on both sides.
	rng := rand.New(rand.NewPCG(1, 2))
	for id, b := range p.Bufs {
		rows := maxB
		if ir.BufID(id) == p.Logits {
			rows = 1
		}
		v := make([]float32, rows*b.Width)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		if host := cb.Buf(ir.BufID(id)); host != nil {
			copy(host, v)
		}
		if ge == nil {
			continue
		}
		if err := ge.WriteBuffer(ir.BufID(id), v); err != nil {
			return nil, fmt.Errorf("profile: %w", err)
		}
	}
	r := &profileRun{m: m, units: units, batches: batches, cb: cb, pool: pool, ge: ge, cw: cw, rows: ctxSize, note: opt.Progress}
	r.tokens = make([]int32, maxB)
	for i := range r.tokens {
		r.tokens[i] = int32(rng.IntN(p.Hyper.NVocab))
	}
	// Units a hybrid context may repack are timed in both layouts, the
	// layers they are in whole in both.
	packable := make([]bool, len(units))
	for i, u := range units {
		packable[i] = repackable(cw, u)
	}
	layerPackable := func(ly *layer) bool { return slices.Contains(packable[ly.first:ly.last+1], true) }
	steps := len(reps) + len(layerKinds)
	for _, i := range reps {
		if packable[i] {
			steps++
		}
		if units[i].Anchor == ir.AnchorCache {
			steps++ // timed at depth too
		}
	}
	for _, ly := range layerKinds {
		if layerPackable(ly) {
			steps++
		}
	}
	r.total = len(batches) * steps
	prof := &plan.Profile{Version: plan.ProfileVersion, Model: filepath.Base(m.File.Path), Hardware: hardware(dev, pool.Threads()),
		Created: time.Now().UTC(), Batches: batches, DecodePos: profileDecodePos, DepthPos: profileDepth, Measured: len(reps)}
	prof.Units = make([]plan.UnitTimes, len(units))
	for i, u := range units {
		t := &prof.Units[i]
		t.Name, t.Sig = u.Name, u.Sig
		t.CPU, t.GPU = make([]float64, len(batches)), make([]float64, len(batches))
		t.CPUAlone, t.GPUAlone = make([]float64, len(batches)), make([]float64, len(batches))
		if packable[i] {
			t.CPUPacked, t.CPUPackedAlone = make([]float64, len(batches)), make([]float64, len(batches))
		}
	}
	// Each representative unit alone, on each backend, and on the CPU
	// from repacked copies too.
	type times struct{ cpu, gpu, packed, share, cpuPerPos, gpuPerPos []float64 }
	alone := map[int]times{}
	for _, i := range reps {
		u := units[i]
		var cr [][2]int
		for _, j := range cpuRot[i] {
			cr = append(cr, [2]int{units[j].Lo, units[j].Hi})
		}
		var gr [][2]int
		for _, j := range gpuRot[i] {
			gr = append(gr, [2]int{units[j].Lo, units[j].Hi})
		}
		schs, err := r.compile(gr)
		if err != nil {
			return nil, fmt.Errorf("profile: %s: %w", u.Name, err)
		}
		var a times
		rot := r.layout(cr, false)
		for _, n := range batches {
			tc, err := r.timeCPU(rot, n)
			if err != nil {
				release(schs)
				return nil, err
			}
			tg, err := r.timeGPU(schs, n)
			if err != nil {
				release(schs)
				return nil, fmt.Errorf("profile: %s on the GPU: %w", u.Name, err)
			}
			a.cpu, a.gpu = append(a.cpu, tc), append(a.gpu, tg)
			r.step(u.Name)
		}
		if u.Anchor == ir.AnchorCache {
			// Its work grows with the context: again, profileDepth
			// positions further in.
			r.depth = profileDepth
			for k, n := range batches {
				tc, err := r.timeCPU(rot, n)
				if err == nil {
					var tg float64
					if tg, err = r.timeGPU(schs, n); err == nil {
						per := float64(n) * profileDepth
						a.cpuPerPos = append(a.cpuPerPos, max(tc-a.cpu[k], 0)/per)
						a.gpuPerPos = append(a.gpuPerPos, max(tg-a.gpu[k], 0)/per)
					}
				}
				if err != nil {
					r.depth = 0
					release(schs)
					return nil, fmt.Errorf("profile: %s at depth %d: %w", u.Name, profileDepth, err)
				}
				r.step(fmt.Sprintf("%s at depth %d", u.Name, profileDepth))
			}
			r.depth = 0
		}
		release(schs)
		if packable[i] {
			rot := r.layout(cr, true)
			for _, n := range batches {
				tc, err := r.timeCPU(rot, n)
				if err != nil {
					return nil, err
				}
				a.packed = append(a.packed, tc)
				r.step(u.Name + " repacked")
			}
			if moeExperts(u) > 0 && canSplitMoE(cw, u) {
				for _, n := range batches {
					ts, err := r.timeShare(rot, n)
					if err != nil {
						return nil, fmt.Errorf("profile: %s, the CPU's share: %w", u.Name, err)
					}
					a.share = append(a.share, ts)
				}
			}
		}
		r.restore()
		alone[i] = a
	}
	for i := range units {
		a := alone[rep[units[i].Sig]]
		t := &prof.Units[i]
		copy(t.CPUAlone, a.cpu)
		copy(t.GPUAlone, a.gpu)
		copy(t.CPU, a.cpu)
		copy(t.GPU, a.gpu)
		copy(t.CPUPackedAlone, a.packed)
		copy(t.CPUPacked, a.packed)
		t.CPUShare = slices.Clone(a.share)
		t.CPUPerPos, t.GPUPerPos = slices.Clone(a.cpuPerPos), slices.Clone(a.gpuPerPos)
	}
	// Each kind of layer whole: its fusion ratio scales its units, in
	// each layout.
	ratio := map[*layer]times{}
	for _, ly := range layerKinds {
		span := func(ls []*layer) [][2]int {
			var out [][2]int
			for _, l := range ls {
				out = append(out, [2]int{units[l.first].Lo, units[l.last].Hi})
			}
			return out
		}
		schs, err := r.compile(span(gpuLayers[ly]))
		if err != nil {
			return nil, fmt.Errorf("profile: layer %d: %w", units[ly.first].Layer, err)
		}
		var rt times
		rot := r.layout(span(cpuLayers[ly]), false)
		for bi, n := range batches {
			tc, err := r.timeCPU(rot, n)
			if err != nil {
				release(schs)
				return nil, err
			}
			tg, err := r.timeGPU(schs, n)
			if err != nil {
				release(schs)
				return nil, fmt.Errorf("profile: layer %d on the GPU: %w", units[ly.first].Layer, err)
			}
			var sc, sg float64
			for i := ly.first; i <= ly.last; i++ {
				sc += prof.Units[i].CPUAlone[bi]
				sg += prof.Units[i].GPUAlone[bi]
			}
			rt.cpu, rt.gpu = append(rt.cpu, fusedRatio(tc, sc)), append(rt.gpu, fusedRatio(tg, sg))
			r.step(fmt.Sprintf("layer %d", units[ly.first].Layer))
		}
		release(schs)
		if layerPackable(ly) {
			rot := r.layout(span(cpuLayers[ly]), true)
			for bi, n := range batches {
				tc, err := r.timeCPU(rot, n)
				if err != nil {
					return nil, err
				}
				var sc float64
				for i := ly.first; i <= ly.last; i++ {
					t := prof.Units[i]
					if packable[i] {
						sc += t.CPUPackedAlone[bi]
					} else {
						sc += t.CPUAlone[bi]
					}
				}
				rt.packed = append(rt.packed, fusedRatio(tc, sc))
				r.step(fmt.Sprintf("layer %d repacked", units[ly.first].Layer))
			}
		}
		r.restore()
		ratio[ly] = rt
	}
	for i := range units {
		ly := layerOf[i]
		if ly == nil {
			continue
		}
		rt := ratio[ly]
		t := &prof.Units[i]
		for bi := range batches {
			t.CPU[bi] = t.CPUAlone[bi] * rt.cpu[bi]
			t.GPU[bi] = t.GPUAlone[bi] * rt.gpu[bi]
			if packable[i] {
				t.CPUPacked[bi] = t.CPUPackedAlone[bi] * rt.packed[bi]
			}
		}
	}
	floorDecodeByHostRead(prof, units, hostReadRate(pool))
	if dev == nil {
		prof.Took = time.Since(start).Seconds()
		return prof, nil
	}
	// Switches: activations of one hidden row per token, there and back,
	// at two sizes for a latency and a rate.
	for _, n := range batches {
		small := p.Hyper.NEmbd * n
		t1, err := dev.MeasureSwitch(small, 7)
		if err != nil {
			return nil, fmt.Errorf("profile: switch: %w", err)
		}
		t2, err := dev.MeasureSwitch(8*small, 7)
		if err != nil {
			return nil, fmt.Errorf("profile: switch: %w", err)
		}
		l := plan.Link{Latency: t1}
		if t2 > t1 {
			l.BytesPerSec = float64(4*7*small) / (t2 - t1)
			l.Latency = max(t1-float64(4*small)/l.BytesPerSec, 0)
		}
		prof.Switch = append(prof.Switch, l)
	}
	// Streaming: the largest streamable matrix from the file.
	var big *ir.Weight
	for _, u := range units {
		if !u.Streamable {
			continue
		}
		for _, w := range u.Mats {
			if big == nil || len(w.Data) > len(big.Data) {
				big = w
			}
		}
	}
	if big != nil {
		bps, pinned, err := dev.MeasureUpload(big.Data, files, 3)
		if err != nil {
			return nil, fmt.Errorf("profile: streaming %s: %w", big.Name, err)
		}
		prof.Stream, prof.Pinned = plan.Link{BytesPerSec: bps}, pinned
	}
	prof.Took = time.Since(start).Seconds()
	return prof, nil
}

// layout points the CPU's matrices of the ops in ranges at the file's
// blocks (packed false) or at repacked copies, made now (several at once)
// and dropped by the next restore, and returns the rotation of the ranges
// in that layout. The embedding is never repacked (a context never reads
// it from a copy), and matrices without a repacked layout stay as they
// are.
func (r *profileRun) layout(ranges [][2]int, packed bool) *cpuRotation {
	r.restore()
	var list []*ir.Weight
	for _, rg := range ranges {
		for i := rg[0]; i < rg[1]; i++ {
			op := &r.m.Prog.Ops[i]
			if op.Class().Lookup {
				continue
			}
			for _, w := range []*ir.Weight{op.W, op.Gate, op.Up, op.Down} {
				if w != nil && !w.IsVector() {
					list = append(list, w)
				}
			}
		}
	}
	r.undo = r.cw.Layout(list, packed)
	r.copies = packed
	return &cpuRotation{ranges: ranges}
}

// restore points the CPU's matrices at the file's blocks again, and gives
// the memory of the copies layout made back to the system at once: the
// process should stay near the size of the weights (a context repacks
// its own next), not hold a rotation or two of garbage.
func (r *profileRun) restore() {
	if r.undo != nil {
		r.undo()
		r.undo = nil
	}
	if r.copies {
		r.copies = false
		debug.FreeOSMemory()
	}
}

func (r *profileRun) step(what string) {
	r.done++
	if r.note != nil {
		r.note(r.done, r.total, what)
	}
}

// pos0 is where a batch of n is timed: decode deep in a conversation,
// prefill from the start.
func pos0(n int) int {
	if n == 1 {
		return profileDecodePos
	}
	return 0
}

// batch is the step a timing of n rows runs: the profile's tokens, of one
// sequence at pos0(n), whose blocks lie in order, the last row's logits
// wanted.
func (r *profileRun) batch(n int) *ir.Batch {
	b := &ir.Batch{Tokens: r.tokens[:n], Pos: make([]int32, n), Seq: make([]int32, n), Block: kvcache.DefaultBlock, Logits: []int32{int32(n - 1)}}
	for t := range n {
		b.Pos[t] = int32(r.depth + pos0(n) + t)
	}
	table := make([]int32, (r.rows+b.Block-1)/b.Block)
	for k := range table {
		table[k] = int32(k)
	}
	b.Tables = [][]int32{table}
	return b
}

// fusedRatio is a layer's time whole over the sum of its units' alone,
// at most 1 (1 when nothing was timed: no GPU).
func fusedRatio(whole, sum float64) float64 {
	if sum <= 0 {
		return 1
	}
	return min(whole/sum, 1)
}

// compile makes a one-segment GPU schedule of each op range (none
// without a GPU).
func (r *profileRun) compile(ranges [][2]int) ([]backend.Schedule, error) {
	if r.ge == nil {
		return nil, nil
	}
	var out []backend.Schedule
	nOps := len(r.m.Prog.Ops)
	for _, rg := range ranges {
		sch, err := r.ge.Compile([]backend.SegmentSpec{{Lo: rg[0], Hi: rg[1], Logits: rg[1] == nOps}}, nil)
		if err != nil {
			release(out)
			return nil, err
		}
		out = append(out, sch)
	}
	return out, nil
}

func release(schs []backend.Schedule) {
	for _, s := range schs {
		_ = s.Release()
	}
}

// cpuRotation is a rotation of op ranges of one shape, in one layout,
// timed on the CPU at each batch size in turn: every run takes the next
// range, carrying on from one batch size to the next, so the range timed
// was last run a whole rotation (several times the last-level cache) of
// weights ago.
type cpuRotation struct {
	ranges  [][2]int
	next    int
	touched bool // every range run once
}

// timeCPU is the median seconds of the rotation's next ranges on the CPU
// over n rows. The first timing of a rotation runs every range once
// before (page faults, fresh copies out of the caches; medianOf warms the
// first); the next ones need not, their ranges were all run since.
func (r *profileRun) timeCPU(rot *cpuRotation, n int) (float64, error) {
	b := r.batch(n)
	if !rot.touched {
		for _, rg := range rot.ranges[1:] {
			r.cb.Begin()
			if _, err := r.cb.Run(rg[0], rg[1], b, n); err != nil {
				return 0, err
			}
		}
		rot.touched = true
	}
	return medianOf(func() (float64, error) {
		rg := rot.ranges[rot.next%len(rot.ranges)]
		rot.next++
		start := time.Now()
		r.cb.Begin()
		_, err := r.cb.Run(rg[0], rg[1], b, n)
		return time.Since(start).Seconds(), err
	})
}

// shareProfiled: the profile times the CPU's share of a split MoE layer
// over the first 1/shareProfiled of its experts (plan.UnitTimes.CPUShare;
// every MoE model's expert count so far is a multiple of it), and
// splitCPU scales that time by the share the planner tries.
const shareProfiled = 4

// timeShare is the median seconds of the CPU's share of a split MoE
// layer (cpu.Backend.MoEPartial over the first 1/shareProfiled of the
// experts) for the rotation's next MoE ops over n rows, with random
// routing (each token top-k distinct experts), which a prompt's routing
// resembles in that it reaches most experts.
func (r *profileRun) timeShare(rot *cpuRotation, n int) (float64, error) {
	var moes []*ir.Op
	for _, rg := range rot.ranges {
		for i := rg[0]; i < rg[1]; i++ {
			if op := &r.m.Prog.Ops[i]; op.Class().Experts {
				moes = append(moes, op)
			}
		}
	}
	if len(moes) == 0 {
		return 0, errors.New("no MoE op in the rotation")
	}
	op := moes[0]
	k, ne, emb := op.TopK, op.Experts(), op.Gate.Cols()
	rng := rand.New(rand.NewPCG(uint64(n), 3))
	x, out := make([]float32, n*emb), make([]float32, n*emb)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	ids, w := make([]int32, n*k), make([]float32, n*k)
	for t := range n {
		for j, e := range rng.Perm(ne)[:k] {
			ids[t*k+j], w[t*k+j] = int32(e), rng.Float32()/float32(k)
		}
	}
	next := 0
	return medianOf(func() (float64, error) {
		op := moes[next%len(moes)]
		next++
		// As a split layer's share starts: the workers woken while the
		// GPU routes (about a millisecond), spinning (the device backend's
		// Expect), not parked as between two timings.
		r.pool.Expect(5 * time.Millisecond)
		for t := time.Now(); time.Since(t) < time.Millisecond; {
		}
		r.pool.Expect(15 * time.Millisecond)
		start := time.Now()
		err := r.cb.MoEPartial(op, n, 0, max(1, ne/shareProfiled), x, ids, w, out)
		return time.Since(start).Seconds(), err
	})
}

// timeGPU is the median device seconds of one of the schedules (the next
// in turn each run); 0 without a GPU.
func (r *profileRun) timeGPU(schs []backend.Schedule, n int) (float64, error) {
	if r.ge == nil {
		return 0, nil
	}
	b := r.batch(n)
	for _, sch := range schs[1:] { // graph captures (medianOf warms the first)
		if err := r.ge.Begin(sch, b); err != nil {
			return 0, err
		}
		if _, err := r.ge.TimeRun(sch.Segments()[0], n); err != nil {
			return 0, err
		}
	}
	k := 0
	return medianOf(func() (float64, error) {
		sch := schs[k%len(schs)]
		k++
		if err := r.ge.Begin(sch, b); err != nil {
			return 0, err
		}
		d, err := r.ge.TimeRun(sch.Segments()[0], n)
		return d.Seconds(), err
	})
}

// coldBytes is how many bytes of weights a rotation covers on each side:
// four times the CPU's last-level cache and twice the GPU's L2, at least
// 256 and 128 MiB.
func coldBytes(dev backend.Accelerator) (cpu, gpu int64) {
	cpu, gpu = 256<<20, 128<<20
	if l3 := int64(cpuid.CPU.Cache.L3); l3 > 0 {
		cpu = max(cpu, 4*l3)
	}
	if dev == nil {
		return cpu, gpu
	}
	if l2 := dev.Info().L2Cache; l2 > 0 {
		gpu = max(gpu, 2*l2)
	}
	return cpu, gpu
}

// medianOf runs f once to warm up, then until it has at least 3 samples
// and 20 ms of them (at most 15), and returns the median.
func medianOf(f func() (float64, error)) (float64, error) {
	if _, err := f(); err != nil {
		return 0, err
	}
	var ts []float64
	sum := 0.0
	for len(ts) < 3 || (sum < 0.02 && len(ts) < 15) {
		t, err := f()
		if err != nil {
			return 0, err
		}
		ts = append(ts, t)
		sum += t
	}
	sort.Float64s(ts)
	return ts[len(ts)/2], nil
}

// floorDecodeByHostRead keeps every matrix unit's decode time on the CPU
// at or above what its weights take to read at rate (bytes/s). A unit
// timed on its own in the rotation reads faster than the same unit inside
// a whole decode step, where the CPU's units back to back hold host memory
// at its sustained rate: without the floor the plan over-predicted hybrid
// decode by up to a third once the CPU's units were timed repacked.
func floorDecodeByHostRead(prof *plan.Profile, units []model.Unit, rate float64) {
	bi := slices.Index(prof.Batches, 1)
	if rate <= 0 || bi < 0 {
		return
	}
	prof.HostRead = rate
	for i, u := range units {
		if !u.Products() {
			continue // the embedding reads a row, attention its cache
		}
		floor := float64(u.DecodeBytes) / rate
		t := &prof.Units[i]
		t.CPU[bi] = max(t.CPU[bi], floor)
		if t.CPUPacked != nil {
			t.CPUPacked[bi] = max(t.CPUPacked[bi], floor)
		}
	}
}

// hostReadBytes is the buffer hostReadRate streams: well beyond any CPU's
// last-level cache.
const hostReadBytes = 512 << 20

// hostReadRate measures how fast the pool's threads together read host
// memory: the best of three passes summing a buffer far larger than the
// caches (bytes/s).
func hostReadRate(pool *ops.Pool) float64 {
	buf := make([]uint64, hostReadBytes/8)
	for i := range buf {
		buf[i] = uint64(i) // touch every page before timing
	}
	var sum atomic.Uint64 // kept, so the reads are not optimised away
	best := 0.0
	for pass := 0; pass < 3; pass++ {
		t0 := time.Now()
		pool.RunChunks(len(buf), 1<<15, func(lo, hi int) {
			var a, b, c, d uint64
			x := buf[lo:hi]
			for len(x) >= 4 {
				a += x[0]
				b += x[1]
				c += x[2]
				d += x[3]
				x = x[4:]
			}
			for _, v := range x {
				a += v
			}
			sum.Add(a + b + c + d)
		})
		if dt := time.Since(t0).Seconds(); dt > 0 {
			best = max(best, hostReadBytes/dt)
		}
	}
	goruntime.KeepAlive(sum.Load())
	return best
}
