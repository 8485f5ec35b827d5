package cpu

import "github.com/atsinfer/ats/runtime/ir"

// embed looks up the batch's tokens' rows of the embedding table.
func (b *Backend) embed(op *ir.Op, bt *ir.Batch, n int) {
	m := b.w.Of(op.W)
	b.pool.Run(n, 1, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			m.DequantizeRow(int(bt.Tokens[t]), b.row(op.Out, t))
		}
	})
}
