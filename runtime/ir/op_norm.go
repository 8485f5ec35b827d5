package ir

func init() { register(OpNorm, Class{Name: "norm"}) }

// Norm is RMSNorm of in, times w, into out.
func (b *Builder) Norm(in BufID, w *Weight, out BufID) {
	if w != nil && (w.Dims[0] != b.width(in) || b.width(in) != b.width(out)) {
		b.fail("norm %q of width %d on buffer of width %d", w.Name, w.Dims[0], b.width(in))
	}
	b.add(Op{Kind: OpNorm, In: in, W: w, Out: out, Eps: b.H.RMSEps})
}
