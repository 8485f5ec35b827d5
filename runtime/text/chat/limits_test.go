package chat

import (
	"errors"
	"strings"
	"testing"
)

// TestTemplateLimits: the hostile templates of issue 13 (from a model
// file) end quickly with an error that names the limit they broke.
func TestTemplateLimits(t *testing.T) {
	cases := []struct{ name, src, limit string }{
		{"recursive macro", `{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}`, "recursion depth"},
		{"huge repeat", `{{ 'x' * 10000000000 }}`, "output size"},
		{"tojson indent", `{{ messages | tojson(indent=1000000000) }}`, "output size"},
		{"tojson string indent", `{{ messages | tojson(indent='x' * 60000000) }}`, "output size"},
		{"range 1e9", `{% for i in range(1000000000) %}{{ i }}{% endfor %}`, "output size"},
		{"nested range", `{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`, "memory"},
		{"self-containing list", `{% set l = [] %}{{ l.append(l) }}{{ l | tojson }}`, "nesting"},
		{"raise a huge value", `{% set ns = namespace(x=[1]) %}{% for i in range(60) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ raise_exception(ns.x) }}`, "output size"},
		// Issue 33: 20 MB of format made 40 MB of prompt, which the
		// tokenizer then took gigabytes for.
		{"strftime of a huge format", `{{ strftime_now('%Y' * 10000000) }}`, "output size"},
	}
	lim := DefaultLimits()
	lim.MaxOutput, lim.MaxAlloc = 4<<20, 16<<20
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := New(c.src)
			if err != nil {
				t.Fatal(err)
			}
			_, err = tmpl.Render([]Message{{Role: "user", Content: "hi"}}, Options{Limits: &lim})
			var le *LimitError
			if !errors.As(err, &le) || le.Limit != c.limit {
				t.Fatalf("Render: %v; want the %s limit", err, c.limit)
			}
			if !strings.Contains(err.Error(), c.limit) {
				t.Errorf("error %q does not name the limit", err)
			}
		})
	}
}

// TestNestedLoopsHitTheStepLimit: loops that allocate nothing are stopped
// by the step budget of DefaultLimits, well before its time limit.
func TestNestedLoopsHitTheStepLimit(t *testing.T) {
	tmpl, err := New(`{% set r = range(20000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	lim := DefaultLimits()
	lim.MaxSteps = 2_000_000
	_, err = tmpl.Render(nil, Options{Limits: &lim})
	var le *LimitError
	if !errors.As(err, &le) || le.Limit != "steps" {
		t.Fatalf("Render: %v; want the steps limit", err)
	}
}

// TestLoadFallsBackFromHostileTemplate: a model whose template breaks a
// limit on a plain conversation gets the built-in template of its family,
// with a warning that names the limit, instead of a crash at start.
func TestLoadFallsBackFromHostileTemplate(t *testing.T) {
	src := `{% macro f(n) %}{{ f(n+1) }}{% endmacro %}<|im_start|>{{ f(0) }}`
	var warned string
	tmpl, err := Load(src, func(s string) { warned = s })
	if err != nil {
		t.Fatal(err)
	}
	if tmpl.Family() != "chatml" {
		t.Errorf("family %q, want the chatml fallback", tmpl.Family())
	}
	if !strings.Contains(warned, "recursion depth") || !strings.Contains(warned, "chatml") {
		t.Errorf("warning %q does not name the limit and the fallback", warned)
	}
	if _, err := Load(strings.Repeat("x", MaxTemplateBytes+1), nil); err == nil {
		t.Error("a template larger than MaxTemplateBytes loaded")
	}
}

func TestReservedEngineNames(t *testing.T) {
	tmpl, err := New(`{% set ns = namespace(a=1) %}{{ ns.a }}{% for i in range(2) %}{{ loop.index }}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"namespace", "range", "loop", "dict", "caller"} {
		if !ReservedVar(name) {
			t.Errorf("ReservedVar(%q) = false", name)
		}
		if _, err := tmpl.Render(nil, Options{Vars: map[string]any{name: 1}}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Vars[%q]: err = %v, want one naming it", name, err)
		}
	}
}
