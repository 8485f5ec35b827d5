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
	"github.com/atsinfer/ats/ops"
)

// BufID names an activation buffer: one row of Width floats per token.
type BufID int

// Buf is an activation buffer of the program.
type Buf struct {
	Name  string
	Width int
}

// OpKind is what an op computes.
type OpKind uint8

const (
	OpEmbed     OpKind = iota // Out[t] = row tokens[t] of W
	OpNorm                    // Out = rmsnorm(In) * W, per row
	OpHeadNorm                // In = rmsnorm(each head of In) * W, in place (Qwen3 Q/K norms)
	OpMatMul                  // Out = W·In (+ Bias)
	OpRoPE                    // In = rope(In) for each head, in place
	OpAttention               // store K=In2, V=In3 in the cache of Layer; Out = attention(Q=In)
	OpSwiGLU                  // Out = silu(In) * In2, or silu(first half of In) * second half when In2 < 0
	OpAdd                     // Out = In + In2
	OpMoE                     // Out = Σ_k p_k · Down_e(silu(Gate_e·In) * Up_e·In) over the top experts of router W
)

var opNames = [...]string{"embed", "norm", "head_norm", "matmul", "rope", "attention", "swiglu", "add", "moe"}

func (k OpKind) String() string { return opNames[k] }

// Op is one step of a program.
type Op struct {
	Kind              OpKind
	Layer             int // -1 outside the blocks
	In, In2, In3, Out BufID
	W, Bias           *Weight // the op's weight tensor (and bias)
	Gate, Up, Down    *Weight // MoE expert stacks
	Eps               float32 // norms
	Heads, HeadSize   int     // HeadNorm and RoPE
	Rope              *ops.Rope
	Attn              *ops.Attention
	TopK              int  // MoE experts per token
	NormTopK          bool // MoE: renormalise the chosen experts' weights to sum to 1
	// Output marks the final ops (norm and logits) that only run on the
	// tokens whose logits are wanted.
	Output bool
}

// Weight is a tensor of the model file used by an op: a view of the
// mapped file, never a copy (small F32 vectors are decoded once).
type Weight struct {
	Name   string
	Type   gguf.Type
	Dims   []int        // ggml order: Dims[0] is the row length
	Data   []byte       // the tensor's bytes in the file
	Mat    ops.Matrix   // 2-D weights: Dims[1] rows of Dims[0]
	Stack  []ops.Matrix // 3-D expert stacks: one matrix per expert
	Vector []float32    // 1-D F32 weights (norms, biases, rope factors)
}

// Bytes is the size of the tensor in the file.
func (w *Weight) Bytes() int64 { return int64(len(w.Data)) }

// Program is a model ready to run.
type Program struct {
	Hyper  Hyper
	Bufs   []Buf
	Ops    []Op
	Logits BufID // output buffer with NVocab columns
	Tokens BufID // unused by ops; reserved
}

// Builder assembles a Program; architecture files call its methods in
// execution order. The first error sticks and is returned by Build.
type Builder struct {
	File  *gguf.File
	H     Hyper
	prog  Program
	bufs  map[string]BufID
	used  map[string]bool
	err   error
	layer int
	out   bool
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
	w := &Weight{Name: t.Name, Type: t.Type, Dims: dims, Data: t.Data}
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
	k, err := ops.KernelFor(t.Type)
	if err != nil {
		b.fail("%s: tensor %q: %w", b.File.Path, t.Name, err)
		return nil
	}
	rows := 1
	for _, d := range dims[1:] {
		rows *= d
	}
	m, err := ops.NewMatrix(k, rows, dims[0], t.Data)
	if err != nil {
		b.fail("%s: tensor %q: %w", b.File.Path, t.Name, err)
		return nil
	}
	w.Mat = m
	if len(dims) == 3 {
		for e := 0; e < dims[2]; e++ {
			w.Stack = append(w.Stack, m.Slice(e*dims[1], (e+1)*dims[1]))
		}
	}
	return w
}

// Blk is the name of a block tensor: Blk(3, "attn_q.weight") = "blk.3.attn_q.weight".
func Blk(layer int, name string) string { return fmt.Sprintf("blk.%d.%s", layer, name) }

// Embed looks up token rows of the embedding table into out.
func (b *Builder) Embed(w *Weight, out BufID) {
	if w != nil && w.Dims[0] != b.width(out) {
		b.fail("embedding %q has %d columns, buffer %q %d", w.Name, w.Dims[0], b.prog.Bufs[out].Name, b.width(out))
	}
	b.add(Op{Kind: OpEmbed, W: w, Out: out})
}

// Norm is RMSNorm of in, times w, into out.
func (b *Builder) Norm(in BufID, w *Weight, out BufID) {
	if w != nil && (w.Dims[0] != b.width(in) || b.width(in) != b.width(out)) {
		b.fail("norm %q of width %d on buffer of width %d", w.Name, w.Dims[0], b.width(in))
	}
	b.add(Op{Kind: OpNorm, In: in, W: w, Out: out, Eps: b.H.RMSEps})
}

// HeadNorm is RMSNorm of each head of in, times w, in place.
func (b *Builder) HeadNorm(in BufID, w *Weight, heads, headSize int) {
	if w != nil && (w.Dims[0] != headSize || heads*headSize != b.width(in)) {
		b.fail("head norm %q of %d on %d heads of %d (width %d)", w.Name, w.Dims[0], heads, headSize, b.width(in))
	}
	b.add(Op{Kind: OpHeadNorm, In: in, W: w, Heads: heads, HeadSize: headSize, Eps: b.H.RMSEps})
}

