package runtime

// qwen2: Qwen2 and Qwen2.5. Llama's block with Q/K/V biases and NeoX rope.
func init() {
	registerArch(Arch{Name: "qwen2", Build: func(b *Builder) BufID {
		h := &b.H
		emb, x := embeddings(b)
		r := rope(b, true)
		xn, y := b.Buf("xn", h.NEmbd), b.Buf("y", h.NEmbd)
		for l := 0; l < h.NLayer; l++ {
			b.Layer(l)
			b.Norm(x, b.Weight(Blk(l, "attn_norm.weight"), h.NEmbd), xn)
			selfAttention(b, l, xn, r, attnOpts{biases: true, neox: true}, y)
			b.Add(x, y, x)
			b.Norm(x, b.Weight(Blk(l, "ffn_norm.weight"), h.NEmbd), xn)
			swigluFFN(b, l, xn, y)
			b.Add(x, y, x)
		}
		return outputHead(b, x, emb)
	}})
}
