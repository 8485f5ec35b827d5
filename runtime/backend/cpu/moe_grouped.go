package cpu

import (
	"fmt"
	"sort"

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
//     expert after expert (a hot expert's tokens in segments); the thread
//     that computes a segment's last group applies SwiGLU to its rows and
//     quantizes them for the down product;
//   - one dispatch for every expert's down product, in row groups;
//   - one dispatch over the tokens, adding each token's slots, weighted.
//
// Each slot's arithmetic is the expert loop's (the same quantized rows
// through the same kernels, the weighted sum in slot order), so the
// results are identical.
func (b *Backend) moeGrouped(op *ir.Op, n int) {
	b.moeGroupedRange(op, n, b.bufs[op.In][:n*b.w.Of(op.Gate).Stack[0].Cols], func(t int) []float32 { return b.row(op.Out, t) }, 0, b.w.Of(op.W).Rows)
}

// moeGroupedRange is moeGrouped over the experts [e0, e1) only, the
// routing in s.choice and s.weight, the inputs x ([n][emb]) and each
// token's output row out(t): the sum of its slots of those experts, zero
// when it has none (MoEPartial: the CPU's share of a split MoE layer).
func (b *Backend) moeGroupedRange(op *ir.Op, n int, x []float32, out func(t int) []float32, e0, e1 int) {
	s := &b.moe
	k := op.TopK
	ne := b.w.Of(op.W).Rows
	gate0, down0 := b.w.Of(op.Gate).Stack[0], b.w.Of(op.Down).Stack[0]
	emb, ff := gate0.Cols, gate0.Rows
	slots := n * k
	const rg = ops.RowGroup
	t0 := b.lapStart()

	// Group the slots by expert (a counting sort, stable: each expert's
	// slots in token order): pos is slot i's row in its group's buffers
	// (-1: an expert outside the range), start[e] the first row of expert e.
	start, pos := s.start[:ne+1], s.pos[:slots]
	clear(start)
	for _, e := range s.choice[:slots] {
		if e >= e0 && e < e1 {
			start[e+1]++
		}
	}
	for e := range ne {
		start[e+1] += start[e]
	}
	next := s.next[:ne]
	copy(next, start[:ne])
	for i, e := range s.choice[:slots] {
		if e < e0 || e >= e1 {
			pos[i] = -1
			continue
		}
		pos[i] = next[e]
		next[e]++
	}
	ab := gate0.Kernel.ActRowBytes(emb)
	db := down0.Kernel.ActRowBytes(ff)
	xq := gate0.QuantizeActs(b.pool, x, n, b.scratch)
	xg, xd := s.groupAct[:slots*ab], s.downAct[:slots*db]
	b.pool.Run(slots, 64, func(lo, hi int) {
		for i := lo; i < hi; i++ {
			if pos[i] >= 0 {
				copy(xg[pos[i]*ab:(pos[i]+1)*ab], xq[i/k*ab:(i/k+1)*ab])
			}
		}
	})
	t0 = b.lap(n, "moe > group", t0)

	// Each expert's rows are cut into segments of at most moeSegRows
	// tokens: a unit of work is a row group of one segment, so that no unit
	// of a hot expert holds a thread far longer than the others' (a row
	// group of an expert with a thousand tokens took 0.2 ms, and the last
	// chunks of a dispatch left one thread on several while fifteen
	// waited).
	segs := s.segStart[:0]
	segExpert := s.segExpert[:0]
	for e := e0; e < e1; e++ {
		r0, r1 := start[e], start[e+1]
		if r0 == r1 {
			continue
		}
		parts := (r1 - r0 + moeSegRows - 1) / moeSegRows
		size := ((r1-r0+parts-1)/parts + 31) / 32 * 32 // whole AMX passes but the last
		for r := r0; r < r1; r += size {
			segs, segExpert = append(segs, r), append(segExpert, e)
		}
	}
	nseg := len(segExpert)
	segs = append(segs, start[e1])

	// Gate and up: segment i's units are its expert's gate's row groups
	// [0, g), then its up's [g, 2g), each over the segment's rows; they
	// are handed out by their cost (expertCosts).
	g := (ff + rg - 1) / rg
	for i := range nseg {
		s.segLeft[i].Store(int32(2 * g))
	}
	minUnits := max(1, moeChunkBytes/(rg*gate0.Kernel.RowBytes(emb)))
	costs := expertCosts{per: 2 * g, cum: s.cum[:nseg+1]}
	costs.weigh(segs)
	b.pool.RunChunks(costs.total(), minUnits*costs.mean(), func(lo, hi int) {
		lo, hi = costs.unit(lo), costs.unit(hi)
		if lo == hi {
			return // a segment's countdown must not see an empty chunk
		}
		for i := lo / (2 * g); i*2*g < hi; i++ {
			e, r0, r1 := segExpert[i], segs[i], segs[i+1]
			a, z := max(lo-i*2*g, 0), min(hi-i*2*g, 2*g)
			x := xg[r0*ab : r1*ab]
			gate, up := s.gate[r0*ff:r1*ff], s.up[r0*ff:r1*ff]
			if a < g {
				b.w.Of(op.Gate).Stack[e].MulRows(a*rg, min(min(z, g)*rg, ff), x, r1-r0, gate, ff)
			}
			if z > g {
				b.w.Of(op.Up).Stack[e].MulRows((max(a, g)-g)*rg, min((z-g)*rg, ff), x, r1-r0, up, ff)
			}
			// The atomic orders the other threads' rows of this segment
			// before the last one's reading them.
			if s.segLeft[i].Add(-int32(z-a)) == 0 {
				for r := r0; r < r1; r++ {
					row := s.gate[r*ff : (r+1)*ff]
					ops.SwiGLU(row, row, s.up[r*ff:(r+1)*ff])
					down0.Kernel.QuantizeAct(xd[r*db:(r+1)*db], row)
				}
			}
		}
	})
	t0 = b.lap(n, "moe > gate+up, swiglu", t0)

	// Down: segment i's units are its expert's down product's row groups
	// [0, gd).
	gd := (emb + rg - 1) / rg
	down := s.results[:slots*emb]
	minUnits = max(1, moeChunkBytes/(rg*down0.Kernel.RowBytes(ff)))
	costs = expertCosts{per: gd, cum: s.cum[:nseg+1]}
	costs.weigh(segs)
	b.pool.RunChunks(costs.total(), minUnits*costs.mean(), func(lo, hi int) {
		lo, hi = costs.unit(lo), costs.unit(hi)
		if lo == hi {
			return
		}
		for i := lo / gd; i*gd < hi; i++ {
			e, r0, r1 := segExpert[i], segs[i], segs[i+1]
			a, z := max(lo-i*gd, 0), min(hi-i*gd, gd)
			b.w.Of(op.Down).Stack[e].MulRows(a*rg, min(z*rg, emb), xd[r0*db:r1*db], r1-r0, down[r0*emb:r1*emb], emb)
		}
	})
	t0 = b.lap(n, "moe > down", t0)

	// Each token's slots, weighted, added in slot order (the expert
	// loop's rounding: every product rounded before its add).
	b.pool.Run(n, 4, func(lo, hi int) {
		for t := lo; t < hi; t++ {
			o, first := out(t), true
			for j := 0; j < k; j++ {
				i := t*k + j
				if pos[i] >= 0 {
					addSlot(o, down[pos[i]*emb:(pos[i]+1)*emb], s.weight[i], first)
					first = false
				}
			}
			if first {
				clear(o) // none of its experts is in the range
			}
		}
	})
	b.lap(n, "moe > sum", t0)
}

// MoEPartial computes the CPU's share of an MoE layer split between the
// CPU and the GPU: for each of n tokens, the weighted sum of its slots
// whose expert is in [e0, e1), zero when it has none, into out
// ([n][emb]). The routing is the GPU's (ids and weights: [n][topK], as
// the router chose them), so both sides agree on every slot; x is the
// layer's input ([n][emb]). Each slot's arithmetic is the layer's own:
// moeSlots' for a few tokens (decode), moeGrouped's for more.
func (b *Backend) MoEPartial(op *ir.Op, n, e0, e1 int, x []float32, ids []int32, weights []float32, out []float32) error {
	k, ne, emb := op.TopK, b.w.Of(op.W).Rows, b.w.Of(op.Gate).Stack[0].Cols
	if op.Kind != ir.OpMoE || b.moe.start == nil || len(b.moe.choice) < n*k || n < 0 || e0 < 0 || e1 > ne || e0 > e1 {
		return fmt.Errorf("cpu: the MoE layer %d over experts [%d, %d) of %d for %d tokens: not prepared here", op.Layer, e0, e1, ne, n)
	}
	if len(x) < n*emb || len(ids) < n*k || len(weights) < n*k || len(out) < n*emb {
		return fmt.Errorf("cpu: the MoE layer %d for %d tokens: short buffers", op.Layer, n)
	}
	if b.w.Of(op.Up).Stack[0].Kernel.ActType != b.w.Of(op.Gate).Stack[0].Kernel.ActType {
		return fmt.Errorf("cpu: the MoE layer %d: gate and up read different activation types, which the grouped path does not take", op.Layer)
	}
	s := &b.moe
	for i, e := range ids[:n*k] {
		if e < 0 || int(e) >= ne {
			return fmt.Errorf("cpu: the MoE layer %d: slot %d routed to expert %d of %d", op.Layer, i, e, ne)
		}
		s.choice[i] = int(e)
	}
	copy(s.weight, weights[:n*k])
	outRow := func(t int) []float32 { return out[t*emb : (t+1)*emb] }
	if n*k <= maxMoESlots {
		// A decode step's share (a routed layer): moeSlots' two
		// dispatches, over the share's slots.
		b.moeSlotsRange(op, n, x[:n*emb], outRow, e0, e1)
		return nil
	}
	b.moeGroupedRange(op, n, x[:n*emb], outRow, e0, e1)
	return nil
}

// expertCosts weighs the units of a range of experts (or of their
// segments) by their work, so that the pool's guided chunks (RunChunks,
// over the costs) split the work evenly, not the unit count: each of an
// expert's per units (row groups) costs its rows (the tokens routed to
// it) plus unitOverhead (the unit's weights to read), and nothing when no
// token chose it. Routing is rarely even: when a few experts take many of
// a batch's tokens, chunks by unit count left a thread on a hot expert's
// big first chunk for milliseconds while the others waited (the CPU's
// quarter of a split 30B-A3B layer took 11.5 ms with 5 threads busy on
// average, against 4-5 ms with even routing; docs/bench/hybrid.md in the git history, eighth
// pass).
type expertCosts struct {
	per  int   // units per expert (or segment)
	cum  []int // cum[i]: the cost of the units of the range's first i experts (segments)
	paid int   // the units that cost something
}

// unitOverhead is a unit's cost beyond its rows, in rows: reading a row
// group's weights takes about as long as multiplying them by eight
// activation rows.
const unitOverhead = 8

// weigh sets the costs from the experts' (segments') first rows (start:
// one more than the experts, the last ending the last one's rows).
func (c *expertCosts) weigh(start []int) {
	c.cum[0], c.paid = 0, 0
	for i := range len(start) - 1 {
		unit := 0
		if rows := start[i+1] - start[i]; rows > 0 {
			unit = rows + unitOverhead
			c.paid += c.per
		}
		c.cum[i+1] = c.cum[i] + c.per*unit
	}
}

// total is the cost of every unit.
func (c *expertCosts) total() int { return c.cum[len(c.cum)-1] }

// mean is the mean cost of the units that cost something (at least 1):
// a chunk of m units' worth of the work is m*mean.
func (c *expertCosts) mean() int { return max(1, c.total()/max(1, c.paid)) }

// unit is the first unit (counting from the range's first) that starts at
// or after cost x, and the count of units from x = total() on: the
// chunks [x, y) of costs cover each unit once, as [unit(x), unit(y)).
// Units that cost nothing fall into a neighbouring chunk.
func (c *expertCosts) unit(x int) int {
	n := len(c.cum) - 1
	if x <= 0 {
		return 0
	}
	if x >= c.total() {
		return n * c.per
	}
	// The expert whose units span x: cum[i] <= x < cum[i+1].
	i := sort.Search(n, func(i int) bool { return c.cum[i+1] > x })
	each := (c.cum[i+1] - c.cum[i]) / c.per
	return i*c.per + (x-c.cum[i]+each-1)/each
}
