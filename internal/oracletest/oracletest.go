// Package oracletest opens the oracle models of the repository's test
// data (testdata/oracle: tiny models with llama.cpp's logits) for the
// engine's tests.
package oracletest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/model"
)

// Dir is the folder of the oracles.
func Dir(t testing.TB) string {
	return filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
}

// Open opens oracle name (without .gguf), closed when the test ends; the
// test fails without it (the repository holds every oracle).
func Open(t testing.TB, name string) *model.Model {
	t.Helper()
	path := filepath.Join(Dir(t), name+".gguf")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	m, err := model.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	return m
}

// Files lists the oracle models' files.
func Files(t testing.TB) []string {
	files, _ := filepath.Glob(filepath.Join(Dir(t), "*.gguf"))
	if len(files) == 0 {
		t.Fatalf("no oracle models in %s", Dir(t))
	}
	return files
}
