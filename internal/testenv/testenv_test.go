package testenv

import (
	"os"
	"path/filepath"
	"testing"
)

func TestSharedDirFromEnv(t *testing.T) {
	d := t.TempDir()
	if err := os.Mkdir(filepath.Join(d, "testdata"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv(EnvShared, d)
	if got := SharedDirOrEmpty(); got != d {
		t.Fatalf("SharedDirOrEmpty() = %q, want %q", got, d)
	}
	t.Setenv(EnvShared, filepath.Join(d, "nope"))
	if got := SharedDirOrEmpty(); got != "" {
		t.Fatalf("SharedDirOrEmpty() with a bad $%s = %q, want empty", EnvShared, got)
	}
}

func TestSharedDirBesideModule(t *testing.T) {
	t.Setenv(EnvShared, "")
	d := SharedDirOrEmpty()
	if d == "" {
		t.Skip("no ../shared beside the module root on this machine")
	}
	if !hasTestdata(d) {
		t.Fatalf("%s has no testdata/", d)
	}
}
