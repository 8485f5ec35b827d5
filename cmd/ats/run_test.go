package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/tools/synth"
)

// runATSIn runs the root command in-process with args and stdin, returning
// stdout and stderr.
func runATSIn(t *testing.T, stdin string, args ...string) (string, string, error) {
	t.Helper()
	root := newRootCmd()
	var out, errb bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errb)
	root.SetIn(strings.NewReader(stdin))
	root.SetArgs(llamaSpellings(args))
	err := root.Execute()
	return out.String(), errb.String(), err
}

func oracleModel(t *testing.T, name string) string {
	return filepath.Join(testenv.SharedDir(t), "testdata", "oracle", name+".gguf")
}

func TestRunRawTokensDeterministic(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	args := []string{"run", "-m", m, "--raw", "-p", "hello world", "-n", "6", "--print-tokens", "--seed", "7", "-t", "2"}
	a, stderr, err := runATSIn(t, "", args...)
	if err != nil {
		t.Fatal(err)
	}
	if f := strings.Fields(a); len(f) != 6 {
		t.Fatalf("want 6 token ids, got %q", a)
	}
	if !strings.Contains(stderr, "prompt:") || !strings.Contains(stderr, "t/s") {
		t.Errorf("no speed report on stderr: %q", stderr)
	}
	b, _, err := runATSIn(t, "", args...)
	if err != nil || a != b {
		t.Fatalf("same seed, different output: %q vs %q (%v)", a, b, err)
	}
	// The prompt from stdin gives the same result.
	c, _, err := runATSIn(t, "hello world\n", "run", "-m", m, "--raw", "-n", "6", "--print-tokens", "--seed", "7", "-t", "2")
	if err != nil || c != a {
		t.Fatalf("stdin prompt: %q vs %q (%v)", c, a, err)
	}
}

// TestRunGreedyMatchesEval checks that run --temp 0 produces the tokens
// eval's greedy decode does for the same prompt.
func TestRunGreedyMatchesEval(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-f16")
	ids, _, err := runATSIn(t, "", "tokenize", "-m", m, "hello world")
	if err != nil {
		t.Fatal(err)
	}
	toks := strings.Join(strings.Fields(strings.Trim(strings.TrimSpace(ids), "[]")), ",")
	out := filepath.Join(t.TempDir(), "l.json")
	if _, _, err := runATSIn(t, "", "eval", "-m", m, "--tokens", "1,"+toks, "--n-gen", "5", "--logits-json", out); err != nil {
		t.Fatalf("eval --tokens 1,%s: %v", toks, err)
	}
	var res evalResult
	b, _ := os.ReadFile(out)
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatal(err)
	}
	got, _, err := runATSIn(t, "", "run", "-m", m, "--raw", "-p", "hello world", "-n", "5", "--temp", "0", "--print-tokens")
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Trim(fmt.Sprint(res.Generated), "[]")
	if strings.TrimSpace(got) != want {
		t.Fatalf("run greedy %q, eval greedy %q", strings.TrimSpace(got), want)
	}
}

// TestRunChatTemplateRealVocab runs a synthetic model carrying Qwen3's real
// tokenizer and chat template.
func TestRunChatTemplateRealVocab(t *testing.T) {
	vocab := filepath.Join(testenv.SharedDir(t), "testdata", "vocab", "vocab-qwen3.gguf")
	path := filepath.Join(t.TempDir(), "q.gguf")
	if _, err := synth.Write(path, synth.Options{Preset: "tiny-qwen3", Layout: "q8_0", Vocab: vocab, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	out, stderr, err := runATSIn(t, "", "run", "-m", path, "-p", "Hello!", "--system", "Be brief.", "-n", "4", "--seed", "1", "--think=false", "-t", "2")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stderr, "warning") {
		t.Errorf("unexpected warning with a real template: %s", stderr)
	}
	if !strings.Contains(stderr, "generated: 4 tokens") {
		t.Errorf("stderr %q", stderr)
	}
	_ = out
}

func TestRunErrors(t *testing.T) {
	m := oracleModel(t, "tiny-llama-q8_0")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-p", "x"}, "no model given: ats run MODEL or -m MODEL"},
		{[]string{"run", "-m", m, "-p", "x", "--logit-bias", "abc"}, "TOKEN+BIAS"},
		{[]string{"run", "-m", m, "-p", "x", "--temp", "-1"}, "temperature"},
		{[]string{"run", "-m", filepath.Join(t.TempDir(), "missing.gguf"), "-p", "x"}, "no such file"},
	} {
		_, _, err := runATSIn(t, "", tc.args...)
		if err == nil || !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(tc.want)) {
			t.Errorf("%v: error %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
}
