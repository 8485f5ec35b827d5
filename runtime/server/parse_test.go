package server

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/text/chat"
)

type call struct{ name, args string }

type parseCase struct {
	name      string
	format    ToolFormat
	tools     []string
	open      bool // ThinkingOpen
	text      string
	reasoning string
	content   string
	calls     []call
}

var weather = []string{"get_weather", "get_time"}

// Hand-written replies in each family's format, as llama.cpp's
// common/chat.cpp parses them.
var parseCases = []parseCase{
	// Qwen3 (Hermes tool calls, <think> reasoning).
	{name: "qwen3/think", format: FormatHermes,
		text:      "<think>\nThe user greets me.\nI should answer.\n</think>\n\nHello! How can I help?",
		reasoning: "The user greets me.\nI should answer.", content: "Hello! How can I help?"},
	{name: "qwen3/no-think", format: FormatHermes, text: "Hello! How can I help?", content: "Hello! How can I help?"},
	{name: "qwen3/leading-blanks", format: FormatHermes, text: "\n\n  Hi", content: "\n\n  Hi"},
	{name: "qwen3/empty-think", format: FormatHermes, text: "<think>\n\n</think>\n\nHi.", content: "Hi."},
	{name: "qwen3/cut-while-thinking", format: FormatHermes, text: "<think>\nLet me see, 2+2 is", reasoning: "Let me see, 2+2 is"},
	{name: "qwen3/forced-open", format: FormatHermes, open: true, text: "\nhmm, easy.\n</think>\n\n4", reasoning: "hmm, easy.", content: "4"},
	{name: "qwen3/tool", format: FormatHermes, tools: weather,
		text:      "<think>\nI need the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
		reasoning: "I need the weather.",
		calls:     []call{{"get_weather", `{"city":"Paris","unit":"celsius"}`}}},
	{name: "qwen3/two-tools-with-text", format: FormatHermes, tools: weather,
		text:    "Let me check both.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": {}}\n</tool_call>",
		content: "Let me check both.\n",
		calls:   []call{{"get_weather", `{"city":"Paris"}`}, {"get_time", `{}`}}},
	{name: "qwen3/args-as-string", format: FormatHermes, tools: weather,
		text:  `<tool_call>{"name": "get_weather", "arguments": "{\"city\": \"Rome\"}"}</tool_call>`,
		calls: []call{{"get_weather", `{"city": "Rome"}`}}},
	{name: "qwen3/unclosed-tool", format: FormatHermes, tools: weather,
		text:  "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"tz\": \"UTC\"}}\n",
		calls: []call{{"get_time", `{"tz":"UTC"}`}}},
	{name: "qwen3/bad-json-stays-text", format: FormatHermes, tools: weather,
		text:    "<tool_call>\n{\"name\": get_weather}\n</tool_call> sorry",
		content: "<tool_call>\n{\"name\": get_weather}\n</tool_call> sorry"},
	{name: "qwen3/no-tools-offered", format: FormatHermes,
		text:    "Use <tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call> to call.",
		content: "Use <tool_call>{\"name\": \"x\", \"arguments\": {}}</tool_call> to call."},
	{name: "qwen3/text-after-call", format: FormatHermes, tools: weather,
		text:    "<tool_call>{\"name\": \"get_time\", \"arguments\": {}}</tool_call>\nDone.",
		content: "\nDone.", calls: []call{{"get_time", `{}`}}},
	{name: "qwen3/lt-in-answer", format: FormatHermes, tools: weather, text: "a <b> c <tool d", content: "a <b> c <tool d"},

	// Llama 3.x: JSON calls, <|python_tag|>, built-in tools.
	{name: "llama3/json", format: FormatLlama3, tools: weather,
		text:  `{"name": "get_weather", "parameters": {"city": "Paris"}}`,
		calls: []call{{"get_weather", `{"city":"Paris"}`}}},
	{name: "llama3/json-typed", format: FormatLlama3, tools: weather,
		text:  "\n{\"type\": \"function\", \"name\": \"get_time\", \"parameters\": {}}",
		calls: []call{{"get_time", `{}`}}},
	{name: "llama3/python-tag-json", format: FormatLlama3, tools: weather,
		text:  `<|python_tag|>{"name": "get_weather", "parameters": {"city": "Oslo"}}`,
		calls: []call{{"get_weather", `{"city":"Oslo"}`}}},
	{name: "llama3/builtin", format: FormatLlama3, tools: []string{"brave_search"},
		text:  `<|python_tag|>brave_search.call(query="weather in Paris", count=3)`,
		calls: []call{{"brave_search", `{"query":"weather in Paris","count":3}`}}},
	{name: "llama3/two-calls", format: FormatLlama3, tools: weather,
		text:  `{"name": "get_weather", "parameters": {"city": "A"}}; {"name": "get_weather", "parameters": {"city": "B"}}`,
		calls: []call{{"get_weather", `{"city":"A"}`}, {"get_weather", `{"city":"B"}`}}},
	{name: "llama3/answer", format: FormatLlama3, tools: weather, text: "It is sunny in Paris.", content: "It is sunny in Paris."},
	{name: "llama3/json-answer", format: FormatLlama3, tools: weather, text: `{"temperature": 21}`, content: `{"temperature": 21}`},
	{name: "llama3/no-tools", format: FormatLlama3,
		text: `{"name": "get_weather", "parameters": {}}`, content: `{"name": "get_weather", "parameters": {}}`},

	// GLM-4-0414 / GLM-Z1: "name\n{json}", <think> for Z1.
	{name: "glm4/call", format: FormatGLM4, tools: weather,
		text:  "get_weather\n{\"city\": \"Beijing\"}",
		calls: []call{{"get_weather", `{"city":"Beijing"}`}}},
	{name: "glm4/z1-think-call", format: FormatGLM4, tools: weather,
		text:      "<think>The user wants the weather.</think>\nget_weather\n{\"city\": \"Beijing\"}",
		reasoning: "The user wants the weather.",
		calls:     []call{{"get_weather", `{"city":"Beijing"}`}}},
	{name: "glm4/z1-answer", format: FormatGLM4,
		text:      "<think>\n2+2=4\n</think>\nThe answer is 4.",
		reasoning: "2+2=4", content: "The answer is 4."},
	{name: "glm4/two-calls", format: FormatGLM4, tools: weather,
		text:  "get_weather\n{\"city\": \"A\"}<|assistant|>get_time\n{}",
		calls: []call{{"get_weather", `{"city":"A"}`}, {"get_time", `{}`}}},
	{name: "glm4/two-calls-unrendered-marker", format: FormatGLM4, tools: weather,
		text:  "get_weather\n{\"city\": \"A\"}\nget_weather\n{\"city\": \"B\"}",
		calls: []call{{"get_weather", `{"city":"A"}`}, {"get_weather", `{"city":"B"}`}}},
	{name: "glm4/answer", format: FormatGLM4, tools: weather, text: "\nHello, I am GLM.", content: "\nHello, I am GLM."},
	{name: "glm4/name-in-prose", format: FormatGLM4, tools: weather,
		text: "get_weather can tell you.\nAsk me.", content: "get_weather can tell you.\nAsk me."},
	{name: "glm4/bare-name", format: FormatGLM4, tools: weather, text: "get_time", calls: []call{{"get_time", `{}`}}},
}

