package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
)

// The reference renderings in testdata/ come from Python's jinja2 set up as
// HF transformers does (testdata/gen_refs.py); ats must match them byte for
// byte.

type refCase struct {
	Name                string         `json:"name"`
	AddGenerationPrompt bool           `json:"add_generation_prompt"`
	Messages            []Message      `json:"messages"`
	Tools               []Tool         `json:"tools"`
	Vars                map[string]any `json:"vars"`
}

func loadCases(t *testing.T) []refCase {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "cases.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cases []refCase
	if err := json.Unmarshal(b, &cases); err != nil {
		t.Fatalf("testdata/cases.json: %v", err)
	}
	return cases
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// firstDiff describes where got and want part, for readable failures.
func firstDiff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(i-40, 0)
	return "at byte " + itoa(i) + ":\n got: " + quote(got[lo:min(i+40, len(got))]) +
		"\nwant: " + quote(want[lo:min(i+40, len(want))])
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }
func quote(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return strings.TrimSpace(b.String())
}

func TestModelTemplatesMatchReference(t *testing.T) {
	cases := loadCases(t)
	for _, family := range []string{"qwen3", "llama3"} {
		src := readFile(t, filepath.Join("testdata", family+".jinja"))
		var tokens struct {
			BOS string `json:"bos_token"`
			EOS string `json:"eos_token"`
		}
		if err := json.Unmarshal([]byte(readFile(t, filepath.Join("testdata", family+".tokens.json"))), &tokens); err != nil {
			t.Fatal(err)
		}
		tmpl, err := Load(src, func(w string) { t.Errorf("%s: unexpected fallback: %s", family, w) })
		if err != nil {
			t.Fatalf("%s: %v", family, err)
		}
		if tmpl.Family() != "" {
			t.Fatalf("%s: got the built-in %s template, want the model's", family, tmpl.Family())
		}
		for _, c := range cases {
			checkCase(t, tmpl, family, c, tokens.BOS, tokens.EOS)
		}
	}
}

// TestTemplatesFromGGUF checks that the testdata copies are the templates
// the GGUF fixtures carry, and renders straight from the GGUF.
func TestTemplatesFromGGUF(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "vocab")
	cases := loadCases(t)
	for _, family := range []string{"qwen3", "llama3"} {
		f, err := gguf.Open(filepath.Join(dir, "vocab-"+family+".gguf"))
		if err != nil {
			t.Fatal(err)
		}
		src, err := f.String("tokenizer.chat_template")
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		if src != readFile(t, filepath.Join("testdata", family+".jinja")) {
			t.Errorf("testdata/%s.jinja is not the GGUF's template: run testdata/gen_refs.py", family)
		}
		tmpl, err := Load(src, func(w string) { t.Errorf("%s: unexpected fallback: %s", family, w) })
		if err != nil {
			t.Fatal(err)
		}
		var tokens struct {
			BOS string `json:"bos_token"`
			EOS string `json:"eos_token"`
		}
		if err := json.Unmarshal([]byte(readFile(t, filepath.Join("testdata", family+".tokens.json"))), &tokens); err != nil {
			t.Fatal(err)
		}
		checkCase(t, tmpl, family, cases[len(cases)-1], tokens.BOS, tokens.EOS)
	}
}

func TestFallbacksMatchReference(t *testing.T) {
	// Same special tokens as FALLBACK_TOKENS in gen_refs.py.
	tokens := map[string][2]string{
		"chatml": {"", "<|im_end|>"},
		"llama3": {"<|begin_of_text|>", "<|eot_id|>"},
		"glm4":   {"", "<|endoftext|>"},
	}
	cases := loadCases(t)
	for family, tok := range tokens {
		tmpl, ok := Fallback(family)
		if !ok {
			t.Fatalf("no fallback %q", family)
		}
		for _, c := range cases {
			checkCase(t, tmpl, "fallback-"+family, c, tok[0], tok[1])
		}
	}
}

