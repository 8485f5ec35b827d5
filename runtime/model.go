package runtime

import (
	"fmt"
	"os"
	"sync"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/runtime/ir"
)

// Model is an opened GGUF model and its program.
type Model struct {
	File *gguf.File
	Prog *ir.Program

	repackMu sync.Mutex
	repacked int64 // heap bytes of the repacked copies (repackForCPU, repackHybrid)
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
	if os.Getenv(EnvRepack) == "0" {
		return m.repacked
	}
	for _, w := range ws {
		if w == nil || w.Mat.RepackedBytes() > 0 || (limit >= 0 && w.Bytes() > limit) {
			continue
		}
		r, ok := w.Mat.Repack()
		if !ok {
			continue
		}
		w.Mat = r
		b := int64(r.RepackedBytes())
		m.repacked += b
		limit -= b
		if n := len(w.Stack); n > 0 {
			per := r.Rows / n
			for e := range w.Stack {
				w.Stack[e] = r.Slice(e*per, (e+1)*per)
			}
		}
	}
	return m.repacked
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
	var released, total int64
	var dense, moe []*ir.Weight
	for i, u := range pl.units {
		for _, w := range u.Mats {
			total += w.Bytes()
			switch {
			case pl.resident(i):
				released += w.Bytes()
			case u.Op == ir.OpEmbed:
				// Looked up a row at a time from its own blocks: a copy
				// would never be read.
			case u.Op == ir.OpMoE:
				moe = append(moe, w)
			default:
				dense = append(dense, w)
			}
		}
	}
	if !m.File.Mapped {
		released = 0 // heap copies are not given back
	}
	m.repackMu.Lock()
	limit := released + total/32 - m.repacked
	m.repackMu.Unlock()
	if limit <= 0 {
		return m.RepackedBytes()
	}
	return m.repackWeights(append(dense, moe...), limit)
}

// RepackedBytes is the heap the model's repacked CPU copies take (0 when
// no context asked for them).
func (m *Model) RepackedBytes() int64 {
	m.repackMu.Lock()
	defer m.repackMu.Unlock()
	return m.repacked
}
