// Package chat turns a conversation into a model's prompt by rendering the
// Jinja chat template the model ships in its GGUF (tokenizer.chat_template)
// the way Hugging Face transformers' apply_chat_template does, so a prompt
// built by ats matches the one the model was trained and evaluated with.
//
// Engine: github.com/ardanlabs/jinja (v1.8.0), forked into internal/jinja
// so that a template runs within limits (see Limits). Both it and
// github.com/nikolalohinski/gonja/v2 parse and run the real Qwen3 and
// Llama 3 templates, but ardanlabs/jinja was written for HF chat templates:
// it applies HF's trim_blocks/lstrip_blocks, supports the Python string and
// dict methods the templates call (.startswith, .split, .lstrip, .items()),
// namespace(), loop controls and slicing like messages[::-1], and its
// dicts keep insertion order, so tool-call arguments reach the prompt in
// the order the model wrote them (Python dicts do that too). gonja's
// tojson is Go's encoding/json (compact separators, <>& escaped) and its
// maps are unordered, so its tool prompts differ from HF's byte-wise.
// Newer ardanlabs/jinja releases need a newer Go than this module's.
package chat

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/atsinfer/ats/internal/jinja"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// Message is one turn of a conversation, in the shape of OpenAI's chat API
// (the JSON tags match it, so the server can decode requests straight into
// it).
type Message struct {
	Role    string `json:"role"` // "system", "user", "assistant", "tool"
	Content string `json:"content"`
	// ReasoningContent is an assistant's thinking, kept apart from Content
	// (Qwen3's template wraps it in <think> for the latest turn).
	ReasoningContent string     `json:"reasoning_content,omitempty"`
	ToolCalls        []ToolCall `json:"tool_calls,omitempty"`
	// ToolCallID and Name identify, on a "tool" message, which call it
	// answers and which function produced it.
	ToolCallID string `json:"tool_call_id,omitempty"`
	Name       string `json:"name,omitempty"`
}

