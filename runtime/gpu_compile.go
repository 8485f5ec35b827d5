package runtime

import (
	"fmt"
	"strings"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/ops"
)

// compile turns the program's ops into g.steps. It matches op patterns and
// never looks at the architecture. A decode step of a dense 40-layer model
// is ~800 launches unfused, and at a few µs each the launches, not the
// weights, would set the pace; so:
//   - matrix products reading the same input (Q, K, V; gate, up) form a
//     group that converts the input once (gpuPreparedOps);
//   - a norm or SwiGLU whose output feeds such a group writes the Q8_1
//     form itself when the group reads Q8_1 (decode), so the group
//     converts nothing (q8Link);
//   - a residual add and the norm after it are one kernel, and the MoE
//     weighted sum of expert outputs joins that add;
//   - the head norms and rotations of Q and K are one launch, which also
//     writes K and V to the cache when the attention follows.
func (g *gpuExec) compile() error {
	ops := g.prog.Ops
	for i := range ops {
		if g.place[i] != onGPU {
			return fmt.Errorf("gpu: op %d (%s) is placed on the CPU: mixed placement is not implemented yet", i, ops[i].Kind)
		}
		if i > 0 && ops[i-1].Output && !ops[i].Output {
			return fmt.Errorf("gpu: op %d (%s) follows the output head: the head must be the program's tail", i, ops[i].Kind)
		}
	}
	kvStored := map[int]bool{} // attention ops whose cache write a rope step did
	for i := 0; i < len(ops); {
		op := &ops[i]
		var st gpuStep
		var err error
		used := 1
		switch op.Kind {
		case OpAdd:
			if i+1 < len(ops) && g.fusesAddNorm(op, &ops[i+1]) {
				st, used = g.normExStep(op, &ops[i+1], nil), 2
			} else {
				st = g.addStep(op)
			}
		case OpHeadNorm, OpRoPE:
			st, used, err = g.ropeStep(i, kvStored)
		case OpEmbed:
			st, err = g.embedStep(op)
		case OpNorm:
			st = g.normExStep(nil, op, nil)
		case OpMatMul:
			used = g.matMulGroupLen(i)
			st, err = g.groupStep(ops[i : i+used])
		case OpAttention:
			st = g.attentionStep(op, !kvStored[i])
		case OpSwiGLU:
			st = g.swigluStep(op)
		case OpMoE:
			// The weighted sum of the experts' outputs joins the residual
			// add after it (and the norm after that) when they follow.
			fuse := i+1 < len(ops) && g.takesMoESum(op, &ops[i+1])
			if st, err = g.moeStep(op, !fuse); err == nil && fuse {
				g.appendStep(st, i, op)
				add := &ops[i+1]
				var norm *Op
				if i+2 < len(ops) && g.fusesAddNorm(add, &ops[i+2]) {
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
			return fmt.Errorf("gpu: op %d (%s, layer %d): %w", i, op.Kind, op.Layer, err)
		}
		g.appendStep(st, i, op)
		i += used
	}
	// Link each producer of a group's input to the group.
	for i := 0; i+1 < len(g.steps); i++ {
		p, c := &g.steps[i], &g.steps[i+1]
		if p.link != nil && c.group != nil && c.group.in == p.out && p.output == c.output {
			p.link.group = c.group
			c.group.fedQ8 = true
		}
	}
	return nil
}

func (g *gpuExec) appendStep(st gpuStep, i int, op *Op) {
	st.op, st.output = i, op.Output
	if st.name == "" {
		st.name = op.Kind.String()
	}
	g.steps = append(g.steps, st)
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

func (g *gpuExec) width(id BufID) int { return g.prog.Bufs[id].Width }

// vec is the device pointer of a 1-D weight, 0 for none.
func (g *gpuExec) vec(w *Weight) cudadrv.DevicePtr {
	if w == nil {
		return 0
	}
	return g.gm.vecs[w]
}

func (g *gpuExec) mat(w *Weight) (*gpuMat, error) {
	m := g.gm.mats[w]
	if m == nil {
		return nil, fmt.Errorf("weight %q is not on the device", w.Name)
	}
	return m, nil
}

// gpuGroup is a run of matrix products that read the same input buffer.
type gpuGroup struct {
	in      BufID
	x       cudadrv.DevicePtr
	cols    int
	members []groupMember
	// fedQ8 is set when the step before writes the input's Q8_1 form
	// into g.act whenever the group reads Q8_1 (see q8Ready).
	fedQ8 bool
	// moe marks the input of an MoE op's expert products (gate, up; down
	// reads SwiGLU's output): members are asked MoEInputFormat.
	moe bool
}

type groupMember struct {
	m    *gpuMat
	out  cudadrv.DevicePtr
	ld   int
	bias cudadrv.DevicePtr
}

// q8Link is how a step that produces a group's input learns, at run time,
// that it should also write the input's Q8_1 form (set by compile).
type q8Link struct{ group *gpuGroup }

// format is the input format the group's products read at nTok tokens,
// actMixed when they differ (or the weight kernels take float32 only).
func (g *gpuExec) format(grp *gpuGroup, nTok int) actFormat {
	p, ok := g.w.(gpuPreparedOps)
	if !ok {
		return actMixed
	}
	in := p.InputFormat
	if grp.moe {
		pm, ok := g.w.(gpuMoEPreparedOps)
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
	return f
}

// q8Ready says whether, at nTok tokens, the group reads Q8_1 and its
// producer writes that form (the producer and the group ask the same).
func (g *gpuExec) q8Ready(grp *gpuGroup, nTok int) bool {
	return grp != nil && grp.fedQ8 && grp.cols%32 == 0 && g.format(grp, nTok) == actQ8_1
}

// matMulGroupLen is how many matrix products from ops[i] on read ops[i].In
// and write other buffers, none of which a later member reads.
func (g *gpuExec) matMulGroupLen(i int) int {
	ops := g.prog.Ops
	first := &ops[i]
	outs := map[BufID]bool{}
	n := 0
	for j := i; j < len(ops); j++ {
		op := &ops[j]
		if op.Kind != OpMatMul || op.In != first.In || op.Out == first.In || outs[op.Out] || op.Output != first.Output {
			break
		}
		outs[op.Out] = true
		n++
	}
	return max(n, 1)
}

func (g *gpuExec) groupStep(ops []Op) (gpuStep, error) {
	grp := &gpuGroup{in: ops[0].In, x: g.bufs[ops[0].In], cols: g.width(ops[0].In)}
	var names []string
	for i := range ops {
		op := &ops[i]
		m, err := g.mat(op.W)
		if err != nil {
			return gpuStep{}, err
		}
		grp.members = append(grp.members, groupMember{m: m, out: g.bufs[op.Out], ld: g.width(op.Out), bias: g.vec(op.Bias)})
		name := layerless(op.W.Name)
		if op.Bias != nil {
			name += "+bias"
		}
		names = append(names, name)
	}
	return gpuStep{name: "matmul " + strings.Join(names, ","), group: grp, run: func(s *cudadrv.Stream, n int) error {
		return g.runGroup(s, grp, n)
	}}, nil
}

func (g *gpuExec) runGroup(s *cudadrv.Stream, grp *gpuGroup, n int) error {
	f := g.format(grp, n)
	if f == actMixed {
		for _, mb := range grp.members {
			if err := g.w.MatMul(s, mb.m, grp.x, n, mb.out, mb.ld, g.scratch); err != nil {
				return err
			}
			if err := g.addBias(s, mb, n); err != nil {
				return err
			}
		}
		return nil
	}
	p := g.w.(gpuPreparedOps)
	x := grp.x
	if f != actF32 {
		if !g.q8Ready(grp, n) { // else the producer wrote g.act
			if err := p.Prepare(s, f, grp.x, n, grp.cols, g.act); err != nil {
				return err
			}
		}
		x = g.act
	}
	for _, mb := range grp.members {
		if err := p.MatMulPrepared(s, mb.m, f, x, n, mb.out, mb.ld); err != nil {
			return err
		}
		if err := g.addBias(s, mb, n); err != nil {
			return err
		}
	}
	return nil
}

func (g *gpuExec) addBias(s *cudadrv.Stream, mb groupMember, n int) error {
	if mb.bias == 0 {
		return nil
	}
	return g.dev.glu.AddBias(s, mb.out, mb.bias, mb.m.Rows, n)
}

func (g *gpuExec) fusesAddNorm(add, norm *Op) bool {
	return add.Kind == OpAdd && norm.Kind == OpNorm && norm.In == add.Out && add.Output == norm.Output &&
		norm.Out != add.Out && norm.Out != add.In && norm.Out != add.In2
}

// takesMoESum says whether the add after an MoE op can take the weighted
// sum of the experts' outputs in place of the MoE op's output buffer.
func (g *gpuExec) takesMoESum(moe, add *Op) bool {
	return add.Kind == OpAdd && (add.In == moe.Out) != (add.In2 == moe.Out) && add.Output == moe.Output
}

func (g *gpuExec) addStep(op *Op) gpuStep {
	out, a, b, w := g.bufs[op.Out], g.bufs[op.In], g.bufs[op.In2], g.width(op.Out)
	return gpuStep{run: func(s *cudadrv.Stream, n int) error {
		return g.dev.elem.AddF32(s, out, a, b, n*w)
	}}
}

// normExStep compiles, into one rms_norm_ex launch, a norm alone (add and
// moe nil), an add with the norm of its sum, an add alone (norm nil) whose
// term is an MoE op's weighted sum (moe set), or all three.
func (g *gpuExec) normExStep(add, norm, moe *Op) gpuStep {
	var a kernels.NormEx
	var name []string
	st := gpuStep{out: -1}
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

func (g *gpuExec) embedStep(op *Op) (gpuStep, error) {
	m, err := g.mat(op.W)
	if err != nil {
		return gpuStep{}, err
	}
	out, ids := g.bufs[op.Out], g.dIn.Add(4)
	return gpuStep{run: func(s *cudadrv.Stream, n int) error {
		return g.w.GetRows(s, m, ids, n, out)
	}}, nil
}

func (g *gpuExec) swigluStep(op *Op) gpuStep {
	out, w := g.bufs[op.Out], g.width(op.Out)
	gate, up, ld := g.bufs[op.In], cudadrv.DevicePtr(0), w
	if op.In2 < 0 {
		up, ld = gate.Add(4*w), 2*w // both halves of one row
	} else {
		up = g.bufs[op.In2]
	}
	link := &q8Link{}
	return gpuStep{out: op.Out, link: link, run: func(s *cudadrv.Stream, n int) error {
		if g.q8Ready(link.group, n) {
			return g.dev.glu.SwiGLUQ8(s, out, gate, up, w, ld, n, g.act)
		}
		return g.dev.glu.SwiGLU(s, out, gate, up, w, ld, n)
	}}
}

func (g *gpuExec) attentionStep(op *Op, store bool) gpuStep {
	a := op.Attn
	kc, vc := g.kvK[op.Layer], g.kvV[op.Layer]
	q, k, v, out := g.bufs[op.In], g.bufs[op.In2], g.bufs[op.In3], g.bufs[op.Out]
	width := a.NKVHeads * a.HeadSize
	pos0 := g.dIn
	args := kernels.AttnArgs{Out: out, Q: q, K: kc, V: vc, Pos0: pos0,
		NHeads: a.NHeads, NKV: a.NKVHeads, HeadSize: a.HeadSize, Scale: a.Scale}
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
	return gpuStep{name: name, out: op.Out, link: link, run: func(s *cudadrv.Stream, n int) error {
		if store {
			if err := g.dev.attn.Store(s, kc, vc, k, v, width, pos0, n); err != nil {
				return err
			}
		}
		args := args // a copy per launch: the closure's stays unchanged
		args.NTok = n
		if n == 1 && g.attn.splits > 1 {
			// Decode: split the positions across blocks. The split count
			// covers the whole cache, so a captured graph fits any position.
			args.Splits, args.Chunk, args.Part, args.ML = g.attn.splits, g.attn.chunk, g.attn.part, g.attn.ml
		}
		if link != nil && g.q8Ready(link.group, n) {
			args.Q8 = g.act
		}
		return g.dev.attn.Run(s, &args)
	}}
}

// ropeTensor is one buffer of a rope/head-norm group.
type ropeTensor struct {
	buf      BufID
	heads    int
	norm     *Weight
	rope     *ops.Rope
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
func (g *gpuExec) ropeStep(i int, kvStored map[int]bool) (gpuStep, int, error) {
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
	for j := i; j < len(ops) && (ops[j].Kind == OpHeadNorm || ops[j].Kind == OpRoPE) && ops[j].Output == ops[i].Output; j++ {
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
		if op.Kind == OpHeadNorm {
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
		if op.Kind == OpHeadNorm {
			if op.W == nil {
				return gpuStep{}, 0, fmt.Errorf("head norm without a weight")
			}
			t.norm, t.eps = op.W, op.Eps
		} else {
			t.rope = op.Rope
		}
		ts, used = []ropeTensor{t}, 1
	}
	args := kernels.RopeArgs{NTensors: len(ts), HeadSize: ts[0].headSize, Pos0: g.dIn}
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
			args.Factors = g.gm.ropes[r]
		}
		name = append(name, "rope")
	}
	// The cache write of the attention right after, when it reads these
	// keys: the values were computed before (they are not in this launch).
	if j := i + used; j < len(ops) && ops[j].Kind == OpAttention && ops[j].Output == ops[i].Output {
		at := &ops[j]
		for x, t := range ts {
			if t.buf == at.In2 && t.heads*t.headSize == at.Attn.NKVHeads*at.Attn.HeadSize && t.buf != at.In3 {
				args.KV = &kernels.RopeKV{T: x, V: g.bufs[at.In3], KC: g.kvK[at.Layer], VC: g.kvV[at.Layer]}
				kvStored[j] = true
				name = append(name, "kv_store")
			}
		}
	}
	return gpuStep{name: fmt.Sprintf("%s ×%d", strings.Join(name, "+"), len(ts)), run: func(s *cudadrv.Stream, n int) error {
		a := args
		a.NTok = n
		return g.dev.rope.Run(s, &a)
	}}, used, nil
}

// moeStep compiles an MoE op; without sum, it leaves the weighted sum of
// the experts' outputs to the next step (normExStep).
func (g *gpuExec) moeStep(op *Op, sum bool) (gpuStep, error) {
	router, err := g.mat(op.W)
	if err != nil {
		return gpuStep{}, err
	}
	gate, err := g.mat(op.Gate)
	if err != nil {
		return gpuStep{}, err
	}
	up, err := g.mat(op.Up)
	if err != nil {
		return gpuStep{}, err
	}
	down, err := g.mat(op.Down)
	if err != nil {
		return gpuStep{}, err
	}
	in, out := g.bufs[op.In], g.bufs[op.Out]
	ne, k, ff, emb := router.Rows, op.TopK, gate.Rows, down.Rows
	if ne > kernels.MaxExperts || k > kernels.MaxTopK {
		return gpuStep{}, fmt.Errorf("top %d of %d experts: the routing kernel takes up to %d of %d", k, ne, kernels.MaxTopK, kernels.MaxExperts)
	}
	m, w, d, norm := &g.moe, g.w, g.dev, op.NormTopK
	grp := &gpuGroup{in: op.In, x: in, cols: emb, moe: true,
		members: []groupMember{{m: gate}, {m: up}, {m: down}}}
	return gpuStep{group: grp, run: func(s *cudadrv.Stream, n int) error {
		// Router logits, top-k ids and weights (they stay on the device),
		// gate and up of the chosen experts per slot, SwiGLU, down per
		// slot, and the weighted sum in slot order.
		if err := w.MatMul(s, router, in, n, m.probs, ne, g.scratch); err != nil {
			return err
		}
		if err := d.moe.Route(s, m.probs, ne, k, norm, m.ids, m.weights, n); err != nil {
			return err
		}
		if g.format(grp, n) == actQ8_1 && ff%32 == 0 && emb%32 == 0 {
			// Decode: one Q8_1 input for gate and up (written by the norm
			// before, or quantized here), SwiGLU writing down's.
			pm := w.(gpuMoEPreparedOps)
			if !g.q8Ready(grp, n) {
				if err := w.(gpuPreparedOps).Prepare(s, actQ8_1, in, n, emb, g.act); err != nil {
					return err
				}
			}
			if err := pm.MoEMatMulPrepared(s, gate, g.act, false, m.ids, n, k, m.gate); err != nil {
				return err
			}
			if err := pm.MoEMatMulPrepared(s, up, g.act, false, m.ids, n, k, m.up); err != nil {
				return err
			}
			// g.act is free again: the products above read it first.
			if err := d.glu.SwiGLUQ8(s, m.gate, m.gate, m.up, ff, ff, n*k, g.act); err != nil {
				return err
			}
			if err := pm.MoEMatMulPrepared(s, down, g.act, true, m.ids, n, k, m.down); err != nil {
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

// moeExperts queues the expert products of an MoE op through MoEMatMul,
// which prepares its inputs itself.
func (g *gpuExec) moeExperts(s *cudadrv.Stream, gate, up, down *gpuMat, in cudadrv.DevicePtr, n, k, ff int) error {
	m, w := &g.moe, g.w
	if err := w.MoEMatMul(s, gate, in, false, m.ids, n, k, m.gate, g.scratch); err != nil {
		return err
	}
	if err := w.MoEMatMul(s, up, in, false, m.ids, n, k, m.up, g.scratch); err != nil {
		return err
	}
	if err := g.dev.glu.SwiGLU(s, m.gate, m.gate, m.up, ff, ff, n*k); err != nil {
		return err
	}
	return w.MoEMatMul(s, down, m.gate, true, m.ids, n, k, m.down, g.scratch)
}
