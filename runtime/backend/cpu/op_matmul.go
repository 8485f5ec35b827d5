package cpu

import (
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// matMulGroup returns the end of the run of matrix products starting at
// ops[i] that read the same input in the same activation format (Q, K and
// V; gate and up) and write other buffers: they share one quantization of
// the input and one split of their rows over the threads.
func (b *Backend) matMulGroup(ops []ir.Op, i int) int {
	first := &ops[i]
	if first.Kind != ir.OpMatMul || first.Out == first.In {
		return i + 1
	}
	m0 := b.w.Of(first.W)
	j := i + 1
	for ; j < len(ops); j++ {
		op := &ops[j]
		if op.Kind != ir.OpMatMul || op.In != first.In || op.Out == op.In || op.Output != first.Output {
			break
		}
		m := b.w.Of(op.W)
		if m.Cols != m0.Cols || m.Kernel.ActType != m0.Kernel.ActType {
			break
		}
	}
	return j
}

// execMatMuls runs a group from matMulGroup over n rows.
func (b *Backend) execMatMuls(group []ir.Op, n int) {
	in := group[0].In
	m0 := b.w.Of(group[0].W)
	xq := m0.QuantizeActs(b.pool, b.bufs[in][:n*m0.Cols], n, b.scratch)
	var mats [4]ops.Matrix
	var outs [4][]float32
	var lds [4]int
	for start := 0; start < len(group); start += len(mats) {
		g := group[start:min(len(group), start+len(mats))]
		for k := range g {
			mats[k] = b.w.Of(g[k].W).Matrix
			outs[k] = b.bufs[g[k].Out]
			lds[k] = b.prog.Bufs[g[k].Out].Width
		}
		ops.MulQGroup(b.pool, mats[:len(g)], xq, n, outs[:len(g)], lds[:len(g)])
	}
	for k := range group {
		if op := &group[k]; op.Bias != nil {
			for t := 0; t < n; t++ {
				ops.AddTo(b.row(op.Out, t), op.Bias.Vector)
			}
		}
	}
}

func (b *Backend) row(id ir.BufID, t int) []float32 {
	w := b.prog.Bufs[id].Width
	return b.bufs[id][t*w : (t+1)*w]
}

// matMul is out = W·in (+ bias) over n rows.
func (b *Backend) matMul(op *ir.Op, n int) {
	m := b.w.Of(op.W)
	width := b.prog.Bufs[op.Out].Width
	m.Mul(b.pool, b.bufs[op.In][:n*m.Cols], n, b.bufs[op.Out], width, b.scratch)
	if op.Bias != nil {
		for t := 0; t < n; t++ {
			ops.AddTo(b.row(op.Out, t), op.Bias.Vector)
		}
	}
}
