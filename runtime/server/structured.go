package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"unicode"

	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/constrain"
)

// Structured output: response_format json_object / json_schema and forced
// tool calls (tool_choice "required" or a named function) are constrained
// decoding with runtime/text/constrain. The grammar is compiled on the
// request's goroutine, so a schema outside the supported subset is a 400
// before the request waits for the model; compiled grammars (with their
// cached masks) are kept for the next request with the same schema, as
// agent loops send the same tools every turn.

// structuredCache holds the vocabulary's prefix tree (built on the first
// constrained request) and the recently used constraints.
type structuredCache struct {
	vocabOnce sync.Once
	vocab     *constrain.Vocab
	vocabErr  error

	mu    sync.Mutex
	byKey map[string]*constrain.Constraint
	order []string // least recently used first
}

// maxConstraints is how many compiled constraints the server keeps (each
// caches up to 32 MiB of masks, usually far less).
const maxConstraints = 8

func (s *Server) constrainVocab() (*constrain.Vocab, error) {
	c := &s.structured
	c.vocabOnce.Do(func() {
		tok := s.sess.Tok
		var eog []int
		for id := range min(tok.VocabSize(), s.nVocab) {
			if tok.IsEOG(id) {
				eog = append(eog, id)
			}
		}
		c.vocab, c.vocabErr = constrain.NewVocab(s.nVocab, func(id int) string {
			// The text the generation writes for a token (special false).
			return tok.Piece(id, false)
		}, eog)
	})
	return c.vocab, c.vocabErr
}

// constraint returns the compiled constraint for key, building it with
// build when it is not cached.
func (s *Server) constraint(key string, build func() (constrain.Expr, error)) (*constrain.Constraint, error) {
	c := &s.structured
	c.mu.Lock()
	if con, ok := c.byKey[key]; ok {
		for i, k := range c.order {
			if k == key {
				c.order = append(append(c.order[:i:i], c.order[i+1:]...), key)
				break
			}
		}
		c.mu.Unlock()
		return con, nil
	}
	c.mu.Unlock()
	v, err := s.constrainVocab()
	if err != nil {
		return nil, err
	}
	e, err := build()
	if err != nil {
		return nil, err
	}
	g, err := constrain.Compile(e)
	if err != nil {
		return nil, err
	}
	con := constrain.New(g, v)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byKey == nil {
		c.byKey = map[string]*constrain.Constraint{}
	}
	if _, ok := c.byKey[key]; !ok {
		c.byKey[key] = con
		c.order = append(c.order, key)
		if len(c.order) > maxConstraints {
			delete(c.byKey, c.order[0])
			c.order = c.order[1:]
		}
	}
	return con, nil
}

// constraintError turns a grammar or schema error into a 400 for param.
func constraintError(param string, err error) *apiError {
	if errors.Is(err, constrain.ErrSchema) || errors.Is(err, constrain.ErrGrammar) {
		msg := strings.TrimPrefix(strings.TrimPrefix(err.Error(), "constrain: "), "invalid grammar: ")
		return badRequest(param, "%s: %s", param, msg)
	}
	return internalError(fmt.Errorf("constrained decoding: %w", err))
}