func checkCase(t *testing.T, tmpl *Template, name string, c refCase, bos, eos string) {
	t.Helper()
	got, err := tmpl.Render(c.Messages, Options{
		AddGenerationPrompt: c.AddGenerationPrompt,
		Tools:               c.Tools,
		Vars:                c.Vars,
		BOS:                 bos,
		EOS:                 eos,
	})
	if err != nil {
		t.Errorf("%s.%s: %v", name, c.Name, err)
		return
	}
	want := readFile(t, filepath.Join("testdata", name+"."+c.Name+".txt"))
	if got != want {
		t.Errorf("%s.%s differs from the jinja2 rendering %s", name, c.Name, firstDiff(got, want))
	}
}

func TestTojsonMatchesPython(t *testing.T) {
	tmpl, err := New(readFile(t, filepath.Join("testdata", "tojson.jinja")))
	if err != nil {
		t.Fatal(err)
	}
	// json.RawMessage keeps the key order of the file, as json.load does.
	var raw map[string]json.RawMessage
	if err := json.Unmarshal([]byte(readFile(t, filepath.Join("testdata", "tojson_vars.json"))), &raw); err != nil {
		t.Fatal(err)
	}
	vars := map[string]any{}
	for k, v := range raw {
		vars[k] = v
	}
	got, err := tmpl.Render(nil, Options{Vars: vars})
	if err != nil {
		t.Fatal(err)
	}
	if want := readFile(t, filepath.Join("testdata", "tojson.txt")); got != want {
		t.Errorf("tojson differs from Python's %s", firstDiff(got, want))
	}
}

func TestFallbacksRenderFamilyFormats(t *testing.T) {
	msgs := []Message{
		{Role: "system", Content: "Be brief."},
		{Role: "user", Content: "Hi"},
		{Role: "assistant", Content: "Hello!"},
		{Role: "user", Content: "Bye"},
	}
	want := map[string]string{
		"chatml": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" +
			"<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n",
		"llama3": "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\nHello!<|eot_id|>" +
			"<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>" +
			"<|start_header_id|>assistant<|end_header_id|>\n\n",
		"glm4": "[gMASK]<sop><|system|>\nBe brief.<|user|>\nHi<|assistant|>\nHello!<|user|>\nBye<|assistant|>\n",
	}
	for family, w := range want {
		tmpl, ok := Fallback(family)
		if !ok || tmpl.Family() != family {
			t.Fatalf("Fallback(%q) = %v, %v", family, tmpl, ok)
		}
		got, err := tmpl.Render(msgs, Options{AddGenerationPrompt: true, BOS: "<|begin_of_text|>"})
		if err != nil {
			t.Fatalf("%s: %v", family, err)
		}
		if got != w {
			t.Errorf("%s fallback:\n got %q\nwant %q", family, got, w)
		}
		if Detect(tmpl.Source()) != family {
			t.Errorf("Detect does not recognise the %s fallback's own source", family)
		}
	}
	if _, ok := Fallback("mistral"); ok {
		t.Error("Fallback(\"mistral\") exists")
	}
}

func TestDetect(t *testing.T) {
	for src, want := range map[string]string{
		readFile(t, filepath.Join("testdata", "qwen3.jinja")):                              "chatml",
		readFile(t, filepath.Join("testdata", "llama3.jinja")):                             "llama3",
		"[gMASK]<sop>{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}{% endfor %}": "glm4",
		"{{ bos_token }}[INST] {{ messages[0].content }} [/INST]":                          "",
	} {
		if got := Detect(src); got != want {
			t.Errorf("Detect(%.40q…) = %q, want %q", src, got, want)
		}
	}
}

