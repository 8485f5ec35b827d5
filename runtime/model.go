package runtime

import (
	"fmt"
	"os"
	"sync"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/ir"
)

// Model is an opened GGUF model and its program.
type Model struct {
	File *gguf.File
	Prog *ir.Program

	repackMu sync.Mutex
	repacked int64 // heap bytes of the repacked copies (repackForCPU, repackHybrid)
	contexts int   // contexts open on the model (repackMu)
	// packedExperts is, for an MoE expert stack repacked in part, how
	// many of its first experts have copies (repackHybrid; repackMu).
	packedExperts map[*ir.Weight]int

	// rejected: promotion plans measured slower than none, by placement
	// and plan, with the estimates of the machine when they were
	// (promoter.dropToBase).
	rejectedMu sync.Mutex
	rejected   map[string]plan.Estimates
}

// rejectPlan records that the promotion plan named key measured slower
// than no promotion under the estimates e.
func (m *Model) rejectPlan(key string, e plan.Estimates) {
	m.rejectedMu.Lock()
	defer m.rejectedMu.Unlock()
	if m.rejected == nil {
		m.rejected = map[string]plan.Estimates{}
	}
	if len(m.rejected) >= maxRejectedPlans {
		clear(m.rejected) // a long-lived server under ever-changing load
	}
	m.rejected[key] = e
}

// rejectedPlan says whether the plan named key was rejected, and under
// which estimates.
func (m *Model) rejectedPlan(key string) (plan.Estimates, bool) {
	m.rejectedMu.Lock()
	defer m.rejectedMu.Unlock()
	e, ok := m.rejected[key]
	return e, ok
}

// maxRejectedPlans bounds the verdicts a model keeps.
const maxRejectedPlans = 256

// enterContext counts a context opened on the model, leaveContext one
// closed.
func (m *Model) enterContext() {
	m.repackMu.Lock()
	defer m.repackMu.Unlock()
	m.contexts++
}

func (m *Model) leaveContext() {
	m.repackMu.Lock()
	defer m.repackMu.Unlock()
	m.contexts--
}

// sharedRepackNote says once that a context did not repack.
var sharedRepackNote sync.Once

// repackAlone repacks ws (repackLocked) unless another context is open on
// the model: a repack swaps the matrices that context's CPU backend is
// reading as it computes. This context's CPU units then read the file's
// blocks, which is said once. The caller holds repackMu.
func (m *Model) repackAlone(ws []*ir.Weight) {
	if len(ws) > 0 && m.contexts > 1 {
		sharedRepackNote.Do(func() {
			fmt.Fprintln(os.Stderr, "ats: another context of this model is open: its weights are not repacked now, and this context's CPU runs them from the file's blocks (slower)")
		})
		return
	}
	m.repackLocked(ws)
}

// Open maps a GGUF file and builds its program. Weights stay in the map.
func Open(path string) (*Model, error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, err
	}
	m, err := Load(f)
	if err != nil {
		f.Close()
		return nil, err
	}
	return m, nil
}

// Load builds the program of an opened file.
func Load(f *gguf.File) (*Model, error) {
	p, err := Build(f)
	if err != nil {
		return nil, err
	}
	return &Model{File: f, Prog: p}, nil
}

// Hyper returns the model's hyperparameters.
func (m *Model) Hyper() ir.Hyper { return m.Prog.Hyper }

// Close unmaps the file; contexts must not be used afterwards.
func (m *Model) Close() error { return m.File.Close() }

// WeightBytes is the size of every weight the program uses.
func (m *Model) WeightBytes() int64 {
	seen := map[*ir.Weight]bool{}
	var n int64
	for i := range m.Prog.Ops {
		for _, w := range m.Prog.Ops[i].Weights() {
			if !seen[w] {
				seen[w] = true
				n += w.Bytes()
			}
		}
	}
	return n
}

func (m *Model) String() string {
	h := m.Prog.Hyper
	return fmt.Sprintf("%s: %d layers, %d wide, %d/%d heads of %d, vocab %d", h.Arch, h.NLayer, h.NEmbd, h.NHead, h.NKVHead, h.HeadK, h.NVocab)
}

// EnvRepack set to "0" keeps CPU-only contexts on the file's own blocks.
const EnvRepack = "ATS_REPACK"

// repackForCPU gives the model's Q4_K and Q6_K matrices an interleaved
// copy (ops.Matrix.Repack: 16 rows a block, read by kernels that multiply
// many rows by many tokens at once), which makes CPU prefill about twice
// as fast and decode about 1.5 times, at the cost of that copy on the heap
// (88% of a Q4_K_M file's weights; the mapped pages the CPU no longer
// reads may then be dropped by the OS). CPU-only contexts ask for every
// matrix but the output head (prefill computes it for one token); hybrid
// contexts for what fits their memory (repackHybrid). It runs before the
// asking context computes, and returns the bytes the copies take.
func (m *Model) repackForCPU() int64 {
	var ws []*ir.Weight
	for i := range m.Prog.Ops {
		op := &m.Prog.Ops[i]
		switch {
		case op.Kind == ir.OpMatMul && !op.Output:
			ws = append(ws, op.W)
		case op.Kind == ir.OpMoE:
			ws = append(ws, op.Gate, op.Up, op.Down)
		}
	}
	return m.repackWeights(ws, -1)
}

