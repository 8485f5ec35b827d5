package model

import "github.com/atsinfer/ats/runtime/ir"

// glm4: GLM-4-0414 and GLM-Z1. Q/K/V biases, rotary (pairs of adjacent
// values) on the first rope.dimension_count values of each head, norms after
// attention and after the FFN, and a fused gate+up projection.
//
//	per block: a = wo·attn(...norm(x)...);  x += post_attn_norm(a)
//	           f = down(swiglu(up_gate·norm(x)));  x += post_ffw_norm(f)
func init() {
	registerArch(Arch{Name: "glm4", Build: func(b *ir.Builder) ir.BufID {
		h := &b.H
		emb, x := embeddings(b)
		r := rope(b, false)
		xn, y := b.Buf("xn", h.NEmbd), b.Buf("y", h.NEmbd)
		upGate, act := b.Buf("up_gate", 2*h.NFF), b.Buf("gate", h.NFF)
		for l := 0; l < h.NLayer && b.Err() == nil; l++ {
			b.Layer(l)
			b.Norm(x, b.Weight(ir.Blk(l, "attn_norm.weight"), h.NEmbd), xn)
			selfAttention(b, l, xn, r, attnOpts{biases: true}, y)
			b.Norm(y, b.Weight(ir.Blk(l, "post_attention_norm.weight"), h.NEmbd), y)
			b.Add(x, y, x)
			b.Norm(x, b.Weight(ir.Blk(l, "ffn_norm.weight"), h.NEmbd), xn)
			b.MatMul(xn, b.Weight(ir.Blk(l, "ffn_up.weight"), h.NEmbd, 2*h.NFF), nil, upGate)
			b.SwiGLUFused(upGate, act)
			b.MatMul(act, b.Weight(ir.Blk(l, "ffn_down.weight"), h.NFF, h.NEmbd), nil, y)
			b.Norm(y, b.Weight(ir.Blk(l, "post_ffw_norm.weight"), h.NEmbd), y)
			b.Add(x, y, x)
		}
		return outputHead(b, x, emb)
	}})
}
