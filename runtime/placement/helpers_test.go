package placement

import (
	"testing"

	"github.com/atsinfer/ats/internal/oracletest"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

func openOracle(t *testing.T, name string) *model.Model { return oracletest.Open(t, name) }

func oracleFiles(t *testing.T) []string { return oracletest.Files(t) }

// programUnits is model.Units with an f16 cache of ctx rows.
func programUnits(p *ir.Program, ctx int, deviceBytes func(*ir.Weight) int64) []model.Unit {
	return model.Units(p, model.KV{Rows: ctx, Type: kvcache.F16}, deviceBytes)
}

// hostWeights are m's host weights, made for the test.
func hostWeights(t *testing.T, m *model.Model) *cpu.Weights {
	t.Helper()
	w, err := cpu.NewWeights(m.Prog)
	if err != nil {
		t.Fatal(err)
	}
	return w
}