// ToolCall is a function call made by the assistant.
type ToolCall struct {
	ID       string       `json:"id,omitempty"`
	Type     string       `json:"type"` // "function"; empty means "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function and carries its arguments as JSON text,
// as OpenAI's API does.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is one OpenAI tool definition ({"type": "function", "function":
// {...}}), handed to the template as is. Go maps have no order, so the
// template sees its keys sorted; a json.RawMessage value keeps the order
// of its text.
type Tool = map[string]any

// Options are the template inputs besides the messages.
type Options struct {
	// AddGenerationPrompt ends the prompt with the assistant's header, so
	// the model's reply comes next.
	AddGenerationPrompt bool
	// Tools is the `tools` variable; nil or empty renders as none, as HF
	// does without tools.
	Tools []Tool
	// Vars are extra template variables, such as "enable_thinking": false
	// for Qwen3. They may not reuse a name Render sets itself.
	Vars map[string]any
	// BOS and EOS are the tokenizer's begin/end-of-sequence token text,
	// visible as bos_token and eos_token ("" when the model has none).
	BOS, EOS string
	// Limits bound the rendering (nil: DefaultLimits()); Context, when
	// set, stops it when cancelled.
	Limits  *Limits
	Context context.Context
	// Tokenizer is the model's: when set, RenderPrompt finds the
	// control-token texts in the conversation's strings and reports them
	// in Prompt.Plain, so that EncodePrompt keeps them plain text.
	Tokenizer *tokenizer.Tokenizer
}

// Limits bound one rendering of a template. A template comes from the model
// file, so it may be hostile or merely careless: without limits a
// recursive macro would crash the process and `'x' * 10000000000` would
// take its memory. Breaking a limit is a *LimitError naming it. A zero
// field means no limit of that kind.
type Limits struct {
	Timeout   time.Duration // wall clock
	MaxOutput int           // bytes of the prompt, and of any one value built on the way
	MaxAlloc  int64         // bytes the template's operations allocate in all
	MaxDepth  int           // nested macro calls
	MaxSteps  int64         // loop iterations and evaluations
}

// DefaultLimits are generous for real templates (a long conversation with
// many tools renders in milliseconds, a few MiB, a few hundred thousand
// steps, and no template recurses more than a few levels) and small enough
// that a hostile one ends within seconds and a bounded amount of memory.
func DefaultLimits() Limits {
	return Limits{
		Timeout:   10 * time.Second,
		MaxOutput: 64 << 20,
		MaxAlloc:  1 << 30,
		MaxDepth:  100,
		MaxSteps:  50_000_000,
	}
}

// LimitError is the error of a rendering that broke one of its Limits; its
// Limit field names which ("time", "output size", "memory", "recursion
// depth", "steps" or "nesting"). Find it with errors.As.
type LimitError = jinja.LimitError

// MaxTemplateBytes bounds the source of a chat template. Real ones are a
// few KiB to a few tens of KiB.
const MaxTemplateBytes = 1 << 20

// Template is a parsed chat template; safe for concurrent Render calls.
type Template struct {
	src    string
	family string // the built-in family for a fallback, "" for a model's own template
	t      *jinja.Template
	avoid  map[rune]bool // private use characters of src, which placeholders must not be (prompt.go)
}

// ErrNoTemplate is returned by Load for an empty template source.
var ErrNoTemplate = errors.New("chat: model has no chat template")

// New parses a chat template. It fails only when the engine cannot parse
// it; a template can still fail at Render time (see Load).
func New(src string) (*Template, error) {
	if len(src) > MaxTemplateBytes {
		return nil, fmt.Errorf("chat: the template is %d bytes, more than the %d a chat template may have", len(src), MaxTemplateBytes)
	}
	code := prepareSource(src)
	t, err := jinja.Compile(code)
	if err != nil {
		return nil, fmt.Errorf("chat: parse template: %w", err)
	}
	return &Template{src: src, t: t, avoid: placeholderRunesOf(src)}, nil
}

// Source returns the template text as given to New.
func (t *Template) Source() string { return t.src }

// Family returns the built-in family ("chatml", "llama3", "glm4") when t is
// a fallback, and "" when it is a model's own template.
func (t *Template) Family() string { return t.family }

// Render renders the conversation into a prompt.
func (t *Template) Render(msgs []Message, opt Options) (string, error) {
	p, err := t.RenderPrompt(msgs, opt)
	return p.Text, err
}

// RenderPrompt renders the conversation into a prompt and, when
// opt.Tokenizer is set, says which of its bytes are control-token texts
// that came from the conversation (see Prompt).
func (t *Template) RenderPrompt(msgs []Message, opt Options) (Prompt, error) {
	prot := newProtector(opt.Tokenizer, t.avoid)
	data, err := templateData(msgs, opt, prot)
	if err != nil {
		return Prompt{}, err
	}
	lim := DefaultLimits()
	if opt.Limits != nil {
		lim = *opt.Limits
	}
	out, err := t.t.RenderLimited(data, jinja.Limits{Timeout: lim.Timeout, Context: opt.Context, MaxOutput: lim.MaxOutput,
		MaxAlloc: lim.MaxAlloc, MaxDepth: lim.MaxDepth, MaxSteps: lim.MaxSteps})
	if err != nil {
		return Prompt{}, fmt.Errorf("chat: render template: %w", err)
	}
	p, err := prot.restore(out, lim.MaxOutput)
	if err != nil {
		return Prompt{}, fmt.Errorf("chat: render template: %w", err)
	}
	return p, nil
}

// templateData builds the variables HF's apply_chat_template passes; prot,
// when not nil, protects the strings that come from the caller.
func templateData(msgs []Message, opt Options, prot *protector) (map[string]jinja.Value, error) {
	data := make(map[string]jinja.Value, 8+len(opt.Vars))
	for k, v := range opt.Vars {
		if reserved[k] {
			return nil, fmt.Errorf("chat: Vars[%q] would replace a variable Render sets itself", k)
		}
		val, err := toValue(v)
		if err == nil {
			val, err = prot.protectValue(val, 0)
		}
		if err != nil {
			return nil, fmt.Errorf("chat: Vars[%q]: %w", k, err)
		}
		data[k] = val
	}

	list := make([]jinja.Value, len(msgs))
	for i, m := range msgs {
		v, err := messageValue(m, prot)
		if err != nil {
			return nil, fmt.Errorf("chat: message %d: %w", i, err)
		}
		list[i] = v
	}
	data["messages"] = jinja.NewList(list)

	// HF passes tools=None without tools; `{% if tools %}` is then false.
	data["tools"] = jinja.None()
	if len(opt.Tools) > 0 {
		tools := make([]jinja.Value, len(opt.Tools))
		for i, tool := range opt.Tools {
			v, err := toValue(tool)
			if err == nil {
				v, err = prot.protectValue(v, 0)
			}
			if err != nil {
				return nil, fmt.Errorf("chat: Tools[%d]: %w", i, err)
			}
			tools[i] = v
		}
		data["tools"] = jinja.NewList(tools)
	}

	data["add_generation_prompt"] = jinja.NewBool(opt.AddGenerationPrompt)
	data["bos_token"] = jinja.NewString(opt.BOS)
	data["eos_token"] = jinja.NewString(opt.EOS)
	data["raise_exception"] = jinja.NewLimitedCallable("raise_exception", raiseException)
	data["strftime_now"] = jinja.NewLimitedCallable("strftime_now", strftimeNow)
	data[tojsonFilter] = jinja.NewLimitedCallable("tojson", func(b *jinja.Budget, args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		return tojson(b, args, kwargs, prot)
	})
	return data, nil
}

var reserved = map[string]bool{
	"messages": true, "tools": true, "add_generation_prompt": true,
	"bos_token": true, "eos_token": true, "raise_exception": true,
	"strftime_now": true, tojsonFilter: true,
	// The engine's own globals and the names it binds in loops and
	// macros: a variable of the same name would hide them, and the
	// template would fail in ways that have nothing to do with it.
	"namespace": true, "range": true, "dict": true, "joiner": true, "cycler": true,
	"loop": true, "caller": true, "varargs": true, "kwargs": true, "self": true,
}

// ReservedVar reports whether name may not be set through Options.Vars:
// Render sets it itself, or it names one of the engine's globals.
func ReservedVar(name string) bool { return reserved[name] }

// messageValue is the dict a template sees for m. It follows what HF
// templates expect from OpenAI-style messages:
//   - content is always a string ("" when empty): templates concatenate
//     it and test it with `in` and .startswith, which fail on None;
//   - optional fields are left out when empty, so `is defined` tests work:
//     Qwen3 looks for <think> in the content only when reasoning_content
//     is undefined (or None), so an empty one must not be passed as "";
//   - tool-call arguments are a mapping when they parse as a JSON object
//     (templates iterate them or pass them through tojson), else the raw
//     string.
func messageValue(m Message, prot *protector) (jinja.Value, error) {
	d := jinja.NewDict()
	dict := d.AsDict()
	// str protects a string of the caller's; the first error sticks.
	var err error
	str := func(s string) jinja.Value {
		if err == nil {
			s, err = prot.protect(s)
		}
		return jinja.NewString(s)
	}
	dict.Set("role", jinja.NewString(m.Role))
	dict.Set("content", str(m.Content))
	if m.ReasoningContent != "" {
		dict.Set("reasoning_content", str(m.ReasoningContent))
	}
	if len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, len(m.ToolCalls))
		for i, c := range m.ToolCalls {
			var cerr error
			if calls[i], cerr = toolCallValue(c, prot); cerr != nil && err == nil {
				err = cerr
			}
		}
		dict.Set("tool_calls", jinja.NewList(calls))
	}
	if m.ToolCallID != "" {
		dict.Set("tool_call_id", str(m.ToolCallID))
	}
	if m.Name != "" {
		dict.Set("name", str(m.Name))
	}
	return d, err
}