func TestLoadFallsBack(t *testing.T) {
	for _, tc := range []struct {
		name, src, family, warn string
	}{
		{"parse error", "<|im_start|>{% for m in messages %}{{ m.content }", "chatml", "parse"},
		{"unknown filter at run time", "{% for m in messages %}<|start_header_id|>{{ m.content | no_such_filter }}{% endfor %}", "llama3", "no_such_filter"},
		{"unknown tag", "[gMASK]<sop>{% for m in messages %}{% generation_x %}{{ m.content }}{% endfor %}", "glm4", ""},
	} {
		var warnings []string
		tmpl, err := Load(tc.src, func(w string) { warnings = append(warnings, w) })
		if err != nil {
			t.Errorf("%s: Load: %v", tc.name, err)
			continue
		}
		if tmpl.Family() != tc.family {
			t.Errorf("%s: got template family %q, want the %s fallback", tc.name, tmpl.Family(), tc.family)
		}
		if len(warnings) != 1 || !strings.Contains(warnings[0], tc.warn) || !strings.Contains(warnings[0], tc.family) {
			t.Errorf("%s: warnings %q, want one naming %q and %s", tc.name, warnings, tc.warn, tc.family)
		}
	}

	// Nothing to fall back to.
	if _, err := Load("{% for m in messages %}{{ m.content", nil); err == nil || !strings.Contains(err.Error(), "parse") {
		t.Errorf("unknown family, broken template: err = %v, want a parse error", err)
	}
	if _, err := Load("  \n", nil); !errors.Is(err, ErrNoTemplate) {
		t.Errorf("empty template: err = %v, want ErrNoTemplate", err)
	}
	// New reports parse errors itself.
	if _, err := New("{% if %}"); err == nil {
		t.Error("New accepted {% if %}")
	}

	// A template that refuses system turns is still the model's own.
	strict := "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}" +
		"<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
	tmpl, err := Load(strict, func(w string) { t.Errorf("strict template fell back: %s", w) })
	if err != nil || tmpl.Family() != "" {
		t.Errorf("strict template: %v, family %q", err, tmpl.Family())
	}
}

func TestRaiseException(t *testing.T) {
	tmpl, err := New("{% if messages[0].role != 'user' %}{{ raise_exception('Conversation must start with a user turn') }}{% endif %}ok")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render([]Message{{Role: "assistant", Content: "x"}}, Options{})
	var te *TemplateError
	if !errors.As(err, &te) || te.Msg != "Conversation must start with a user turn" {
		t.Errorf("err = %v, want TemplateError with the template's message", err)
	}
	if out, err := tmpl.Render([]Message{{Role: "user", Content: "x"}}, Options{}); err != nil || out != "ok" {
		t.Errorf("Render = %q, %v", out, err)
	}
}

