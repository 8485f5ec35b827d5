package cpu

import (
	"fmt"
	"sync/atomic"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// matMulGroup returns the end of the run of matrix products starting at
// ops[i] that read the same input in the same activation format (Q, K and
// V; gate and up) and write other buffers: they share one quantization of
// the input and one split of their rows over the threads.
func matMulGroup(ops []ir.Op, i int) int {
	first := &ops[i]
	if first.Kind != ir.OpMatMul || first.Out == first.In {
		return i + 1
	}
	m0 := first.W.Mat
	j := i + 1
	for ; j < len(ops); j++ {
		op := &ops[j]
		if op.Kind != ir.OpMatMul || op.In != first.In || op.Out == op.In || op.Output != first.Output {
			break
		}
		m := op.W.Mat
		if m.Cols != m0.Cols || m.Kernel.ActType != m0.Kernel.ActType {
			break
		}
	}
	return j
}

// execMatMuls runs a group from matMulGroup over n rows.
func (b *Backend) execMatMuls(group []ir.Op, n int) {
	in := group[0].In
	m0 := group[0].W.Mat
	xq := m0.QuantizeActs(b.pool, b.bufs[in][:n*m0.Cols], n, b.scratch)
	var mats [4]ops.Matrix
	var outs [4][]float32
	var lds [4]int
	for start := 0; start < len(group); start += len(mats) {
		g := group[start:min(len(group), start+len(mats))]
		for k := range g {
			mats[k] = g[k].W.Mat
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

// exec runs one op over n rows on the CPU.
func (b *Backend) exec(op *ir.Op, tokens []int, n, pos0 int) {
	switch op.Kind {
	case ir.OpEmbed:
		b.pool.Run(n, 1, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				op.W.Mat.DequantizeRow(tokens[t], b.row(op.Out, t))
			}
		})
	case ir.OpNorm:
		var w []float32
		if op.W != nil {
			w = op.W.Vector
		}
		b.pool.Run(n, 4, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				ops.RMSNorm(b.row(op.Out, t), b.row(op.In, t), w, op.Eps)
			}
		})
	case ir.OpHeadNorm:
		b.pool.Run(n, 4, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				r := b.row(op.In, t)
				for hd := 0; hd < op.Heads; hd++ {
					v := r[hd*op.HeadSize : (hd+1)*op.HeadSize]
					ops.RMSNorm(v, v, op.W.Vector, op.Eps)
				}
			}
		})
	case ir.OpMatMul:
		width := b.prog.Bufs[op.Out].Width
		op.W.Mat.Mul(b.pool, b.bufs[op.In][:n*op.W.Mat.Cols], n, b.bufs[op.Out], width, b.scratch)
		if op.Bias != nil {
			for t := 0; t < n; t++ {
				ops.AddTo(b.row(op.Out, t), op.Bias.Vector)
			}
		}
	case ir.OpRoPE:
		cos, sin := b.ropeTable(op.Rope, pos0, n)
		half := op.Rope.Dims / 2
		b.pool.Run(n, 4, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				op.Rope.Apply(b.row(op.In, t), op.Heads, op.HeadSize, cos[t*half:(t+1)*half], sin[t*half:(t+1)*half])
			}
		})
	case ir.OpAttention:
		kv := b.kv[op.Layer]
		ab := &b.batch
		ab.Pos, ab.Seq = ab.Pos[:0], ab.Seq[:0]
		for t := 0; t < n; t++ {
			ab.Pos = append(ab.Pos, int32(pos0+t))
			ab.Seq = append(ab.Seq, 0)
		}
		var err error
		if b.prog.Bufs[op.In2].Width == kv.Width && b.prog.Bufs[op.In3].Width == kv.Width {
			err = kv.StoreBatch(b.pool, ab, b.bufs[op.In2], b.bufs[op.In3])
		} else {
			for t := 0; t < n && err == nil; t++ {
				err = kv.Store(ab.Cell(t), b.row(op.In2, t), b.row(op.In3, t))
			}
		}
		if err == nil {
			err = op.Attn.Run(b.pool, kv, b.bufs[op.In], b.bufs[op.Out], ab)
		}
		if err != nil {
			panic(fmt.Sprintf("cpu: attention of layer %d: %v", op.Layer, err))
		}
	case ir.OpSwiGLU:
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
	case ir.OpAdd:
		for t := 0; t < n; t++ {
			ops.Add(b.row(op.Out, t), b.row(op.In, t), b.row(op.In2, t))
		}
	case ir.OpMoE:
		b.moeFFN(op, n)
	default:
		panic(fmt.Sprintf("runtime: op %v has no CPU implementation", op.Kind))
	}
}

