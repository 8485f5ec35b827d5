package cpu

import (
	"slices"
	"sync/atomic"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
)

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
// pair is a slot, and the slots that share an expert (tokens that chose
// the same one) form one group, whose products read the expert's rows once
// for all its tokens. At decode a layer's experts are a few hundred
// microseconds of work, so what also counts is each dispatch and barrier
// over the pool (microseconds at 16 threads) and every serial stretch
// between them, the more so as those read rows that other cores wrote and
// must fetch from their caches. So the work runs in two dispatches, and
// the small steps between the products are done inside them, spread over
// the threads, as soon as their inputs are complete:
//
//   - the groups' gate and up products, in row groups, group after group;
//     the thread that computes a group's last row group applies SwiGLU to
//     its slots and quantizes them for the down product;
//   - the down products, in row groups, group after group; the thread that
//     computes a row range's last group adds the slots' rows there into
//     the output, weighted.
//
// Each dispatch walks every expert's rows in the order they lie in memory,
// in long runs: a split that reads all slots' rows of one output range
// together (so that one thread could own the sum) reads eight short runs
// instead, which DRAM streams 5-15% slower. Each slot's arithmetic is that
// of the expert loop (the same quantized rows through the same kernels,
// which give a token the same result whatever other tokens share the
// call, and the weighted sum in slot order), so the results are identical.
func (b *Backend) moeSlots(op *ir.Op, n int) {
	emb := b.w.Of(op.Gate).Stack[0].Cols
	b.moeSlotsRange(op, n, b.bufs[op.In][:n*emb], func(t int) []float32 { return b.row(op.Out, t) }, 0, b.w.Of(op.W).Rows)
}

// slotGroup is the slots of one expert in moeSlotsRange: rows
// [row, row+n) of its buffers, in token order; first is the index in sel
// of its first slot.
type slotGroup struct{ expert, row, n, first int }

// groupSlots groups the slots sel (indices into choice, in slot order) by
// expert: the groups in the order of their first slot, and each slot's row
// (rows[j] for sel[j]) in the groups' buffers. The top-k of a token are
// distinct experts, so a group's slots are of distinct tokens.
func groupSlots(choice, sel []int, groups []slotGroup, rows []int) []slotGroup {
	var taken [maxMoESlots]bool
	r := 0
	for j, i := range sel {
		if taken[j] {
			continue
		}
		g := slotGroup{expert: choice[i], row: r, first: j}
		for j2 := j; j2 < len(sel); j2++ {
			if !taken[j2] && choice[sel[j2]] == g.expert {
				taken[j2], rows[j2] = true, r
				r++
				g.n++
			}
		}
		groups = append(groups, g)
	}
	return groups
}

