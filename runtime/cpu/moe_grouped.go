package cpu

import (
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// moeGrouped is the MoE FFN of a batch (more slots than moeSlots takes):
// the slots are grouped by expert, and every expert's products run in the
// same pool dispatch. The expert loop (moeLoop) dispatches each expert's
// gate, up and down products one after the other, with serial steps
// between them; at 16 threads a 512-token batch of 128 experts spent most
// of its time in those, not in the products. Here:
//
//   - routing, and the quantization of the inputs, spread over the pool;
//     each slot's quantized input row is copied into its expert's group;
//   - one dispatch for every expert's gate and up products, in row groups,
//     expert after expert; the thread that computes an expert's last group
//     applies SwiGLU to its rows and quantizes them for the down product;
//   - one dispatch for every expert's down product, in row groups;
//   - one dispatch over the tokens, adding each token's slots, weighted.
//
// Each slot's arithmetic is the expert loop's (the same quantized rows
// through the same kernels, the weighted sum in slot order), so the
// results are identical.
func (b *Backend) moeGrouped(op *ir.Op, n int) {
	s := &b.moe
	k := op.TopK
	ne := op.W.Mat.Rows
	gate0, down0 := op.Gate.Stack[0], op.Down.Stack[0]
	emb, ff := gate0.Cols, gate0.Rows
	slots := n * k
	const rg = ops.RowGroup
	t0 := b.lapStart()

	// Group the slots by expert (a counting sort, stable: each expert's
	// slots in token order): pos is slot i's row in its group's buffers,
	// start[e] the first row of expert e.
	start, pos := s.start[:ne+1], s.pos[:slots]
	clear(start)
	for _, e := range s.choice[:slots] {
		start[e+1]++
	}
	for e := range ne {
		start[e+1] += start[e]
	}
	next := s.next[:ne]
	copy(next, start[:ne])
	for i, e := range s.choice[:slots] {
		pos[i] = next[e]
		next[e]++
	}
	ab := gate0.Kernel.ActRowBytes(emb)
	db := down0.Kernel.ActRowBytes(ff)
	xq := gate0.QuantizeActs(b.pool, b.bufs[op.In][:n*emb], n, b.scratch)
	xg, xd := s.groupAct[:slots*ab], s.downAct[:slots*db]
	b.pool.Run(slots, 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			copy(xg[pos[i]*ab:(pos[i]+1)*ab], xq[i/k*ab:(i/k+1)*ab])
		}
	})
	t0 = b.lap(n, "moe > group", t0)

	// Gate and up: expert e's units are its gate's row groups [0, g),
	// then its up's [g, 2g), each over the expert's rows.
	g := (ff + rg - 1) / rg
	for e := range ne {
		s.expertLeft[e].Store(int32(2 * g))
	}
	minUnits := max(1, moeChunkBytes/(rg*gate0.Kernel.RowBytes(emb)))
	b.pool.RunChunks(ne*2*g, minUnits, func(lo, hi int) {
		for e := lo / (2 * g); e*2*g < hi; e++ {
			r0, r1 := start[e], start[e+1]
			if r0 == r1 {
				continue
			}
			a, z := max(lo-e*2*g, 0), min(hi-e*2*g, 2*g)
			x := xg[r0*ab : r1*ab]
			gate, up := s.gate[r0*ff:r1*ff], s.up[r0*ff:r1*ff]
			if a < g {
				op.Gate.Stack[e].MulRows(a*rg, min(min(z, g)*rg, ff), x, r1-r0, gate, ff)
			}
			if z > g {
				op.Up.Stack[e].MulRows((max(a, g)-g)*rg, min((z-g)*rg, ff), x, r1-r0, up, ff)
			}
			// The atomic orders the other threads' rows of this expert
			// before the last one's reading them.
			if s.expertLeft[e].Add(-int32(z-a)) == 0 {
				for r := r0; r < r1; r++ {
					row := s.gate[r*ff : (r+1)*ff]
					ops.SwiGLU(row, row, s.up[r*ff:(r+1)*ff])
					down0.Kernel.QuantizeAct(xd[r*db:(r+1)*db], row)
				}
			}
		}
	})
	t0 = b.lap(n, "moe > gate+up, swiglu", t0)

	// Down: expert e's units are its down product's row groups [0, gd).
	gd := (emb + rg - 1) / rg
	down := s.results[:slots*emb]
	minUnits = max(1, moeChunkBytes/(rg*down0.Kernel.RowBytes(ff)))
	b.pool.RunChunks(ne*gd, minUnits, func(lo, hi int) {
		for e := lo / gd; e*gd < hi; e++ {
			r0, r1 := start[e], start[e+1]
			if r0 == r1 {
				continue
			}
			a, z := max(lo-e*gd, 0), min(hi-e*gd, gd)
			op.Down.Stack[e].MulRows(a*rg, min(z*rg, emb), xd[r0*db:r1*db], r1-r0, down[r0*emb:r1*emb], emb)
		}
	})
	t0 = b.lap(n, "moe > down", t0)

	// Each token's slots, weighted, added in slot order (the expert
	// loop's rounding: every product rounded before its add).
	b.pool.Run(n, 4, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			out := b.row(op.Out, t)
			for j := 0; j < k; j++ {
				i := t*k + j
				addSlot(out, down[pos[i]*emb:(pos[i]+1)*emb], s.weight[i], j == 0)
			}
		}
	})
	b.lap(n, "moe > sum", t0)
}
