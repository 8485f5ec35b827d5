// Package testenv locates the test data that several engineers share: the
// numerics oracles and tokenizer fixtures live outside the repository (they
// are large and read-only), in a folder that contains testdata/.
package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

// EnvShared names the environment variable that points at the shared folder
// (the one that contains testdata/).
const EnvShared = "ATS_SHARED"

// SharedDirOrEmpty returns the shared folder: $ATS_SHARED when set, otherwise
// ../shared beside the module root (found by walking up from the working
// directory to the folder holding go.mod). It returns "" when neither holds
// a testdata/ folder.
func SharedDirOrEmpty() string {
	if d := os.Getenv(EnvShared); d != "" {
		if hasTestdata(d) {
			return d
		}
		return ""
	}
	dir, err := os.Getwd()
	if err != nil {
		return ""
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			d := filepath.Join(filepath.Dir(dir), "shared")
			if hasTestdata(d) {
				return d
			}
			return ""
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return ""
		}
		dir = parent
	}
}

// SharedDir returns the shared folder, or skips the test with a message that
// says where it looked and how to point at it.
func SharedDir(t testing.TB) string {
	t.Helper()
	d := SharedDirOrEmpty()
	if d == "" {
		if env := os.Getenv(EnvShared); env != "" {
			t.Skipf("shared test data not found: $%s=%s has no testdata/ folder", EnvShared, env)
		}
		t.Skipf("shared test data not found: set $%s to the folder that contains testdata/, or put it at ../shared beside the module root", EnvShared)
	}
	return d
}

// Glob returns the shared files matching pattern (relative to the shared
// folder, e.g. "testdata/oracle/*.gguf"), skipping the test when the shared
// folder is absent or nothing matches.
func Glob(t testing.TB, pattern string) []string {
	t.Helper()
	d := SharedDir(t)
	m, err := filepath.Glob(filepath.Join(d, pattern))
	if err != nil {
		t.Fatalf("bad pattern %q: %v", pattern, err)
	}
	if len(m) == 0 {
		t.Skipf("no shared test files match %s in %s", pattern, d)
	}
	return m
}

func hasTestdata(d string) bool {
	st, err := os.Stat(filepath.Join(d, "testdata"))
	return err == nil && st.IsDir()
}
