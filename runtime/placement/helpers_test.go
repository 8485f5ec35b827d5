package placement

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/backend/cpu"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
)

func openOracle(t *testing.T, name string) *model.Model {
	t.Helper()
	path := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", name+".gguf")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err) // the repository's testdata/ holds every oracle
	}
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

func oracleFiles(t *testing.T) []string {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	files, _ := filepath.Glob(filepath.Join(dir, "*.gguf"))
	if len(files) == 0 {
		t.Fatalf("no oracle models in %s", dir)
	}
	return files
}

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