// moeSlotsRange is moeSlots over the slots whose expert is in [e0, e1)
// (s.choice), from the inputs x ([n][emb]) into out(t), which gets zeros
// for a token without such a slot: the whole layer, or the CPU's share of
// a routed decode layer (MoEPartial).
func (b *Backend) moeSlotsRange(op *ir.Op, n int, x []float32, out func(t int) []float32, e0, e1 int) {
	s := &b.moe
	k := op.TopK
	gate0, down0 := b.w.Of(op.Gate).Stack[0], b.w.Of(op.Down).Stack[0]
	emb, ff := gate0.Cols, gate0.Rows
	var selBuf [maxMoESlots]int // the slots in the range, in slot order
	sel := selBuf[:0]
	for i, e := range s.choice[:n*k] {
		if e >= e0 && e < e1 {
			sel = append(sel, i)
		}
	}
	slots := len(sel)
	const rg = ops.RowGroup
	t0 := b.lapStart()
	if slots == 0 {
		for t := range n {
			clear(out(t)[:emb])
		}
		return
	}
	var rowBuf [maxMoESlots]int
	var groupBuf [maxMoESlots]slotGroup
	rows := rowBuf[:slots]
	groups := groupSlots(s.choice, sel, groupBuf[:0], rows)
	xq := gate0.QuantizeActs(b.pool, x, n, b.scratch)
	ab := gate0.Kernel.ActRowBytes(emb)
	db := down0.Kernel.ActRowBytes(ff)
	xd := s.downAct[:slots*db]
	// A group's inputs: its one token's row, or its tokens' rows copied
	// together.
	var actBuf [maxMoESlots][]byte
	acts := actBuf[:len(groups)]
	for gi, g := range groups {
		if g.n == 1 {
			t := sel[g.first] / k
			acts[gi] = xq[t*ab : (t+1)*ab]
			continue
		}
		xg := s.groupAct[g.row*ab : (g.row+g.n)*ab]
		for j, i := range sel {
			if r := rows[j]; r >= g.row && r < g.row+g.n {
				t := i / k
				copy(xg[(r-g.row)*ab:], xq[t*ab:(t+1)*ab])
			}
		}
		acts[gi] = xg
	}

	// Gate and up: group gi's units are its gate's row groups [0, rgs),
	// then its up's [rgs, 2rgs).
	rgs := (ff + rg - 1) / rg
	for gi := range groups {
		s.gateLeft[gi].Store(int32(2 * rgs))
	}
	minUnits := max(1, moeChunkBytes/(rg*gate0.Kernel.RowBytes(emb)))
	b.pool.RunChunks(len(groups)*2*rgs, minUnits, func(lo, hi int) {
		for gi := lo / (2 * rgs); gi*2*rgs < hi; gi++ {
			a, z := max(lo-gi*2*rgs, 0), min(hi-gi*2*rgs, 2*rgs)
			g := groups[gi]
			gate, up := s.gate[g.row*ff:(g.row+g.n)*ff], s.up[g.row*ff:(g.row+g.n)*ff]
			if a < rgs {
				b.w.Of(op.Gate).Stack[g.expert].MulRows(a*rg, min(min(z, rgs)*rg, ff), acts[gi], g.n, gate, ff)
			}
			if z > rgs {
				b.w.Of(op.Up).Stack[g.expert].MulRows((max(a, rgs)-rgs)*rg, min((z-rgs)*rg, ff), acts[gi], g.n, up, ff)
			}
			// The atomic orders the other threads' rows of this group
			// before the last one's reading them.
			if s.gateLeft[gi].Add(-int32(z-a)) == 0 {
				for q := range g.n {
					gq, uq := gate[q*ff:(q+1)*ff], up[q*ff:(q+1)*ff]
					ops.SwiGLU(gq, gq, uq)
					down0.Kernel.QuantizeAct(xd[(g.row+q)*db:(g.row+q+1)*db], gq)
				}
			}
		}
	})
	t0 = b.lap(n, "moe > gate+up, swiglu", t0)

	// Down: group gi's units are its down product's row groups [0, gd).
	// The countdowns are per moeSumRows rows (an atomic add per group
	// would cost as much as the sum).
	gd := (emb + rg - 1) / rg
	const bg = moeSumRows / rg // row groups per countdown
	for c := range (gd + bg - 1) / bg {
		s.downLeft[c].Store(int32(len(groups) * min(bg, gd-c*bg)))
	}
	minUnits = max(1, moeChunkBytes/(rg*down0.Kernel.RowBytes(ff)))
	b.pool.RunChunks(len(groups)*gd, minUnits, func(lo, hi int) {
		for gi := lo / gd; gi*gd < hi; gi++ {
			a, z := max(lo-gi*gd, 0), min(hi-gi*gd, gd)
			g := groups[gi]
			b.w.Of(op.Down).Stack[g.expert].MulRows(a*rg, min(z*rg, emb), xd[g.row*db:(g.row+g.n)*db], g.n, s.down[g.row*emb:(g.row+g.n)*emb], emb)
			for c := a / bg; c*bg < z; c++ {
				done := min(z, (c+1)*bg) - max(a, c*bg)
				if s.downLeft[c].Add(-int32(done)) == 0 {
					b.sumSlotRows(op, n, c*moeSumRows, min((c+1)*moeSumRows, emb), sel, rows, out)
				}
			}
		}
	})
	b.lap(n, "moe > down, sum", t0)
}

