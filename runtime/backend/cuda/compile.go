package cuda

import (
	"fmt"
	"strings"

	"github.com/atsinfer/ats/cudadrv"
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
