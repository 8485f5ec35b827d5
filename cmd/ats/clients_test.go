package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// llama.cpp's flags as its users type them: the ones ats takes work, the
// others are refused by the name typed, with what ats does instead.
func TestLlamaFlagsAsTyped(t *testing.T) {
	m := oracleModel(t, "tiny-llama-q8_0")
	t.Setenv("ATS_MODELS", t.TempDir())
	base := []string{"run", m, "--raw", "-p", "hello", "-n", "2", "-t", "2", "--print-tokens"}
	for _, extra := range [][]string{
		{"-fa"}, {"-fa", "on"}, {"--flash-attn", "auto"}, {"--jinja"}, {"-ub", "256"}, {"-dev", "none"}, {"-ngl", "0"},
		{"-ctk", "f16", "-ctv", "f16"}, {"-ctk", "f32"},
	} {
		if _, stderr, err := runATSIn(t, "", append(base, extra...)...); err != nil {
			t.Errorf("%v: %v\n%s", extra, err, stderr)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-np", "4"}, "unknown flag -np (--parallel): only ats serve runs several requests at once"},
		{[]string{"-ctk", "q8_0", "-ctv", "f16"}, "--cache-type-k q8_0 and --cache-type-v f16 differ"},
		{[]string{"-ctk", "q5_1"}, `--cache-type-k: KV cache type "q5_1": want one of`},
		{[]string{"-sm", "row"}, "unknown flag -sm (--split-mode)"},
		{[]string{"--nosuch"}, "unknown flag --nosuch; see ats run --help"},
		{[]string{"-dev", "Vulkan0"}, "ats runs on none (the CPU) or CUDA0"},
	} {
		_, _, err := runATSIn(t, "", append(base, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
	// -hf is not -h -f: it names the model.
	_, _, err := runATSIn(t, "", "run", "-hf", "Org/Missing-GGUF:Q4_K_M", "-p", "x", "--vram-budget", "0")
	if err == nil || !strings.Contains(err.Error(), "hf.co/Org/Missing-GGUF:Q4_K_M") {
		t.Errorf("-hf: %v", err)
	}
}

func TestEmptyPromptIsAnError(t *testing.T) {
	m := oracleModel(t, "tiny-llama-q8_0")
	for _, args := range [][]string{{"run", m, "-t", "2"}, {"run", m, "-p", "", "-t", "2"}, {"run", m, "-p", "  \n", "-t", "2"}} {
		_, _, err := runATSIn(t, "", args...)
		if err == nil || !strings.Contains(err.Error(), "the prompt is empty") {
			t.Errorf("%v: %v", args, err)
		}
	}
}

// Every command that takes a model takes it first; inspect without one
// says so.
func TestModelFirstEverywhere(t *testing.T) {
	m := oracleModel(t, "tiny-llama-q8_0")
	a, _, err := runATSIn(t, "", "tokenize", m, "hello world")
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := runATSIn(t, "", "tokenize", "-m", m, "hello world")
	if err != nil || a != b || strings.TrimSpace(a) == "" {
		t.Errorf("tokenize MODEL TEXT %q, -m MODEL TEXT %q (%v)", a, b, err)
	}
	if _, stderr, err := runATSIn(t, "", "profile", m, "--cpu-only", "-t", "2"); err != nil {
		t.Errorf("profile MODEL: %v\n%s", err, stderr)
	}
	_, _, err = runATSIn(t, "", "inspect")
	if err == nil || !strings.Contains(err.Error(), "inspect: no model given: ats inspect MODEL") {
		t.Errorf("inspect without a model: %v", err)
	}
}

// Help shows a value placeholder for each flag, never a command.
func TestFlagPlaceholders(t *testing.T) {
	out, _, err := runATSIn(t, "", "serve", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"--placement FILE", "-m, --model MODEL", "--vram-budget SIZE", "--host ADDR"} {
		if !strings.Contains(out, want) {
			t.Errorf("serve --help lacks %q", want)
		}
	}
	if strings.Contains(out, "ats plan --json  ") || strings.Contains(out, "--placement ats") {
		t.Errorf("a command as a placeholder:\n%s", out)
	}
}

// ats pull ./file.gguf registers it by name with its quantization;
// unfinished downloads are named by list and removed by rm.
func TestPullLocalFileAndUnfinished(t *testing.T) {
	dir := t.TempDir()
	t.Setenv("ATS_MODELS", dir)
	src := filepath.Join(t.TempDir(), "Tiny-Qwen3.gguf")
	b, err := os.ReadFile(oracleModel(t, "tiny-qwen3-q4_k_m"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(src, b, 0o644)
	out, _, err := runATSIn(t, "", "pull", src, "--alias", "tq")
	if err != nil || !strings.Contains(out, "registered") || !strings.Contains(out, "as tiny-qwen3 (Q4_K_M") {
		t.Fatalf("pull FILE: %v %q", err, out)
	}
	out, _, err = runATSIn(t, "", "list")
	if err != nil || !strings.Contains(out, "tiny-qwen3") || !strings.Contains(out, "Q4_K_M") {
		t.Errorf("list: %v %q", err, out)
	}
	if out, _, err := runATSIn(t, "", "run", "tq", "--raw", "-p", "hi", "-n", "2", "-t", "2"); err != nil {
		t.Errorf("run of a registered file: %v %q", err, out)
	}
	part := filepath.Join(dir, "hf.co", "Org", "Big-GGUF", "Q4_K_M")
	os.MkdirAll(part, 0o755)
	os.WriteFile(filepath.Join(part, "big-q4_k_m.gguf.partial"), make([]byte, 2048), 0o644)
	_, stderr, err := runATSIn(t, "", "list")
	if err != nil || !strings.Contains(stderr, "hf.co/Org/Big-GGUF:Q4_K_M") {
		t.Errorf("list does not name the unfinished download: %v %q", err, stderr)
	}
	out, _, err = runATSIn(t, "", "rm", "Org/Big-GGUF:Q4_K_M", "tiny-qwen3")
	if err != nil || !strings.Contains(out, "removed the unfinished download of hf.co/Org/Big-GGUF:Q4_K_M") {
		t.Errorf("rm: %v %q", err, out)
	}
	if _, err := os.Stat(src); err != nil {
		t.Errorf("rm removed the registered file itself: %v", err)
	}
}
