package server

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"regexp"
	"strings"
	"unicode"

	"github.com/atsinfer/ats/runtime/text/chat"
)

// ToolFormat is the way a model family writes tool calls in its reply.
type ToolFormat int

const (
	// FormatHermes: <tool_call>{"name": ..., "arguments": {...}}</tool_call>,
	// one block per call (Qwen2.5, Qwen3, the built-in ChatML template).
	FormatHermes ToolFormat = iota
	// FormatLlama3: the whole reply is {"name": ..., "parameters": {...}}
	// (Llama 3.1/3.2/3.3 custom tools), possibly after <|python_tag|>,
	// which also introduces built-in tools as name.call(arg=value, ...).
	FormatLlama3
	// FormatGLM4: the reply starts with the function name on a line of its
	// own and the arguments as a JSON object after it (GLM-4-0414, GLM-Z1,
	// ChatGLM3: the name is the "metadata" of the assistant header).
	FormatGLM4
)

func (f ToolFormat) String() string {
	switch f {
	case FormatHermes:
		return "hermes"
	case FormatLlama3:
		return "llama3"
	case FormatGLM4:
		return "glm4"
	}
	return "unknown"
}

// DetectToolFormat picks the tool-call format from the chat template the
// model uses, by the markers the template writes for tool calls, as
// llama.cpp's common/chat.cpp does.
func DetectToolFormat(templateSource string) ToolFormat {
	switch {
	case strings.Contains(templateSource, "<tool_call>"):
		return FormatHermes
	case strings.Contains(templateSource, "[gMASK]"):
		return FormatGLM4
	case strings.Contains(templateSource, "<|start_header_id|>"), strings.Contains(templateSource, "<|python_tag|>"):
		return FormatLlama3
	}
	return FormatHermes
}

// ThinkingOpen reports whether a rendered prompt ends inside a reasoning
// block (some templates open <think> in the generation prompt), so the
// reply starts with reasoning and has no opening tag of its own.
func ThinkingOpen(prompt string) bool {
	return strings.HasSuffix(strings.TrimRightFunc(prompt, unicode.IsSpace), thinkOpen)
}

const (
	thinkOpen     = "<think>"
	thinkClose    = "</think>"
	hermesOpen    = "<tool_call>"
	hermesClose   = "</tool_call>"
	pythonTag     = "<|python_tag|>"
	glmAssistant  = "<|assistant|>"
	defaultToolID = "call_"
)

// ParseOptions say how to read a reply.
type ParseOptions struct {
	Format ToolFormat
	// Tools names the functions offered; tool calls are only parsed when
	// the request offered tools (as llama.cpp does), so a reply that
	// merely talks about <tool_call> stays text.
	Tools []string
	// ThinkingOpen: the reply starts inside a reasoning block.
	ThinkingOpen bool
}

// Parsed is a reply split into its parts.
type Parsed struct {
	Reasoning string
	Content   string
	ToolCalls []chat.ToolCall // IDs are set by StreamParser
}

// Parse splits a model's reply into reasoning, content and tool calls.
// With final false the text is a prefix of the reply still being
// generated, and Parse returns only what can no longer change: it holds
// back a possible partial tag, trailing blanks of the reasoning, and a tool
// call until it is complete. Successive partial parses of a growing text
// therefore extend each other, and the final parse extends them all, so a
// stream of differences adds up to the final result (StreamParser relies on
// it; the tests check it).
func Parse(text string, opt ParseOptions, final bool) Parsed {
	var p Parsed
	rest := text
	inThink := opt.ThinkingOpen
	if !inThink {
		lead := strings.TrimLeftFunc(rest, unicode.IsSpace)
		switch {
		case strings.HasPrefix(lead, thinkOpen):
			inThink = true
			rest = lead[len(thinkOpen):]
		case !final && strings.HasPrefix(thinkOpen, lead):
			// Blank so far, or a partial "<think": wait and see.
			return p
		}
	}
	if inThink {
		end := strings.Index(rest, thinkClose)
		if end < 0 {
			if final {
				// Cut off while thinking: all of it is reasoning.
				p.Reasoning = strings.TrimSpace(rest)
				return p
			}
			r := rest[:len(rest)-partialSuffix(rest, thinkClose)]
			p.Reasoning = strings.TrimSpace(r)
			return p
		}
		p.Reasoning = strings.TrimSpace(rest[:end])
		rest = strings.TrimLeftFunc(rest[end+len(thinkClose):], unicode.IsSpace)
	}
	if len(opt.Tools) == 0 {
		p.Content = rest
		return p
	}
	switch opt.Format {
	case FormatLlama3:
		parseLlama3(&p, rest, final)
	case FormatGLM4:
		parseGLM4(&p, rest, opt.Tools, final)
	default:
		parseHermes(&p, rest, final)
	}
	return p
}

