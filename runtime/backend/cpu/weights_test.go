package cpu

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/atsinfer/ats/internal/oracletest"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

func openModel(t *testing.T, name string) *model.Model { return oracletest.Open(t, name) }

// dense lists the products of p but the output head.
func dense(p *ir.Program) []*ir.Weight {
	var out []*ir.Weight
	for i := range p.Ops {
		if op := &p.Ops[i]; op.Kind == ir.OpMatMul && !op.Output {
			out = append(out, op.W)
		}
	}
	return out
}

// The weights are not repacked while a backend computes with them: the
// swap would race with its reading the matrices.
func TestNoRepackWhileComputing(t *testing.T) {
	m := openModel(t, "tiny-qwen3-q4_k_m")
	w := fileWeights(t, m.Prog)
	list := w.Choose(dense(m.Prog), -1)
	if len(list) == 0 {
		t.Skip("this CPU level has no kernels for repacked weights (noasm, or not amd64)")
	}
	pool := ops.NewPool(1)
	defer pool.Close()
	be, err := New(w, pool, Options{Batch: 4, KV: model.KV{Rows: 8}})
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	w.Notes = func(s string) { said = append(said, s) }
	if got := w.Repack(list, nil, 0); got != 0 {
		t.Fatalf("repacked %d bytes while a backend computes", got)
	}
	if len(said) != 1 {
		t.Errorf("notes %q, want one saying why nothing was repacked", said)
	}
	be.Close()
	be.Close() // closing twice counts once
	if w.Repack(list, nil, 0) == 0 {
		t.Error("nothing repacked once the backend closed")
	}
}

// An expert stack repacked for its first experts (in two steps, as two
// placements would ask): each of those experts reads a copy of its own
// rows, with the products of the file's blocks, the others still read the
// file's blocks, and the share is what the planner counts.
func TestRepackExperts(t *testing.T) {
	m := openModel(t, "tiny-qwen3moe-q4_k_m")
	ws := fileWeights(t, m.Prog)
	var w *ir.Weight
	for i := range m.Prog.Ops {
		if op := &m.Prog.Ops[i]; op.Kind == ir.OpMoE && ws.Repackable(op.Gate) {
			w = op.Gate
			break
		}
	}
	if w == nil {
		t.Skip("no MoE stack with a repacked layout (noasm, or not amd64)")
	}
	mw := ws.Of(w)
	ne := len(mw.Stack)
	orig := slices.Clone(mw.Stack)
	ws.Repack(nil, []*ir.Weight{w}, 1)
	ws.Repack(nil, []*ir.Weight{w}, 2) // the second expert only: the first has its copy
	if share, want := ws.PackedShare(w), 2/float64(ne); share != want {
		t.Errorf("packed share %g, want %g", share, want)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	x := make([]float32, 3*mw.Stack[0].Cols)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	for e := range ne {
		s := mw.Stack[e]
		if packed := s.RepackedBytes() > 0; packed != (e < 2) {
			t.Fatalf("expert %d: repacked %v, want %v", e, packed, e < 2)
		}
		if &s.Data[0] != &orig[e].Data[0] || len(s.Data) != len(orig[e].Data) {
			t.Fatalf("expert %d's matrix is not its own rows", e)
		}
		xq := s.QuantizeActs(nil, x, 3, make([]byte, s.ActBytes(3)))
		got, want := make([]float32, 3*s.Rows), make([]float32, 3*s.Rows)
		s.MulRows(0, s.Rows, xq, 3, got, s.Rows)
		orig[e].MulRows(0, s.Rows, xq, 3, want, s.Rows)
		var num, den float64
		for i := range want {
			d := float64(got[i] - want[i])
			num, den = num+d*d, den+float64(want[i])*float64(want[i])
		}
		if num/den > 1e-9 {
			t.Errorf("expert %d: the copy's products differ from the blocks' (NMSE %.3g)", e, num/den)
		}
	}
	if mw.RepackedBytes() != 0 {
		t.Error("the whole stack was repacked")
	}
}
