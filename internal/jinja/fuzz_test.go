package jinja_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/atsinfer/ats/internal/jinja"
)

// FuzzRenderLimited renders arbitrary templates within small limits: the
// engine must return (output or an error) without panicking and within its
// time limit, whatever the template does.
//
//	go test ./internal/jinja -run '^$' -fuzz FuzzRenderLimited -fuzztime 10m
func FuzzRenderLimited(f *testing.F) {
	for _, seed := range []string{
		`{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}`,
		`{{ 'x' * 10000000000 }}`,
		`{{ messages | tojson(indent=1000000000) }}`,
		`{% for i in range(1000000000) %}{{ i }}{% endfor %}`,
		`{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`,
		`{% set l = [1] %}{{ l.append(l) }}{{ l }}{{ l == l }}{{ l | tojson }}`,
		`{% set ns = namespace(s='ab') %}{% for m in messages %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s[::-1] | upper }}`,
		`{{ messages[0].content.split('') | join(', ') | replace('', '--') }}`,
		`{% for k, v in messages[0].items() %}{{ k }}={{ v | string | indent(4, true) }}{% endfor %}`,
		`{{ (messages | map(attribute='role') | unique | list | sort | reverse | first).title() }}`,
		`{{ '{0}{1}{}'.format(messages, tools) * 3 }}{{ range(5) | batch(2) | list }}{{ {'a': 1} | dictsort }}`,
		`{% call(x) loop_macro() %}{{ x }}{% endcall %}{% filter upper %}{{ messages[-1]['content'] }}{% endfilter %}`,
	} {
		f.Add(seed)
	}
	files, _ := filepath.Glob("testdata/templates/*.jinja")
	for _, file := range files {
		if src, err := os.ReadFile(file); err == nil {
			f.Add(string(src))
		}
	}
	lim := jinja.Limits{Timeout: 100 * time.Millisecond, MaxOutput: 1 << 20, MaxAlloc: 32 << 20, MaxDepth: 20, MaxSteps: 100_000}
	f.Fuzz(func(t *testing.T, src string) {
		// A hang inside the engine never returns to the checks below: a
		// watchdog crashes the worker instead, which makes the fuzzer keep
		// the input, and shows where it hung.
		watchdog := time.AfterFunc(20*lim.Timeout+5*time.Second, func() {
			buf := make([]byte, 1<<20)
			panic(fmt.Sprintf("jinja hung on %q\n%s", src, buf[:runtime.Stack(buf, true)]))
		})
		defer watchdog.Stop()
		tmpl, err := jinja.Compile(src)
		if errors.Is(err, jinja.ErrInternal) {
			t.Fatalf("parser panic: %v", err)
		}
		if err != nil {
			return
		}
		data := map[string]jinja.Value{
			"messages": jinja.FromGoValue([]any{
				map[string]any{"role": "system", "content": "Be brief."},
				map[string]any{"role": "user", "content": "Hi <tool_call> there\n"},
			}),
			"tools":                 jinja.FromGoValue([]any{map[string]any{"type": "function", "function": map[string]any{"name": "f", "parameters": map[string]any{"a": []any{1, 2.5, nil, true}}}}}),
			"add_generation_prompt": jinja.NewBool(true),
		}
		start := time.Now()
		out, err := tmpl.RenderLimited(data, lim)
		if took := time.Since(start); took > 20*lim.Timeout {
			// The limit is checked every few steps; a step that runs far
			// longer than the budget means some work is not counted.
			t.Fatalf("rendering took %v with a time limit of %v", took, lim.Timeout)
		}
		if errors.Is(err, jinja.ErrInternal) {
			t.Fatalf("engine panic: %v", err)
		}
		if err == nil && len(out) > lim.MaxOutput {
			t.Fatalf("output of %d bytes passed the limit of %d", len(out), lim.MaxOutput)
		}
	})
}
