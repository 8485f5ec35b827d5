package jinja_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atsinfer/ats/internal/jinja"
)

// testLimits are small enough that every hostile case below ends in
// milliseconds.
var testLimits = jinja.Limits{
	Timeout:   5 * time.Second,
	MaxOutput: 1 << 20,
	MaxAlloc:  16 << 20,
	MaxDepth:  50,
	MaxSteps:  1_000_000,
}

// TestHostileTemplates runs templates that, without limits, crash the
// process (a stack overflow is fatal in Go), take gigabytes or never end.
// Each must fail with a LimitError naming the limit.
func TestHostileTemplates(t *testing.T) {
	cases := []struct {
		name, src string
		limit     string // the LimitError.Limit expected
	}{
		{"recursive macro", `{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}`, "recursion depth"},
		{"mutual recursion", `{% macro a(n) %}{{ b(n) }}{% endmacro %}{% macro b(n) %}{{ a(n) }}{% endmacro %}{{ a(0) }}`, "recursion depth"},
		{"caller recursion", `{% macro m() %}{{ caller() }}{% endmacro %}{% macro r() %}{% call m() %}{{ r() }}{% endcall %}{% endmacro %}{{ r() }}`, "recursion depth"},
		{"string repeat", `{{ 'x' * 10000000000 }}`, "output size"},
		{"string repeat huge count", `{{ 'xy' * 9223372036854775807 }}`, "output size"},
		{"tojson indent", `{{ {'a': [1, 2, {'b': 3}]} | tojson(indent=1000000000) }}`, "output size"},
		{"range 1e9", `{% for i in range(1000000000) %}{% endfor %}`, "output size"},
		{"range extreme", `{{ range(-9223372036854775807, 9223372036854775807) | length }}`, "output size"},
		{"nested range", `{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}`, "output size"}, // a list of 100000 is 3.2 MB
		{"nested loops", `{% set r = range(3000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}`, "steps"},
		{"garbage", `{% for i in range(20000) %}{% for j in range(20000) %}{% endfor %}{% endfor %}`, "memory"},
		{"output", `{% for i in range(30000) %}{{ 'abcdefghijklmnopqrstuvwxyz0123456789' }}{% endfor %}`, "output size"},
		{"doubling string", `{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}`, "output size"},
		{"doubling list", `{% set ns = namespace(l=[1]) %}{% for i in range(64) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}`, "output size"},
		{"many strings kept", `{% set l = [] %}{% for i in range(10000) %}{{ l.append('x' * 100000) }}{% endfor %}`, "memory"},
		{"shared structure printed", `{% set a = [1, 1] %}{% set ns = namespace(x=a) %}{% for i in range(80) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}{{ ns.x }}`, "steps"},
		{"shared structure compared", `{% set ns = namespace(x=[1], y=[1]) %}{% for i in range(80) %}{% set ns.x = [ns.x, ns.x] %}{% set ns.y = [ns.y, ns.y] %}{% endfor %}{{ ns.x == ns.y }}`, "steps"},
		{"self-containing list printed", `{% set l = [1] %}{{ l.append(l) }}{{ l }}`, "nesting"},
		{"self-containing list to json", `{% set l = [1] %}{{ l.append(l) }}{{ l | tojson }}`, "nesting"},
		{"self-containing dict compared", `{% set ns = namespace() %}{% set ns.me = ns %}{{ ns == ns.me.me }}{% set other = namespace() %}{% set other.me = other %}{{ ns == other }}`, "nesting"},
		{"replace empty", `{{ ('x' * 1000) | replace('', 'y' * 100000) }}`, "output size"},
		{"join", `{{ range(100000) | map('string') | join('y' * 1000) }}`, "output size"},
		{"indent", `{{ ('a\n' * 1000) | indent(1000000) }}`, "output size"},
		{"split into characters", `{% set s = 'x' * 500000 %}{% for c in s %}{% endfor %}`, "output size"},
		{"deep parentheses", strings.Repeat("{{ ", 1) + strings.Repeat("(", 5000) + "1" + strings.Repeat(")", 5000) + " }}", "nesting"},
		{"deep not", "{{ " + strings.Repeat("not ", 5000) + "x }}", "nesting"},
		{"deep unary", "{{ " + strings.Repeat("-", 5000) + "1 }}", "nesting"},
		{"long sum", "{{ " + strings.Repeat("1 + ", 5000) + "1 }}", "nesting"},
		{"deep blocks", strings.Repeat("{% if true %}", 3000) + strings.Repeat("{% endif %}", 3000), "nesting"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := jinja.Compile(c.src)
			if err != nil {
				checkLimit(t, err, c.limit)
				return
			}
			out, err := tmpl.RenderLimited(map[string]jinja.Value{}, testLimits)
			if err == nil {
				t.Fatalf("rendered %d bytes without error; want the %s limit", len(out), c.limit)
			}
			checkLimit(t, err, c.limit)
		})
	}
}

func checkLimit(t *testing.T, err error, limit string) {
	t.Helper()
	var le *jinja.LimitError
	if !errors.As(err, &le) {
		t.Fatalf("error %v (%T) is not a LimitError", err, err)
	}
	if le.Limit != limit {
		t.Fatalf("broke the %q limit (%v), want %q", le.Limit, err, limit)
	}
	if !strings.Contains(err.Error(), limit) {
		t.Errorf("error %q does not name the %s limit", err, limit)
	}
}

func TestTimeLimitAndCancel(t *testing.T) {
	// Unbounded steps: only the clock stops it.
	tmpl, err := jinja.Compile(`{% for i in range(10000) %}{% for j in range(10000) %}{% endfor %}{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	lim := testLimits
	lim.MaxSteps = 0
	lim.Timeout = 50 * time.Millisecond
	_, err = tmpl.RenderLimited(nil, lim)
	checkLimit(t, err, "time")

	// One filter call that would outlast the limit: the sort stops too.
	sorting, err := jinja.Compile(`{% set l = ('123456789 ' * 300000).split(' ') %}{{ l | sort | length }}`)
	if err != nil {
		t.Fatal(err)
	}
	lim.MaxOutput, lim.MaxAlloc = 1<<30, 1<<30
	_, err = sorting.RenderLimited(nil, lim)
	checkLimit(t, err, "time")

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	lim.Timeout = 0
	lim.Context = ctx
	_, err = tmpl.RenderLimited(nil, lim)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled rendering: %v, want context.Canceled", err)
	}
}

// TestRealTemplatesWithinLimits renders every upstream template with the
// limits on and off: the limits must not change a byte of a real prompt.
func TestRealTemplatesWithinLimits(t *testing.T) {
	files, err := filepath.Glob("testdata/templates/*.jinja")
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates: %v", err)
	}
	msgs := jinja.FromGoValue([]any{
		map[string]any{"role": "system", "content": "You are helpful."},
		map[string]any{"role": "user", "content": strings.Repeat("Hello there. ", 2000)},
		map[string]any{"role": "assistant", "content": "Hi!"},
		map[string]any{"role": "user", "content": "Tell me a joke."},
	})
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		tmpl, err := jinja.Compile(string(src))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		data := map[string]jinja.Value{"messages": msgs, "add_generation_prompt": jinja.NewBool(true), "bos_token": jinja.NewString("<s>")}
		want, errWant := tmpl.RenderValues(data)
		got, errGot := tmpl.RenderLimited(data, testLimits)
		if (errWant == nil) != (errGot == nil) || got != want {
			t.Errorf("%s: limited rendering differs: %v / %v", filepath.Base(f), errGot, errWant)
		}
	}
}
