// Package testenv finds the test data of the repository: llama.cpp's logits
// for the small oracle models, the models themselves and real tokenizers,
// kept in testdata/ at the module root. Some of it is stored packed to keep
// the repository small (gzip, and one model as a difference from another);
// testdata/MANIFEST says how each file is unpacked, and the first test that
// asks unpacks the whole set once into the user's cache folder, checking
// every file against the SHA-256 the manifest records.
package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// EnvShared names the environment variable that overrides the test data: a
// folder that contains testdata/ in the unpacked layout (oracle/, vocab/).
const EnvShared = "ATS_SHARED"

// EnvCache names the environment variable that chooses where the test data
// is unpacked (default: the user's cache folder, ats/testdata under it).
const EnvCache = "ATS_TESTDATA_CACHE"

var unpacked struct {
	once sync.Once
	dir  string
	err  error
}

// SharedDirOrEmpty returns the folder that holds the unpacked testdata/:
// $ATS_SHARED when set, otherwise the repository's testdata unpacked into
// the cache. It returns "" when $ATS_SHARED names a folder without
// testdata/, or when no repository test data can be found or unpacked.
func SharedDirOrEmpty() string {
	d, _ := sharedDir()
	return d
}

// SharedDir returns the folder that holds the unpacked testdata/, or skips
// the test when $ATS_SHARED points elsewhere, and fails it when the
// repository's test data is missing or does not match its manifest: a
// fresh clone always has it, so a test that cannot read it must not pass
// as skipped.
func SharedDir(t testing.TB) string {
	t.Helper()
	if env := os.Getenv(EnvShared); env != "" && !hasTestdata(env) {
		t.Skipf("test data not found: $%s=%s has no testdata/ folder", EnvShared, env)
	}
	d, err := sharedDir()
	if err != nil {
		t.Fatalf("test data: %v", err)
	}
	return d
}

// Glob returns the files matching pattern (relative to the folder that
// holds testdata/, e.g. "testdata/oracle/*.gguf"). Nothing matching fails
// the test: the data is in the repository.
func Glob(t testing.TB, pattern string) []string {
	t.Helper()
	d := SharedDir(t)
	m, err := filepath.Glob(filepath.Join(d, pattern))
	if err != nil {
		t.Fatalf("bad pattern %q: %v", pattern, err)
	}
	if len(m) == 0 {
		t.Fatalf("no test files match %s in %s", pattern, d)
	}
	return m
}

func sharedDir() (string, error) {
	if env := os.Getenv(EnvShared); env != "" {
		if hasTestdata(env) {
			return env, nil
		}
		return "", fmt.Errorf("$%s=%s has no testdata/ folder", EnvShared, env)
	}
	unpacked.once.Do(func() {
		root, err := ModuleRoot()
		if err != nil {
			unpacked.err = err
			return
		}
		unpacked.dir, unpacked.err = Unpack(filepath.Join(root, "testdata"), cacheDir())
		if unpacked.err != nil {
			unpacked.err = fmt.Errorf("%w ($%s chooses where it is unpacked)", unpacked.err, EnvCache)
		}
	})
	return unpacked.dir, unpacked.err
}

// ModuleRoot is the folder holding go.mod, found by walking up from the
// working directory (a test runs in its package's folder).
func ModuleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the module root: %w", err)
	}
	for d := dir; ; {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		parent := filepath.Dir(d)
		if parent == d {
			return "", fmt.Errorf("no go.mod in %s or above it", dir)
		}
		d = parent
	}
}

// cacheDir is where test data is unpacked: $ATS_TESTDATA_CACHE, else
// ats/testdata in the user's cache folder, else in the temporary folder.
func cacheDir() string {
	if d := os.Getenv(EnvCache); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "ats", "testdata")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("ats-testdata-%d", os.Getuid()))
}

func hasTestdata(d string) bool {
	st, err := os.Stat(filepath.Join(d, "testdata"))
	return err == nil && st.IsDir()
}
