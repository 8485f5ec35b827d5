package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"strings"

	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/sampler"
)

// samplingParams are the request fields that configure sampling: OpenAI's,
// and the llama.cpp extensions (top_k, min_p, repeat_penalty,
// repeat_last_n) that llama.cpp's server also accepts. Pointers tell "not
// given" (use the server's default) from zero.
type samplingParams struct {
	Temperature      *float64           `json:"temperature"`
	TopP             *float64           `json:"top_p"`
	TopK             *int               `json:"top_k"`
	MinP             *float64           `json:"min_p"`
	RepeatPenalty    *float64           `json:"repeat_penalty"`
	RepeatLastN      *int               `json:"repeat_last_n"`
	PresencePenalty  *float64           `json:"presence_penalty"`
	FrequencyPenalty *float64           `json:"frequency_penalty"`
	Seed             *int64             `json:"seed"`
	LogitBias        map[string]float64 `json:"logit_bias"`
	Stop             stopList           `json:"stop"`
	MaxTokens        *int               `json:"max_tokens"`
	N                *int               `json:"n"`
	Stream           bool               `json:"stream"`
	StreamOptions    *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	// llama-server's: a GBNF grammar, a JSON schema (the schema itself,
	// not response_format's wrapper) and max_tokens's other name.
	Grammar    *string         `json:"grammar"`
	JSONSchema json.RawMessage `json:"json_schema"`
	NPredict   *int            `json:"n_predict"`
	// IgnoreEOS generates past the end of the turn (benchmarks);
	// ReturnProgress streams the prompt's evaluation as prompt_progress
	// chunks before the text.
	IgnoreEOS      bool `json:"ignore_eos"`
	ReturnProgress bool `json:"return_progress"`
}

// checkRaw refuses the fields of a chat request ats cannot honour
// (grammar.go); decodeBody calls it with the body.
func (r *chatRequest) checkRaw(body []byte) *apiError {
	return checkUnsupported(body, samplerFields, chatFields)
}

// checkRaw refuses the fields of a completion request ats cannot honour.
func (r *completionRequest) checkRaw(body []byte) *apiError {
	return checkUnsupported(body, samplerFields)
}

// rawChecker is a request that checks its raw body after decoding.
type rawChecker interface {
	checkRaw(body []byte) *apiError
}

// chatRequest is the body of POST /v1/chat/completions. Fields the server
// does not know are ignored, as OpenAI-compatible servers do (clients send
// "user", "metadata", "store", ...); fields it knows but cannot honour are
// rejected rather than silently dropped.
type chatRequest struct {
	Model    string           `json:"model"`
	Messages []requestMessage `json:"messages"`
	samplingParams
	MaxCompletionTokens *int              `json:"max_completion_tokens"`
	Tools               []json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage   `json:"tool_choice"`
	ParallelToolCalls   *bool             `json:"parallel_tool_calls"`
	// ChatTemplateKwargs are extra template variables, as llama.cpp and
	// vLLM accept them: {"enable_thinking": false} turns Qwen3's thinking
	// off.
	ChatTemplateKwargs map[string]json.RawMessage `json:"chat_template_kwargs"`
	// ReasoningEffort "none" turns thinking off where the template can.
	ReasoningEffort *string          `json:"reasoning_effort"`
	Logprobs        *bool            `json:"logprobs"`
	TopLogprobs     *int             `json:"top_logprobs"`
	ResponseFormat  *json.RawMessage `json:"response_format"`
}

// completionRequest is the body of POST /v1/completions.
type completionRequest struct {
	Model  string          `json:"model"`
	Prompt json.RawMessage `json:"prompt"`
	samplingParams
	Echo     bool            `json:"echo"`
	Suffix   *string         `json:"suffix"`
	BestOf   *int            `json:"best_of"`
	Logprobs json.RawMessage `json:"logprobs"`
}

// requestMessage is one message of a chat request.
type requestMessage struct {
	Role             string            `json:"role"`
	Content          messageContent    `json:"content"`
	ReasoningContent string            `json:"reasoning_content"`
	ToolCalls        []requestToolCall `json:"tool_calls"`
	ToolCallID       string            `json:"tool_call_id"`
	Name             string            `json:"name"`
}

type requestToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

// messageContent is a message's content: a string, null, or an array of
// parts of which ats understands the text ones.
type messageContent struct {
	Text string
	Set  bool // present and not null
}

func (c *messageContent) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*c = messageContent{}
		return nil
	case len(b) > 0 && b[0] == '"':
		c.Set = true
		return json.Unmarshal(b, &c.Text)
	case len(b) > 0 && b[0] == '[':
		var parts []map[string]json.RawMessage
		if err := json.Unmarshal(b, &parts); err != nil {
			return badRequest("messages", "a message's content array must hold objects such as {\"type\": \"text\", \"text\": \"...\"}")
		}
		var sb strings.Builder
		for i, p := range parts {
			var typ, text string
			if err := json.Unmarshal(p["type"], &typ); err != nil {
				return badRequest("messages", "content part %d has no string \"type\"", i)
			}
			if typ != "text" {
				return badRequest("messages", "content part %d has type %q: ats serves text-only models, only \"text\" parts are supported", i, typ)
			}
			if err := json.Unmarshal(p["text"], &text); err != nil {
				return badRequest("messages", "content part %d (type text) has no string \"text\"", i)
			}
			if i > 0 {
				sb.WriteByte('\n')
			}
			sb.WriteString(text)
		}
		c.Text, c.Set = sb.String(), true
		return nil
	}
	return badRequest("messages", "a message's content must be a string, an array of text parts, or null")
}

// stopList is "stop": a string or an array of strings.
type stopList []string

func (s *stopList) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*s = nil
		return nil
	case len(b) > 0 && b[0] == '"':
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return err
		}
		*s = stopList{one}
		return nil
	case len(b) > 0 && b[0] == '[':
		var many []string
		if err := json.Unmarshal(b, &many); err != nil {
			return badRequest("stop", "stop must be a string or an array of strings")
		}
		*s = many
		return nil
	}
	return badRequest("stop", "stop must be a string or an array of strings")
}

// maxStops bounds the stop strings of one request (OpenAI allows 4; more
// cost little, but an unbounded list would be an easy way to waste CPU).
const maxStops = 16

// decodeBody reads a JSON request body into v, turning every way it can be
// wrong into a 400 (or 413) that says what is wrong.
func decodeBody(w http.ResponseWriter, r *http.Request, limit int64, budget *bodyBudget, v any) *apiError {
	// The Content-Type is not checked: curl -d sends
	// application/x-www-form-urlencoded unless told otherwise, and the
	// body is JSON all the same.
	body, held, err := budget.readAll(http.MaxBytesReader(w, r.Body, limit), r.ContentLength, limit)
	defer budget.give(held)
	if err != nil {
		var mbe *http.MaxBytesError
		switch {
		case errors.As(err, &mbe):
			return &apiError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest,
				Message: fmt.Sprintf("request body is larger than %d bytes", mbe.Limit)}
		case errors.Is(err, errBodiesFull):
			return busyBodies(budget.max)
		}
		return badRequest("", "reading the request body: %v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("", "the request body is empty; send a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		return jsonError(err, body)
	}
	if dec.More() {
		return badRequest("", "malformed JSON: unexpected data after the top-level object at offset %d", dec.InputOffset())
	}
	if rc, ok := v.(rawChecker); ok {
		return rc.checkRaw(body)
	}
	return nil
}

// jsonError explains a decoding error.
func jsonError(err error, body []byte) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return badRequest("", "malformed JSON at offset %d: %v", se.Offset, err)
	}
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		if te.Field == "" {
			return badRequest("", "the request body must be a JSON object, got %s", te.Value)
		}
		// encoding/json names an embedded struct's fields through the
		// struct's Go name; the client knows only the JSON name.
		field := strings.TrimPrefix(te.Field, "samplingParams.")
		return badRequest(field, "invalid type for %q: expected %s, got %s", field, jsonKind(te.Type), te.Value)
	}
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return badRequest("", "malformed JSON: the body ends before the object does (%d bytes)", len(body))
	}
	return badRequest("", "invalid request body: %v", err)
}

