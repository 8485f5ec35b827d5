package ir

import "fmt"

// OpKind is what an op computes. Each kind has a file of its own
// (op_<kind>.go) with its builder method and its class: what it reads and
// writes, and what the planner needs to know of it. A backend implements
// each kind in its own op_<kind>.go.
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
	numOpKinds
)

// Anchor says what makes an op the anchor of a unit, the thing the planner
// places: the weights it consumes, or the KV cache it keeps.
type Anchor uint8

const (
	AnchorNone    Anchor = iota // elementwise: joins the next unit
	AnchorWeights               // consumes weight tensors (the unit's bytes are theirs)
	AnchorCache                 // keeps a KV cache (the unit's bytes are the cache's)
)

// Class is what every op of a kind has in common.
type Class struct {
	Name   string
	Anchor Anchor
	// Streams: a weight op whose matrices may stream to the GPU for a
	// batch instead of living there (not the embedding, looked up a row
	// at a time, nor the output head).
	Streams bool
	// Experts: the weights are stacks of experts, of which a token reads
	// only the top-k (the planner counts a decode step's bytes so).
	Experts bool
	// Lookup: the op reads rows of its weight by token id (an embedding)
	// rather than multiplying by it: a step reads a few rows of it.
	Lookup bool
	// Reads and Writes list the buffers an op reads and writes: the
	// executor tracks through them which backend holds a buffer's rows.
	Reads, Writes func(op *Op) []BufID
}

var classes [numOpKinds]Class

// register sets the class of a kind (op_<kind>.go's init).
func register(k OpKind, c Class) {
	if c.Reads == nil {
		c.Reads = readsIn
	}
	if c.Writes == nil {
		c.Writes = writesOut
	}
	classes[k] = c
}

func readsIn(op *Op) []BufID   { return []BufID{op.In} }
func writesOut(op *Op) []BufID { return []BufID{op.Out} }
func writesIn(op *Op) []BufID  { return []BufID{op.In} }

// Class is the kind's class.
func (k OpKind) Class() *Class {
	if k >= numOpKinds {
		panic(fmt.Sprintf("ir: op kind %d has no class", k))
	}
	return &classes[k]
}

func (k OpKind) String() string {
	if k >= numOpKinds {
		return fmt.Sprintf("op(%d)", k)
	}
	return classes[k].Name
}

// Op is one step of a program. Which fields an op uses depends on its kind
// (op_<kind>.go says).
type Op struct {
	Kind              OpKind
	Layer             int // -1 outside the blocks
	In, In2, In3, Out BufID
	W, Bias           *Weight    // the op's weight tensor (and bias)
	Gate, Up, Down    *Weight    // MoE expert stacks
	Eps               float32    // norms
	Heads, HeadSize   int        // HeadNorm and RoPE
	Rope              *Rope      // RoPE
	Attn              *Attention // Attention
	TopK              int        // MoE experts per token
	NormTopK          bool       // MoE: renormalise the chosen experts' weights to sum to 1
	// Output marks the final ops (norm and logits) that only run on the
	// tokens whose logits are wanted.
	Output bool
}

// Class is the op's kind's class.
func (op *Op) Class() *Class { return op.Kind.Class() }

// Reads lists the buffers op reads; Writes those it writes.
func (op *Op) Reads() []BufID { return op.Class().Reads(op) }

// Writes lists the buffers op writes (see Reads).
func (op *Op) Writes() []BufID { return op.Class().Writes(op) }

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

// Experts is the number of experts of an expert op's stacks (0 for other
// ops).
func (op *Op) Experts() int {
	if !op.Class().Experts || op.Gate == nil {
		return 0
	}
	return op.Gate.Experts()
}
