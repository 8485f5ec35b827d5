package cpu

import (
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// rope rotates each head of each row by its token's position.
func (b *Backend) rope(op *ir.Op, bt *ir.Batch, n int) {
	r := b.ropes[op.Rope]
	cos, sin := b.ropeTable(op.Rope, r, bt, n)
	half := r.Dims / 2
	b.pool.Run(n, 4, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			r.Apply(b.row(op.In, t), op.Heads, op.HeadSize, cos[t*half:(t+1)*half], sin[t*half:(t+1)*half])
		}
	})
}

// ropeCache holds the rotation table of the current step: every layer's
// Q and K rotations use the same positions, so cos and sin are computed
// once per step instead of once per op (2·layers times).
type ropeCache struct {
	r        *ir.Rope
	step     uint64
	cos, sin []float32 // n rows of Dims/2
}

// ropeTable returns cos and sin for the positions of the step's n rows.
func (b *Backend) ropeTable(key *ir.Rope, r *ops.Rope, bt *ir.Batch, n int) (cos, sin []float32) {
	rc := &b.ropeTab
	half := r.Dims / 2
	if rc.r != key || rc.step != b.step {
		if cap(rc.cos) < n*half {
			rc.cos, rc.sin = make([]float32, n*half), make([]float32, n*half)
		}
		cs, sn := rc.cos[:n*half], rc.sin[:n*half]
		b.pool.Run(n, 1, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				r.Table(int(bt.Pos[t]), cs[t*half:(t+1)*half], sn[t*half:(t+1)*half])
			}
		})
		rc.r, rc.step = key, b.step
	}
	return rc.cos[:n*half], rc.sin[:n*half]
}

// opsRope is r as the CPU's kernels take it.
func opsRope(r *ir.Rope) *ops.Rope {
	return &ops.Rope{Dims: r.Dims, Base: r.Base, FreqScale: r.FreqScale, Factors: r.Factors, NeoX: r.NeoX}
}