// responseFormat reads response_format. It returns the schema to follow
// (nil for plain text) and whether any JSON object will do.
func responseFormat(raw *json.RawMessage) (schema json.RawMessage, anyObject bool, e *apiError) {
	if raw == nil || bytes.Equal(bytes.TrimSpace(*raw), []byte("null")) {
		return nil, false, nil
	}
	var rf struct {
		Type       string `json:"type"`
		JSONSchema *struct {
			Name   string          `json:"name"`
			Schema json.RawMessage `json:"schema"`
			Strict *bool           `json:"strict"`
		} `json:"json_schema"`
		Schema json.RawMessage `json:"schema"` // llama-server's json_object with a schema
	}
	if err := json.Unmarshal(*raw, &rf); err != nil {
		return nil, false, badRequest("response_format", "response_format must be an object like {\"type\": \"json_schema\", \"json_schema\": {\"name\": ..., \"schema\": {...}}}")
	}
	switch rf.Type {
	case "", "text":
		return nil, false, nil
	case "json_object":
		if len(rf.Schema) > 0 && !bytes.Equal(bytes.TrimSpace(rf.Schema), []byte("null")) {
			return rf.Schema, false, nil
		}
		return nil, true, nil
	case "json_schema":
		if rf.JSONSchema == nil {
			return nil, false, badRequest("response_format", "response_format of type json_schema needs \"json_schema\": {\"name\": ..., \"schema\": {...}}")
		}
		s := bytes.TrimSpace(rf.JSONSchema.Schema)
		if len(s) == 0 || bytes.Equal(s, []byte("null")) {
			return nil, true, nil // no schema: any JSON object, as OpenAI
		}
		return s, false, nil
	}
	return nil, false, badRequest("response_format", "response_format type %q: use \"text\", \"json_object\" or \"json_schema\"", rf.Type)
}

// forcedTool is what tool_choice asks for.
type forcedTool struct {
	use      bool   // the tools go to the model
	required bool   // it must call one
	name     string // ... this one, when set
}

// toolChoice reads tool_choice: "auto" (the default), "none", "required",
// or {"type": "function", "function": {"name": ...}}.
func toolChoice(raw json.RawMessage) (forcedTool, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return forcedTool{use: true}, nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		switch s {
		case "auto":
			return forcedTool{use: true}, nil
		case "none":
			return forcedTool{}, nil
		case "required":
			return forcedTool{use: true, required: true}, nil
		}
		return forcedTool{}, badRequest("tool_choice", "tool_choice %q: use \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}", s)
	}
	var named struct {
		Type     string `json:"type"`
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil || named.Type != "function" || named.Function.Name == "" {
		return forcedTool{}, badRequest("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}")
	}
	return forcedTool{use: true, required: true, name: named.Function.Name}, nil
}

// thinkMode is how a constrained reply may begin on a reasoning model.
type thinkMode int

const (
	thinkSkip     thinkMode = iota // straight to the constrained part
	thinkOptional                  // a <think>...</think> block may come first
	thinkForced                    // the prompt opened the block: free text up to </think> first
)

// thinkModeFor decides from the template and the rendered prompt whether
// the model may reason before the constrained part, as llama.cpp lets it:
// reasoning is left free and only what follows it is constrained.
func thinkModeFor(templateSource, prompt string) thinkMode {
	switch {
	case ThinkingOpen(prompt):
		return thinkForced
	case !strings.Contains(templateSource, thinkClose):
		return thinkSkip
	case strings.HasSuffix(strings.TrimRightFunc(prompt, unicode.IsSpace), thinkClose):
		return thinkSkip // thinking turned off: the template closed an empty block
	}
	return thinkOptional
}

func (m thinkMode) expr(rest constrain.Expr) constrain.Expr {
	switch m {
	case thinkForced:
		return constrain.Seq(constrain.Until(thinkClose), constrain.WS(), rest)
	case thinkOptional:
		return constrain.Seq(constrain.Opt(constrain.Seq(constrain.Lit(thinkOpen), constrain.Until(thinkClose))), constrain.WS(), rest)
	}
	return constrain.Seq(constrain.WS(), rest)
}

func (m thinkMode) key() string { return fmt.Sprint(int(m)) }

// formatConstraint is the constraint for response_format, or nil.
func (s *Server) formatConstraint(schema json.RawMessage, anyObject bool, think thinkMode) (*constrain.Constraint, *apiError) {
	if schema == nil && !anyObject {
		return nil, nil
	}
	var compact bytes.Buffer
	if schema != nil {
		if err := json.Compact(&compact, schema); err != nil {
			return nil, badRequest("response_format", "the schema is not valid JSON: %v", err)
		}
	}
	key := "format|" + think.key() + "|" + compact.String()
	con, err := s.constraint(key, func() (constrain.Expr, error) {
		body := constrain.JSONObject()
		if schema != nil {
			var err error
			if body, err = constrain.Schema(schema); err != nil {
				return constrain.Expr{}, err
			}
		}
		return think.expr(body), nil
	})
	if err != nil {
		return nil, constraintError("response_format", err)
	}
	return con, nil
}

