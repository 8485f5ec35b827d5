package placement

import (
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

// The repack policy: which of the host's matrices get repacked copies
// (cpu.Weights makes them). The copies make the host's products faster,
// and cost host memory.

// RepackHost repacks, for a context that runs on the host alone, every
// matrix but the output head (a prompt computes it for one token) and the
// embedding (looked up a row at a time). It returns the heap the copies
// take.
func RepackHost(w *cpu.Weights) int64 {
	p := w.Program()
	var ws []*ir.Weight
	for i := range p.Ops {
		op := &p.Ops[i]
		cl := op.Class()
		switch {
		case cl.Experts:
			ws = append(ws, op.Gate, op.Up, op.Down)
		case cl.Anchor == ir.AnchorWeights && !cl.Lookup && !op.Output:
			ws = append(ws, op.W)
		}
	}
	return w.Repack(w.Choose(ws, -1), nil, 0)
}

// RepackHybrid repacks the matrices of a hybrid placement's host units, in
// the order the host profits most (dense products, which decode reads
// whole, before expert stacks, of which a token reads top-k), as far as
// host memory allows. On a host short of memory the process should stay
// near the size of the weights, so the copies may take what the
// device-resident weights give back (their mapped pages are released once
// uploaded) plus a thirty-second of the weights (the process's own heap
// and the driver's take about as much again). On a host with memory to
// spare (cpu.Weights.AvailableMemory) they may take half of what it would
// have free with the weights in: repacked experts decode faster (the
// 30B-A3B's 8 chosen experts in 0.18-0.23 ms against 0.28-0.29 from the
// file's blocks at 16 threads on the GPU machine, BenchmarkMoEDecode).
// There the hybrid 30B-A3B at depth 16384, its CPU computing all of a
// token's experts (ATS_MOE_ROUTED=0), decoded at 76.2 t/s twice with all
// of them repacked against 60.7 and 71.5 with 60 of 128; routed, as it
// runs by default, the CPU computes 5 of 8 and the two were within the
// machine's noise. The host units' own pages stay, pinned for the copies
// that promote or stream them.
func RepackHybrid(w *cpu.Weights, m *model.Model, pl *Placement) int64 {
	ch := hybridChoice(w, m, pl.units, pl.resident)
	return w.Repack(ch.whole, ch.stacks, ch.experts)
}

// hybridRepack is what RepackHybrid repacks: whole matrices, and the first
// experts of expert stacks.
type hybridRepack struct {
	whole   []*ir.Weight
	stacks  []*ir.Weight
	experts int // of each of stacks, the first experts repacked
}

// hybridChoice is what RepackHybrid would repack now for a placement of
// units where resident(i) says whether unit i lives on the device: the
// dense products first, then the expert layers' stacks, the same first
// experts of every stack. A token's experts are any of a layer's, so for
// decode it does not matter which are repacked; a prompt batch split
// between the host and the device gives the host the first experts of
// each layer (the device's moeSplit), and those are the repacked ones: on
// the GPU machine the CPU took a 512-token batch's MoE layer in 13.7 ms
// repacked and 27.9 ms from the file's blocks (BenchmarkMoEPrefill).
func hybridChoice(w *cpu.Weights, m *model.Model, units []model.Unit, resident func(i int) bool) hybridRepack {
	var released, total int64
	var dense, stacks []*ir.Weight
	for i, u := range units {
		for _, mw := range u.Mats {
			total += mw.Bytes()
			switch {
			case resident(i):
				released += mw.Bytes()
			case u.Lookup:
				// Looked up a row at a time from its own blocks: a copy
				// would never be read.
			case u.Experts > 0 && mw.Experts() > 0:
				stacks = append(stacks, mw)
			default:
				dense = append(dense, mw)
			}
		}
	}
	if !m.File.Mapped {
		released = 0 // heap copies are not given back
	}
	limit := released + total/32
	if w.AvailableMemory > 0 {
		// On a host with memory to spare the copies may take half of what
		// would be left free once the host units' pages are in (every
		// weight's, where they are not mapped).
		limit = max(limit, (w.AvailableMemory-(total-released))/2)
	}
	limit -= w.RepackedBytes()
	if w.RepackAll {
		limit = total
	}
	if limit <= 0 {
		return hybridRepack{}
	}
	var ch hybridRepack
	ch.whole = w.Choose(dense, limit)
	for _, mw := range ch.whole {
		limit -= w.RepackSize(mw)
	}
	if w.NoRepack {
		return ch
	}
	// The most experts p of every stack whose copies, beyond those made
	// already, fit what is left.
	cost := func(p int) int64 {
		var c int64
		for _, mw := range stacks {
			if w.Repacked(mw) {
				continue // repacked whole (a host-only context)
			}
			ne := mw.Experts()
			if have := w.PackedExperts(mw); p > have {
				c += w.RepackSize(mw) / int64(ne) * int64(p-have)
			}
		}
		return c
	}
	ne := 0
	for _, mw := range stacks {
		ne = max(ne, mw.Experts())
	}
	p := 0
	for p < ne && cost(p+1) <= limit {
		p++
	}
	for _, mw := range stacks {
		if !w.Repacked(mw) && w.PackedExperts(mw) < min(p, mw.Experts()) && w.RepackSize(mw) > 0 {
			ch.stacks = append(ch.stacks, mw)
		}
	}
	if len(ch.stacks) > 0 {
		ch.experts = p
	}
	return ch
}

// packedFractions is, for each unit, the fraction (by bytes) of its
// repackable matrices (repackable) that the host would read from repacked
// copies in a hybrid context where resident(i) says whether unit i lives
// on the device: those RepackHybrid would repack now and those already
// repacked. A resident unit counts as repacked when repacking is on (its
// host times only describe it). bytes is what the host units read from
// copies.
func packedFractions(w *cpu.Weights, m *model.Model, units []model.Unit, resident func(i int) bool) (frac []float64, bytes int64) {
	ch := hybridChoice(w, m, units, resident)
	share := map[*ir.Weight]float64{} // what the choice would make of mw
	for _, mw := range ch.whole {
		share[mw] = 1
	}
	for _, mw := range ch.stacks {
		share[mw] = float64(min(ch.experts, mw.Experts())) / float64(mw.Experts())
	}
	on := !w.NoRepack
	frac = make([]float64, len(units))
	for i, u := range units {
		if !repackable(w, u) {
			continue
		}
		var all, got int64
		for _, mw := range u.Mats {
			if !w.Repackable(mw) {
				continue
			}
			all += mw.Bytes()
			f := max(share[mw], w.PackedShare(mw))
			if on && resident(i) {
				f = 1
			}
			got += int64(f * float64(mw.Bytes()))
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

// repackable says whether a hybrid context may give unit u's matrices
// repacked copies (RepackHybrid: every host unit's but the embedding's,
// as memory allows): whether the host's kernel level has a repacked layout
// for any of them.
func repackable(w *cpu.Weights, u model.Unit) bool {
	if u.Lookup {
		return false
	}
	for _, mw := range u.Mats {
		if w.Repackable(mw) {
			return true
		}
	}
	return false
}
