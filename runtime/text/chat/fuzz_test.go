package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/atsinfer/ats/internal/jinja"
)

// FuzzRender renders arbitrary chat templates the way ats does (the source
// rewritten by prepareSource, HF's tojson, raise_exception, strftime_now)
// over a conversation with tools, within small limits: it must return
// within its time budget, with a prompt no larger than the output limit or
// an error, and never panic.
//
//	go test ./runtime/text/chat -run '^$' -fuzz FuzzRender -fuzztime 10m
func FuzzRender(f *testing.F) {
	for _, seed := range []string{
		`{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}`,
		`{{ 'x' * 10000000000 }}`,
		`{{ messages | tojson(indent=1000000000) }}`,
		`{{ tools | tojson(indent='\t', separators=(',', ': '), sort_keys=true, ensure_ascii=true) }}`,
		`{% for i in range(1000000000) %}{{ i }}{% endfor %}`,
		`{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`,
		`{% set l = [] %}{{ l.append(l) }}{{ raise_exception(l) }}`,
		`{{ strftime_now('%Y-%m-%d %-d %b') }}{% raw %}{{ not parsed }}{% endraw %}{#- c -#}`,
		`{%- for m in messages -%}{{- m.role | upper -}}:{{ m.content }}{%- if m.tool_calls %}{{ m.tool_calls[0].function.arguments | tojson }}{% endif %}{% endfor %}`,
	} {
		f.Add(seed)
	}
	for _, name := range []string{"qwen3.jinja", "llama3.jinja", "tojson.jinja", "whitespace.jinja"} {
		if b, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(string(b))
		}
	}
	for _, src := range fallbacks {
		f.Add(src)
	}
	msgs := []Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Weather in Paris? <think>"},
		{Role: "assistant", Content: "", ReasoningContent: "Look it up.", ToolCalls: []ToolCall{{ID: "c1", Function: FunctionCall{Name: "get_weather", Arguments: `{"city":"Paris","days":[1,2.5,null]}`}}}},
		{Role: "tool", ToolCallID: "c1", Name: "get_weather", Content: "sunny"},
		{Role: "user", Content: "Thanks! 🇫🇷\n"},
	}
	tools := []Tool{{"type": "function", "function": json.RawMessage(`{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}`)}}
	lim := Limits{Timeout: 100 * time.Millisecond, MaxOutput: 1 << 20, MaxAlloc: 32 << 20, MaxDepth: 20, MaxSteps: 100_000}
	f.Fuzz(func(t *testing.T, src string) {
		watchdog := time.AfterFunc(20*lim.Timeout+5*time.Second, func() {
			buf := make([]byte, 1<<20)
			panic(fmt.Sprintf("chat template hung on %q\n%s", src, buf[:runtime.Stack(buf, true)]))
		})
		defer watchdog.Stop()
		tmpl, err := New(src)
		if errors.Is(err, jinja.ErrInternal) {
			t.Fatalf("parser panic: %v", err)
		}
		if err != nil {
			return
		}
		start := time.Now()
		out, err := tmpl.Render(msgs, Options{AddGenerationPrompt: true, Tools: tools, Vars: map[string]any{"enable_thinking": false}, BOS: "<s>", EOS: "</s>", Limits: &lim})
		if took := time.Since(start); took > 20*lim.Timeout {
			t.Fatalf("rendering took %v with a time limit of %v", took, lim.Timeout)
		}
		if errors.Is(err, jinja.ErrInternal) {
			t.Fatalf("engine panic: %v", err)
		}
		if err == nil && len(out) > lim.MaxOutput {
			t.Fatalf("prompt of %d bytes passed the limit of %d", len(out), lim.MaxOutput)
		}
		_ = strings.TrimSpace(out)
	})
}

// BenchmarkRenderLimits measures what the limits cost on a real template:
// Qwen3's, over a conversation with tools.
func BenchmarkRenderLimits(b *testing.B) {
	src, err := os.ReadFile(filepath.Join("testdata", "qwen3.jinja"))
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := New(string(src))
	if err != nil {
		b.Fatal(err)
	}
	var msgs []Message
	for i := range 50 {
		msgs = append(msgs, Message{Role: "user", Content: strings.Repeat("question ", 50)}, Message{Role: "assistant", Content: fmt.Sprintf("answer %d", i)})
	}
	msgs = append(msgs, Message{Role: "user", Content: "last"})
	// The engine's unlimited path (no budget at all), for comparison.
	b.Run("unbudgeted", func(b *testing.B) {
		data, err := templateData(msgs, Options{AddGenerationPrompt: true}, nil)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if _, err := tmpl.t.RenderValues(data); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, c := range []struct {
		name string
		lim  Limits
	}{{"limits", DefaultLimits()}, {"none", Limits{}}} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if _, err := tmpl.Render(msgs, Options{AddGenerationPrompt: true, Limits: &c.lim}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
