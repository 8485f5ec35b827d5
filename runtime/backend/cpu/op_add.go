package cpu

import (
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// add is the sum of two buffers, per row.
func (b *Backend) add(op *ir.Op, n int) {
	for t := 0; t < n; t++ {
		ops.Add(b.row(op.Out, t), b.row(op.In, t), b.row(op.In2, t))
	}
}
