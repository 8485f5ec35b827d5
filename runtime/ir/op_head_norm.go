package ir

func init() { register(OpHeadNorm, Class{Name: "head_norm", Writes: writesIn}) }

// HeadNorm is RMSNorm of each head of in, times w, in place.
func (b *Builder) HeadNorm(in BufID, w *Weight, heads, headSize int) {
	if w != nil && (w.Dims[0] != headSize || heads*headSize != b.width(in)) {
		b.fail("head norm %q of %d on %d heads of %d (width %d)", w.Name, w.Dims[0], heads, headSize, b.width(in))
	}
	b.add(Op{Kind: OpHeadNorm, In: in, W: w, Heads: heads, HeadSize: headSize, Eps: b.H.RMSEps})
}
