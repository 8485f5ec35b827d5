package ir

func init() { register(OpMatMul, Class{Name: "matmul", Anchor: AnchorWeights, Streams: true}) }

// MatMul is out = w·in (+ bias).
func (b *Builder) MatMul(in BufID, w, bias *Weight, out BufID) {
	if w != nil {
		if w.Dims[0] != b.width(in) || w.Rows() != b.width(out) {
			b.fail("matmul %q (%v) from width %d to %d", w.Name, w.Dims, b.width(in), b.width(out))
		}
		if bias != nil && bias.Dims[0] != w.Rows() {
			b.fail("bias %q has %d values for %d rows", bias.Name, bias.Dims[0], w.Rows())
		}
	}
	b.add(Op{Kind: OpMatMul, In: in, W: w, Bias: bias, Out: out})
}
