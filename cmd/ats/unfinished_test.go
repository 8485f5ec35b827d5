package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/hub/hubtest"
)

// Issue 33: a pull of a missing file leaves nothing for ats list to report
// forever; an interrupted one is listed by name, and ats rm deletes it.
func TestUnfinishedDownloads(t *testing.T) {
	dir, srv := modelsEnv(t, &hubtest.Repo{ID: "Org/Tiny-GGUF", Files: map[string][]byte{"Tiny-Q8_0.gguf": make([]byte, 100_000)}})
	if _, _, err := runATSIn(t, "", "pull", srv.URL+"/files/missing.gguf"); err == nil || !strings.Contains(err.Error(), "404") {
		t.Fatalf("pull of a missing file: %v", err)
	}
	if _, stderr, err := runATSIn(t, "", "list"); err != nil || strings.Contains(stderr, "unfinished") {
		t.Errorf("list after a 404: %v %q", err, stderr)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("the 404 left %v in the models directory", entries)
	}

	// An unfinished download, as a Ctrl-C leaves it.
	mdir := filepath.Join(dir, "hf.co", "Org", "Tiny-GGUF", "Q8_0")
	os.MkdirAll(mdir, 0o755)
	os.WriteFile(filepath.Join(mdir, "Tiny-Q8_0.gguf.partial"), make([]byte, 4096), 0o644)
	os.WriteFile(filepath.Join(mdir, "pull.json"), []byte(`{"name":"hf.co/Org/Tiny-GGUF:Q8_0","source":"hf.co/Org/Tiny-GGUF:Q8_0"}`), 0o644)
	_, stderr, err := runATSIn(t, "", "list")
	if err != nil || !strings.Contains(stderr, "hf.co/Org/Tiny-GGUF:Q8_0: 4.0 KiB so far") || !strings.Contains(stderr, "ats rm NAME") {
		t.Errorf("list with an unfinished download: %v\n%s", err, stderr)
	}
	out, _, err := runATSIn(t, "", "rm", "hf.co/Org/Tiny-GGUF:Q8_0")
	if err != nil || !strings.Contains(out, "removed the unfinished download of hf.co/Org/Tiny-GGUF:Q8_0") {
		t.Errorf("rm of an unfinished download: %v %q", err, out)
	}
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		t.Errorf("rm left %v in the models directory", entries)
	}
	if _, _, err := runATSIn(t, "", "rm", "hf.co/Org/Tiny-GGUF:Q8_0"); err == nil || !strings.Contains(err.Error(), "no model named") {
		t.Errorf("rm of nothing: %v", err)
	}
}
