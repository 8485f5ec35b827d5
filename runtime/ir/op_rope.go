package ir

import "fmt"

func init() { register(OpRoPE, Class{Name: "rope", Writes: writesIn}) }

// Rope is the rotary position embedding of a model: the backends turn it
// into their tables and kernels.
type Rope struct {
	Dims      int       // rotated dimensions of each head (n_rot), even, <= head size
	Base      float32   // freq_base
	FreqScale float32   // 1/linear scaling factor (1 when unscaled)
	Factors   []float32 // optional per-pair divisors of theta (Llama 3 rope_freqs), len Dims/2
	NeoX      bool      // pairs (i, i+Dims/2) instead of (2i, 2i+1)
}

// RoPE rotates each head of in, in place.
func (b *Builder) RoPE(in BufID, r *Rope, heads, headSize int) {
	if heads*headSize != b.width(in) || r.Dims > headSize {
		b.fail("rope of %d dims on %d heads of %d (width %d)", r.Dims, heads, headSize, b.width(in))
	}
	if r.Factors != nil && len(r.Factors) != r.Dims/2 {
		b.fail("rope: %d frequency factors for %d dims", len(r.Factors), r.Dims)
	}
	b.add(Op{Kind: OpRoPE, In: in, Rope: r, Heads: heads, HeadSize: headSize})
}

func (r *Rope) String() string {
	return fmt.Sprintf("rope(%d dims, base %g, neox %v)", r.Dims, r.Base, r.NeoX)
}
