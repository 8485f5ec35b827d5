package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/tools/synth"
)

// syncBuffer is a bytes.Buffer safe to read while a command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

var servingRE = regexp.MustCompile(`serving on (http://[0-9.:\[\]]+)`)

// startServe runs "ats serve" in-process until the test ends (or stop is
// called) and returns its base URL.
func startServe(t *testing.T, args ...string) (url string, stderr *syncBuffer, stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	root := newRootCmd()
	stderr = &syncBuffer{}
	root.SetOut(io.Discard)
	root.SetErr(stderr)
	root.SetArgs(append([]string{"serve", "--port", "0", "-t", "2"}, args...))
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(30 * time.Second):
				t.Errorf("serve did not stop; stderr:\n%s", stderr)
			}
		})
		return err
	}
	t.Cleanup(func() { stop() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if m := servingRE.FindStringSubmatch(stderr.String()); m != nil {
			return m[1], stderr, stop
		}
		select {
		case err := <-done:
			t.Fatalf("serve ended: %v\nstderr:\n%s", err, stderr)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("serve did not start; stderr:\n%s", stderr)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func httpPost(url, body string) (*http.Response, error) {
	return http.Post(url, "application/json", strings.NewReader(body))
}

func post(t *testing.T, url, body string, header ...string) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatalf("response is not JSON: %v", err)
	}
	return resp.StatusCode, v
}

func TestServeCommand(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	url, stderr, stop := startServe(t, "-m", m, "--alias", "tiny", "--queue", "3", "--temp", "0")
	resp, err := http.Get(url + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()
	body := `{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"logit_bias":{"2":-100}}`
	code, v := post(t, url+"/v1/chat/completions", body)
	if code != 200 || v["model"] != "tiny" {
		t.Fatalf("%d %v", code, v)
	}
	// --temp 0 is the default for requests: greedy, so repeatable.
	_, v2 := post(t, url+"/v1/chat/completions", body)
	text := func(v map[string]any) any {
		return v["choices"].([]any)[0].(map[string]any)["message"].(map[string]any)["content"]
	}
	if text(v) != text(v2) {
		t.Errorf("--temp 0 default, yet %q then %q", text(v), text(v2))
	}
	if err := stop(); err != nil {
		t.Fatalf("serve: %v", err)
	}
	for _, want := range []string{"ats: loaded tiny-qwen3-q4_k_m.gguf", "queue 3", "shutting down", "ats: stopped"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr.String(), "without --api-key") {
		t.Errorf("warned about the key on loopback")
	}
}

func TestServeAPIKeyAndWarning(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	_, stderr, stop := startServe(t, "-m", m, "--host", "0.0.0.0")
	stop()
	if !strings.Contains(stderr.String(), "without --api-key: anyone who can reach this port can use the model") {
		t.Errorf("no warning for 0.0.0.0 without a key:\n%s", stderr)
	}

	t.Setenv("ATS_API_KEY", "k3y")
	url, stderr, _ := startServe(t, "-m", m, "--host", "0.0.0.0")
	if strings.Contains(stderr.String(), "without --api-key") {
		t.Errorf("warned although $ATS_API_KEY is set")
	}
	url = strings.Replace(url, "0.0.0.0", "127.0.0.1", 1)
	body := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`
	if code, _ := post(t, url+"/v1/chat/completions", body); code != 401 {
		t.Errorf("without the key: %d", code)
	}
	if code, v := post(t, url+"/v1/chat/completions", body, "Authorization", "Bearer k3y"); code != 200 {
		t.Errorf("with the key: %d %v", code, v)
	}
}

func TestServeErrors(t *testing.T) {
	for _, args := range [][]string{
		{"serve"},
		{"serve", "-m", "/nonexistent.gguf"},
		{"serve", "-m", oracleModel(t, "tiny-llama-q8_0"), "--stop", "x"},
		{"serve", "-m", oracleModel(t, "tiny-llama-q8_0"), "--queue", "-1", "--port", "0"},
	} {
		if _, _, err := runATSIn(t, "", args...); err == nil {
			t.Errorf("%q: no error", args)
		}
	}
}

// TestRealVocabulary serves and chats with a synthetic model that carries
// Qwen3's real tokenizer and chat template: thinking can be turned off per
// request, tool calls are read in Qwen3's format, and chat works on it.
func TestRealVocabulary(t *testing.T) {
	vocab := filepath.Join(testenv.SharedDir(t), "testdata", "vocab", "vocab-qwen3.gguf")
	path := filepath.Join(t.TempDir(), "qwen3.gguf")
	if _, err := synth.Write(path, synth.Options{Preset: "tiny-qwen3", Layout: "q8_0", Vocab: vocab, Seed: 1}); err != nil {
		t.Fatal(err)
	}
	t.Run("serve", func(t *testing.T) {
		url, stderr, _ := startServe(t, "-m", path, "-c", "512")
		if strings.Contains(stderr.String(), "warning") {
			t.Errorf("warning with a real template:\n%s", stderr)
		}
		if !strings.Contains(stderr.String(), "tool calls: hermes") {
			t.Errorf("Qwen3's template should give Hermes tool calls:\n%s", stderr)
		}
		promptTokens := func(extra string) float64 {
			t.Helper()
			code, v := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Hello!"}],"max_tokens":1`+extra+`}`)
			if code != 200 {
				t.Fatalf("%s: %d %v", extra, code, v)
			}
			return v["usage"].(map[string]any)["prompt_tokens"].(float64)
		}
		on := promptTokens("")
		// Qwen3's template closes an empty <think></think> block in the
		// prompt when thinking is off: 4 more tokens.
		for _, off := range []string{`,"chat_template_kwargs":{"enable_thinking":false}`, `,"reasoning_effort":"none"`} {
			if got := promptTokens(off); got != on+4 {
				t.Errorf("%s: %v prompt tokens, with thinking %v", off, got, on)
			}
		}
		code, v := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"Weather in Paris?"}],"max_tokens":1,`+
			`"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}`)
		if code != 200 || v["usage"].(map[string]any)["prompt_tokens"].(float64) < on+50 {
			t.Errorf("tools did not reach the prompt: %d %v", code, v)
		}
	})
	t.Run("chat", func(t *testing.T) {
		out, stderr, err := runATSIn(t, "Hello!\n/set think off\nAnd now?\n", "chat", "-m", path, "-c", "512", "-n", "2", "--seed", "1", "-t", "2", "--history", "")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		speeds := speedLine.FindAllStringSubmatch(stderr, -1)
		if len(speeds) != 2 || strings.Contains(stderr, "warning") {
			t.Fatalf("stdout %q\nstderr %s", out, stderr)
		}
	})
}