// partialSuffix returns the length of the longest suffix of s that is a
// proper prefix of tag: text that may turn into the tag.
func partialSuffix(s, tag string) int {
	for n := min(len(s), len(tag)-1); n > 0; n-- {
		if strings.HasSuffix(s, tag[:n]) {
			return n
		}
	}
	return 0
}

// parseHermes reads <tool_call> blocks. Text around them is content, except
// blanks between and after calls.
func parseHermes(p *Parsed, rest string, final bool) {
	var content strings.Builder
	for {
		i := strings.Index(rest, hermesOpen)
		if i < 0 {
			if !final {
				rest = rest[:len(rest)-partialSuffix(rest, hermesOpen)]
			}
			if len(p.ToolCalls) == 0 || strings.TrimSpace(rest) != "" {
				content.WriteString(rest)
			}
			break
		}
		if len(p.ToolCalls) == 0 || strings.TrimSpace(rest[:i]) != "" {
			content.WriteString(rest[:i])
		}
		body := rest[i+len(hermesOpen):]
		j := strings.Index(body, hermesClose)
		if j < 0 {
			if final {
				// The reply ended inside the block (a stop at the end
				// of the turn without the closing tag): take the call
				// if it is complete JSON.
				if call, ok := hermesCall(body); ok {
					p.ToolCalls = append(p.ToolCalls, call)
				} else {
					content.WriteString(rest[i:])
				}
			}
			break
		}
		if call, ok := hermesCall(body[:j]); ok {
			p.ToolCalls = append(p.ToolCalls, call)
		} else {
			content.WriteString(rest[i : i+len(hermesOpen)+j+len(hermesClose)])
		}
		rest = body[j+len(hermesClose):]
	}
	p.Content = content.String()
}