// repackWeights repacks each of ws (nil entries and matrices without a
// packed layout are skipped) while the copies made stay within limit
// bytes (negative: no limit); it returns the heap all repacked copies of
// the model take.
func (m *Model) repackWeights(ws []*ir.Weight, limit int64) int64 {
	m.repackMu.Lock()
	defer m.repackMu.Unlock()
	m.repackAlone(m.repackChoice(ws, limit))
	return m.repacked
}

// repackChoice is what repackWeights(ws, limit) would repack now: in
// order, each of ws that has a repacked layout at the CPU's level and no
// copy yet, while the copies stay within limit (a matrix larger than
// what is left is passed over, a smaller one after it may still fit);
// nothing with ATS_REPACK=0. The caller holds repackMu.
func (m *Model) repackChoice(ws []*ir.Weight, limit int64) []*ir.Weight {
	if os.Getenv(EnvRepack) == "0" {
		return nil
	}
	var out []*ir.Weight
	seen := map[*ir.Weight]bool{}
	for _, w := range ws {
		if w == nil || seen[w] || w.Mat.RepackedBytes() > 0 || (limit >= 0 && w.Bytes() > limit) {
			continue
		}
		size := int64(w.Mat.RepackSize())
		if size == 0 {
			continue
		}
		seen[w] = true
		out = append(out, w)
		limit -= size
	}
	return out
}

// repackLocked repacks ws (repackChoice's); the caller holds repackMu.
func (m *Model) repackLocked(ws []*ir.Weight) {
	for _, w := range ws {
		r, ok := w.Mat.Repack()
		if !ok {
			continue
		}
		w.Mat = r
		m.repacked += int64(r.RepackedBytes())
		if n := len(w.Stack); n > 0 {
			copy(w.Stack, stackOf(r, n))
		}
	}
}

// repackHybrid repacks the matrices of a hybrid placement's CPU units, in
// the order the CPU profits most (dense products, which decode reads
// whole, before MoE expert stacks, of which a token reads top-k), as far
// as host memory allows: the process should stay near the size of the
// weights, so the copies may take what the GPU-resident weights give
// back (their mapped pages are released once uploaded; Context.init)
// plus a thirty-second of the weights (the process's own heap and the
// driver's take about as much again). The CPU units' own pages stay, pinned
// for the copies that promote or stream them.
func (m *Model) repackHybrid(pl *Placement) int64 {
	m.repackMu.Lock()
	defer m.repackMu.Unlock()
	ch := m.hybridChoice(pl.units, pl.resident)
	if len(ch.whole) == 0 && ch.experts == 0 {
		return m.repacked
	}
	if m.contexts > 1 {
		m.repackAlone(append(ch.whole, ch.stacks...)) // says why it does not
		return m.repacked
	}
	m.repackLocked(ch.whole)
	for _, w := range ch.stacks {
		m.repackExperts(w, ch.experts)
	}
	return m.repacked
}

// hybridRepack is what repackHybrid repacks: whole matrices, and the first
// experts of MoE expert stacks.
type hybridRepack struct {
	whole   []*ir.Weight
	stacks  []*ir.Weight
	experts int // of each of stacks, the first experts repacked
}

// hybridChoice is what repackHybrid would repack now for a placement of
// units where resident(i) says whether unit i lives on the GPU: the dense
// products first, then the MoE layers' expert stacks, the same first
// experts of every stack. A token's experts are any of a layer's, so for
// decode it does not matter which are repacked; a prefill batch split
// between the CPU and the GPU gives the CPU the first experts of each
// layer (gpu moeSplit), and those are the repacked ones: on the GPU
// machine the CPU took a 512-token batch's MoE layer in 13.7 ms repacked
// and 27.9 ms from the file's blocks (BenchmarkMoEPrefill). The caller
// holds repackMu.
func (m *Model) hybridChoice(units []Unit, resident func(i int) bool) hybridRepack {
	var released, total int64
	var dense, moe []*ir.Weight
	for i, u := range units {
		for _, w := range u.Mats {
			total += w.Bytes()
			switch {
			case resident(i):
				released += w.Bytes()
			case u.Op == ir.OpEmbed:
				// Looked up a row at a time from its own blocks: a copy
				// would never be read.
			case u.Op == ir.OpMoE && len(w.Stack) > 0:
				moe = append(moe, w)
			default:
				dense = append(dense, w)
			}
		}
	}
	if !m.File.Mapped {
		released = 0 // heap copies are not given back
	}
	limit := released + total/32 - m.repacked
	if limit <= 0 {
		return hybridRepack{}
	}
	var ch hybridRepack
	ch.whole = m.repackChoice(dense, limit)
	for _, w := range ch.whole {
		limit -= int64(w.Mat.RepackSize())
	}
	if os.Getenv(EnvRepack) == "0" {
		return ch
	}
	// The most experts p of every stack whose copies, beyond those made
	// already, fit what is left.
	cost := func(p int) int64 {
		var c int64
		for _, w := range moe {
			if w.Mat.RepackedBytes() > 0 {
				continue // repacked whole (a CPU-only context)
			}
			ne := len(w.Stack)
			if have := m.packedExperts[w]; p > have {
				c += int64(w.Mat.RepackSize()) / int64(ne) * int64(p-have)
			}
		}
		return c
	}
	ne := 0
	for _, w := range moe {
		ne = max(ne, len(w.Stack))
	}
	p := 0
	for p < ne && cost(p+1) <= limit {
		p++
	}
	for _, w := range moe {
		if w.Mat.RepackedBytes() == 0 && m.packedExperts[w] < min(p, len(w.Stack)) && w.Mat.RepackSize() > 0 {
			ch.stacks = append(ch.stacks, w)
		}
	}
	if len(ch.stacks) > 0 {
		ch.experts = p
	}
	return ch
}