// toolFunction is the part of an offered tool a forced call needs.
type toolFunction struct {
	Name       string          `json:"name"`
	Parameters json.RawMessage `json:"parameters"`
}

// toolConstraint is the constraint for a forced tool call in the model
// family's format, the arguments following each function's parameters.
func (s *Server) toolConstraint(tools []chat.Tool, ft forcedTool, think thinkMode, parallel bool) (*constrain.Constraint, *apiError) {
	if !ft.required {
		return nil, nil
	}
	if len(tools) == 0 {
		return nil, badRequest("tool_choice", "tool_choice forces a tool call, but the request offers no tools")
	}
	var fns []toolFunction
	for _, t := range tools {
		raw, _ := t["function"].(json.RawMessage)
		var fn toolFunction
		if err := json.Unmarshal(raw, &fn); err != nil {
			return nil, badRequest("tools", "tools: %v", err)
		}
		if ft.name == "" || fn.Name == ft.name {
			fns = append(fns, fn)
		}
	}
	if len(fns) == 0 {
		return nil, badRequest("tool_choice", "tool_choice names the function %q, which is not among the tools", ft.name)
	}
	var key strings.Builder
	fmt.Fprintf(&key, "tools|%s|%s|%v", s.format, think.key(), parallel)
	for _, fn := range fns {
		var p bytes.Buffer
		if len(bytes.TrimSpace(fn.Parameters)) > 0 {
			if err := json.Compact(&p, fn.Parameters); err != nil {
				return nil, badRequest("tools", "the parameters of %q are not valid JSON", fn.Name)
			}
		}
		key.WriteString("|" + jsonString(fn.Name) + ":" + p.String())
	}
	format := s.format
	con, err := s.constraint(key.String(), func() (constrain.Expr, error) {
		var calls []constrain.Expr
		for _, fn := range fns {
			c, err := toolCallExpr(format, fn)
			if err != nil {
				return constrain.Expr{}, fmt.Errorf("function %q: %w", fn.Name, err)
			}
			calls = append(calls, c)
		}
		call := constrain.Alt(calls...)
		if format == FormatHermes {
			block := constrain.Seq(constrain.Lit(hermesOpen), constrain.WS(), call, constrain.WS(), constrain.Lit(hermesClose))
			if parallel {
				block = constrain.Seq(block, constrain.Star(constrain.Seq(constrain.WS(), block)))
			}
			call = block
		}
		return think.expr(call), nil
	})
	if err != nil {
		return nil, constraintError("tools", err)
	}
	return con, nil
}

// toolCallExpr is one call of fn as the model family writes it.
func toolCallExpr(format ToolFormat, fn toolFunction) (constrain.Expr, error) {
	args := constrain.JSONObject()
	if p := bytes.TrimSpace(fn.Parameters); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
		var err error
		if args, err = constrain.Schema(p); err != nil {
			return constrain.Expr{}, err
		}
	}
	ws, lit := constrain.WS, constrain.Lit
	switch format {
	case FormatGLM4:
		// The name on a line of its own, then the arguments.
		return constrain.Seq(lit(fn.Name), lit("\n"), args), nil
	case FormatLlama3:
		return constrain.Seq(lit("{"), ws(), lit(`"name"`), ws(), lit(":"), ws(), lit(jsonString(fn.Name)), ws(), lit(","), ws(),
			lit(`"parameters"`), ws(), lit(":"), ws(), args, ws(), lit("}")), nil
	}
	return constrain.Seq(lit("{"), ws(), lit(`"name"`), ws(), lit(":"), ws(), lit(jsonString(fn.Name)), ws(), lit(","), ws(),
		lit(`"arguments"`), ws(), lit(":"), ws(), args, ws(), lit("}")), nil
}

// jsonString is s as a JSON string, without HTML escapes.
func jsonString(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}
