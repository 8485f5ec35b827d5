package cuda

// Norms and residual adds: one rms_norm_ex launch takes an add, the
// norm of its sum and an MoE op's weighted sum where they follow each other.

import (
	"strings"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/runtime/ir"
)

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
		if link != nil {
			if planes := g.q8Ready(link.group, n); planes > 0 {
				a.Q8, a.Q8Planes = g.act, planes
			}
		}
		if add == nil && moe == nil && a.Q8 == 0 {
			return g.dev.norm.RMSNorm(s, a.Dst, a.A, a.W, a.Cols, a.Eps, n)
		}
		return g.dev.norm.RMSNormEx(s, &a)
	}
	return st
}
