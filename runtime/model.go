package runtime

import (
	"fmt"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/runtime/ir"
)

// Model is an opened GGUF model and its program.
type Model struct {
	File *gguf.File
	Prog *ir.Program
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
