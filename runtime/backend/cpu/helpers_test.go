package cpu

import (
	"testing"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

// testMat is a weight a test made, with the CPU's matrix of it: m, its
// experts' rows a matrix each when experts > 0.
func testMat(typ ir.Weight, m ops.Matrix, experts int) (*ir.Weight, *Mat) {
	w := typ
	w.Dims = []int{m.Cols, m.Rows}
	if experts > 0 {
		w.Dims = []int{m.Cols, m.Rows / experts, experts}
	}
	return &w, &Mat{Matrix: m, Stack: stackOf(m, experts)}
}

// testWeights are the host weights of a program the test built op by op,
// whose matrices it made itself (mats): the weights get their ids here.
func testWeights(p *ir.Program, mats map[*ir.Weight]*Mat) *Weights {
	p.Weights = nil
	for i := range p.Ops {
		for _, w := range p.Ops[i].Weights() {
			w.ID = len(p.Weights)
			p.Weights = append(p.Weights, w)
		}
	}
	ws := &Weights{prog: p, mats: make([]*Mat, len(p.Weights))}
	for _, w := range p.Weights {
		ws.mats[w.ID] = mats[w]
	}
	return ws
}

// newTestBackend is a backend of every op of w's program for batches of
// batch tokens.
func newTestBackend(t testing.TB, w *Weights, pool *ops.Pool, batch int) *Backend {
	t.Helper()
	be, err := New(w, pool, Options{Batch: batch, KV: model.KV{Rows: 4, Type: kvcache.F16}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(be.Close)
	return be
}

// fileWeights are the host weights of a program built from a file.
func fileWeights(t testing.TB, p *ir.Program) *Weights {
	t.Helper()
	w, err := NewWeights(p)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// runAll runs every op of the backend's program over n rows of one
// sequence from position 0, no logits wanted.
func runAll(t testing.TB, be *Backend, n int) {
	t.Helper()
	b := &ir.Batch{Tokens: make([]int32, n), Pos: make([]int32, n), Seq: make([]int32, n), Tables: [][]int32{{0}}, Block: max(n, 1)}
	for i := range b.Pos {
		b.Pos[i] = int32(i)
	}
	be.Begin()
	if _, err := be.Run(0, len(be.prog.Ops), b, n); err != nil {
		t.Fatal(err)
	}
}