func TestStrftimeNow(t *testing.T) {
	defer func(f func() time.Time) { now = f }(now)
	now = func() time.Time { return time.Date(2024, time.July, 6, 9, 5, 3, 0, time.UTC) }
	tmpl, err := New(`{{ strftime_now("%d %b %Y") }}|{{ strftime_now("%-d %B, %A %H:%M:%S %I%p %j %y %%") }}|{{ strftime_now("2006 Jan %Q") }}`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render(nil, Options{})
	if want := "06 Jul 2024|6 July, Saturday 09:05:03 09AM 188 24 %|2006 Jan %Q"; err != nil || got != want {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
}

func TestMessageFields(t *testing.T) {
	tmpl, err := New(`{% for m in messages %}[{{ m.role }}|{{ m.content is string }}|` +
		`{{ m.reasoning_content is defined }}|{{ m.tool_calls is defined }}|{{ m.tool_call_id is defined }}|{{ m.name is defined }}` +
		`{% for c in m.tool_calls or [] %}|{{ c.id is defined }},{{ c.type }},{{ c.function.name }},{{ c.function.arguments is mapping }},{{ c.function.arguments | tojson }}{% endfor %}]{% endfor %}`)
	if err != nil {
		t.Fatal(err)
	}
	msgs := []Message{
		{Role: "user"},
		{Role: "assistant", ReasoningContent: "hmm", ToolCalls: []ToolCall{
			{Function: FunctionCall{Name: "f", Arguments: `{"b": 1, "a": [true, null]}`}},
			{ID: "c2", Type: "function", Function: FunctionCall{Name: "g", Arguments: `[1, 2]`}},
			{ID: "c3", Function: FunctionCall{Name: "h", Arguments: `{"broken": `}},
		}},
		{Role: "tool", Content: "42", ToolCallID: "c2", Name: "g"},
	}
	got, err := tmpl.Render(msgs, Options{})
	want := `[user|True|False|False|False|False]` +
		`[assistant|True|True|True|False|False` +
		`|False,function,f,True,{"b": 1, "a": [true, null]}` +
		`|True,function,g,False,"[1, 2]"` +
		`|True,function,h,False,"{\"broken\": "]` +
		`[tool|True|False|False|True|True]`
	if err != nil || got != want {
		t.Errorf("got  %s, %v\nwant %s", got, err, want)
	}
}

func TestVars(t *testing.T) {
	tmpl, err := New(`{{ flag }}|{{ n }}|{{ x }}|{{ obj | tojson }}|{{ list | tojson }}`)
	if err != nil {
		t.Fatal(err)
	}
	type point struct {
		Y int     `json:"y"`
		X float64 `json:"x"`
	}
	got, err := tmpl.Render(nil, Options{Vars: map[string]any{
		"flag": false,
		"n":    float64(3), // integral: an int, as JSON's 3 is in Python
		"x":    2.5,
		"obj":  point{Y: 1, X: 0.5}, // struct: field order kept
		"list": []any{map[string]any{"b": 1, "a": "é"}, nil},
	}})
	if want := `False|3|2.5|{"y": 1, "x": 0.5}|[{"a": "é", "b": 1}, null]`; err != nil || got != want {
		t.Errorf("got %q, %v; want %q", got, err, want)
	}
	for _, name := range []string{"messages", "tools", "add_generation_prompt", "bos_token", "raise_exception"} {
		if _, err := tmpl.Render(nil, Options{Vars: map[string]any{name: 1}}); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("Vars[%q]: err = %v, want an error naming it", name, err)
		}
	}
	if _, err := tmpl.Render(nil, Options{Vars: map[string]any{"c": make(chan int)}}); err == nil {
		t.Error("a channel in Vars did not fail")
	}
}

func TestWhitespaceMatchesPython(t *testing.T) {
	tmpl, err := New(readFile(t, filepath.Join("testdata", "whitespace.jinja")))
	if err != nil {
		t.Fatal(err)
	}
	got, err := tmpl.Render(nil, Options{Vars: map[string]any{"x": "X", "items": []any{1, 2, 3}}})
	if err != nil {
		t.Fatal(err)
	}
	if want := readFile(t, filepath.Join("testdata", "whitespace.txt")); got != want {
		t.Errorf("whitespace handling differs from Jinja2's %s", firstDiff(got, want))
	}
}

func TestPrepareSource(t *testing.T) {
	for src, want := range map[string]string{
		"a\r\nb\rc\n": "a\nb\nc",
		"x\n\n":       "x\n",
		// tojson is renamed in code only: not in text, strings, comments.
		"a{{ x|tojson }}b{{ x |\n tojson(indent=2) }}c":                       "a{{ x|__ats_tojson }}b{{ x |\n __ats_tojson(indent=2) }}c",
		"text | tojson {{ 'a | tojson' }}.":                                   "text | tojson {{ 'a | tojson' }}.",
		"a{% set y = x|tojsonish %}.":                                         "a{% set y = x|tojsonish %}.",
		"a{# x|tojson #}b{% raw %}{{ x|tojson }}{% endraw %}c{{ x|tojson }}.": "a{# x|tojson #}b{% raw %}{{ x|tojson }}{% endraw %}c{{ x|__ats_tojson }}.",
		`a{{ "say \"|tojson\"" | tojson }}.`:                                  `a{{ "say \"|tojson\"" | __ats_tojson }}.`,
		// Touching tags get a space between that the first one strips.
		"a{{ x }}{%- endif %}": "a{{ x -}} {%- endif %}",
		"{{ x }}b":             " {{- x }}b",
		// An unclosed tag stays unclosed, for the parser to report.
		"a{{ x": "a{{ x",
	} {
		if got := prepareSource(src); got != want {
			t.Errorf("prepareSource(%q) = %q, want %q", src, got, want)
		}
	}
	for _, src := range []string{"a{{ x", "a{% if x %}", "a{# x", "{{ 'x }}"} {
		if _, err := New(src); err == nil {
			t.Errorf("New(%q) accepted an unclosed tag", src)
		}
	}
}

func TestPyFloat(t *testing.T) {
	for f, want := range map[float64]string{
		1: "1.0", 0.1: "0.1", 1e16: "1e+16", 1e15: "1000000000000000.0", 1e-5: "1e-05",
		1e-4: "0.0001", -2.5e-7: "-2.5e-07", 123456789.125: "123456789.125", 1e22: "1e+22",
		9007199254740993.0: "9007199254740992.0", 5e-324: "5e-324",
	} {
		if got := pyFloat(f); got != want {
			t.Errorf("pyFloat(%v) = %q, want %q", f, got, want)
		}
	}
}
