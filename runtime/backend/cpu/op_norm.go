package cpu

import (
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// norm is RMSNorm of each row, times the weight.
func (b *Backend) norm(op *ir.Op, n int) {
	var w []float32
	if op.W != nil {
		w = op.W.Vector
	}
	b.pool.Run(n, 4, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			ops.RMSNorm(b.row(op.Out, t), b.row(op.In, t), w, op.Eps)
		}
	})
}
