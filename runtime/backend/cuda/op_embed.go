package cuda

// The embedding: rows of the token embedding by token id.

import (
	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/runtime/ir"
)

func (g *Exec) embedStep(op *ir.Op) (step, error) {
	m, err := g.weight(op.W)
	if err != nil {
		return step{}, err
	}
	out, ids := g.bufs[op.Out], g.dIn.Add(4*g.inLay.tokens)
	return step{run: func(s *cudadrv.Stream, n int) error {
		return g.with(s, m, func() error { return g.w.GetRows(s, m, ids, n, out) })
	}}, nil
}