// hermesCall reads {"name": ..., "arguments": ...}.
func hermesCall(body string) (chat.ToolCall, bool) {
	var c struct {
		Name       string          `json:"name"`
		Arguments  json.RawMessage `json:"arguments"`
		Parameters json.RawMessage `json:"parameters"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(body)), &c); err != nil || c.Name == "" {
		return chat.ToolCall{}, false
	}
	args := c.Arguments
	if args == nil {
		args = c.Parameters
	}
	a, ok := jsonArguments(args)
	if !ok {
		return chat.ToolCall{}, false
	}
	return chat.ToolCall{Type: "function", Function: chat.FunctionCall{Name: c.Name, Arguments: a}}, true
}

// jsonArguments turns a call's arguments into OpenAI's form: JSON text of
// an object. A model may write them as the object or as a string of JSON.
func jsonArguments(raw json.RawMessage) (string, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "{}", true
	}
	if raw[0] == '"' {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return "", false
		}
		return s, true
	}
	if raw[0] != '{' {
		return "", false
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return "", false
	}
	return b.String(), true
}

// parseLlama3 reads a reply that is one or more JSON calls (separated by
// blanks or ';'), or <|python_tag|> and then calls. Any other reply is
// content. The decision needs the whole reply, so a reply that starts like
// a call is held back until the end.
func parseLlama3(p *Parsed, rest string, final bool) {
	lead := strings.TrimLeftFunc(rest, unicode.IsSpace)
	body, tagged := strings.CutPrefix(lead, pythonTag)
	switch {
	case tagged || strings.HasPrefix(lead, "{"):
		if !final {
			return
		}
		if calls, ok := jsonCalls(body); ok {
			p.ToolCalls = calls
			return
		}
		if tagged {
			if call, ok := pythonCall(body); ok {
				p.ToolCalls = []chat.ToolCall{call}
				return
			}
			p.Content = body
			return
		}
		p.Content = rest
	case !final && strings.HasPrefix(pythonTag, lead):
		return // blank, or a partial <|python_tag|>
	default:
		p.Content = rest
	}
}

// jsonCalls reads a sequence of {"name": ..., "parameters"|"arguments": ...}
// objects separated by blanks, ';' or ','.
func jsonCalls(s string) ([]chat.ToolCall, bool) {
	var calls []chat.ToolCall
	for {
		s = strings.TrimLeft(s, " \t\r\n;,")
		if s == "" {
			return calls, len(calls) > 0
		}
		if s[0] != '{' {
			return nil, false
		}
		dec := json.NewDecoder(strings.NewReader(s))
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return nil, false
		}
		var c struct {
			Type       string          `json:"type"`
			Name       string          `json:"name"`
			Parameters json.RawMessage `json:"parameters"`
			Arguments  json.RawMessage `json:"arguments"`
		}
		if json.Unmarshal(raw, &c) != nil || c.Name == "" || (c.Type != "" && c.Type != "function") {
			return nil, false
		}
		if c.Parameters == nil && c.Arguments == nil {
			return nil, false // {"name": "x"} alone is more likely an answer than a call
		}
		args := c.Parameters
		if args == nil {
			args = c.Arguments
		}
		a, ok := jsonArguments(args)
		if !ok {
			return nil, false
		}
		calls = append(calls, chat.ToolCall{Type: "function", Function: chat.FunctionCall{Name: c.Name, Arguments: a}})
		s = s[dec.InputOffset():]
	}
}

var pythonCallRE = regexp.MustCompile(`(?s)^\s*([A-Za-z_]\w*)\.call\((.*)\)\s*$`)
var pythonArgRE = regexp.MustCompile(`^\s*([A-Za-z_]\w*)\s*=\s*`)

// pythonCall reads Llama 3's built-in tool syntax, name.call(k=v, ...),
// with JSON values (Llama writes strings in double quotes).
func pythonCall(s string) (chat.ToolCall, bool) {
	m := pythonCallRE.FindStringSubmatch(s)
	if m == nil {
		return chat.ToolCall{}, false
	}
	args := map[string]json.RawMessage{}
	var order []string
	rest := m[2]
	for strings.TrimSpace(rest) != "" {
		am := pythonArgRE.FindStringSubmatch(rest)
		if am == nil {
			return chat.ToolCall{}, false
		}
		rest = rest[len(am[0]):]
		dec := json.NewDecoder(strings.NewReader(rest))
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return chat.ToolCall{}, false
		}
		if _, dup := args[am[1]]; !dup {
			order = append(order, am[1])
		}
		args[am[1]] = v
		rest = strings.TrimLeft(rest[dec.InputOffset():], " \t\r\n")
		if r, ok := strings.CutPrefix(rest, ","); ok {
			rest = r
		} else if strings.TrimSpace(rest) != "" {
			return chat.ToolCall{}, false
		}
	}
	// Keep the order the model wrote the arguments in.
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range order {
		if i > 0 {
			b.WriteByte(',')
		}
		kb, _ := json.Marshal(k)
		b.Write(kb)
		b.WriteByte(':')
		json.Compact(&b, args[k])
	}
	b.WriteByte('}')
	return chat.ToolCall{Type: "function", Function: chat.FunctionCall{Name: m[1], Arguments: b.String()}}, true
}

// parseGLM4 reads GLM-4's calls: "name\n{json}", repeated (between calls
// the model writes <|assistant|>, which renders as nothing unless special
// tokens are shown). Only names of offered tools count, since a first line
// of plain text must stay content.
func parseGLM4(p *Parsed, rest string, tools []string, final bool) {
	lead := strings.TrimLeftFunc(rest, unicode.IsSpace)
	line, _, complete := strings.Cut(lead, "\n")
	line = strings.TrimSpace(line)
	if !complete {
		if !final && (lead == "" || anyHasPrefix(tools, line) && !strings.ContainsAny(line, " \t")) {
			return // may be the start of a call's name
		}
	}
	if !isTool(tools, line) {
		p.Content = rest
		return
	}
	if !final {
		return
	}
	if calls, ok := glmCalls(lead, tools); ok {
		p.ToolCalls = calls
		return
	}
	p.Content = rest
}

func glmCalls(s string, tools []string) ([]chat.ToolCall, bool) {
	var calls []chat.ToolCall
	for {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
		s = strings.TrimPrefix(s, glmAssistant)
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
		if s == "" {
			return calls, len(calls) > 0
		}
		name, body, _ := strings.Cut(s, "\n")
		name = strings.TrimSpace(name)
		if !isTool(tools, name) {
			return nil, false
		}
		body = strings.TrimLeftFunc(body, unicode.IsSpace)
		if body == "" || !strings.HasPrefix(body, "{") {
			// A call without arguments: the name alone.
			if strings.TrimSpace(body) != "" && !strings.HasPrefix(body, glmAssistant) {
				return nil, false
			}
			calls = append(calls, chat.ToolCall{Type: "function", Function: chat.FunctionCall{Name: name, Arguments: "{}"}})
			s = body
			continue
		}
		dec := json.NewDecoder(strings.NewReader(body))
		var raw json.RawMessage
		if dec.Decode(&raw) != nil {
			return nil, false
		}
		a, ok := jsonArguments(raw)
		if !ok {
			return nil, false
		}
		calls = append(calls, chat.ToolCall{Type: "function", Function: chat.FunctionCall{Name: name, Arguments: a}})
		s = body[dec.InputOffset():]
	}
}

func isTool(tools []string, name string) bool {
	for _, t := range tools {
		if t == name {
			return true
		}
	}
	return false
}

func anyHasPrefix(tools []string, prefix string) bool {
	for _, t := range tools {
		if strings.HasPrefix(t, prefix) {
			return true
		}
	}
	return false
}

// StreamParser turns generated text, piece by piece, into deltas of
// reasoning, content and complete tool calls.
type StreamParser struct {
	opt  ParseOptions
	text strings.Builder
	sent Parsed // what the deltas so far add up to
}

// NewStreamParser returns a parser for one reply.
func NewStreamParser(opt ParseOptions) *StreamParser { return &StreamParser{opt: opt} }

// Delta is what a piece of text added to the reply.
type Delta struct {
	Reasoning string
	Content   string
	// ToolCalls are calls completed by this piece; FirstIndex is the index
	// of the first of them in the reply's list of calls.
	ToolCalls  []chat.ToolCall
	FirstIndex int
}

// Empty reports whether the delta carries nothing.
func (d Delta) Empty() bool {
	return d.Reasoning == "" && d.Content == "" && len(d.ToolCalls) == 0
}

// Push adds generated text and returns what became certain.
func (sp *StreamParser) Push(piece string) Delta {
	sp.text.WriteString(piece)
	return sp.advance(Parse(sp.text.String(), sp.opt, false))
}

// Finish parses the complete reply and returns the rest of it.
func (sp *StreamParser) Finish() Delta {
	return sp.advance(Parse(sp.text.String(), sp.opt, true))
}

// Result is the whole reply as the deltas so far add up to it.
func (sp *StreamParser) Result() Parsed { return sp.sent }

// Text is the raw text pushed so far.
func (sp *StreamParser) Text() string { return sp.text.String() }

func (sp *StreamParser) advance(cur Parsed) Delta {
	var d Delta
	// Parse guarantees that cur extends what was sent; the checks keep a
	// violation from garbling the stream (it would drop text instead).
	if strings.HasPrefix(cur.Reasoning, sp.sent.Reasoning) {
		d.Reasoning = cur.Reasoning[len(sp.sent.Reasoning):]
		sp.sent.Reasoning = cur.Reasoning
	}
	if strings.HasPrefix(cur.Content, sp.sent.Content) {
		d.Content = cur.Content[len(sp.sent.Content):]
		sp.sent.Content = cur.Content
	}
	d.FirstIndex = len(sp.sent.ToolCalls)
	for i := len(sp.sent.ToolCalls); i < len(cur.ToolCalls); i++ {
		c := cur.ToolCalls[i]
		c.ID = newToolCallID()
		sp.sent.ToolCalls = append(sp.sent.ToolCalls, c)
		d.ToolCalls = append(d.ToolCalls, c)
	}
	return d
}

// newToolCallID makes an id like OpenAI's ("call_" and 24 letters/digits).
func newToolCallID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	var b [24]byte
	rand.Read(b[:])
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return defaultToolID + string(b[:])
}
