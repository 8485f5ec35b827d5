package ir

import (
	"fmt"
	"math"
)

func init() {
	register(OpAttention, Class{Name: "attention", Anchor: AnchorCache,
		Reads: func(op *Op) []BufID { return []BufID{op.In, op.In2, op.In3} }})
}

// Attention is causal grouped-query attention over a layer's KV cache:
// each token attends to the positions of its own sequence up to its own.
type Attention struct {
	NHeads, NKVHeads, HeadSize int
	Scale                      float32 // usually 1/sqrt(HeadSize)
}

// Check validates the head layout.
func (a *Attention) Check() error {
	if a.NHeads <= 0 || a.NKVHeads <= 0 || a.HeadSize <= 0 || a.NHeads%a.NKVHeads != 0 {
		return fmt.Errorf("attention: %d heads over %d KV heads of %d: heads must be a positive multiple of KV heads", a.NHeads, a.NKVHeads, a.HeadSize)
	}
	return nil
}

// KVWidth is the values of a key (or value) row: KV heads times head size.
func (a *Attention) KVWidth() int { return a.NKVHeads * a.HeadSize }

// DefaultScale is 1/sqrt(headSize).
func DefaultScale(headSize int) float32 { return float32(1 / math.Sqrt(float64(headSize))) }

// Attention stores k and v in the layer's cache and attends with q.
func (b *Builder) Attention(q, k, v BufID, a *Attention, out BufID) {
	if err := a.Check(); err != nil {
		b.fail("%w", err)
	}
	if b.width(q) != a.NHeads*a.HeadSize || b.width(k) != a.KVWidth() || b.width(v) != b.width(k) || b.width(out) != b.width(q) {
		b.fail("attention buffer widths q %d k %d v %d out %d for %d/%d heads of %d", b.width(q), b.width(k), b.width(v), b.width(out), a.NHeads, a.NKVHeads, a.HeadSize)
	}
	b.add(Op{Kind: OpAttention, In: q, In2: k, In3: v, Attn: a, Out: out})
}