// ropeCache holds the rotation table of the current batch: every layer's
// Q and K rotations use the same positions, so cos and sin are computed
// once per batch instead of once per op (2·layers times).
type ropeCache struct {
	r        *ops.Rope
	pos0, n  int
	cos, sin []float32 // n rows of Dims/2
}

// ropeTable returns cos and sin for positions pos0..pos0+n-1 under r.
func (b *Backend) ropeTable(r *ops.Rope, pos0, n int) (cos, sin []float32) {
	rc := &b.rope
	half := r.Dims / 2
	if rc.r != r || rc.pos0 != pos0 || rc.n != n {
		if cap(rc.cos) < n*half {
			rc.cos, rc.sin = make([]float32, n*half), make([]float32, n*half)
		}
		cs, sn := rc.cos[:n*half], rc.sin[:n*half]
		b.pool.Run(n, 1, func(lo, hi int) {
			for t := lo; t < hi; t++ {
				r.Table(pos0+t, cs[t*half:(t+1)*half], sn[t*half:(t+1)*half])
			}
		})
		rc.r, rc.pos0, rc.n = r, pos0, n
	}
	return rc.cos[:n*half], rc.sin[:n*half]
}

// moeScratch holds the buffers of the mixture-of-experts op.
type moeScratch struct {
	probs   []float32 // [n][nExpert] router output
	choice  []int     // [n][topK] chosen experts
	weight  []float32 // [n][topK] their weights
	idx     []int     // [nExpert] Route's scratch
	in      []float32 // [cnt][nEmbd] gathered rows for one expert
	gate    []float32 // [cnt][nFF]
	up      []float32 // [cnt][nFF]
	down    []float32 // [cnt][nEmbd]
	results []float32 // [n][topK][nEmbd] weighted expert outputs (moeGrouped: the down products, by group row)
	downAct []byte    // moeSlots, moeGrouped: the slots' down inputs, quantized
	// moeGrouped: the slots grouped by expert. start[e] is expert e's
	// first row ([nExpert+1]), pos[i] slot i's row ([n·topK]), next the
	// counting sort's cursors; groupAct the rows' quantized inputs.
	start, pos, next []int
	groupAct         []byte
	// segStart[i] is segment i's first row (an expert's rows, cut at
	// moeSegRows; the last entry ends the last segment), segExpert[i] its
	// expert, segLeft[i] its gate and up row groups not yet computed.
	segStart, segExpert []int
	segLeft             []atomic.Int32
	cum                 []int // [segments+1] expertCosts' sums
	// moeSlots' countdowns: per slot, the row groups of its gate and up
	// products not yet computed; per moeSumRows rows of the output, the
	// row groups of the slots' down products not yet computed there.
	gateLeft [maxMoESlots]atomic.Int32
	downLeft []atomic.Int32
}

// maxMoESlots is the most (token, expert) pairs moeSlots takes: decode
// and small batches, where each expert has one or two tokens.
const maxMoESlots = 32

// moeSegRows is the most tokens of one expert a unit of moeGrouped's
// work takes: a row group of the expert's products over up to 128 tokens
// is some tens of microseconds on the GPU machine's cores.
const moeSegRows = 128

// moeSumRows is how many output rows moeSlots adds up at a time, by the
// thread that completes the last slot's down product there.
const moeSumRows = 8 * ops.RowGroup

// moeChunkBytes is about the weight bytes of one chunk of moeSlots' work
// handed to a thread (ops' chunkBytes): some microseconds of work against
// a hand-off of about one.
const moeChunkBytes = 64 << 10