func checkParsed(t *testing.T, c parseCase, got Parsed) {
	t.Helper()
	if got.Reasoning != c.reasoning {
		t.Errorf("reasoning = %q, want %q", got.Reasoning, c.reasoning)
	}
	if got.Content != c.content {
		t.Errorf("content = %q, want %q", got.Content, c.content)
	}
	var calls []call
	for _, tc := range got.ToolCalls {
		calls = append(calls, call{tc.Function.Name, tc.Function.Arguments})
		if tc.Type != "function" {
			t.Errorf("call type %q", tc.Type)
		}
	}
	if !slices.Equal(calls, c.calls) {
		t.Errorf("calls = %q, want %q", calls, c.calls)
	}
}

func TestParse(t *testing.T) {
	for _, c := range parseCases {
		t.Run(c.name, func(t *testing.T) {
			got := Parse(c.text, ParseOptions{Format: c.format, Tools: c.tools, ThinkingOpen: c.open}, true)
			checkParsed(t, c, got)
		})
	}
}

// TestStreamParser feeds each reply in pieces (every byte alone, and
// random splits) and checks that the deltas add up to the final parse and
// that no delta carries text a later piece could take back (a partial tag).
func TestStreamParser(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for _, c := range parseCases {
		t.Run(c.name, func(t *testing.T) {
			splits := [][]string{{c.text}, strings.Split(c.text, "")}
			for range 20 {
				var pieces []string
				for rest := c.text; rest != ""; {
					n := min(len(rest), 1+rng.IntN(6))
					pieces = append(pieces, rest[:n])
					rest = rest[n:]
				}
				splits = append(splits, pieces)
			}
			for _, pieces := range splits {
				sp := NewStreamParser(ParseOptions{Format: c.format, Tools: c.tools, ThinkingOpen: c.open})
				var r, content strings.Builder
				var calls []chat.ToolCall
				add := func(d Delta) {
					r.WriteString(d.Reasoning)
					content.WriteString(d.Content)
					if len(d.ToolCalls) > 0 && d.FirstIndex != len(calls) {
						t.Fatalf("delta index %d, have %d calls", d.FirstIndex, len(calls))
					}
					calls = append(calls, d.ToolCalls...)
				}
				for _, p := range pieces {
					add(sp.Push(p))
				}
				add(sp.Finish())
				got := Parsed{Reasoning: r.String(), Content: content.String(), ToolCalls: calls}
				checkParsed(t, c, got)
				res := sp.Result()
				if res.Reasoning != got.Reasoning || res.Content != got.Content || len(res.ToolCalls) != len(calls) {
					t.Fatalf("Result() %+v differs from the deltas %+v", res, got)
				}
				for i, tc := range calls {
					if !strings.HasPrefix(tc.ID, "call_") || len(tc.ID) != 29 {
						t.Errorf("call %d id %q", i, tc.ID)
					}
				}
				if t.Failed() {
					t.Fatalf("pieces %q", pieces)
				}
			}
		})
	}
}

