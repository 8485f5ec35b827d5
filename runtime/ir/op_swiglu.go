package ir

func init() {
	register(OpSwiGLU, Class{Name: "swiglu", Reads: func(op *Op) []BufID {
		if op.In2 >= 0 {
			return []BufID{op.In, op.In2}
		}
		return []BufID{op.In}
	}})
}

// SwiGLU is out = silu(gate) * up.
func (b *Builder) SwiGLU(gate, up, out BufID) {
	if b.width(gate) != b.width(up) || b.width(out) != b.width(gate) {
		b.fail("swiglu widths %d, %d -> %d", b.width(gate), b.width(up), b.width(out))
	}
	b.add(Op{Kind: OpSwiGLU, In: gate, In2: up, Out: out})
}

// SwiGLUFused is out = silu(first half of in) * second half of in.
func (b *Builder) SwiGLUFused(in, out BufID) {
	if b.width(in) != 2*b.width(out) {
		b.fail("fused swiglu from width %d to %d", b.width(in), b.width(out))
	}
	b.add(Op{Kind: OpSwiGLU, In: in, In2: -1, Out: out})
}