// moeSlots is the MoE FFN of a few tokens: every chosen (token, expert)
// pair is a slot. At decode a layer's experts are a few hundred
// microseconds of work, so what also counts is each dispatch and barrier
// over the pool (microseconds at 16 threads) and every serial stretch
// between them, the more so as those read rows that other cores wrote and
// must fetch from their caches. So the work runs in two dispatches, and
// the small steps between the products are done inside them, spread over
// the threads, as soon as their inputs are complete:
//
//   - the slots' gate and up products, in row groups, slot after slot; the
//     thread that computes a slot's last group applies SwiGLU to the slot
//     and quantizes it for the down product;
//   - the down products, in row groups, slot after slot; the thread that
//     computes a row group's last slot adds the slots' rows there into the
//     output, weighted.
//
// Each dispatch walks every expert's rows in the order they lie in memory,
// in long runs: a split that reads all slots' rows of one output range
// together (so that one thread could own the sum) reads eight short runs
// instead, which DRAM streams 5-15% slower. Each slot's arithmetic is that
// of the expert loop (the same quantized rows through the same kernels,
// the weighted sum in slot order), so the results are identical.
func (b *Backend) moeSlots(op *ir.Op, n int) {
	s := &b.moe
	k := op.TopK
	gate0, down0 := op.Gate.Stack[0], op.Down.Stack[0]
	emb, ff := gate0.Cols, gate0.Rows
	slots := n * k
	const rg = ops.RowGroup
	t0 := b.lapStart()
	xq := gate0.QuantizeActs(b.pool, b.bufs[op.In][:n*emb], n, b.scratch)
	ab := gate0.Kernel.ActRowBytes(emb)
	db := down0.Kernel.ActRowBytes(ff)
	xd := s.downAct[:slots*db]

	// Gate and up: slot i's units are its gate's row groups [0, g), then
	// its up's [g, 2g).
	g := (ff + rg - 1) / rg
	for i := range slots {
		s.gateLeft[i].Store(int32(2 * g))
	}
	minUnits := max(1, moeChunkBytes/(rg*gate0.Kernel.RowBytes(emb)))
	b.pool.RunChunks(slots*2*g, minUnits, func(lo, hi int) {
		for i := lo / (2 * g); i*2*g < hi; i++ {
			a, z := max(lo-i*2*g, 0), min(hi-i*2*g, 2*g)
			e, x := s.choice[i], xq[i/k*ab:(i/k+1)*ab]
			gate, up := s.gate[i*ff:(i+1)*ff], s.up[i*ff:(i+1)*ff]
			if a < g {
				op.Gate.Stack[e].MulRows(a*rg, min(min(z, g)*rg, ff), x, 1, gate, ff)
			}
			if z > g {
				op.Up.Stack[e].MulRows((max(a, g)-g)*rg, min((z-g)*rg, ff), x, 1, up, ff)
			}
			// The atomic orders the other threads' rows of this slot
			// before the last one's reading them.
			if s.gateLeft[i].Add(-int32(z-a)) == 0 {
				ops.SwiGLU(gate, gate, up)
				down0.Kernel.QuantizeAct(xd[i*db:(i+1)*db], gate)
			}
		}
	})
	t0 = b.lap(n, "moe > gate+up, swiglu", t0)

	// Down: slot i's units are its down product's row groups [0, gd). The
	// countdowns are per moeSumRows rows (an atomic add per group would
	// cost as much as the sum).
	gd := (emb + rg - 1) / rg
	const bg = moeSumRows / rg // groups per countdown
	for c := range (gd + bg - 1) / bg {
		s.downLeft[c].Store(int32(slots * min(bg, gd-c*bg)))
	}
	minUnits = max(1, moeChunkBytes/(rg*down0.Kernel.RowBytes(ff)))
	b.pool.RunChunks(slots*gd, minUnits, func(lo, hi int) {
		for i := lo / gd; i*gd < hi; i++ {
			a, z := max(lo-i*gd, 0), min(hi-i*gd, gd)
			op.Down.Stack[s.choice[i]].MulRows(a*rg, min(z*rg, emb), xd[i*db:(i+1)*db], 1, s.down[i*emb:(i+1)*emb], emb)
			for c := a / bg; c*bg < z; c++ {
				done := min(z, (c+1)*bg) - max(a, c*bg)
				if s.downLeft[c].Add(-int32(done)) == 0 {
					b.sumSlotRows(op, n, c*moeSumRows, min((c+1)*moeSumRows, emb))
				}
			}
		}
	})
	b.lap(n, "moe > down, sum", t0)
}

// sumSlotRows writes output rows [r0, r1) of each of n tokens: its slots'
// down products (in s.down) times their weights, added in slot order. The
// conversions keep every product rounded before its add, as the expert
// loop's separate passes do (moeLoop, moeSum).
func (b *Backend) sumSlotRows(op *ir.Op, n, r0, r1 int) {
	s := &b.moe
	k, emb := op.TopK, op.Gate.Stack[0].Cols
	for t := 0; t < n; t++ {
		out := b.row(op.Out, t)[r0:r1]
		for j := 0; j < k; j++ {
			i := t*k + j
			addSlot(out, s.down[i*emb+r0:i*emb+r1], s.weight[i], j == 0)
		}
	}
}

