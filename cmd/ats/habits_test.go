package main

import (
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atsinfer/ats/internal/testenv"
)

// The habits people bring from llama.cpp and ollama.

func TestModelAsArgument(t *testing.T) {
	m := oracleModel(t, "tiny-llama-q8_0")
	t.Setenv("ATS_MODELS", t.TempDir())
	base := []string{"--raw", "-p", "hello", "-n", "3", "--temp", "0", "--print-tokens", "-t", "2"}
	want, _, err := runATSIn(t, "", append([]string{"run", "-m", m}, base...)...)
	if err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		append([]string{"run", m}, base...),
		append([]string{"run"}, append(base, m)...), // after the flags too
		append([]string{"run", m, "-m", m}, base...),
	} {
		got, _, err := runATSIn(t, "", args...)
		if err != nil || got != want {
			t.Errorf("%v: %q, %v; want %q", args, got, err, want)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", m, "-m", oracleModel(t, "tiny-qwen3-f16"), "-p", "x"}, "the model is given twice"},
		{[]string{"run", m, "extra", "-p", "x"}, "accepts at most 1 arg"},
		{[]string{"chat"}, "no model given: ats chat MODEL or -m MODEL"},
		{[]string{"bench", "-p", "0", "-n", "1"}, "no model given"},
		{[]string{"eval", "--tokens", "1"}, "no model given"},
		{[]string{"run", "nosuchmodel", "-p", "x"}, "nosuchmodel: no such file, and no pulled model of that name"},
	} {
		_, _, err := runATSIn(t, "", tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want it to mention %q", tc.args, err, tc.want)
		}
	}
	// The other model commands take it as an argument too.
	out, _, err := runATSIn(t, "", "eval", m, "--tokens", "1,2", "--n-gen", "1", "--logits-json", filepath.Join(t.TempDir(), "l.json"))
	if err != nil {
		t.Errorf("eval MODEL: %v %s", err, out)
	}
	out, _, err = runATSIn(t, "", "bench", m, "-p", "0", "-n", "2", "-r", "1", "-t", "2", "--no-warmup")
	if err != nil || !strings.Contains(out, "tg2") {
		t.Errorf("bench MODEL: %v\n%s", err, out)
	}
	out, _, err = runATSIn(t, "hi\n", "chat", m, "-n", "2", "-t", "2", "--history", "")
	if err != nil {
		t.Errorf("chat MODEL: %v\n%s", err, out)
	}
}