// jsonKind names the JSON kind a Go type decodes from.
func jsonKind(t reflect.Type) string {
	if t == nil {
		return "a different type"
	}
	switch t.Kind() {
	case reflect.Pointer:
		return jsonKind(t.Elem())
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return t.String()
}

// zeroSeed replaces a requested seed of 0: OpenAI's seed 0 is a seed like
// any other, but the sampler reads 0 as "pick one at random".
const zeroSeed = 0x9e3779b97f4a7c15

// samplerConfig applies the request's sampling fields to the server's
// defaults and checks them against a vocabulary of nVocab tokens.
func (p *samplingParams) samplerConfig(def sampler.Config, nVocab int) (sampler.Config, *apiError) {
	cfg := def
	f32 := func(param string, v *float64, dst *float32) *apiError {
		if v == nil {
			return nil
		}
		if math.IsNaN(*v) || math.IsInf(*v, 0) || math.Abs(*v) > math.MaxFloat32 {
			return badRequest(param, "%s must be a finite number", param)
		}
		*dst = float32(*v)
		return nil
	}
	for _, x := range []struct {
		name string
		v    *float64
		dst  *float32
	}{
		{"temperature", p.Temperature, &cfg.Temperature},
		{"top_p", p.TopP, &cfg.TopP},
		{"min_p", p.MinP, &cfg.MinP},
		{"repeat_penalty", p.RepeatPenalty, &cfg.RepeatPenalty},
		{"presence_penalty", p.PresencePenalty, &cfg.PresencePenalty},
		{"frequency_penalty", p.FrequencyPenalty, &cfg.FrequencyPenalty},
	} {
		if e := f32(x.name, x.v, x.dst); e != nil {
			return cfg, e
		}
	}
	if p.TopK != nil {
		cfg.TopK = *p.TopK
	}
	if p.RepeatLastN != nil {
		cfg.RepeatLastN = *p.RepeatLastN
	}
	if p.Seed != nil {
		cfg.Seed = uint64(*p.Seed)
		if cfg.Seed == 0 {
			cfg.Seed = zeroSeed
		}
	}
	if len(p.LogitBias) > 0 {
		cfg.LogitBias = make(map[int]float32, len(p.LogitBias))
		for k, v := range p.LogitBias {
			id, err := sampler.ParseTokenID(k)
			if err != nil {
				return cfg, badRequest("logit_bias", "logit_bias key %q: %v", k, err)
			}
			if id < 0 || id >= nVocab {
				return cfg, badRequest("logit_bias", "logit_bias token %d is outside the vocabulary [0, %d)", id, nVocab)
			}
			if math.IsNaN(v) || v < -100 || v > 100 {
				return cfg, badRequest("logit_bias", "logit_bias for token %d is %v; it must be in [-100, 100]", id, v)
			}
			// OpenAI: "-100 should result in a ban". Adding -100 to a
			// logit nearly does that; -Inf does it exactly.
			b := float32(v)
			if v == -100 {
				b = float32(math.Inf(-1))
			}
			cfg.LogitBias[id] = b
		}
	}
	// Validate, not New: a sampler allocates vocabulary-sized buffers,
	// which a request must not cost before it is admitted.
	if err := cfg.Validate(nVocab); err != nil {
		if errors.Is(err, sampler.ErrConfig) {
			return cfg, badRequest("", "%v", err)
		}
		return cfg, internalError(err)
	}
	return cfg, nil
}

// common checks the fields both endpoints share.
func (p *samplingParams) common() *apiError {
	if p.N != nil && *p.N != 1 {
		return badRequest("n", "n is %d; ats generates one choice per request, so n must be 1 or absent", *p.N)
	}
	if len(p.Stop) > maxStops {
		return badRequest("stop", "stop has %d strings; at most %d are allowed", len(p.Stop), maxStops)
	}
	for i, s := range p.Stop {
		if s == "" {
			return badRequest("stop", "stop string %d is empty", i)
		}
	}
	if p.StreamOptions != nil && !p.Stream {
		return badRequest("stream_options", "stream_options is only allowed when stream is true")
	}
	return nil
}

// maxTokens resolves the requested completion length: 0 means "until the
// end of the turn or a full context". llama.cpp's -1 means the same.
func maxTokens(param string, v *int, def int) (int, *apiError) {
	if v == nil {
		return def, nil
	}
	switch {
	case *v == -1:
		return 0, nil
	case *v < 1:
		return 0, badRequest(param, "%s is %d; it must be at least 1 (or -1 for no limit)", param, *v)
	}
	return *v, nil
}

// chatMessages converts and checks the request's messages.
func chatMessages(in []requestMessage) ([]chat.Message, *apiError) {
	if len(in) == 0 {
		return nil, badRequest("messages", "messages is empty; send at least one message")
	}
	out := make([]chat.Message, 0, len(in))
	for i, m := range in {
		param := fmt.Sprintf("messages[%d]", i)
		msg := chat.Message{Role: m.Role, Content: m.Content.Text, ReasoningContent: m.ReasoningContent,
			ToolCallID: m.ToolCallID, Name: m.Name}
		switch m.Role {
		case "system", "user", "assistant", "tool":
		case "developer":
			// OpenAI's newer name for the system role; templates know only "system".
			msg.Role = "system"
		case "":
			return nil, badRequest(param+".role", "%s has no role", param)
		default:
			return nil, badRequest(param+".role", "%s has role %q; use system, developer, user, assistant or tool", param, m.Role)
		}
		if !m.Content.Set && (m.Role != "assistant" || len(m.ToolCalls) == 0) {
			return nil, badRequest(param+".content", "%s (%s) has no content", param, m.Role)
		}
		if len(m.ToolCalls) > 0 && m.Role != "assistant" {
			return nil, badRequest(param+".tool_calls", "%s: only assistant messages carry tool_calls", param)
		}
		for j, tc := range m.ToolCalls {
			if tc.Type != "" && tc.Type != "function" {
				return nil, badRequest(param+".tool_calls", "%s.tool_calls[%d] has type %q; only \"function\" is supported", param, j, tc.Type)
			}
			if tc.Function.Name == "" {
				return nil, badRequest(param+".tool_calls", "%s.tool_calls[%d] has no function name", param, j)
			}
			args, err := argumentsText(tc.Function.Arguments)
			if err != nil {
				return nil, badRequest(param+".tool_calls", "%s.tool_calls[%d].function.arguments: %v", param, j, err)
			}
			msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: tc.ID, Type: "function",
				Function: chat.FunctionCall{Name: tc.Function.Name, Arguments: args}})
		}
		out = append(out, msg)
	}
	return out, nil
}

