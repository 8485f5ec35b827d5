package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
)

func runTokenize(t *testing.T, stdin string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	cmd := newTokenizeCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	err = cmd.Execute()
	return out.String(), errOut.String(), err
}

// Each fixture's .inp, tokenized with --file, must give its .out exactly.
func TestTokenizeFileMatchesFixtures(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "vocab")
	for _, name := range []string{"qwen3", "llama3", "gpt-2", "llama-spm", "phi-3"} {
		t.Run(name, func(t *testing.T) {
			base := filepath.Join(dir, "vocab-"+name)
			want, err := os.ReadFile(base + ".out")
			if err != nil {
				t.Fatal(err)
			}
			got, stderr, err := runTokenize(t, "", "-m", base+".gguf", "--file", base+".inp")
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			if got != string(want) {
				gl, wl := strings.Split(got, "\n"), strings.Split(string(want), "\n")
				for i := range min(len(gl), len(wl)) {
					if gl[i] != wl[i] {
						t.Fatalf("line %d:\n got %q\nwant %q", i+1, gl[i], wl[i])
					}
				}
				t.Fatalf("got %d lines, want %d", len(gl), len(wl))
			}
		})
	}
}

func TestTokenizeText(t *testing.T) {
	model := filepath.Join(testenv.SharedDir(t), "testdata", "vocab", "vocab-qwen3.gguf")
	for _, tc := range []struct {
		name, stdin string
		args        []string
		want        string
	}{
		{"argument", "", []string{"Hello world"}, " 9707 1879\n"},
		{"stdin", "Hello world", nil, " 9707 1879\n"},
		{"special off", "", []string{"<|im_end|>"}, " 27 91 318 6213 91 29\n"},
		{"special on", "", []string{"--special", "<|im_end|>"}, " 151645\n"},
		{"pieces", "", []string{"--pieces", "--special", "Hi<|im_end|>"}, " 13048 -> \"Hi\"\n151645 -> \"<|im_end|>\"\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, stderr, err := runTokenize(t, tc.stdin, append([]string{"-m", model}, tc.args...)...)
			if err != nil {
				t.Fatalf("%v\n%s", err, stderr)
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
	// --bos adds the model's BOS token (Llama 3: 128000).
	llama3 := filepath.Join(testenv.SharedDir(t), "testdata", "vocab", "vocab-llama3.gguf")
	if got, _, err := runTokenize(t, "", "-m", llama3, "--bos", "Hello"); err != nil || !strings.HasPrefix(got, " 128000 ") {
		t.Errorf("--bos: %q, %v", got, err)
	}
}

func TestTokenizeErrors(t *testing.T) {
	if _, _, err := runTokenize(t, "", "x"); err == nil || !strings.Contains(err.Error(), "-m") {
		t.Errorf("missing -m: %v", err)
	}
	if _, _, err := runTokenize(t, "", "-m", filepath.Join(t.TempDir(), "none.gguf"), "x"); err == nil {
		t.Error("missing model file: no error")
	}
	if _, _, err := runTokenize(t, "", "-m", "m.gguf", "--file", "f.inp", "text"); err == nil || !strings.Contains(err.Error(), "not both") {
		t.Errorf("file and text: %v", err)
	}
}
