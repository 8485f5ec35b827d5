package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atsinfer/ats/gguf"
)

// TestFlagBounds: sizes from flags are checked before anything big is
// allocated, with errors that say what to do (issue 13).
func TestFlagBounds(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"run", "-m", m, "-p", "x", "-c", "100000000"}, "context"},
		{[]string{"run", "-m", m, "-p", "x", "-t", "20000"}, "threads"},
		{[]string{"run", "-m", m, "-p", "x", "-c", "256", "--repeat-penalty", "1.1", "--repeat-last-n", "10000000000"}, "repeat_last_n"},
		{[]string{"chat", "-m", m, "-c", "256", "--repeat-last-n", "1000", "--history", ""}, "repeat_last_n"},
	} {
		start := time.Now()
		_, _, err := runATSIn(t, "", tc.args...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want it to mention %q", tc.args, err, tc.want)
		}
		t.Logf("%v: %v (%v)", tc.args[5:], err, time.Since(start).Round(time.Millisecond))
	}
}

// TestChatKeepsHistoryWhenTooLong: a message too long for the context is
// refused, and the conversation before it stays.
func TestChatKeepsHistoryWhenTooLong(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	long := strings.Repeat("word ", 400)
	stdin := "hello\n" + long + "\n/set repeat_last_n 100000\n/stats\n"
	out, stderr, err := runATSIn(t, stdin, "chat", "-m", m, "-c", "256", "-n", "4", "--seed", "1", "-t", "2", "--history", "")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "too long") {
		t.Errorf("no note about the long message; stderr:\n%s", stderr)
	}
	if !strings.Contains(out, "1 exchange in the conversation") {
		t.Errorf("the conversation was not kept; stdout:\n%s", out)
	}
	if !strings.Contains(out, "error: repeat_last_n 100000 is more than the context") {
		t.Errorf("/set repeat_last_n past the context accepted; stdout:\n%s", out)
	}
}

// TestServeBusyPort: a busy port is reported before the model loads.
func TestServeBusyPort(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	_, stderr, err := runATSIn(t, "", "serve", "-m", m, "--port", port, "-t", "2")
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("serve on a busy port: %v", err)
	}
	if strings.Contains(stderr, "loaded") {
		t.Errorf("the model was loaded before the port was taken:\n%s", stderr)
	}
}

// withTemplate writes a copy of an oracle model whose chat template is src.
func withTemplate(t *testing.T, model, src string) string {
	t.Helper()
	f, err := gguf.Open(oracleModel(t, model))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p := f.Parts[0]
	p.KVs = append(p.KVs, gguf.KV{Key: "tokenizer.chat_template", Value: gguf.String(src)})
	path := filepath.Join(t.TempDir(), "templated.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if _, err := f.WriteTo(out); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestHostileTemplateFallsBack: a model whose template recurses without end
// (issue 13: ats serve died of a stack overflow at start) runs with the
// built-in template and a warning naming the limit.
func TestHostileTemplateFallsBack(t *testing.T) {
	path := withTemplate(t, "tiny-qwen3-q4_k_m", `{% macro f(n) %}{{ f(n+1) }}{% endmacro %}<|im_start|>{{ f(0) }}`)
	_, stderr, err := runATSIn(t, "", "run", "-m", path, "-p", "hi", "-n", "2", "-t", "2", "-c", "256")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(stderr, "recursion depth") || !strings.Contains(stderr, "built-in chatml") {
		t.Errorf("no warning about the limit and the fallback:\n%s", stderr)
	}
	url, serveErr, _ := startServe(t, "-m", path, "-c", "256")
	if code, v := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`); code != 200 {
		t.Errorf("serve with the fallback: %d %v", code, v)
	}
	if !strings.Contains(serveErr.String(), "recursion depth") {
		t.Errorf("serve gave no warning:\n%s", serveErr)
	}
}
