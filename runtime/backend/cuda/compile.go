package cuda

import (
	"fmt"
	"strings"
	"time"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
)

// compile turns the program's ops into g.steps. It matches op patterns and
// never looks at the architecture. A decode step of a dense 40-layer model
// is ~800 launches unfused, and at a few µs each the launches, not the
// weights, would set the pace; so:
//   - matrix products reading the same input (Q, K, V; gate, up) form a
//     group that converts the input once (preparedOps);
//   - a norm or SwiGLU whose output feeds such a group writes the Q8_1
//     form itself when the group reads Q8_1 (decode), so the group
//     converts nothing (q8Link);
//   - a residual add and the norm after it are one kernel, and the MoE
//     weighted sum of expert outputs joins that add;
//   - the head norms and rotations of Q and K are one launch, which also
//     writes K and V to the cache when the attention follows.
//
// split maps the MoE ops split with the host to the first expert the GPU
// computes (SegmentSpec.Split).
func (g *Exec) compile(lo, hi int, resolve func(*ir.Weight) (*mat, error), split map[int]int) ([]step, error) {
	ops := g.prog.Ops
	g.resolve = resolve
	defer func() { g.resolve = nil }()
	for i := lo; i < hi; i++ {
		if i > 0 && ops[i-1].Output && !ops[i].Output {
			return nil, fmt.Errorf("gpu: op %d (%s) follows the output head: the head must be the program's tail", i, ops[i].Kind)
		}
	}
	var steps []step
	appendStep := func(st step, i int, op *ir.Op) {
		st.op, st.output = i, op.Output
		if st.name == "" {
			st.name = op.Kind.String()
		}
		steps = append(steps, st)
	}
	kvStored := map[int]bool{} // attention ops whose cache write a rope step did
	for i := lo; i < hi; {
		op := &ops[i]
		var st step
		var err error
		used := 1
		switch op.Kind {
		case ir.OpAdd:
			if i+1 < hi && g.fusesAddNorm(op, &ops[i+1]) {
				st, used = g.normExStep(op, &ops[i+1], nil), 2
			} else {
				st = g.addStep(op)
			}
		case ir.OpHeadNorm, ir.OpRoPE:
			st, used, err = g.ropeStep(i, hi, kvStored)
		case ir.OpEmbed:
			st, err = g.embedStep(op)
		case ir.OpNorm:
			st = g.normExStep(nil, op, nil)
		case ir.OpMatMul:
			used = g.matMulGroupLen(i, hi)
			st, err = g.groupStep(ops[i : i+used])
		case ir.OpAttention:
			st = g.attentionStep(op, !kvStored[i])
		case ir.OpSwiGLU:
			st = g.swigluStep(op)
		case ir.OpMoE:
			// The weighted sum of the experts' outputs joins the residual
			// add after it (and the norm after that) when they follow.
			ks := split[i]
			fuse := ks == 0 && i+1 < hi && g.takesMoESum(op, &ops[i+1])
			if st, err = g.moeStep(op, !fuse, ks); err == nil && fuse {
				appendStep(st, i, op)
				add := &ops[i+1]
				var norm *ir.Op
				if i+2 < hi && g.fusesAddNorm(add, &ops[i+2]) {
					norm = &ops[i+2]
				}
				st = g.normExStep(add, norm, op)
				i++
				if norm != nil {
					used = 2
				}
				op = add
			}
		default:
			err = fmt.Errorf("op %v has no GPU implementation", op.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("gpu: op %d (%s, layer %d): %w", i, op.Kind, op.Layer, err)
		}
		appendStep(st, i, op)
		i += used
	}
	// Link each producer of a group's input to the group.
	for i := 0; i+1 < len(steps); i++ {
		p, c := &steps[i], &steps[i+1]
		if p.link != nil && c.group != nil && c.group.in == p.out && p.output == c.output {
			p.link.group = c.group
			c.group.fedQ8 = true
		}
	}
	return steps, nil
}

// step is one launch group of a compiled segment.
type step struct {
	name   string // op kinds it runs, for errors
	op     int    // index of its first op
	output bool   // part of the output head
	run    func(s *cudadrv.Stream, n int) error

	out   ir.BufID // with link: the buffer the step writes for the next
	link  *q8Link  // set on steps that can also write their output as Q8_1
	group *group   // set on matrix-product groups
}

// StepNames compiles ops [lo, hi) of p against made-up device pointers
// and returns the names of its steps with the ops they start at: the
// fusions the backend makes, without a device (for tests and reports).
func StepNames(p *ir.Program, lo, hi int) ([]string, []int, error) {
	g := &Exec{prog: p, w: &quantOps{}}
	fake := cudadrv.DevicePtr(1 << 20)
	next := func() cudadrv.DevicePtr { fake += 1 << 12; return fake }
	g.bufs = make([]cudadrv.DevicePtr, len(p.Bufs))
	for i := range g.bufs {
		g.bufs[i] = next()
	}
	g.kvK, g.kvV = make([]cudadrv.DevicePtr, p.Hyper.NLayer), make([]cudadrv.DevicePtr, p.Hyper.NLayer)
	for l := range g.kvK {
		g.kvK[l], g.kvV[l] = next(), next()
	}
	g.dIn = next()
	g.ws = &weightSet{mats: map[*ir.Weight]*mat{}, vecs: map[*ir.Weight]cudadrv.DevicePtr{}, ropes: map[*ir.Rope]cudadrv.DevicePtr{}}
	for _, w := range programWeights(p) {
		if isVector(w) {
			g.ws.vecs[w] = next()
		} else {
			m := matOf(w, next())
			g.ws.mats[w] = &m
		}
	}
	steps, err := g.compile(lo, hi, func(w *ir.Weight) (*mat, error) { return g.ws.mats[w], nil }, nil)
	if err != nil {
		return nil, nil, err
	}
	var names []string
	var first []int
	for _, st := range steps {
		name := st.name
		if st.group != nil && st.group.fedQ8 {
			name += " (Q8_1 fed)"
		}
		names = append(names, name)
		first = append(first, st.op)
	}
	return names, first, nil
}

// layerless drops the "blk.N." of a tensor name: profiles sum by role.
func layerless(name string) string {
	if rest, ok := strings.CutPrefix(name, "blk."); ok {
		if _, after, ok := strings.Cut(rest, "."); ok {
			return after
		}
	}
	return name
}

func (g *Exec) width(id ir.BufID) int { return g.prog.Bufs[id].Width }

// vec is the device pointer of a 1-D weight, 0 for none.
func (g *Exec) vec(w *ir.Weight) cudadrv.DevicePtr {
	if w == nil {
		return 0
	}
	return g.ws.vecs[w]
}

// weight is the device matrix of w: resident, or the ring region it streams
// into (Compile's resolver).
func (g *Exec) weight(w *ir.Weight) (*mat, error) {
	m, err := g.resolve(w)
	if err != nil {
		return nil, err
	}
	if m == nil {
		return nil, fmt.Errorf("weight %q is not on the device", w.Name)
	}
	return m, nil
}

// group is a run of matrix products that read the same input buffer.
type group struct {
	in      ir.BufID
	x       cudadrv.DevicePtr
	cols    int
	members []groupMember
	// fedQ8 is set when the step before writes the input's Q8_1 form
	// into g.act whenever the group reads Q8_1 (see q8Ready).
	fedQ8 bool
	// moe marks the input of an MoE op's expert products (gate, up; down
	// reads SwiGLU's output): members are asked MoEInputFormat.
	moe bool
	// The members as one launch takes them (groupedOps), when oneLaunch.
	mats []*mat
	outs []cudadrv.DevicePtr
	lds  []int
}

// oneLaunch says whether the group's Q8_1 products may share one launch:
// the weight ops can, the members are resident (a streamed one waits for
// its own upload) and add no bias.
func (grp *group) oneLaunch() bool {
	return grp.mats != nil
}

// prepareOneLaunch fills mats, outs and lds when the members qualify.
func (g *Exec) prepareOneLaunch(grp *group) {
	if _, ok := g.w.(groupedOps); !ok || len(grp.members) < 2 || len(grp.members) > kernels.MaxMatVecGroup {
		return
	}
	for _, mb := range grp.members {
		if mb.m.seq >= 0 || mb.bias != 0 {
			return
		}
	}
	for _, mb := range grp.members {
		grp.mats = append(grp.mats, mb.m)
		grp.outs = append(grp.outs, mb.out)
		grp.lds = append(grp.lds, mb.ld)
	}
}

type groupMember struct {
	m    *mat
	out  cudadrv.DevicePtr
	ld   int
	bias cudadrv.DevicePtr
}

// groupedOps is implemented by weight ops that run several products of
// one prepared Q8_1 input in one launch (one launch where there were one
// per matrix: decode is a chain of short launches). They answer false,
// having queued nothing, when the matrices cannot share one.
type groupedOps interface {
	MatMulPreparedGroup(s *cudadrv.Stream, ms []*mat, xq cudadrv.DevicePtr, nTok int, outs []cudadrv.DevicePtr, lds []int) (bool, error)
	MoEMatMulPreparedGroup(s *cudadrv.Stream, ms []*mat, xq, ids cudadrv.DevicePtr, nTok, topK int, outs []cudadrv.DevicePtr) (bool, error)
}

// q8Link is how a step that produces a group's input learns, at run time,
// that it should also write the input's Q8_1 form (set by compile).
type q8Link struct{ group *group }

// format is the input format the group's products read at nTok tokens,
// actMixed when they differ (or the weight kernels take float32 only).
func (g *Exec) format(grp *group, nTok int) actFormat {
	p, ok := g.w.(preparedOps)
	if !ok {
		return actMixed
	}
	in := p.InputFormat
	if grp.moe {
		pm, ok := g.w.(moePreparedOps)
		if !ok {
			return actMixed
		}
		in = pm.MoEInputFormat
	}
	f := in(grp.members[0].m, nTok)
	for _, mb := range grp.members[1:] {
		if in(mb.m, nTok) != f {
			return actMixed
		}
	}
	if f == actQ8_1 && nTok > kernels.MatVecMaxTokens && !grp.moe && (g.batch == nil || !g.batch.Decode()) {
		// Beyond one matvec launch, only the decode rows of many
		// sequences take the matvec in runs (its cost grows with the
		// rows); prompt chunks keep the tensor cores' f16 activations,
		// whose rounding the oracles' margins were measured with.
		return actF16
	}
	return f
}

// q8Ready says whether, at nTok tokens, the group reads Q8_1 and its
// producer writes that form (the producer and the group ask the same).
func (g *Exec) q8Ready(grp *group, nTok int) bool {
	return grp != nil && grp.fedQ8 && grp.cols%32 == 0 && g.format(grp, nTok) == actQ8_1
}

// matMulGroupLen is how many matrix products from ops[i] on read ops[i].In
// and write other buffers, none of which a later member reads.
func (g *Exec) matMulGroupLen(i, hi int) int {
	ops := g.prog.Ops
	first := &ops[i]
	outs := map[ir.BufID]bool{}
	n := 0
	for j := i; j < hi; j++ {
		op := &ops[j]
		if op.Kind != ir.OpMatMul || op.In != first.In || op.Out == first.In || outs[op.Out] || op.Output != first.Output {
			break
		}
		outs[op.Out] = true
		n++
	}
	return max(n, 1)
}

func (g *Exec) groupStep(ops []ir.Op) (step, error) {
	grp := &group{in: ops[0].In, x: g.bufs[ops[0].In], cols: g.width(ops[0].In)}
	var names []string
	for i := range ops {
		op := &ops[i]
		m, err := g.weight(op.W)
		if err != nil {
			return step{}, err
		}
		grp.members = append(grp.members, groupMember{m: m, out: g.bufs[op.Out], ld: g.width(op.Out), bias: g.vec(op.Bias)})
		name := layerless(op.W.Name)
		if op.Bias != nil {
			name += "+bias"
		}
		names = append(names, name)
	}
	g.prepareOneLaunch(grp)
	return step{name: "matmul " + strings.Join(names, ","), group: grp, run: func(s *cudadrv.Stream, n int) error {
		return g.runGroup(s, grp, n)
	}}, nil
}

func (g *Exec) runGroup(s *cudadrv.Stream, grp *group, n int) error {
	f := g.format(grp, n)
	if f == actMixed {
		for _, mb := range grp.members {
			if err := g.with(s, mb.m, func() error { return g.w.MatMul(s, mb.m, grp.x, n, mb.out, mb.ld, g.scratch) }); err != nil {
				return err
			}
			if err := g.addBias(s, mb, n); err != nil {
				return err
			}
		}
		return nil
	}
	p := g.w.(preparedOps)
	x := grp.x
	if f != actF32 {
		if !g.q8Ready(grp, n) { // else the producer wrote g.act
			if err := p.Prepare(s, f, grp.x, n, grp.cols, g.act); err != nil {
				return err
			}
		}
		x = g.act
	}
	if f == actQ8_1 && grp.oneLaunch() {
		if done, err := g.w.(groupedOps).MatMulPreparedGroup(s, grp.mats, x, n, grp.outs, grp.lds); done || err != nil {
			return err
		}
	}
	if mp, ok := g.w.(multiPreparedOps); ok && f == actF16 {
		return g.runGroupMulti(s, grp, mp, x, n)
	}
	for _, mb := range grp.members {
		if err := g.with(s, mb.m, func() error { return p.MatMulPrepared(s, mb.m, f, x, n, mb.out, mb.ld) }); err != nil {
			return err
		}
		if err := g.addBias(s, mb, n); err != nil {
			return err
		}
	}
	return nil
}

// multiPreparedOps is implemented by weight kernels that can run several
// f16 products on one input as one launch (MatMulF16Multi).
type multiPreparedOps interface {
	// MultiMax is how many products one launch takes; MultiFits whether
	// a and b may share one.
	MultiMax() int
	MultiFits(a, b *mat) bool
	MatMulF16Multi(s *cudadrv.Stream, ms []*mat, x cudadrv.DevicePtr, nTok int, outs []cudadrv.DevicePtr, lds []int) error
}

// runGroupMulti runs a group's f16 products (input prepared at x), with
// runs of consecutive resident members that fit one launch (attn_q and
// attn_k, or all three; ffn_gate and ffn_up) launched together: each
// alone would leave part of a wave of the GPU idle. Streamed members run
// alone, between their acquire and release.
func (g *Exec) runGroupMulti(s *cudadrv.Stream, grp *group, mp multiPreparedOps, x cudadrv.DevicePtr, n int) error {
	p := g.w.(preparedOps)
	mbs := grp.members
	for i := 0; i < len(mbs); {
		j := i + 1
		if mbs[i].m.seq < 0 {
			for j < len(mbs) && j-i < mp.MultiMax() && mbs[j].m.seq < 0 && mp.MultiFits(mbs[i].m, mbs[j].m) {
				j++
			}
		}
		if j == i+1 {
			mb := mbs[i]
			if err := g.with(s, mb.m, func() error { return p.MatMulPrepared(s, mb.m, actF16, x, n, mb.out, mb.ld) }); err != nil {
				return err
			}
		} else {
			var ms [8]*mat
			var outs [8]cudadrv.DevicePtr
			var lds [8]int
			for k := i; k < j; k++ {
				ms[k-i], outs[k-i], lds[k-i] = mbs[k].m, mbs[k].out, mbs[k].ld
			}
			if err := mp.MatMulF16Multi(s, ms[:j-i], x, n, outs[:j-i], lds[:j-i]); err != nil {
				return err
			}
		}
		for k := i; k < j; k++ {
			if err := g.addBias(s, mbs[k], n); err != nil {
				return err
			}
		}
		i = j
	}
	return nil
}

func (g *Exec) addBias(s *cudadrv.Stream, mb groupMember, n int) error {
	if mb.bias == 0 {
		return nil
	}
	return g.dev.glu.AddBias(s, mb.out, mb.bias, mb.m.Rows, n)
}

func (g *Exec) fusesAddNorm(add, norm *ir.Op) bool {
	return add.Kind == ir.OpAdd && norm.Kind == ir.OpNorm && norm.In == add.Out && add.Output == norm.Output &&
		norm.Out != add.Out && norm.Out != add.In && norm.Out != add.In2
}

// takesMoESum says whether the add after an MoE op can take the weighted
// sum of the experts' outputs in place of the MoE op's output buffer.
func (g *Exec) takesMoESum(moe, add *ir.Op) bool {
	return add.Kind == ir.OpAdd && (add.In == moe.Out) != (add.In2 == moe.Out) && add.Output == moe.Output
}

func (g *Exec) addStep(op *ir.Op) step {
	out, a, b, w := g.bufs[op.Out], g.bufs[op.In], g.bufs[op.In2], g.width(op.Out)
	return step{run: func(s *cudadrv.Stream, n int) error {
		return g.dev.elem.AddF32(s, out, a, b, n*w)
	}}
}

// normExStep compiles, into one rms_norm_ex launch, a norm alone (add and
// moe nil), an add with the norm of its sum, an add alone (norm nil) whose
// term is an MoE op's weighted sum (moe set), or all three.
func (g *Exec) normExStep(add, norm, moe *ir.Op) step {
	var a kernels.NormEx
	var name []string
	st := step{out: -1}
	if add != nil {
		a.Sum = g.bufs[add.Out]
		other, term := add.In, add.In2
		if moe != nil && add.In == moe.Out {
			other, term = add.In2, add.In
		}
		a.A, a.B, a.Cols = g.bufs[other], g.bufs[term], g.width(add.Out)
		if moe != nil {
			// The sum's term is Σ_j y_j·w_j over the slots; it is also
			// stored in the MoE op's output buffer, as the op would have.
			a.B, a.Y, a.YW, a.K, a.BOut = 0, g.moe.down, g.moe.weights, moe.TopK, g.bufs[moe.Out]
			name = append(name, "moe_sum")
		}
		name = append(name, "add")
	}
	if norm != nil {
		if add == nil {
			a.A, a.Cols = g.bufs[norm.In], g.width(norm.In)
		}
		a.Dst, a.W, a.Eps = g.bufs[norm.Out], g.vec(norm.W), norm.Eps
		st.out, st.link = norm.Out, &q8Link{}
		name = append(name, "norm")
	}
	st.name = strings.Join(name, "+")
	link := st.link
	st.run = func(s *cudadrv.Stream, n int) error {
		a := a
		a.Rows = n
		if link != nil && g.q8Ready(link.group, n) {
			a.Q8 = g.act
		}
		if add == nil && moe == nil && a.Q8 == 0 {
			return g.dev.norm.RMSNorm(s, a.Dst, a.A, a.W, a.Cols, a.Eps, n)
		}
		return g.dev.norm.RMSNormEx(s, &a)
	}
	return st
}

func (g *Exec) embedStep(op *ir.Op) (step, error) {
	m, err := g.weight(op.W)
	if err != nil {
		return step{}, err
	}
	out, ids := g.bufs[op.Out], g.dIn.Add(4*g.inLay.tokens)
	return step{run: func(s *cudadrv.Stream, n int) error {
		return g.with(s, m, func() error { return g.w.GetRows(s, m, ids, n, out) })
	}}, nil
}

func (g *Exec) swigluStep(op *ir.Op) step {
	out, w := g.bufs[op.Out], g.width(op.Out)
	gate, up, ld := g.bufs[op.In], cudadrv.DevicePtr(0), w
	if op.In2 < 0 {
		up, ld = gate.Add(4*w), 2*w // both halves of one row
	} else {
		up = g.bufs[op.In2]
	}
	link := &q8Link{}
	return step{out: op.Out, link: link, run: func(s *cudadrv.Stream, n int) error {
		if g.q8Ready(link.group, n) {
			return g.dev.glu.SwiGLUQ8(s, out, gate, up, w, ld, n, g.act)
		}
		return g.dev.glu.SwiGLU(s, out, gate, up, w, ld, n)
	}}
}

func (g *Exec) attentionStep(op *ir.Op, store bool) step {
	a := op.Attn
	width := a.NKVHeads * a.HeadSize
	cache := kernels.KVCache{K: g.kvK[op.Layer], V: g.kvV[op.Layer], Type: g.kvType, Width: width}
	q, k, v, out := g.bufs[op.In], g.bufs[op.In2], g.bufs[op.In3], g.bufs[op.Out]
	qRow := 4 * a.NHeads * a.HeadSize // bytes of a query (and an output) row
	name := "attention"
	if store {
		name = "kv_store+attention"
	}
	// The output projection's Q8_1 input can come from the attention's
	// epilogue when a head is whole blocks of 32.
	var link *q8Link
	if a.HeadSize%32 == 0 {
		link = &q8Link{}
	}
	// A quantized cache holds its keys and values rotated (llama.cpp's
	// Walsh-Hadamard rotation, as the CPU's): the step rotates the keys
	// and the queries alike, the values, and its outputs back.
	rotK, rotV := g.kvRotation(a)
	qw := a.NHeads * a.HeadSize
	if rotK > 0 {
		name = "rotate+" + name + "+rotate"
	}
	return step{name: name, out: op.Out, link: link, run: func(s *cudadrv.Stream, n int) error {
		if rotK > 0 {
			for _, r := range []struct {
				x        cudadrv.DevicePtr
				w, chunk int
			}{{q, qw, rotK}, {k, width, rotK}, {v, width, rotV}} {
				if err := g.dev.elem.FWHT(s, r.x, n*r.w/r.chunk, r.chunk); err != nil {
					return err
				}
			}
		}
		if store {
			if err := g.dev.attn.StoreKV(s, &kernels.StoreKVArgs{Cache: cache, Batch: &g.kvb, K: k, V: v, NTok: n}); err != nil {
				return err
			}
		}
		plan := &g.plan
		q8 := link != nil && g.q8Ready(link.group, n)
		// The epilogue writes the Q8_1 rows of its own launch: one launch
		// must cover the step (and the outputs need no rotation back),
		// else the rows are quantized afterwards.
		one := rotV == 0 && ((plan.decode == n && len(plan.chunks) == 0) || (plan.decode == 0 && len(plan.chunks) == 1))
		if plan.decode > 0 {
			d := plan.decode
			args := kernels.DecodeKVArgs{Out: out, Q: q, Cache: cache, Batch: &g.kvb, NTok: d,
				NHeads: a.NHeads, NKV: a.NKVHeads, HeadSize: a.HeadSize, Scale: a.Scale}
			if splits, chunk := g.decodeSplits(d); splits > 1 {
				args.Splits, args.Chunk, args.Part, args.ML = splits, chunk, g.attn.part, g.attn.ml
			}
			if q8 && one {
				args.Q8 = g.act
			}
			if err := g.dev.attn.DecodeKV(s, &args); err != nil {
				return err
			}
		}
		for _, c := range plan.chunks {
			args := kernels.AttnArgs{Out: out.Add(c.lo * qRow), Q: q.Add(c.lo * qRow), Pos0: g.kvb.Pos.Add(4 * c.lo),
				NTok: c.hi - c.lo, NHeads: a.NHeads, NKV: a.NKVHeads, HeadSize: a.HeadSize, Scale: a.Scale}
			if c.first >= 0 { // the sequence's cells in order: the cache itself
				args.K, args.V = cache.K.Add(c.first*2*width), cache.V.Add(c.first*2*width)
			} else {
				if err := g.dev.attn.GatherKV(s, &kernels.GatherKVArgs{Cache: cache, Batch: &g.kvb, Tok: c.hi - 1,
					MaxLen: g.cfg.KV.Rows, K: g.gatherK, V: g.gatherV}); err != nil {
					return err
				}
				args.K, args.V = g.gatherK, g.gatherV
			}
			if q8 && one {
				args.Q8 = g.act
			}
			if err := g.dev.attn.Run(s, &args); err != nil {
				return err
			}
		}
		if rotV > 0 {
			if err := g.dev.elem.FWHT(s, out, n*qw/rotV, rotV); err != nil {
				return err
			}
		}
		if q8 && !one {
			return g.w.(preparedOps).Prepare(s, actQ8_1, out, n, qw, g.act)
		}
		return nil
	}}
}

// kvRotation is the rotation of the cache's keys (and the queries) and
// values for attention a: the CPU's rule (ops.KVRotation), on the GPU's
// cache type.
func (g *Exec) kvRotation(a *ir.Attention) (k, v int) {
	if g.kvType != kernels.KVQ8_0 {
		return 0, 0
	}
	return ops.KVRotation(ops.KVQ8_0, a.HeadSize)
}

// ropeTensor is one buffer of a rope/head-norm group.
type ropeTensor struct {
	buf      ir.BufID
	heads    int
	norm     *ir.Weight
	rope     *ir.Rope
	headSize int
	eps      float32
}

// ropeStep compiles ops[i], a head norm or a rotation, together with the
// head norms and rotations right after it when they fit one rope_norm
// launch: at most two buffers, each normalised at most once and then
// rotated at most once, all with the same rope and head size, either all
// rotated or none. When the attention op that reads them comes next, the
// launch also writes its keys and values to the cache (kvStored). It
// returns the step and how many ops it covers.
func (g *Exec) ropeStep(i, hi int, kvStored map[int]bool) (step, int, error) {
	ops := g.prog.Ops
	// valid: the tensors agree on what they share; a tensor not yet rotated
	// (or normalised) may still be, by a later op of the group.
	valid := func(ts []ropeTensor) bool {
		for _, t := range ts {
			for _, u := range ts {
				if t.headSize != u.headSize || (t.rope != nil && u.rope != nil && t.rope != u.rope) ||
					(t.norm != nil && u.norm != nil && t.eps != u.eps) {
					return false
				}
			}
		}
		return true
	}
	var ts, pending []ropeTensor // the launch so far; the ops scanned so far
	used := 0
	for j := i; j < hi && (ops[j].Kind == ir.OpHeadNorm || ops[j].Kind == ir.OpRoPE) && ops[j].Output == ops[i].Output; j++ {
		op := &ops[j]
		next := append([]ropeTensor(nil), pending...)
		k := -1
		for x := range next {
			if next[x].buf == op.In {
				k = x
			}
		}
		if k < 0 {
			next = append(next, ropeTensor{buf: op.In, heads: op.Heads, headSize: op.HeadSize})
			k = len(next) - 1
		}
		t := &next[k]
		ok := len(next) <= 2 && t.heads == op.Heads && t.headSize == op.HeadSize
		if op.Kind == ir.OpHeadNorm {
			ok = ok && t.norm == nil && t.rope == nil && op.W != nil
			t.norm, t.eps = op.W, op.Eps
		} else {
			ok = ok && t.rope == nil
			t.rope = op.Rope
		}
		if !ok || !valid(next) {
			break
		}
		// Keep the longest prefix that is a launch by itself: rotated and
		// unrotated buffers cannot share one.
		mixed := false
		for _, t := range next {
			mixed = mixed || (t.rope == nil) != (next[0].rope == nil)
		}
		if !mixed {
			ts, used = next, j-i+1
		}
		pending = next
	}
	if used == 0 {
		// ops[i] alone always fits.
		op := &ops[i]
		t := ropeTensor{buf: op.In, heads: op.Heads, headSize: op.HeadSize}
		if op.Kind == ir.OpHeadNorm {
			if op.W == nil {
				return step{}, 0, fmt.Errorf("head norm without a weight")
			}
			t.norm, t.eps = op.W, op.Eps
		} else {
			t.rope = op.Rope
		}
		ts, used = []ropeTensor{t}, 1
	}
	args := kernels.RopeArgs{NTensors: len(ts), HeadSize: ts[0].headSize, Batch: &g.kvb}
	var name []string
	for x, t := range ts {
		args.T[x] = kernels.RopeTensor{X: g.bufs[t.buf], Heads: t.heads, NormW: g.vec(t.norm)}
		if t.norm != nil {
			args.Eps = t.eps
			name = append(name, "head_norm")
		}
	}
	if r := ts[0].rope; r != nil {
		args.Dims, args.NeoX, args.Base, args.FreqScale = r.Dims, r.NeoX, r.Base, r.FreqScale
		if r.Factors != nil {
			args.Factors = g.ws.ropes[r]
		}
		name = append(name, "rope")
	}
	// The cache write of the attention right after, when it reads these
	// keys: the values were computed before (they are not in this launch).
	if j := i + used; j < hi && ops[j].Kind == ir.OpAttention && ops[j].Output == ops[i].Output {
		at := &ops[j]
		for x, t := range ts {
			if rk, _ := g.kvRotation(at.Attn); t.buf == at.In2 && t.heads*t.headSize == at.Attn.NKVHeads*at.Attn.HeadSize && t.buf != at.In3 && (g.kvType == kernels.KVF16 || t.headSize%32 == 0) && rk == 0 {
				cache := &kernels.KVCache{K: g.kvK[at.Layer], V: g.kvV[at.Layer], Type: g.kvType, Width: at.Attn.NKVHeads * at.Attn.HeadSize}
				args.KV = &kernels.RopeKV{T: x, V: g.bufs[at.In3], Cache: cache}
				kvStored[j] = true
				name = append(name, "kv_store")
			}
		}
	}
	return step{name: fmt.Sprintf("%s ×%d", strings.Join(name, "+"), len(ts)), run: func(s *cudadrv.Stream, n int) error {
		a := args
		a.NTok = n
		return g.dev.rope.Run(s, &a)
	}}, used, nil
}

// moeStep compiles an MoE op; without sum, it leaves the weighted sum of
// the experts' outputs to the next step (normExStep).
func (g *Exec) moeStep(op *ir.Op, sum bool, ks int) (step, error) {
	router, err := g.weight(op.W)
	if err != nil {
		return step{}, err
	}
	gate, err := g.weight(op.Gate)
	if err != nil {
		return step{}, err
	}
	up, err := g.weight(op.Up)
	if err != nil {
		return step{}, err
	}
	down, err := g.weight(op.Down)
	if err != nil {
		return step{}, err
	}
	in, out := g.bufs[op.In], g.bufs[op.Out]
	ne, k, ff, emb := router.Rows, op.TopK, gate.Rows, down.Rows
	if ne > kernels.MaxExperts || k > kernels.MaxTopK {
		return step{}, fmt.Errorf("top %d of %d experts: the routing kernel takes up to %d of %d", k, ne, kernels.MaxTopK, kernels.MaxExperts)
	}
	m, w, d := &g.moe, g.w, g.dev
	grp := &group{in: op.In, x: in, cols: emb, moe: true,
		members: []groupMember{{m: gate}, {m: up}, {m: down}}}
	// Gate and up share a launch when both are resident.
	gu, _ := w.(groupedOps)
	if gate.seq >= 0 || up.seq >= 0 {
		gu = nil
	}
	if ks > 0 {
		return step{group: grp, run: func(s *cudadrv.Stream, n int) error {
			return g.moeSplit(s, op, router, gate, up, down, in, out, n, ks)
		}}, nil
	}
	gateUp, gateUpOut := []*mat{gate, up}, []cudadrv.DevicePtr{m.gate, m.up}
	return step{group: grp, run: func(s *cudadrv.Stream, n int) error {
		// Router logits, top-k ids and weights (they stay on the device),
		// gate and up of the chosen experts per slot, SwiGLU, down per
		// slot, and the weighted sum in slot order.
		if err := g.route(s, op, router, in, n); err != nil {
			return err
		}
		if g.format(grp, n) == actQ8_1 && ff%32 == 0 && emb%32 == 0 {
			// Decode: one Q8_1 input for gate and up (written by the norm
			// before, or quantized here), SwiGLU writing down's.
			pm := w.(moePreparedOps)
			if !g.q8Ready(grp, n) {
				if err := w.(preparedOps).Prepare(s, actQ8_1, in, n, emb, g.act); err != nil {
					return err
				}
			}
			done := false
			if gu != nil {
				// Gate and up in one launch.
				var err error
				if done, err = gu.MoEMatMulPreparedGroup(s, gateUp, g.act, m.ids, n, k, gateUpOut); err != nil {
					return err
				}
			}
			if !done {
				if err := g.with(s, gate, func() error { return pm.MoEMatMulPrepared(s, gate, g.act, false, m.ids, n, k, m.gate) }); err != nil {
					return err
				}
				if err := g.with(s, up, func() error { return pm.MoEMatMulPrepared(s, up, g.act, false, m.ids, n, k, m.up) }); err != nil {
					return err
				}
			}
			// g.act is free again: the products above read it first.
			if err := d.glu.SwiGLUQ8(s, m.gate, m.gate, m.up, ff, ff, n*k, g.act); err != nil {
				return err
			}
			if err := g.with(s, down, func() error { return pm.MoEMatMulPrepared(s, down, g.act, true, m.ids, n, k, m.down) }); err != nil {
				return err
			}
		} else if err := g.moeExperts(s, gate, up, down, in, n, k, ff); err != nil {
			return err
		}
		if !sum {
			return nil
		}
		return d.moe.WeightedSum(s, out, m.down, m.weights, emb, k, n)
	}}, nil
}

// moeSplit queues an MoE layer split between the host and the GPU at
// expert ks (SegmentSpec.Split). The GPU routes every token; the slots of
// experts below ks, and the layer's input, go to mapped host memory, and
// the GPU's expert products, which drop those slots, are queued. While the
// GPU computes them (and the copy stream brings the next weights), the
// host computes its experts' share (HostMoE), whose weights never cross
// the link; the GPU then adds its slots onto the host's sum. The host
// blocks here for its share: the layers after need the sum.
func (g *Exec) moeSplit(s *cudadrv.Stream, op *ir.Op, router, gate, up, down *mat, in, out cudadrv.DevicePtr, n, ks int) error {
	m, d, sp := &g.moe, g.dev, &g.split
	k, ff, emb := op.TopK, gate.Rows, down.Rows
	if err := g.route(s, op, router, in, n); err != nil {
		return err
	}
	if err := d.moe.Split(s, m.ids, m.weights, ks, n*k, sp.ids.DevicePtr(), sp.weights.DevicePtr()); err != nil {
		return err
	}
	if err := d.elem.CopyF32(s, sp.x.DevicePtr(), in, n*emb); err != nil {
		return err
	}
	if err := sp.ready.Record(s); err != nil {
		return err
	}
	if err := g.moeExperts(s, gate, up, down, in, n, k, ff); err != nil {
		return err
	}
	g.host.Expect(splitRoutingWait)
	t0 := time.Now()
	if err := sp.ready.Synchronize(); err != nil {
		return fmt.Errorf("waiting for the routing of the host's experts: %w", err)
	}
	t1, cpu0 := time.Now(), processCPUTime()
	x := unsafe.Slice((*float32)(sp.x.Pointer()), n*emb)
	y := unsafe.Slice((*float32)(sp.y.Pointer()), n*emb)
	ids := unsafe.Slice((*int32)(sp.ids.Pointer()), n*k)
	w := unsafe.Slice((*float32)(sp.weights.Pointer()), n*k)
	g.host.Expect(splitShareSpin)
	if err := g.host.MoEPartial(op, n, ks, x, ids, w, y); err != nil {
		return fmt.Errorf("the host's experts 0-%d: %w", ks-1, err)
	}
	t2 := time.Now()
	sp.stats.Layers++
	sp.stats.Slots += len(ids)
	// The host's slots, and how many of its experts had any: a share's
	// time follows its slots, which the routing spreads unevenly over the
	// layers (the trace shows both).
	slots, used := 0, 0
	var routed [kernels.MaxExperts]bool // Route takes at most so many
	for _, e := range ids {
		if e >= 0 && int(e) < ks {
			slots++
			if !routed[e] {
				routed[e], used = true, used+1
			}
		}
	}
	sp.stats.HostSlots += slots
	sp.stats.HostExperts += ks
	sp.stats.HostRouted += used
	sp.stats.HostBytes += (op.Gate.Bytes() + op.Up.Bytes() + op.Down.Bytes()) / int64(op.Gate.Experts()) * int64(used)
	sp.stats.Wait += t1.Sub(t0)
	sp.stats.Host += t2.Sub(t1)
	sp.stats.HostCPU += processCPUTime() - cpu0
	if g.measure {
		g.hostSpans = append(g.hostSpans,
			backend.HostSpan{Name: fmt.Sprintf("layer %d: waiting for the routing", op.Layer), Start: t0, End: t1},
			backend.HostSpan{Name: fmt.Sprintf("layer %d: the CPU's experts 0-%d (%d of them routed, %d slots)", op.Layer, ks-1, used, slots), Start: t1, End: t2})
	}
	return d.moe.WeightedSumHost(s, out, m.down, m.weights, m.ids, sp.y.DevicePtr(), emb, k, n)
}

// splitRoutingWait bounds how long the host's workers spin for their share
// of a split expert layer, from when the split is queued, through the wait
// for its routing (about 1 ms, rarely over 3 on the GPU machine), so that
// the share starts on every thread at once: past it they park, as they
// would anyway.
const splitRoutingWait = 5 * time.Millisecond

// splitShareSpin bounds how long the host's workers spin once the share
// starts, so that none parks between its dispatches (each parked worker
// took 0.1-0.8 ms to run again on the GPU machine): the shares take 1-12
// ms there.
const splitShareSpin = 15 * time.Millisecond

// route queues an MoE op's routing of n tokens: the router's logits, then
// each token's top-k experts and their weights (g.moe.ids, weights).
func (g *Exec) route(s *cudadrv.Stream, op *ir.Op, router *mat, in cudadrv.DevicePtr, n int) error {
	m := &g.moe
	if err := g.with(s, router, func() error { return g.routerLogits(s, router, in, n, m.probs) }); err != nil {
		return err
	}
	if err := g.dev.moe.Route(s, m.probs, router.Rows, op.TopK, op.NormTopK, m.ids, m.weights, n); err != nil {
		return err
	}
	if g.routeInspector != nil {
		return g.inspectRoute(s, op, n)
	}
	return nil
}

// routerLogits queues the MoE router's product: the logits of n tokens
// ([n][experts]) from the op's input in. A float32 router (llama.cpp's
// quantizer keeps it so) is multiplied in float32 at any batch, as the CPU
// and llama.cpp multiply it: above the matrix-vector path's batch the
// weight kernels would round its weights and the activations to f16 for
// the tensor cores, and the logits' last bits decide near-tied expert
// choices. The float32 layout of an F32 tensor is the same on both weight
// paths (the file's bytes, or the reference path's dequantized copy).
func (g *Exec) routerLogits(s *cudadrv.Stream, router *mat, in cudadrv.DevicePtr, n int, out cudadrv.DevicePtr) error {
	if router.W.Type == gguf.TypeF32 && n > kernels.MatVecMaxTokens {
		return g.dev.dense.MatMulTiled(s, out, router.Ptr, in, router.Rows, router.Cols, n, router.Rows)
	}
	return g.w.MatMul(s, router, in, n, out, router.Rows, g.scratch)
}

// moeExperts queues the expert products of an MoE op through MoEMatMul,
// which prepares its inputs itself. Where the kernels can (moeReuseOps),
// up takes gate's grouping of the slots and gathered input, and down the
// grouping.
func (g *Exec) moeExperts(s *cudadrv.Stream, gate, up, down *mat, in cudadrv.DevicePtr, n, k, ff int) error {
	m, w := &g.moe, g.w
	mm := func(mt *mat, x cudadrv.DevicePtr, perSlot bool, out cudadrv.DevicePtr, reuse kernels.MoEReuse) error {
		if r, ok := w.(moeReuseOps); ok {
			return r.MoEMatMulReusing(s, mt, x, perSlot, m.ids, n, k, out, g.scratch, reuse)
		}
		return w.MoEMatMul(s, mt, x, perSlot, m.ids, n, k, out, g.scratch)
	}
	if err := g.with(s, gate, func() error { return mm(gate, in, false, m.gate, kernels.MoEReuseNothing) }); err != nil {
		return err
	}
	if err := g.with(s, up, func() error { return mm(up, in, false, m.up, kernels.MoEReuseInput) }); err != nil {
		return err
	}
	if err := g.dev.glu.SwiGLU(s, m.gate, m.gate, m.up, ff, ff, n*k); err != nil {
		return err
	}
	return g.with(s, down, func() error { return mm(down, m.gate, true, m.down, kernels.MoEReuseGroups) })
}

// moeReuseOps is implemented by weight kernels whose MoE products can
// take the grouping (and gathered input) of the product before them.
type moeReuseOps interface {
	MoEMatMulReusing(s *cudadrv.Stream, m *mat, x cudadrv.DevicePtr, perSlot bool, ids cudadrv.DevicePtr, nTok, topK int, out cudadrv.DevicePtr, scratch cudadrv.DevicePtr, reuse kernels.MoEReuse) error
}

// with runs a launch that reads m between acquire and release: for a
// streamed weight, after its upload and before its ring region is reused.
func (g *Exec) with(s *cudadrv.Stream, m *mat, launch func() error) error {
	if err := g.acquire(s, m); err != nil {
		return err
	}
	if err := launch(); err != nil {
		return err
	}
	return g.release(s, m)
}