// addSlot adds a slot's down product d, times its weight w, into out
// (first: sets out to it). Each product is rounded before its add, as the
// expert loop's separate passes round it (moeLoop, moeSum); the conversion
// keeps the compiler from fusing the two.
func addSlot(out, d []float32, w float32, first bool) {
	d = d[:len(out)] // no bounds checks in the loops
	if first {
		for x := range out {
			out[x] = float32(d[x] * w)
		}
		return
	}
	for x := range out {
		out[x] += float32(d[x] * w)
	}
}

func (s *moeScratch) grow(batch int, op *ir.Op) {
	ne, k := op.W.Mat.Rows, op.TopK
	emb, ff := op.Gate.Stack[0].Cols, op.Gate.Stack[0].Rows
	fit := func(b []float32, n int) []float32 {
		if len(b) < n {
			return make([]float32, n)
		}
		return b
	}
	s.probs = fit(s.probs, batch*ne)
	s.weight = fit(s.weight, batch*k)
	if len(s.idx) < ne {
		s.idx = make([]int, ne)
	}
	if len(s.choice) < batch*k {
		s.choice = make([]int, batch*k)
	}
	rows := max(batch, batch*k) // the expert loop's tokens, or the slots of moeSlots and moeGrouped
	s.in = fit(s.in, batch*emb)
	s.gate = fit(s.gate, rows*ff)
	s.up = fit(s.up, rows*ff)
	s.down = fit(s.down, max(batch, min(batch*k, maxMoESlots))*emb) // the expert loop's tokens, or moeSlots' slots
	if n := batch * k * op.Down.Stack[0].Kernel.ActRowBytes(ff); len(s.downAct) < n {
		s.downAct = make([]byte, n)
	}
	{ // moeGrouped's, also for small batches: MoEPartial takes any batch
		if len(s.start) < ne+1 {
			s.start, s.next = make([]int, ne+1), make([]int, ne)
		}
		if segs := ne + batch*k/moeSegRows + 1; len(s.segExpert) < segs {
			s.segStart, s.segExpert, s.cum = make([]int, segs+1), make([]int, segs), make([]int, segs+1)
			s.segLeft = make([]atomic.Int32, segs)
		}
		if len(s.pos) < batch*k {
			s.pos = make([]int, batch*k)
		}
		if n := batch * k * op.Gate.Stack[0].Kernel.ActRowBytes(emb); len(s.groupAct) < n {
			s.groupAct = make([]byte, n)
		}
	}
	s.results = fit(s.results, batch*k*emb)
	if c := (emb + moeSumRows - 1) / moeSumRows; len(s.downLeft) < c {
		s.downLeft = make([]atomic.Int32, c)
	}
}

// Route routes one token: softmax over the router's logits p (in
// place), the k most probable experts into choice (ties: the lower id
// first) and their probabilities into weight, renormalised to sum to 1 when
// norm is set. idx is scratch of len(p).
func Route(p []float32, k int, norm bool, choice []int, weight []float32, idx []int) {
	ops.Softmax(p)
	if !topK(p, k, choice, weight) {
		selectTopK(p, k, choice, weight, idx)
	}
	var sum float32
	for j := 0; j < k; j++ {
		sum += weight[j]
	}
	if norm {
		for j := 0; j < k; j++ {
			weight[j] /= sum
		}
	}
}

// topK puts the k largest of p into weight, and their ids into choice,
// in the order a stable sort by decreasing value gives (ties: the lower id
// first). One pass keeps the best so far sorted: most values are below the
// k-th and cost one comparison, where a selection pass per expert costs
// k·len(p) unpredictable branches (microseconds at decode, per layer). Each
// new value goes after the equal ones, whose ids are lower, as a stable
// sort puts them. It returns false when p holds a NaN, which has no place
// in that order (choice and weight are then undefined).
func topK(p []float32, k int, choice []int, weight []float32) bool {
	n := 0 // the best so far: weight[:n]
	for i, v := range p {
		if v != v {
			return false
		}
		if n == k && !(v > weight[k-1]) {
			continue
		}
		j := min(n, k-1) // when full, the last one drops out
		for j > 0 && weight[j-1] < v {
			weight[j], choice[j] = weight[j-1], choice[j-1]
			j--
		}
		weight[j], choice[j] = v, i
		n = min(n+1, k)
	}
	return true
}

