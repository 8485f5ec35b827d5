package session

import (
	"fmt"
	"slices"
	"testing"

	"github.com/atsinfer/ats/internal/oracletest"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

// testCtx is an engine with one sequence, as tests drive it: tokens in,
// logits out.
type testCtx struct {
	*Engine
	seq *kvcache.Seq
}

func newCtx(m *model.Model, opt Options) (*testCtx, error) {
	e, err := NewEngine(m, opt)
	if err != nil {
		return nil, err
	}
	return &testCtx{Engine: e, seq: e.Ctx.KV().NewSeq()}, nil
}

// Eval evaluates tokens after the sequence's and returns a copy of their
// logits (every row's when all is set, else the last's).
func (c *testCtx) Eval(tokens []int, all bool) ([]float32, error) {
	l, err := c.Engine.Eval(c.seq, tokens, all)
	return slices.Clone(l), err
}

// EvalView is Eval returning the executor's memory.
func (c *testCtx) EvalView(tokens []int, all bool) ([]float32, error) {
	return c.Engine.Eval(c.seq, tokens, all)
}

// Truncate keeps the sequence's first n positions.
func (c *testCtx) Truncate(n int) error {
	if n < 0 || n > c.seq.Len() {
		return fmt.Errorf("truncate to %d: the sequence holds %d tokens", n, c.seq.Len())
	}
	c.seq.Truncate(n)
	return nil
}

// Pos is the sequence's length.
func (c *testCtx) Pos() int { return c.seq.Len() }

func (c *testCtx) Close() {
	c.seq.Close()
	c.Engine.Close()
}

// openOracle opens the shared oracle model name, or skips.
func openOracle(t *testing.T, name string) *model.Model { return oracletest.Open(t, name) }
