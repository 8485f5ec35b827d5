package ir

func init() {
	register(OpAdd, Class{Name: "add", Reads: func(op *Op) []BufID { return []BufID{op.In, op.In2} }})
}

// Add is out = x + y.
func (b *Builder) Add(x, y, out BufID) {
	if b.width(x) != b.width(y) || b.width(x) != b.width(out) {
		b.fail("add widths %d + %d -> %d", b.width(x), b.width(y), b.width(out))
	}
	b.add(Op{Kind: OpAdd, In: x, In2: y, Out: out})
}