// repackExperts gives the first p experts of stack w repacked copies (those
// it has not already), each expert's matrix (w.Stack[e]) reading its
// copy; w.Mat, the whole stack, stays in the file's layout. The caller
// holds repackMu.
func (m *Model) repackExperts(w *ir.Weight, p int) {
	ne := len(w.Stack)
	have := m.packedExperts[w]
	p = min(p, ne)
	if p <= have || ne == 0 || w.Mat.Rows%ne != 0 {
		return
	}
	rows := w.Mat.Rows / ne
	r, ok := w.Mat.Slice(have*rows, p*rows).Repack()
	if !ok {
		return
	}
	for e := have; e < p; e++ {
		w.Stack[e] = r.Slice((e-have)*rows, (e-have+1)*rows)
	}
	m.repacked += int64(r.RepackedBytes())
	if m.packedExperts == nil {
		m.packedExperts = map[*ir.Weight]int{}
	}
	m.packedExperts[w] = p
}

// RepackedExperts is the fewest and the most first experts of an MoE
// stack that have repacked copies while the stack itself does not (0, 0:
// none).
func (m *Model) RepackedExperts() (lo, hi int) {
	m.repackMu.Lock()
	defer m.repackMu.Unlock()
	lo = -1
	for _, p := range m.packedExperts {
		if lo < 0 || p < lo {
			lo = p
		}
		hi = max(hi, p)
	}
	return max(lo, 0), hi
}

// packedShare is the fraction of w's bytes the CPU reads from repacked
// copies: all of a matrix repacked whole, the first experts' share of a
// stack repacked in part. The caller holds repackMu.
func (m *Model) packedShare(w *ir.Weight) float64 {
	if w.Mat.RepackedBytes() > 0 {
		return 1
	}
	if ne := len(w.Stack); ne > 0 {
		return float64(m.packedExperts[w]) / float64(ne)
	}
	return 0
}

// packedFractions is, for each unit, the fraction (by bytes) of its
// repackable matrices (repackable) that the CPU would read from repacked
// copies in a hybrid context where resident(i) says whether unit i lives
// on the GPU: those repackHybrid would repack now and those already
// repacked. A resident unit counts as repacked when repacking is on (its
// CPU times only describe it). bytes is what the CPU units read from
// copies.
func (m *Model) packedFractions(units []Unit, resident func(i int) bool) (frac []float64, bytes int64) {
	m.repackMu.Lock()
	defer m.repackMu.Unlock()
	ch := m.hybridChoice(units, resident)
	share := map[*ir.Weight]float64{} // what the choice would make of w
	for _, w := range ch.whole {
		share[w] = 1
	}
	for _, w := range ch.stacks {
		share[w] = float64(min(ch.experts, len(w.Stack))) / float64(len(w.Stack))
	}
	on := os.Getenv(EnvRepack) != "0"
	frac = make([]float64, len(units))
	for i, u := range units {
		if !repackable(u) {
			continue
		}
		var all, got int64
		for _, w := range u.Mats {
			if w.Mat.Kernel == nil || w.Mat.RepackSize() == 0 {
				continue
			}
			all += w.Bytes()
			f := max(share[w], m.packedShare(w))
			if on && resident(i) {
				f = 1
			}
			got += int64(f * float64(w.Bytes()))
		}
		if all > 0 {
			frac[i] = float64(got) / float64(all)
		}
		if !resident(i) {
			bytes += got
		}
	}
	return frac, bytes
}

// RepackedBytes is the heap the model's repacked CPU copies take (0 when
// no context asked for them).
func (m *Model) RepackedBytes() int64 {
	m.repackMu.Lock()
	defer m.repackMu.Unlock()
	return m.repacked
}
