package cpu

import (
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// headNorm is RMSNorm of each head of each row, in place.
func (b *Backend) headNorm(op *ir.Op, n int) {
	b.pool.Run(n, 4, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			r := b.row(op.In, t)
			for hd := 0; hd < op.Heads; hd++ {
				v := r[hd*op.HeadSize : (hd+1)*op.HeadSize]
				ops.RMSNorm(v, v, op.W.Vector, op.Eps)
			}
		}
	})
}
