package session

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/text/chat"
)

// TestContextLimits: sizes from flags are checked before anything is
// allocated (issue 13: -c 100000000 was a fatal out-of-memory, -t 20000
// was accepted).
func TestContextLimits(t *testing.T) {
	m, err := model.Open(filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-qwen3-q4_k_m.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	cases := []struct {
		opt  Options
		want string
	}{
		{Options{CtxSize: 100_000_000}, "context"},
		{Options{CtxSize: MaxCtxSize + 1, Backend: "gpu"}, "more than ats supports"},
		{Options{Threads: 20000}, "threads"},
		{Options{Threads: -1}, "negative"},
	}
	for _, c := range cases {
		_, err := newCtx(m, c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error about %q", c.opt, err, c.want)
		}
	}
	// -c 100000000 on the CPU: an error naming the memory when it can be
	// read, the size cap otherwise.
	_, err = newCtx(m, Options{CtxSize: 100_000_000})
	if _, ok := availableMemory(); ok && !strings.Contains(err.Error(), "memory") {
		t.Errorf("huge context: %v, want the memory it needs", err)
	}
	c, err := newCtx(m, Options{CtxSize: 512, Threads: 1})
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
}

func TestContextWarnings(t *testing.T) {
	h := ir.Hyper{NCtxTrain: 4096}
	if w := ContextWarnings(h, Options{CtxSize: 8192}); len(w) != 1 || !strings.Contains(w[0], "trained on") {
		t.Errorf("warnings %q", w)
	}
	if w := ContextWarnings(h, Options{CtxSize: 4096}); len(w) != 0 {
		t.Errorf("warnings %q", w)
	}
}

func TestContextBytes(t *testing.T) {
	h := ir.Hyper{NLayer: 2, NKVHead: 2, HeadK: 64, HeadV: 64, NVocab: 100, NEmbd: 8, NFF: 16}
	a := contextBytes(h, Options{CtxSize: 1000, Batch: 1})
	b := contextBytes(h, Options{CtxSize: 2000, Batch: 1})
	if b-a != 2*2*128*2*1000 {
		t.Errorf("KV bytes per 1000 tokens: %d", b-a)
	}
	if n := maxFittingCtx(h, Options{Batch: 1}, b); n < 1000 || n > 2000 {
		t.Errorf("maxFittingCtx = %d", n)
	}
	if contextBytes(h, Options{CtxSize: 1 << 62}) <= 0 {
		t.Error("overflow")
	}
}

// TestRenderChatFallsBack: a model's template that breaks a limit midway
// through a chat is replaced by the built-in template of its family, with
// a warning, and the chat goes on.
func TestRenderChatFallsBack(t *testing.T) {
	m, err := model.Open(filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-qwen3-q4_k_m.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	var warned []string
	s, err := NewSession(m, Options{CtxSize: 256, Threads: 1}, func(w string) { warned = append(warned, w) })
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	s.Template, err = chat.New(`{% if messages | length > 1 %}{{ 'x' * 10000000000 }}{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	out, err := s.RenderChat([]chat.Message{{Role: "user", Content: "hi"}, {Role: "assistant", Content: "hello"}, {Role: "user", Content: "again"}}, chat.Options{AddGenerationPrompt: true})
	if err != nil || !strings.Contains(out, "again") {
		t.Fatalf("RenderChat: %q, %v", out, err)
	}
	if s.Template.Family() != "chatml" || len(warned) != 1 || !strings.Contains(warned[0], "output size") {
		t.Errorf("template %q, warnings %q", s.Template.Family(), warned)
	}
}
