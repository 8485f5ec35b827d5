package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/hub/hubtest"
	"github.com/atsinfer/ats/tools/synth"
)

// modelsEnv points the models directory and the hub at a temporary folder
// and a local hub holding repos.
func modelsEnv(t *testing.T, repos ...*hubtest.Repo) (dir string, srv *hubtest.Server) {
	t.Helper()
	srv = hubtest.New(repos...)
	t.Cleanup(srv.Close)
	dir = filepath.Join(t.TempDir(), "models")
	t.Setenv("ATS_MODELS", dir)
	t.Setenv("HF_ENDPOINT", srv.URL)
	t.Setenv("HF_TOKEN", "")
	return dir, srv
}

// realVocabModel writes a tiny model with Qwen3's real tokenizer and chat
// template and returns its bytes.
func realVocabModel(t *testing.T) []byte {
	t.Helper()
	vocab := filepath.Join(testenv.SharedDir(t), "testdata", "vocab", "vocab-qwen3.gguf")
	path := filepath.Join(t.TempDir(), "q.gguf")
	if _, err := synth.Write(path, synth.Options{Preset: "tiny-qwen3", Layout: "q8_0", Vocab: vocab, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPullListShowRunRm is the whole life of a model by name: pulled from
// the (local) hub, listed, shown, run by its names, removed.
func TestPullListShowRunRm(t *testing.T) {
	model := realVocabModel(t)
	dir, srv := modelsEnv(t, &hubtest.Repo{ID: "Org/Tiny-Qwen3-GGUF", Files: map[string][]byte{
		"README.md":              []byte("# tiny\n"),
		"Tiny-Qwen3-Q8_0.gguf":   model,
		"Tiny-Qwen3-Q4_K_M.gguf": []byte("another quantization, not pulled"),
	}})
	srv.CutAfter, srv.Cuts = int64(len(model)/3), 1 // one broken transfer, resumed

	out, stderr, err := runATSIn(t, "", "pull", "hf.co/org/tiny-qwen3-gguf:q8_0", "--alias", "tiny:latest")
	if err != nil {
		t.Fatalf("pull: %v\n%s", err, stderr)
	}
	for _, want := range []string{"pulled hf.co/Org/Tiny-Qwen3-GGUF:Q8_0", "also called: tiny:latest, tiny-qwen3:q8_0", "run it: ats run tiny:latest"} {
		if !strings.Contains(out, want) {
			t.Errorf("pull stdout lacks %q:\n%s", want, out)
		}
	}
	for _, want := range []string{"pulling Tiny-Qwen3-Q8_0.gguf", "; resuming", "Tiny-Qwen3-Q8_0.gguf: ", "sha256 verified"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("pull stderr lacks %q:\n%s", want, stderr)
		}
	}
	// Pulled again: nothing to do.
	out, _, err = runATSIn(t, "", "pull", "hf.co/Org/Tiny-Qwen3-GGUF:Q8_0")
	if err != nil || !strings.Contains(out, "is up to date") {
		t.Errorf("second pull: %v %q", err, out)
	}

	out, _, err = runATSIn(t, "", "list")
	if err != nil || !strings.Contains(out, "hf.co/Org/Tiny-Qwen3-GGUF:Q8_0") || !strings.Contains(out, "Q8_0") ||
		!strings.Contains(out, "tiny:latest, tiny-qwen3:q8_0") {
		t.Errorf("list: %v\n%s", err, out)
	}
	out, _, err = runATSIn(t, "", "list", "--json")
	var listed []struct {
		Name string `json:"name"`
		Path string `json:"path"`
		Size int64  `json:"size_bytes"`
	}
	if err != nil || json.Unmarshal([]byte(out), &listed) != nil || len(listed) != 1 || listed[0].Size != int64(len(model)) ||
		!strings.HasPrefix(listed[0].Path, dir) {
		t.Errorf("list --json: %v %s", err, out)
	}

	out, _, err = runATSIn(t, "", "show", "tiny:latest")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"model:", "hf.co/Org/Tiny-Qwen3-GGUF:Q8_0", "source:", "revision:", "(verified)", "architecture:", "qwen3",
		"chat template text (", "<|im_start|>", "enable_thinking"} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "tensors (") {
		t.Error("show lists tensors without --tensors")
	}

	// The model runs by name; every spelling of the name finds it (the
	// alias, the short name with or without its tag, the hub name).
	_, stderr, err = runATSIn(t, "", "run", "tiny:latest", "-p", "Hello", "-n", "2", "-t", "2", "--seed", "1")
	if err != nil || !strings.Contains(stderr, "generated: 2 tokens") {
		t.Errorf("run NAME: %v\n%s", err, stderr)
	}
	for _, name := range []string{"tiny-qwen3:q8_0", "tiny-qwen3", "hf.co/Org/Tiny-Qwen3-GGUF:Q8_0", "huggingface.co/org/tiny-qwen3-gguf"} {
		if out, _, err := runATSIn(t, "", "inspect", name, "--tensors=false"); err != nil || !strings.Contains(out, "qwen3") {
			t.Errorf("inspect %s: %v", name, err)
		}
	}
	if _, _, err := runATSIn(t, "", "tokenize", "-m", "tiny:latest", "hello"); err != nil {
		t.Errorf("tokenize -m NAME: %v", err)
	}

	out, _, err = runATSIn(t, "", "rm", "tiny:latest")
	if err != nil || !strings.Contains(out, "removed hf.co/Org/Tiny-Qwen3-GGUF:Q8_0") {
		t.Errorf("rm: %v %q", err, out)
	}
	out, _, err = runATSIn(t, "", "list")
	if err != nil || !strings.Contains(out, "no models in "+dir) {
		t.Errorf("list after rm: %v %q", err, out)
	}
	if _, _, err := runATSIn(t, "", "rm", "tiny:latest"); err == nil || !strings.Contains(err.Error(), `no model named "tiny:latest"`) {
		t.Errorf("rm of a missing model: %v", err)
	}
	_, _, err = runATSIn(t, "", "run", "tiny:latest", "-p", "x")
	if err == nil || !strings.Contains(err.Error(), "no pulled model of that name") || !strings.Contains(err.Error(), "ats list") {
		t.Errorf("run of a removed model: %v", err)
	}
	// run pulls a hub model it does not have (as ollama run does), also
	// named without hf.co/, then runs it.
	_, stderr, err = runATSIn(t, "", "run", "Org/Tiny-Qwen3-GGUF:Q8_0", "-p", "x", "-n", "2")
	if err != nil || !strings.Contains(stderr, "hf.co/Org/Tiny-Qwen3-GGUF:Q8_0 is not pulled yet: pulling it") {
		t.Errorf("run of a hub name not pulled: %v\n%s", err, stderr)
	}
	if out, _, err := runATSIn(t, "", "list"); err != nil || !strings.Contains(out, "hf.co/Org/Tiny-Qwen3-GGUF:Q8_0") {
		t.Errorf("list after run pulled: %v %q", err, out)
	}
}