func TestDetectToolFormat(t *testing.T) {
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join("..", "text", "chat", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	fallback := func(family string) string {
		tm, ok := chat.Fallback(family)
		if !ok {
			t.Fatalf("no fallback %s", family)
		}
		return tm.Source()
	}
	for _, c := range []struct {
		name string
		src  string
		want ToolFormat
	}{
		{"qwen3", read("qwen3.jinja"), FormatHermes},
		{"llama3", read("llama3.jinja"), FormatLlama3},
		{"fallback chatml", fallback("chatml"), FormatHermes},
		{"fallback llama3", fallback("llama3"), FormatLlama3},
		{"fallback glm4", fallback("glm4"), FormatGLM4},
		{"unknown", "{{ messages }}", FormatHermes},
	} {
		if got := DetectToolFormat(c.src); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestThinkingOpen(t *testing.T) {
	for s, want := range map[string]bool{
		"<|im_start|>assistant\n<think>\n":                  true,
		"<|assistant|><think>":                              true,
		"<|im_start|>assistant\n<think>\n\n</think>\n\n":    false,
		"<|im_start|>assistant\n":                           false,
		"<|start_header_id|>assistant<|end_header_id|>\n\n": false,
	} {
		if got := ThinkingOpen(s); got != want {
			t.Errorf("ThinkingOpen(%q) = %v", s, got)
		}
	}
}
