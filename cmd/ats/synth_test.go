package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
)

func runATS(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	root := newRootCmd()
	var o, e bytes.Buffer
	root.SetOut(&o)
	root.SetErr(&e)
	root.SetArgs(llamaSpellings(args)) // as main does
	err = root.Execute()
	return o.String(), e.String(), err
}

func TestSynthList(t *testing.T) {
	out, _, err := runATS(t, "synth", "--list")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"qwen3-14b", "qwen3-30b-a3b", "glm4-9b", "llama3-8b", "tiny-qwen3moe", "q4_k_m GiB", "14.77B", "8.378", "17.277"} {
		if !strings.Contains(out, want) {
			t.Errorf("--list output lacks %q:\n%s", want, out)
		}
	}
}

func TestSynthWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "m.gguf")
	out, stderr, err := runATS(t, "synth", "--preset", "tiny-glm4", "--layout", "q8_0", "--seed", "9", "-o", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "wrote "+path) || !strings.Contains(stderr, "100%") {
		t.Errorf("stdout %q, stderr %q", out, stderr)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if a, _ := f.Arch(); a != "glm4" {
		t.Errorf("architecture %q", a)
	}
	if ft, _ := f.Uint("general.file_type"); ft != 7 {
		t.Errorf("file type %d", ft)
	}
}

func TestSynthErrors(t *testing.T) {
	if _, _, err := runATS(t, "synth", "--preset", "qwen3-14b"); err == nil || !strings.Contains(err.Error(), "-o") {
		t.Errorf("missing -o: %v", err)
	}
	if _, _, err := runATS(t, "synth", "--preset", "nope", "-o", filepath.Join(t.TempDir(), "x.gguf")); err == nil || !strings.Contains(err.Error(), "qwen3-14b") {
		t.Errorf("unknown preset: %v", err)
	}
}