// MatMul is out = w·in (+ bias).
func (b *Builder) MatMul(in BufID, w, bias *Weight, out BufID) {
	if w != nil {
		if w.Dims[0] != b.width(in) || w.Mat.Rows != b.width(out) {
			b.fail("matmul %q (%v) from width %d to %d", w.Name, w.Dims, b.width(in), b.width(out))
		}
		if bias != nil && bias.Dims[0] != w.Mat.Rows {
			b.fail("bias %q has %d values for %d rows", bias.Name, bias.Dims[0], w.Mat.Rows)
		}
	}
	b.add(Op{Kind: OpMatMul, In: in, W: w, Bias: bias, Out: out})
}

// RoPE rotates each head of in, in place.
func (b *Builder) RoPE(in BufID, r *ops.Rope, heads, headSize int) {
	if heads*headSize != b.width(in) || r.Dims > headSize {
		b.fail("rope of %d dims on %d heads of %d (width %d)", r.Dims, heads, headSize, b.width(in))
	}
	b.add(Op{Kind: OpRoPE, In: in, Rope: r, Heads: heads, HeadSize: headSize})
}

// Attention stores k and v in the layer's cache and attends with q.
func (b *Builder) Attention(q, k, v BufID, a *ops.Attention, out BufID) {
	if err := a.Check(); err != nil {
		b.fail("%w", err)
	}
	if b.width(q) != a.NHeads*a.HeadSize || b.width(k) != a.NKVHeads*a.HeadSize || b.width(v) != b.width(k) || b.width(out) != b.width(q) {
		b.fail("attention buffer widths q %d k %d v %d out %d for %d/%d heads of %d", b.width(q), b.width(k), b.width(v), b.width(out), a.NHeads, a.NKVHeads, a.HeadSize)
	}
	b.add(Op{Kind: OpAttention, In: q, In2: k, In3: v, Attn: a, Out: out})
}

// SwiGLU is out = silu(gate) * up.
func (b *Builder) SwiGLU(gate, up, out BufID) {
	if b.width(gate) != b.width(up) || b.width(out) != b.width(gate) {
		b.fail("swiglu widths %d, %d -> %d", b.width(gate), b.width(up), b.width(out))
	}
	b.add(Op{Kind: OpSwiGLU, In: gate, In2: up, Out: out})
}

// SwiGLUFused is out = silu(first half of in) * second half of in.
func (b *Builder) SwiGLUFused(in, out BufID) {
	if b.width(in) != 2*b.width(out) {
		b.fail("fused swiglu from width %d to %d", b.width(in), b.width(out))
	}
	b.add(Op{Kind: OpSwiGLU, In: in, In2: -1, Out: out})
}

// Add is out = x + y.
func (b *Builder) Add(x, y, out BufID) {
	if b.width(x) != b.width(y) || b.width(x) != b.width(out) {
		b.fail("add widths %d + %d -> %d", b.width(x), b.width(y), b.width(out))
	}
	b.add(Op{Kind: OpAdd, In: x, In2: y, Out: out})
}

// MoE is the mixture-of-experts FFN: router w (F32 or any type) picks topK
// of the experts in the gate/up/down stacks for each token.
func (b *Builder) MoE(in BufID, router, gate, up, down *Weight, topK int, normTopK bool, out BufID) {
	if router != nil && gate != nil && up != nil && down != nil {
		ne := router.Mat.Rows
		if len(gate.Stack) != ne || len(up.Stack) != ne || len(down.Stack) != ne || topK < 1 || topK > ne {
			b.fail("moe: router has %d experts, stacks %d/%d/%d, top-k %d", ne, len(gate.Stack), len(up.Stack), len(down.Stack), topK)
		}
	}
	b.add(Op{Kind: OpMoE, In: in, W: router, Gate: gate, Up: up, Down: down, TopK: topK, NormTopK: normTopK, Out: out})
}

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

// Reads lists the buffers op reads; Writes those it writes. The executor
// tracks through them which backend holds the current rows of a buffer.
func (op *Op) Reads() []BufID {
	switch op.Kind {
	case OpEmbed:
		return nil
	case OpAttention:
		return []BufID{op.In, op.In2, op.In3}
	case OpAdd:
		return []BufID{op.In, op.In2}
	case OpSwiGLU:
		if op.In2 >= 0 {
			return []BufID{op.In, op.In2}
		}
	}
	return []BufID{op.In}
}

// Writes lists the buffers op writes (see Reads).
func (op *Op) Writes() []BufID {
	switch op.Kind {
	case OpHeadNorm, OpRoPE:
		return []BufID{op.In}
	}
	return []BufID{op.Out}
}

// Buffers lists every buffer op touches.
func (op *Op) Buffers() []BufID { return append(op.Reads(), op.Writes()...) }

// Weights lists the tensors op consumes (matrices, stacks and vectors).
func (op *Op) Weights() []*Weight {
	var ws []*Weight
	for _, w := range []*Weight{op.W, op.Bias, op.Gate, op.Up, op.Down} {
		if w != nil {
			ws = append(ws, w)
		}
	}
	return ws
}

// OutputMode says which rows of logits a batch computes: the output head
// (the ops marked Output, the program's tail) runs on every row, on the
// last row only (its input's last row moved to row 0 first), or not at
// all for a prompt chunk whose logits nobody reads.
type OutputMode uint8

const (
	OutputNone   OutputMode = iota // none: a prompt chunk before the last
	OutputLast                     // the last token's
	OutputAll                      // every token's
	OutputHidden                   // every token's final hidden state (Program.Hidden), not the logits: embeddings
)

// Hidden is the buffer the output matrix reads: the final hidden state,
// after the output norm. An OutputHidden batch stops before that product.
func (p *Program) Hidden() BufID {
	for i := len(p.Ops) - 1; i >= 0; i-- {
		if p.Ops[i].Out == p.Logits {
			return p.Ops[i].In
		}
	}
	return p.Logits
}
