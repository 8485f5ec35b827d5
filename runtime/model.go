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

	repack   sync.Once
	repacked int64 // heap bytes of the repacked copies (repackForCPU)
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
// as fast, at the cost of that copy on the heap (88% of a Q4_K_M file's
// weights; the mapped pages the CPU no longer reads may then be dropped by
// the OS). Only CPU-only contexts ask for it: a hybrid context streams its
// CPU units to the GPU for prefill, and keeps the file pinned for that, so
// a copy would only double its memory. The output head is left as it is:
// prefill computes it for one token. It runs once per model, before any
// context computes, and returns the bytes the copies take.
func (m *Model) repackForCPU() int64 {
	m.repack.Do(func() {
		if os.Getenv(EnvRepack) == "0" {
			return
		}
		repack := func(w *ir.Weight) {
			if w == nil || w.Mat.RepackedBytes() > 0 {
				return
			}
			r, ok := w.Mat.Repack()
			if !ok {
				return
			}
			w.Mat = r
			m.repacked += int64(r.RepackedBytes())
			if n := len(w.Stack); n > 0 {
				per := r.Rows / n
				for e := range w.Stack {
					w.Stack[e] = r.Slice(e*per, (e+1)*per)
				}
			}
		}
		for i := range m.Prog.Ops {
			op := &m.Prog.Ops[i]
			switch {
			case op.Kind == ir.OpMatMul && !op.Output:
				repack(op.W)
			case op.Kind == ir.OpMoE:
				repack(op.Gate)
				repack(op.Up)
				repack(op.Down)
			}
		}
	})
	return m.repacked
}

// RepackedBytes is the heap the model's repacked CPU copies take (0 when
// no CPU-only context asked for them).
func (m *Model) RepackedBytes() int64 { return m.repacked }