// argumentsText accepts tool-call arguments as OpenAI sends them (a string
// holding JSON) and as some clients do (the JSON object itself).
func argumentsText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "{}", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	}
	if raw[0] == '{' {
		var b bytes.Buffer
		if err := json.Compact(&b, raw); err != nil {
			return "", err
		}
		return b.String(), nil
	}
	return "", errors.New("must be a JSON string or object")
}

// chatTools converts the request's tools for the template and returns the
// names of their functions.
func chatTools(raw []json.RawMessage) ([]chat.Tool, []string, *apiError) {
	var tools []chat.Tool
	var names []string
	for i, t := range raw {
		param := fmt.Sprintf("tools[%d]", i)
		var top map[string]json.RawMessage
		if err := json.Unmarshal(t, &top); err != nil {
			return nil, nil, badRequest(param, "%s must be an object like {\"type\": \"function\", \"function\": {\"name\": ...}}", param)
		}
		var typ string
		if err := json.Unmarshal(top["type"], &typ); err != nil || typ != "function" {
			return nil, nil, badRequest(param+".type", "%s.type must be \"function\"", param)
		}
		var fn struct {
			Name string `json:"name"`
		}
		if err := json.Unmarshal(top["function"], &fn); err != nil || fn.Name == "" {
			return nil, nil, badRequest(param+".function", "%s.function must be an object with a non-empty \"name\"", param)
		}
		// Raw JSON values keep the key order the client wrote, which the
		// template's tojson then reproduces, as HF's does.
		tool := chat.Tool{}
		for k, v := range top {
			tool[k] = v
		}
		tools = append(tools, tool)
		names = append(names, fn.Name)
	}
	return tools, names, nil
}