func toolCallValue(c ToolCall, prot *protector) (jinja.Value, error) {
	fn := jinja.NewDict()
	name, err := prot.protect(c.Function.Name)
	if err != nil {
		return jinja.Undefined(), err
	}
	fn.AsDict().Set("name", jinja.NewString(name))
	args := jinja.NewString(c.Function.Arguments)
	if v, err := parseJSON([]byte(c.Function.Arguments)); err == nil && v.IsDict() {
		args = v
	}
	// Parsed first, so that a placeholder never breaks the JSON.
	if args, err = prot.protectValue(args, 0); err != nil {
		return jinja.Undefined(), err
	}
	fn.AsDict().Set("arguments", args)

	d := jinja.NewDict()
	if c.ID != "" {
		id, err := prot.protect(c.ID)
		if err != nil {
			return jinja.Undefined(), err
		}
		d.AsDict().Set("id", jinja.NewString(id))
	}
	typ := c.Type
	if typ == "" {
		typ = "function"
	}
	d.AsDict().Set("type", jinja.NewString(typ))
	d.AsDict().Set("function", fn)
	return d, nil
}

// TemplateError is the error a template raises itself through
// raise_exception (for example "Conversation roles must alternate"): the
// conversation is not one the template accepts, which is the caller's
// problem rather than an engine failure. Find it with errors.As.
type TemplateError struct{ Msg string }

