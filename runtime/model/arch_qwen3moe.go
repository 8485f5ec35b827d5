package model

import "github.com/atsinfer/ats/runtime/ir"

// qwen3moe: Qwen3's attention block with a mixture-of-experts FFN: a
// softmax router picks expert_used_count of expert_count experts per token,
// their weights renormalised to sum to 1, each a SwiGLU FFN.
func init() {
	registerArch(Arch{Name: "qwen3moe", Build: func(b *ir.Builder) ir.BufID {
		h := &b.H
		if h.NExpert == 0 || h.NExpertUsed == 0 || h.NFFExpert == 0 {
			b.Fail("qwen3moe: expert_count, expert_used_count and expert_feed_forward_length must be set (have %d, %d, %d)", h.NExpert, h.NExpertUsed, h.NFFExpert)
			return 0
		}
		emb, x := embeddings(b)
		r := rope(b, true)
		xn, y := b.Buf("xn", h.NEmbd), b.Buf("y", h.NEmbd)
		for l := 0; l < h.NLayer && b.Err() == nil; l++ {
			b.Layer(l)
			b.Norm(x, b.Weight(ir.Blk(l, "attn_norm.weight"), h.NEmbd), xn)
			selfAttention(b, l, xn, r, attnOpts{qkNorm: true, neox: true}, y)
			b.Add(x, y, x)
			b.Norm(x, b.Weight(ir.Blk(l, "ffn_norm.weight"), h.NEmbd), xn)
			b.MoE(xn,
				b.Weight(ir.Blk(l, "ffn_gate_inp.weight"), h.NEmbd, h.NExpert),
				b.Weight(ir.Blk(l, "ffn_gate_exps.weight"), h.NEmbd, h.NFFExpert, h.NExpert),
				b.Weight(ir.Blk(l, "ffn_up_exps.weight"), h.NEmbd, h.NFFExpert, h.NExpert),
				b.Weight(ir.Blk(l, "ffn_down_exps.weight"), h.NFFExpert, h.NEmbd, h.NExpert),
				h.NExpertUsed, true, y)
			b.Add(x, y, x)
		}
		return outputHead(b, x, emb)
	}})
}
