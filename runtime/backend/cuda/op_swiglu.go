package cuda

// SwiGLU: the gate's SiLU times up, writing down's Q8_1 input where
// it is read so.

import (
	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/runtime/ir"
)

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
		if planes := g.q8Ready(link.group, n); planes > 0 {
			return g.dev.glu.SwiGLUQ8(s, out, gate, up, w, ld, n, g.act, planes)
		}
		return g.dev.glu.SwiGLU(s, out, gate, up, w, ld, n)
	}}
}
