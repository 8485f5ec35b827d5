package ir

func init() {
	register(OpMoE, Class{Name: "moe", Anchor: AnchorWeights, Streams: true, Experts: true})
}

// MoE is the mixture-of-experts FFN: router w (F32 or any type) picks topK
// of the experts in the gate/up/down stacks for each token.
func (b *Builder) MoE(in BufID, router, gate, up, down *Weight, topK int, normTopK bool, out BufID) {
	if router != nil && gate != nil && up != nil && down != nil {
		ne := router.Rows()
		if gate.Experts() != ne || up.Experts() != ne || down.Experts() != ne || topK < 1 || topK > ne {
			b.fail("moe: router has %d experts, stacks %d/%d/%d, top-k %d", ne, gate.Experts(), up.Experts(), down.Experts(), topK)
		}
	}
	b.add(Op{Kind: OpMoE, In: in, W: router, Gate: gate, Up: up, Down: down, TopK: topK, NormTopK: normTopK, Out: out})
}