// sumSlotRows writes output rows [r0, r1) of each of n tokens: its slots'
// down products (slot sel[j]'s in s.down row rows[j]) times their weights,
// added in slot order; zeros for a token without a slot in sel. The
// conversions keep every product rounded before its add, as the expert
// loop's separate passes do (moeLoop, moeSum).
func (b *Backend) sumSlotRows(op *ir.Op, n, r0, r1 int, sel, rows []int, out func(t int) []float32) {
	s := &b.moe
	k, emb := op.TopK, b.w.Of(op.Gate).Stack[0].Cols
	j := 0 // sel's first slot of token t
	for t := 0; t < n; t++ {
		o := out(t)[r0:r1]
		first := true
		for ; j < len(sel) && sel[j] < (t+1)*k; j++ {
			addSlot(o, s.down[rows[j]*emb+r0:rows[j]*emb+r1], s.weight[sel[j]], first)
			first = false
		}
		if first {
			clear(o)
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

func (s *moeScratch) grow(ws *Weights, batch int, op *ir.Op) {
	ne, k := ws.Of(op.W).Rows, op.TopK
	emb, ff := ws.Of(op.Gate).Stack[0].Cols, ws.Of(op.Gate).Stack[0].Rows
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
	if n := batch * k * ws.Of(op.Down).Stack[0].Kernel.ActRowBytes(ff); len(s.downAct) < n {
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
		if n := batch * k * ws.Of(op.Gate).Stack[0].Kernel.ActRowBytes(emb); len(s.groupAct) < n {
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
func (b *Backend) moeFFN(op *ir.Op, bt *ir.Batch, n int) error {
	s := &b.moe
	ne, k := b.w.Of(op.W).Rows, op.TopK
	emb := b.w.Of(op.Gate).Stack[0].Cols
	t0 := b.lapStart()
	b.w.Of(op.W).Mul(b.pool, b.bufs[op.In][:n*emb], n, s.probs, ne, b.scratch)
	t0 = b.lap(n, "moe > router", t0)
	var logits []float32
	if b.routeInspector != nil {
		logits = slices.Clone(s.probs[:n*ne]) // Route turns them into probabilities in place
	}
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
	if b.routeInspector != nil {
		if err := b.inspectRoute(op, bt, n, logits); err != nil {
			return err
		}
	}
	if gate0 := b.w.Of(op.Gate).Stack[0]; b.w.Of(op.Up).Stack[0].Kernel.ActType == gate0.Kernel.ActType {
		if n*k <= maxMoESlots {
			b.moeSlots(op, n)
		} else {
			b.moeGrouped(op, n)
		}
		return nil
	}
	b.moeLoop(op, n)
	return nil
}

// InspectRoutes sets f to receive the routing of every MoE op this
// backend runs from now on, in execution order (nil: stop), for tests: f
// may impose another choice (backend.RouteInspector). f runs inside Run.
func (b *Backend) InspectRoutes(f backend.RouteInspector) { b.routeInspector = f }

// inspectRoute hands the routing of op over n tokens (its router logits
// before the softmax) to the inspector, and takes the inspector's choice
// when it imposes one.
func (b *Backend) inspectRoute(op *ir.Op, bt *ir.Batch, n int, logits []float32) error {
	s := &b.moe
	ne, k := b.w.Of(op.W).Rows, op.TopK
	r := backend.RouteRecord{Op: b.prog.OpIndex(op), Layer: op.Layer, NTok: n, NExpert: ne, TopK: k, Pos0: int(bt.Pos[0]),
		Logits: logits, IDs: make([]int32, n*k), Weights: slices.Clone(s.weight[:n*k])}
	for i, e := range s.choice[:n*k] {
		r.IDs[i] = int32(e)
	}
	if !b.routeInspector(&r) {
		return nil
	}
	if err := r.CheckImposed(); err != nil {
		return err
	}
	for i, e := range r.IDs {
		s.choice[i] = int(e)
	}
	copy(s.weight[:n*k], r.Weights)
	return nil
}

// moeLoop runs the experts one by one, each over the tokens that chose it
// (the choice made by moeFFN's routing).
func (b *Backend) moeLoop(op *ir.Op, n int) {
	s := &b.moe
	ne, k := b.w.Of(op.W).Rows, op.TopK
	emb := b.w.Of(op.Gate).Stack[0].Cols
	ff := b.w.Of(op.Gate).Stack[0].Rows
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
		gate, up, down := b.w.Of(op.Gate).Stack[e], b.w.Of(op.Up).Stack[e], b.w.Of(op.Down).Stack[e]
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
	k, emb := op.TopK, b.w.Of(op.Gate).Stack[0].Cols
	for t := 0; t < n; t++ {
		out := b.row(op.Out, t)
		copy(out, s.results[t*k*emb:(t*k+1)*emb])
		for j := 1; j < k; j++ {
			ops.AddTo(out, s.results[(t*k+j)*emb:(t*k+j+1)*emb])
		}
	}
}
