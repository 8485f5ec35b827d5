// Package model is a GGUF file opened as a program: the architecture
// files (arch_*.go) list each model's ops in order through ir.Builder, and
// units.go cuts the program into the units the planner places. Nothing
// here knows how or where the ops run.
package model

import (
	"fmt"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/runtime/ir"
)

// Model is an opened GGUF model and its program. Weights stay in the
// file's mapping.
type Model struct {
	File *gguf.File
	Prog *ir.Program
}

// Open maps a GGUF file and builds its program.
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

// Close unmaps the file; nothing that reads the model may run afterwards.
func (m *Model) Close() error { return m.File.Close() }

// Weights lists every weight the program uses, once each, in the order
// the ops first use them.
func (m *Model) Weights() []*ir.Weight {
	seen := map[*ir.Weight]bool{}
	var out []*ir.Weight
	for i := range m.Prog.Ops {
		for _, w := range m.Prog.Ops[i].Weights() {
			if !seen[w] {
				seen[w] = true
				out = append(out, w)
			}
		}
	}
	return out
}

// WeightBytes is the size of every weight the program uses.
func (m *Model) WeightBytes() int64 {
	var n int64
	for _, w := range m.Weights() {
		n += w.Bytes()
	}
	return n
}

// FileParts are the model file's mapped parts (one per file of a split
// model).
func (m *Model) FileParts() [][]byte {
	var out [][]byte
	for _, part := range m.File.Parts {
		out = append(out, part.Data)
	}
	return out
}

func (m *Model) String() string {
	h := m.Prog.Hyper
	return fmt.Sprintf("%s: %d layers, %d wide, %d/%d heads of %d, vocab %d", h.Arch, h.NLayer, h.NEmbd, h.NHead, h.NKVHead, h.HeadK, h.NVocab)
}
