// Package ir is the program a model runs: named activation buffers and an
// ordered list of ops, each naming the weight tensors it consumes.
// Architecture files (runtime/arch_*.go) build programs with a Builder; the
// executor and its two backends run them without knowing the architecture.
package ir

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/atsinfer/ats/gguf"
)

// BufID names an activation buffer: one row of Width floats per token.
type BufID int

// Buf is an activation buffer of the program.
type Buf struct {
	Name  string
	Width int
}

// Weight is a tensor of the model file used by an op: a view of the
// mapped file, never a copy (small F32 vectors are decoded once). How a
// backend computes with it (kernels, repacked copies, device memory) is
// the backend's business.
type Weight struct {
	ID     int // its index in Program.Weights
	Name   string
	Type   gguf.Type
	Dims   []int     // ggml order: Dims[0] is the row length
	Data   []byte    // the tensor's bytes in the file
	Vector []float32 // 1-D F32 weights (norms, biases, rope factors)
}

// Bytes is the size of the tensor in the file.
func (w *Weight) Bytes() int64 { return int64(len(w.Data)) }

// Cols is the length of a row.
func (w *Weight) Cols() int { return w.Dims[0] }

// Rows is the number of rows of a matrix (all experts' rows of a stack).
func (w *Weight) Rows() int {
	rows := 1
	for _, d := range w.Dims[1:] {
		rows *= d
	}
	return rows
}

// Experts is the number of experts of a 3-D expert stack (0 otherwise).
func (w *Weight) Experts() int {
	if len(w.Dims) != 3 {
		return 0
	}
	return w.Dims[2]
}

// IsVector says whether w is a 1-D weight (a norm, a bias).
func (w *Weight) IsVector() bool { return len(w.Dims) == 1 }

// Program is a model ready to run.
type Program struct {
	Hyper   Hyper
	Bufs    []Buf
	Ops     []Op
	Weights []*Weight // every weight the builder made (Weight.ID)
	Logits  BufID     // output buffer with NVocab columns
	Tokens  BufID     // unused by ops; reserved
}

// Builder assembles a Program; architecture files call its methods in
// execution order. The first error sticks and is returned by Build.
type Builder struct {
	File *gguf.File
	H    Hyper
	prog Program
	bufs map[string]BufID
	used map[string]bool
	// weights are the weights made so far by name: a tensor asked for
	// twice is one Weight.
	weights map[string]*Weight
	err     error
	layer   int
	out     bool
}

func (b *Builder) fail(format string, args ...any) {
	if b.err == nil {
		b.err = fmt.Errorf(format, args...)
	}
}

// Layer sets the block index that following ops belong to (-1 for none).
func (b *Builder) Layer(l int) { b.layer = l }

// Output marks the following ops as the output head (see Op.Output).
func (b *Builder) Output() { b.out = true }

// Buf returns the buffer called name, creating it with width on first use.
// Reusing names across layers keeps memory to one set of buffers.
func (b *Builder) Buf(name string, width int) BufID {
	if id, ok := b.bufs[name]; ok {
		if b.prog.Bufs[id].Width != width {
			b.fail("buffer %q used with widths %d and %d", name, b.prog.Bufs[id].Width, width)
		}
		return id
	}
	id := BufID(len(b.prog.Bufs))
	b.prog.Bufs = append(b.prog.Bufs, Buf{Name: name, Width: width})
	b.bufs[name] = id
	return id
}

func (b *Builder) width(id BufID) int { return b.prog.Bufs[id].Width }

func (b *Builder) add(op Op) {
	op.Layer = b.layer
	op.Output = b.out
	b.prog.Ops = append(b.prog.Ops, op)
}

// Has reports whether the file has a tensor.
func (b *Builder) Has(name string) bool { _, ok := b.File.Tensor(name); return ok }

// Weight finds a tensor and checks its shape (ggml order). A missing or
// misshapen tensor is an error naming it.
func (b *Builder) Weight(name string, dims ...int) *Weight {
	if b.err != nil {
		return nil
	}
	t, ok := b.File.Tensor(name)
	if !ok {
		b.fail("%s: missing tensor %q", b.File.Path, name)
		return nil
	}
	return b.weight(t, dims)
}

// OptWeight is Weight for a tensor that may be absent (nil then).
func (b *Builder) OptWeight(name string, dims ...int) *Weight {
	if b.err != nil {
		return nil
	}
	t, ok := b.File.Tensor(name)
	if !ok {
		return nil
	}
	return b.weight(t, dims)
}

func (b *Builder) weight(t *gguf.Tensor, dims []int) *Weight {
	got := make([]int, len(t.Dims))
	for i, d := range t.Dims {
		got[i] = int(d)
	}
	// ggml drops trailing dimensions of 1.
	for len(got) > len(dims) && got[len(got)-1] == 1 {
		got = got[:len(got)-1]
	}
	if !slices.Equal(got, dims) {
		b.fail("%s: tensor %q has shape %v, want %v", b.File.Path, t.Name, got, dims)
		return nil
	}
	b.used[t.Name] = true
	w := &Weight{ID: len(b.prog.Weights), Name: t.Name, Type: t.Type, Dims: dims, Data: t.Data}
	b.prog.Weights = append(b.prog.Weights, w)
	if len(dims) == 1 {
		if t.Type != gguf.TypeF32 {
			b.fail("%s: tensor %q is %s, want F32", b.File.Path, t.Name, t.Type)
			return nil
		}
		w.Vector = make([]float32, dims[0])
		for i := range w.Vector {
			w.Vector[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
		return w
	}
	return w
}

// Hidden is the buffer the output matrix reads: the final hidden state,
// after the output norm (Batch.Hidden).
func (p *Program) Hidden() BufID {
	if i := p.LogitsOp(); i >= 0 {
		return p.Ops[i].In
	}
	return p.Logits
}

// LogitsOp is the op that writes the logits (-1: none).
func (p *Program) LogitsOp() int {
	for i := len(p.Ops) - 1; i >= 0; i-- {
		if p.Ops[i].Out == p.Logits {
			return i
		}
	}
	return -1
}

// OpIndex is op's index in p.Ops (-1: op is not one of p's ops).
func (p *Program) OpIndex(op *Op) int {
	for i := range p.Ops {
		if &p.Ops[i] == op {
			return i
		}
	}
	return -1
}

// Blk is the name of a block tensor: Blk(3, "attn_q.weight") = "blk.3.attn_q.weight".
func Blk(layer int, name string) string { return fmt.Sprintf("blk.%d.%s", layer, name) }

// NewBuilder starts the program of file f with hyperparameters h.
func NewBuilder(f *gguf.File, h Hyper) *Builder {
	return &Builder{File: f, H: h, bufs: map[string]BufID{}, used: map[string]bool{}, layer: -1}
}

// Err is the first error of the build so far. Architecture files check it
// in their layer loops, so a file that claims millions of layers stops at
// the first missing tensor instead of listing ops for all of them.
func (b *Builder) Err() error { return b.err }

// Fail records an error (the first one sticks).
func (b *Builder) Fail(format string, args ...any) { b.fail(format, args...) }

// Finish returns the program with logits as its output buffer, or the
// first error of the build.
func (b *Builder) Finish(logits BufID) (*Program, error) {
	if b.err != nil {
		return nil, fmt.Errorf("%s model: %w", b.H.Arch, b.err)
	}
	b.prog.Hyper = b.H
	b.prog.Logits = logits
	return &b.prog, nil
}