func (e *TemplateError) Error() string { return "template raised: " + e.Msg }

func raiseException(b *jinja.Budget, args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	msg := "raise_exception called"
	if len(args) > 0 {
		var err error
		if msg, err = jinja.Repr(b, args[0]); err != nil {
			return jinja.Undefined(), err
		}
		if args[0].IsString() {
			msg = args[0].AsString()
		}
	}
	return jinja.Undefined(), &TemplateError{Msg: msg}
}

//go:embed templates/chatml.jinja
var chatmlSrc string

//go:embed templates/llama3.jinja
var llama3Src string

//go:embed templates/glm4.jinja
var glm4Src string

var fallbacks = map[string]string{"chatml": chatmlSrc, "llama3": llama3Src, "glm4": glm4Src}

// Fallback returns a built-in template for a family ("chatml", "llama3",
// "glm4"), for models whose own template is missing or unusable. They are
// plain Jinja (templates/*.jinja) and follow each family's prompt format,
// tool calls included, in a simplified form.
func Fallback(family string) (*Template, bool) {
	src, ok := fallbacks[family]
	if !ok {
		return nil, false
	}
	t, err := New(src)
	if err != nil {
		panic(fmt.Sprintf("chat: built-in %s template does not parse: %v", family, err)) // caught by the tests
	}
	t.family = family
	return t, true
}

// Detect guesses a template's family from the special tokens it writes,
// for picking a fallback; "" when it recognises none.
func Detect(src string) string {
	switch {
	case strings.Contains(src, "<|im_start|>"):
		return "chatml"
	case strings.Contains(src, "<|start_header_id|>"):
		return "llama3"
	case strings.Contains(src, "[gMASK]"):
		return "glm4"
	}
	return ""
}

// Load returns the template for a model's tokenizer.chat_template: the
// template itself when the engine parses it and can render a plain
// conversation with it, otherwise the built-in fallback for Detect(src),
// reporting why through warn (which may be nil). It fails when neither
// works.
func Load(src string, warn func(string)) (*Template, error) {
	if strings.TrimSpace(src) == "" {
		return nil, ErrNoTemplate
	}
	t, err := New(src)
	if err == nil {
		if err = t.probe(); err == nil {
			return t, nil
		}
	}
	family := Detect(src)
	fb, ok := Fallback(family)
	if !ok {
		return nil, fmt.Errorf("chat: model template unusable and no built-in template matches it: %w", err)
	}
	if warn != nil {
		warn(fmt.Sprintf("chat template: %v; using the built-in %s template instead", err, family))
	}
	return fb, nil
}

// probe renders a plain exchange to catch templates that parse but use
// something the engine cannot run (an unknown filter, say), so Load can
// fall back now rather than fail on the first request.
func (t *Template) probe() error {
	msgs := []Message{
		{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "Hello"},
		{Role: "assistant", Content: "Hi! How can I help?"},
		{Role: "user", Content: "Tell me a joke."},
	}
	// A plain exchange renders in well under a millisecond with any real
	// template; a template that needs seconds for it is broken.
	lim := DefaultLimits()
	lim.Timeout, lim.MaxSteps = 2*time.Second, 5_000_000
	out, err := t.Render(msgs, Options{AddGenerationPrompt: true, Limits: &lim})
	if err != nil {
		var te *TemplateError
		if !errors.As(err, &te) {
			return err
		}
		// Some templates refuse a system turn; that says nothing about
		// the engine, so try once more without it.
		if out, err = t.Render(msgs[1:], Options{AddGenerationPrompt: true, Limits: &lim}); err != nil {
			return err
		}
	}
	if !strings.Contains(out, "Tell me a joke.") {
		return fmt.Errorf("chat: template rendered %q, which lacks the last user message", out)
	}
	return nil
}