func TestLlamaSpellings(t *testing.T) {
	got := llamaSpellings([]string{"run", "-ngl", "99", "--gpu-layers=5", "-ngl=0", "-n", "3", "--", "-ngl"})
	want := []string{"run", "--n-gpu-layers", "99", "--n-gpu-layers=5", "--n-gpu-layers=0", "-n", "3", "--", "-ngl"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

// -ngl N is accepted: 0 means the CPU, another count a one-line note.
func TestGPULayersFlag(t *testing.T) {
	m := oracleModel(t, "tiny-llama-q8_0")
	run := func(extra ...string) (string, error) {
		args := append([]string{"run", m, "--raw", "-p", "hi", "-n", "1", "-t", "2"}, extra...)
		_, stderr, err := runATSIn(t, "", args...)
		return stderr, err
	}
	stderr, err := run("-ngl", "99")
	if err != nil || !strings.Contains(stderr, "ats: -ngl 99 ignored") || !strings.Contains(stderr, "--vram-budget") {
		t.Errorf("-ngl 99: %v\n%s", err, stderr)
	}
	if n := strings.Count(stderr, "-ngl"); n != 1 {
		t.Errorf("the note should be one line, got %d mentions", n)
	}
	stderr, err = run("--n-gpu-layers", "0")
	if err != nil || !strings.Contains(stderr, "running on the CPU only (--backend cpu)") {
		t.Errorf("-ngl 0: %v\n%s", err, stderr)
	}
	if _, err := run("-ngl", "0", "--backend", "gpu"); err == nil || !strings.Contains(err.Error(), "-ngl 0 means the CPU only") {
		t.Errorf("-ngl 0 --backend gpu: %v", err)
	}
	if _, err := run("--gpu-layers", "all"); err == nil || !strings.Contains(err.Error(), "want a number of layers") {
		t.Errorf("--gpu-layers all: %v", err)
	}
	// llama-bench takes lists.
	out, stderr, err := runATSIn(t, "", "bench", m, "-ngl", "0,0", "-p", "0", "-n", "1", "-r", "1", "-t", "2", "--no-warmup", "-o", "json")
	if err != nil || !strings.Contains(stderr, "running on the CPU only") || !strings.Contains(out, `"backends": "CPU`) {
		t.Errorf("bench -ngl 0,0: %v\n%s\n%s", err, stderr, out)
	}
}

// complete runs cobra's hidden completion command and returns the
// candidates and the directive line.
func complete(t *testing.T, args ...string) ([]string, string) {
	t.Helper()
	out, _, err := runATSIn(t, "", append([]string{"__complete"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	var cands []string
	for _, l := range lines[:len(lines)-1] {
		c, _, _ := strings.Cut(l, "\t")
		cands = append(cands, c)
	}
	return cands, lines[len(lines)-1]
}

func TestCompletion(t *testing.T) {
	dir, _ := modelsEnv(t)
	got, dir4 := complete(t, "run", "--backend", "")
	if diff := cmp.Diff([]string{"auto", "cpu", "gpu"}, got); diff != "" || dir4 != ":4" {
		t.Errorf("--backend (-want +got):\n%s %s", diff, dir4)
	}
	got, _ = complete(t, "synth", "--preset", "qwen3-")
	if len(got) < 4 || !strings.HasPrefix(got[0], "qwen3-") {
		t.Errorf("--preset: %v", got)
	}
	got, _ = complete(t, "synth", "--layout", "")
	if !strings.Contains(strings.Join(got, " "), "q4_k_m") {
		t.Errorf("--layout: %v", got)
	}
	// No models pulled: the shell completes .gguf files (directive 8).
	got, d := complete(t, "run", "")
	if diff := cmp.Diff([]string{"gguf"}, got); diff != "" || d != ":8" {
		t.Errorf("model with nothing pulled: %v %s", got, d)
	}
	// With one pulled, its names come first.
	mdir := filepath.Join(dir, "m")
	os.MkdirAll(mdir, 0o755)
	os.WriteFile(filepath.Join(mdir, "model.json"), []byte(`{"name":"hf.co/a/b:Q8_0","aliases":["b:q8_0"],"files":[{"name":"b.gguf","size":1}]}`), 0o644)
	got, d = complete(t, "chat", "b")
	if diff := cmp.Diff([]string{"b:q8_0"}, got); diff != "" || d != ":4" {
		t.Errorf("model b: %v %s", got, d)
	}
	got, _ = complete(t, "serve", "-m", "hf")
	if diff := cmp.Diff([]string{"hf.co/a/b:Q8_0"}, got); diff != "" {
		t.Errorf("-m hf: %v", got)
	}
	got, _ = complete(t, "rm", "")
	if len(got) != 2 {
		t.Errorf("rm: %v", got)
	}
	got, d = complete(t, "run", "./")
	if diff := cmp.Diff([]string{"gguf"}, got); diff != "" || d != ":8" {
		t.Errorf("a path: %v %s", got, d)
	}
}

func TestVersionFlag(t *testing.T) {
	a, _, err := runATSIn(t, "", "--version")
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := runATSIn(t, "", "version")
	if err != nil || a != b || !strings.HasPrefix(a, "ats ") {
		t.Errorf("--version %q, version %q (%v)", a, b, err)
	}
	bi := &debug.BuildInfo{Settings: []debug.BuildSetting{
		{Key: "vcs", Value: "git"}, {Key: "vcs.revision", Value: "0123456789abcdef0123"},
		{Key: "vcs.time", Value: "2025-06-01T10:00:00Z"}, {Key: "vcs.modified", Value: "true"},
	}}
	if got, want := commitOf("", "", bi), " (commit 0123456789ab, modified, 2025-06-01)"; got != want {
		t.Errorf("commitOf = %q, want %q", got, want)
	}
	if got := commitOf("", "", &debug.BuildInfo{}); got != "" {
		t.Errorf("no VCS settings: %q", got)
	}
	// A release build: the commit and date given with -ldflags -X win.
	if got, want := commitOf("fedcba9876543210fedcba9876543210fedcba98", "2026-12-01T10:00:00Z", bi), " (commit fedcba987654, built 2026-12-01)"; got != want {
		t.Errorf("release commitOf = %q, want %q", got, want)
	}
	for _, tc := range []struct {
		set, module, want string
	}{
		{"v1.2.3", "v0.0.1", "v1.2.3"},
		{"dev", "v0.4.0", "v0.4.0"}, // go install ...@v0.4.0
		{"dev", "(devel)", "dev"},
		{"dev", "", "dev"},
	} {
		if got := versionOf(tc.set, &debug.BuildInfo{Main: debug.Module{Version: tc.module}}); got != tc.want {
			t.Errorf("versionOf(%q, module %q) = %q, want %q", tc.set, tc.module, got, tc.want)
		}
	}
}

func TestRunPromptFile(t *testing.T) {
	m := oracleModel(t, "tiny-llama-q8_0")
	dir := t.TempDir()
	pf := filepath.Join(dir, "prompt.txt")
	os.WriteFile(pf, []byte("hello world\n"), 0o644)
	base := []string{"run", m, "--raw", "-n", "4", "--temp", "0", "--print-tokens", "-t", "2"}
	want, stderr, err := runATSIn(t, "", append(base, "-p", "hello world")...)
	if err != nil {
		t.Fatal(err)
	}
	// Load and prompt are reported apart.
	if !strings.Contains(stderr, "ats: loaded tiny-llama-q8_0.gguf") || !strings.Contains(stderr, "prompt: ") {
		t.Errorf("stderr: %s", stderr)
	}
	if got, _, err := runATSIn(t, "", append(base, "-f", pf)...); err != nil || got != want {
		t.Errorf("-f FILE: %q %v, want %q", got, err, want)
	}
	if got, _, err := runATSIn(t, "hello world\n", append(base, "-f", "-")...); err != nil || got != want {
		t.Errorf("-f -: %q %v, want %q", got, err, want)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-f", pf, "-p", "x"}, "give the prompt once"},
		{[]string{"-f", dir}, "is a directory"},
		{[]string{"-f", filepath.Join(dir, "missing.txt")}, "no such file"},
	} {
		if _, _, err := runATSIn(t, "", append(base, tc.args...)...); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.want)
		}
	}
}

func TestSynthOutputChecks(t *testing.T) {
	dir := t.TempDir()
	existing := filepath.Join(dir, "m.gguf")
	os.WriteFile(existing, []byte("keep me"), 0o644)
	synthArgs := func(out string, extra ...string) []string {
		return append([]string{"synth", "--preset", "tiny-llama", "--layout", "q8_0", "-o", out}, extra...)
	}
	if _, _, err := runATS(t, synthArgs(existing)...); err == nil || !strings.Contains(err.Error(), "exists; --force replaces it") {
		t.Errorf("existing file: %v", err)
	}
	if b, _ := os.ReadFile(existing); string(b) != "keep me" {
		t.Error("the existing file was changed")
	}
	if _, _, err := runATS(t, synthArgs(dir)...); err == nil || !strings.Contains(err.Error(), "is a directory; give a file name, e.g. -o "+filepath.Join(dir, "tiny-llama-q8_0.gguf")) {
		t.Errorf("-o DIR: %v", err)
	}
	if _, _, err := runATS(t, synthArgs(filepath.Join(dir, "no", "such", "m.gguf"))...); err == nil || !strings.Contains(err.Error(), "cannot write") {
		t.Errorf("-o in a missing folder: %v", err)
	}
	if _, _, err := runATS(t, synthArgs(existing, "--force")...); err != nil {
		t.Errorf("--force: %v", err)
	}
	if b, _ := os.ReadFile(existing); string(b) == "keep me" {
		t.Error("--force did not replace the file")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("files left in the output folder: %v", entries)
	}
}

func TestInspectTemplate(t *testing.T) {
	vocab := filepath.Join(testenv.SharedDir(t), "testdata", "vocab", "vocab-qwen3.gguf")
	out, err := runInspect(t, vocab, "--template", "--tensors=false")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "chat template text (") || !strings.Contains(out, "<|im_start|>") {
		t.Errorf("--template output lacks the template:\n%s", out)
	}
	plain, _ := runInspect(t, vocab, "--tensors=false")
	if strings.Contains(plain, "<|im_start|>assistant") {
		t.Error("the template text without --template")
	}
	js, err := runInspect(t, vocab, "--template", "--json", "--tensors=false")
	var r struct {
		ChatTemplate struct {
			Bytes int    `json:"bytes"`
			Text  string `json:"text"`
		} `json:"chat_template"`
	}
	if err != nil || json.Unmarshal([]byte(js), &r) != nil || len(r.ChatTemplate.Text) != r.ChatTemplate.Bytes || r.ChatTemplate.Bytes == 0 {
		t.Errorf("--json --template: %v, %d bytes, text of %d", err, r.ChatTemplate.Bytes, len(r.ChatTemplate.Text))
	}
	out, err = runInspect(t, oracleModel(t, "tiny-llama-q8_0"), "--template", "--tensors=false")
	if err != nil || !strings.Contains(out, "chat template text: none in the file") {
		t.Errorf("no template: %v\n%s", err, out)
	}
}

func TestServeURLs(t *testing.T) {
	host, _ := os.Hostname()
	for _, tc := range []struct {
		addr          *net.TCPAddr
		local, remote string
	}{
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 8082}, "http://127.0.0.1:8082", "http://" + net.JoinHostPort(host, "8082")},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 80}, "http://127.0.0.1:80", "http://" + net.JoinHostPort(host, "80")},
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 8080}, "http://127.0.0.1:8080", ""},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 8080}, "http://[::1]:8080", ""},
		{&net.TCPAddr{IP: net.IPv4(192, 168, 1, 5), Port: 9}, "http://192.168.1.5:9", ""},
	} {
		local, remote := serveURLs(tc.addr)
		if host == "" || host == "localhost" {
			tc.remote = ""
		}
		if local != tc.local || remote != tc.remote {
			t.Errorf("%v: %q %q, want %q %q", tc.addr, local, remote, tc.local, tc.remote)
		}
	}
}

func TestServeBannerEveryInterface(t *testing.T) {
	url, stderr, stop := startServe(t, "-m", oracleModel(t, "tiny-qwen3-q4_k_m"), "--host", "0.0.0.0", "--api-key", "k")
	defer stop()
	if !strings.HasPrefix(url, "http://127.0.0.1:") || strings.Contains(stderr.String(), "[::]") {
		t.Errorf("banner: %s", stderr.String())
	}
}

func TestChatStatsPlural(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	out, _, err := runATSIn(t, "hi\n/stats\n", "chat", m, "-n", "2", "-t", "2", "--history", "")
	if err != nil || !strings.Contains(out, "; 1 exchange in the conversation;") {
		t.Errorf("%v\n%s", err, out)
	}
	if got := plural(0, "exchange", "exchanges"); got != "0 exchanges" {
		t.Errorf("plural(0) = %q", got)
	}
}
