package cpu

import (
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// swiglu is silu(gate) * up, per row; from one fused buffer (gate then up)
// when the op has no second input.
func (b *Backend) swiglu(op *ir.Op, n int) {
	b.pool.Run(n, 4, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			out := b.row(op.Out, t)
			if op.In2 < 0 {
				in := b.row(op.In, t)
				ops.SwiGLU(out, in[:len(out)], in[len(out):])
			} else {
				ops.SwiGLU(out, b.row(op.In, t), b.row(op.In2, t))
			}
		}
	})
}
