package ir

func init() {
	register(OpEmbed, Class{Name: "embed", Anchor: AnchorWeights, Lookup: true,
		Reads: func(*Op) []BufID { return nil }})
}

// Embed looks up token rows of the embedding table into out.
func (b *Builder) Embed(w *Weight, out BufID) {
	if w != nil && w.Dims[0] != b.width(out) {
		b.fail("embedding %q has %d columns, buffer %q %d", w.Name, w.Dims[0], b.prog.Bufs[out].Name, b.width(out))
	}
	b.add(Op{Kind: OpEmbed, W: w, Out: out})
}