// A split model pulled from the hub comes with all its parts and runs.
func TestPullSplitModelRuns(t *testing.T) {
	f, err := gguf.Open(oracleModel(t, "tiny-qwen3-q4_k_m"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	parts, err := f.WriteSplit(filepath.Join(t.TempDir(), "Tiny-Q4_K_M"), 2)
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, p := range parts {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		files["Q4_K_M/"+filepath.Base(p)] = b
	}
	modelsEnv(t, &hubtest.Repo{ID: "Org/Tiny-GGUF", Files: files})
	if _, stderr, err := runATSIn(t, "", "pull", "hf.co/Org/Tiny-GGUF"); err != nil {
		t.Fatalf("pull: %v\n%s", err, stderr)
	}
	_, stderr, err := runATSIn(t, "", "run", "tiny:q4_k_m", "--raw", "-p", "hello", "-n", "3", "-t", "2")
	if err != nil || !strings.Contains(stderr, "generated: 3 tokens") {
		t.Errorf("run of the split model: %v\n%s", err, stderr)
	}
}

// Without a network the error says what could not be reached.
func TestPullOffline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	t.Setenv("ATS_MODELS", t.TempDir())
	t.Setenv("HF_ENDPOINT", "http://"+addr)
	_, _, err = runATSIn(t, "", "pull", "hf.co/Qwen/Qwen3-8B-GGUF:Q4_K_M")
	if err == nil || !strings.Contains(err.Error(), "cannot reach "+addr) || !strings.Contains(err.Error(), "no network?") {
		t.Errorf("offline pull: %v", err)
	}
	for _, tc := range []struct{ ref, want string }{
		{"qwen3:8b", "want hf.co/ORG/REPO:QUANT"},
		{"hf.co/Qwen", "ORG/REPO"},
	} {
		if _, _, err := runATSIn(t, "", "pull", tc.ref); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("pull %s: %v", tc.ref, err)
		}
	}
}

func TestPullChecksumMismatch(t *testing.T) {
	model := []byte("GGUF and some bytes")
	dir, _ := modelsEnv(t, &hubtest.Repo{ID: "Org/Bad-GGUF", Files: map[string][]byte{"Bad-Q8_0.gguf": model},
		WrongSHA: map[string]bool{"Bad-Q8_0.gguf": true}})
	_, _, err := runATSIn(t, "", "pull", "hf.co/Org/Bad-GGUF")
	if err == nil || !strings.Contains(err.Error(), "corrupt and was deleted") {
		t.Fatalf("pull of a corrupt file: %v", err)
	}
	var left []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			left = append(left, p)
		}
		return nil
	})
	if len(left) != 0 {
		t.Errorf("files left after a failed check: %v", left)
	}
}
