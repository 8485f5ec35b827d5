package cuda

// Matrix products: runs of products that read one input share its
// quantized (Q8_1) or f16 form and, where they can, one launch.

import (
	"strings"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/runtime/ir"
)

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
	MatMulPreparedGroup(s *cudadrv.Stream, ms []*mat, xq cudadrv.DevicePtr, planes, nTok int, outs []cudadrv.DevicePtr, lds []int) (bool, error)
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
	decode := g.batch != nil && g.batch.Decode()
	in := func(m *mat, n int) actFormat { return p.InputFormat(m, n, decode) }
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
	return f
}

// q8Ready says, at nTok tokens, in how many planes the group reads Q8_1
// when its producer writes that form (the producer and the group ask the
// same), else 0.
func (g *Exec) q8Ready(grp *group, nTok int) int {
	if grp == nil || !grp.fedQ8 || grp.cols%32 != 0 {
		return 0
	}
	return g.format(grp, nTok).q8Planes()
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
		if g.q8Ready(grp, n) == 0 { // else the producer wrote g.act
			if err := p.Prepare(s, f, grp.x, n, grp.cols, g.act); err != nil {
				return err
			}
		}
		x = g.act
	}
	if f.q8Planes() > 0 && grp.oneLaunch() {
		if done, err := g.w.(groupedOps).MatMulPreparedGroup(s, grp.mats, x, f.q8Planes(), n, grp.outs, grp.lds); done || err != nil {
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
