package model

import "github.com/atsinfer/ats/runtime/ir"

// llama: Llama 2 and 3 (and 3.1's rope scaling through rope_freqs.weight).
// qwen2 and qwen3 are this block with other attention options.
//
//	x = embed(tokens)
//	per block: x += wo·attn(rope(wq·norm(x)), rope(wk·norm(x)), wv·norm(x))
//	           x += down(silu(gate·norm(x)) * up·norm(x))
//	logits = output·norm(x)
func init() {
	registerArch(Arch{Name: "llama", Build: func(b *ir.Builder) ir.BufID {
		// Some Llama-architecture files (e.g. converted Qwen1.5) carry biases.
		return llamaFamily(b, attnOpts{biases: b.Has(ir.Blk(0, "attn_q.bias"))})
	}})
}

// llamaFamily lists the ops of a pre-norm decoder with a SwiGLU FFN.
func llamaFamily(b *ir.Builder, o attnOpts) ir.BufID {
	h := &b.H
	emb, x := embeddings(b)
	r := rope(b, o.neox)
	xn, y := b.Buf("xn", h.NEmbd), b.Buf("y", h.NEmbd)
	for l := 0; l < h.NLayer && b.Err() == nil; l++ {
		b.Layer(l)
		b.Norm(x, b.Weight(ir.Blk(l, "attn_norm.weight"), h.NEmbd), xn)
		selfAttention(b, l, xn, r, o, y)
		b.Add(x, y, x)
		b.Norm(x, b.Weight(ir.Blk(l, "ffn_norm.weight"), h.NEmbd), xn)
		swigluFFN(b, l, xn, y)
		b.Add(x, y, x)
	}
	return outputHead(b, x, emb)
}