// selectTopK is topK by selection, for any values: each pass takes the
// largest not yet taken, the lowest id among equals (NaN never compares
// larger). idx marks the taken ones.
func selectTopK(p []float32, k int, choice []int, weight []float32, idx []int) {
	for i := range idx {
		idx[i] = 0
	}
	for j := 0; j < k; j++ {
		best := -1
		for i, v := range p {
			if idx[i] == 0 && (best < 0 || v > p[best]) {
				best = i
			}
		}
		idx[best] = 1
		choice[j] = best
		weight[j] = p[best]
	}
}

// moeFFN routes each token to its top experts and sums their outputs in
// slot order, as llama.cpp's build_moe_ffn does.
func (b *Backend) moeFFN(op *ir.Op, n int) {
	s := &b.moe
	ne, k := op.W.Mat.Rows, op.TopK
	emb := op.Gate.Stack[0].Cols
	t0 := b.lapStart()
	op.W.Mat.Mul(b.pool, b.bufs[op.In][:n*emb], n, s.probs, ne, b.scratch)
	t0 = b.lap(n, "moe > router", t0)
	if n < 64 {
		for t := 0; t < n; t++ {
			Route(s.probs[t*ne:(t+1)*ne], k, op.NormTopK, s.choice[t*k:(t+1)*k], s.weight[t*k:(t+1)*k], s.idx[:ne])
		}
	} else { // a batch: about a microsecond a token
		b.pool.Run(n, 32, func(lo, hi int) {
			idx := make([]int, ne)
			for t := lo; t < hi; t++ {
				Route(s.probs[t*ne:(t+1)*ne], k, op.NormTopK, s.choice[t*k:(t+1)*k], s.weight[t*k:(t+1)*k], idx)
			}
		})
	}
	b.lap(n, "moe > top-k", t0)
	if gate0 := op.Gate.Stack[0]; op.Up.Stack[0].Kernel.ActType == gate0.Kernel.ActType {
		if n*k <= maxMoESlots {
			b.moeSlots(op, n)
		} else {
			b.moeGrouped(op, n)
		}
		return
	}
	b.moeLoop(op, n)
}

// moeLoop runs the experts one by one, each over the tokens that chose it
// (the choice made by moeFFN's routing).
func (b *Backend) moeLoop(op *ir.Op, n int) {
	s := &b.moe
	ne, k := op.W.Mat.Rows, op.TopK
	emb := op.Gate.Stack[0].Cols
	ff := op.Gate.Stack[0].Rows
	type slot struct{ t, j int }
	for e := 0; e < ne; e++ {
		var users []slot
		for t := 0; t < n; t++ {
			for j := 0; j < k; j++ {
				if s.choice[t*k+j] == e {
					users = append(users, slot{t, j})
				}
			}
		}
		if len(users) == 0 {
			continue
		}
		cnt := len(users)
		for i, u := range users {
			copy(s.in[i*emb:(i+1)*emb], b.row(op.In, u.t))
		}
		gate, up, down := op.Gate.Stack[e], op.Up.Stack[e], op.Down.Stack[e]
		xq := gate.QuantizeActs(b.pool, s.in[:cnt*emb], cnt, b.scratch)
		gate.MulQ(b.pool, xq, cnt, s.gate, ff)
		if up.Kernel.ActType == gate.Kernel.ActType {
			up.MulQ(b.pool, xq, cnt, s.up, ff)
		} else {
			up.Mul(b.pool, s.in[:cnt*emb], cnt, s.up, ff, b.scratch)
		}
		ops.SwiGLU(s.gate[:cnt*ff], s.gate[:cnt*ff], s.up[:cnt*ff])
		down.Mul(b.pool, s.gate[:cnt*ff], cnt, s.down, emb, b.scratch)
		for i, u := range users {
			dst := s.results[(u.t*k+u.j)*emb : (u.t*k+u.j+1)*emb]
			w := s.weight[u.t*k+u.j]
			for d := range dst {
				dst[d] = s.down[i*emb+d] * w
			}
		}
	}
	b.moeSum(op, n)
}

// moeSum adds each token's weighted expert outputs in slot order, as
// llama.cpp's build_moe_ffn does.
func (b *Backend) moeSum(op *ir.Op, n int) {
	s := &b.moe
	k, emb := op.TopK, op.Gate.Stack[0].Cols
	for t := 0; t < n; t++ {
		out := b.row(op.Out, t)
		copy(out, s.results[t*k*emb:(t*k+1)*emb])
		for j := 1; j < k; j++ {
			ops.AddTo(out, s.results[(t*k+j)*emb:(t*k+j+1)*emb])
		}
	}
}
