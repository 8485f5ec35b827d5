package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/chat"
)

// Anthropic's Messages API: POST /v1/messages, for clients written for
// Claude (Claude Code, the Anthropic SDKs). Text, system prompts, tool use
// and tool results, stop sequences, thinking blocks for reasoning models,
// and the streamed events in Anthropic's order. Errors come in Anthropic's
// shape ({"type": "error", "error": {"type", "message"}}).

type anthropicRequest struct {
	Model         string             `json:"model"`
	MaxTokens     *int               `json:"max_tokens"`
	System        json.RawMessage    `json:"system"`
	Messages      []anthropicMessage `json:"messages"`
	StopSequences []string           `json:"stop_sequences"`
	Stream        bool               `json:"stream"`
	Temperature   *float64           `json:"temperature"`
	TopP          *float64           `json:"top_p"`
	TopK          *int               `json:"top_k"`
	Tools         []anthropicTool    `json:"tools"`
	ToolChoice    *struct {
		Type                   string `json:"type"`
		Name                   string `json:"name"`
		DisableParallelToolUse bool   `json:"disable_parallel_tool_use"`
	} `json:"tool_choice"`
	Thinking *struct {
		Type         string `json:"type"`
		BudgetTokens int    `json:"budget_tokens"`
	} `json:"thinking"`
	// OutputConfig.Format is structured output: {"type": "json_schema",
	// "schema": {...}}.
	OutputConfig *struct {
		Format *struct {
			Type   string          `json:"type"`
			Schema json.RawMessage `json:"schema"`
		} `json:"format"`
	} `json:"output_config"`
}

// checkRaw refuses the fields ats cannot honour.
func (r *anthropicRequest) checkRaw(body []byte) *apiError {
	return checkUnsupported(body, anthropicFields)
}

var anthropicFields = map[string]unsupportedField{
	"mcp_servers": {isEmpty, "ats connects to no MCP servers"},
	"container":   {isNull, "ats runs no code containers"},
}

type anthropicMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type anthropicTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// anthropicBlock is a content block of a request message.
type anthropicBlock struct {
	Type      string          `json:"type"`
	Text      string          `json:"text"`
	ID        string          `json:"id"`
	Name      string          `json:"name"`
	Input     json.RawMessage `json:"input"`
	ToolUseID string          `json:"tool_use_id"`
	Content   json.RawMessage `json:"content"`
	IsError   bool            `json:"is_error"`
	Thinking  string          `json:"thinking"`
}

// anthropicBlocks reads content: a string or an array of blocks.
func anthropicBlocks(raw json.RawMessage, param string) ([]anthropicBlock, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest(param, "%s: %v", param, err)
		}
		return []anthropicBlock{{Type: "text", Text: s}}, nil
	}
	var blocks []anthropicBlock
	if err := json.Unmarshal(raw, &blocks); err != nil {
		return nil, badRequest(param, "%s must be a string or an array of content blocks", param)
	}
	return blocks, nil
}

// blocksText joins the text blocks of a tool result's or system's content.
func blocksText(raw json.RawMessage, param string) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	blocks, e := anthropicBlocks(raw, param)
	if e != nil {
		return "", e
	}
	var parts []string
	for i, b := range blocks {
		if b.Type != "text" {
			return "", badRequest(param, "%s[%d] has type %q: ats serves text-only models, so only text blocks are taken here", param, i, b.Type)
		}
		parts = append(parts, b.Text)
	}
	return strings.Join(parts, "\n"), nil
}

// anthropicJob translates a request into the server's terms.
func anthropicJob(req *anthropicRequest) (*chatJob, *apiError) {
	j := &chatJob{choice: forcedTool{use: true}, parallel: true, maxParam: "max_tokens"}
	if req.MaxTokens == nil {
		return nil, badRequest("max_tokens", "max_tokens is required")
	}
	if *req.MaxTokens < 1 {
		return nil, badRequest("max_tokens", "max_tokens is %d; it must be at least 1", *req.MaxTokens)
	}
	j.max = *req.MaxTokens
	if len(req.Messages) == 0 {
		return nil, badRequest("messages", "messages is empty; send at least one message")
	}
	system, e := blocksText(req.System, "system")
	if e != nil {
		return nil, e
	}
	if system != "" {
		j.msgs = append(j.msgs, chat.Message{Role: "system", Content: system})
	}
	for i, m := range req.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		if m.Role != "user" && m.Role != "assistant" {
			return nil, badRequest(param+".role", "%s has role %q; use user or assistant (the system prompt is the top-level system field)", param, m.Role)
		}
		blocks, e := anthropicBlocks(m.Content, param+".content")
		if e != nil {
			return nil, e
		}
		msg := chat.Message{Role: m.Role}
		var text []string
		flush := func() {
			if len(text) > 0 || m.Role == "assistant" && (msg.ReasoningContent != "" || len(msg.ToolCalls) > 0) {
				msg.Content = strings.Join(text, "\n")
				j.msgs = append(j.msgs, msg)
			}
			msg, text = chat.Message{Role: m.Role}, nil
		}
		for k, b := range blocks {
			bp := fmt.Sprintf("%s.content[%d]", param, k)
			switch b.Type {
			case "text":
				text = append(text, b.Text)
			case "thinking", "redacted_thinking":
				if m.Role != "assistant" {
					return nil, badRequest(bp, "%s: only assistant messages carry thinking", bp)
				}
				msg.ReasoningContent += b.Thinking
			case "tool_use":
				if m.Role != "assistant" {
					return nil, badRequest(bp, "%s: only assistant messages carry tool_use", bp)
				}
				args, err := argumentsText(b.Input)
				if err != nil || b.Name == "" {
					return nil, badRequest(bp, "%s: tool_use needs a name and an input object", bp)
				}
				msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: b.ID, Type: "function", Function: chat.FunctionCall{Name: b.Name, Arguments: args}})
			case "tool_result":
				if m.Role != "user" {
					return nil, badRequest(bp, "%s: only user messages carry tool_result", bp)
				}
				flush()
				content, e := blocksText(b.Content, bp+".content")
				if e != nil {
					return nil, e
				}
				if b.IsError && content == "" {
					content = "error"
				}
				j.msgs = append(j.msgs, chat.Message{Role: "tool", Content: content, ToolCallID: b.ToolUseID})
			default:
				return nil, badRequest(bp+".type", "%s has type %q: ats serves text-only models; use text, tool_use, tool_result or thinking blocks", bp, b.Type)
			}
		}
		flush()
	}
	var fns []functionTool
	for i, t := range req.Tools {
		if t.Type != "" && t.Type != "custom" {
			return nil, badRequest(fmt.Sprintf("tools[%d].type", i), "tools[%d] is Anthropic's built-in tool %q, which ats does not run; describe it as a custom tool with an input_schema", i, t.Type)
		}
		fns = append(fns, functionTool{Name: t.Name, Description: t.Description, Parameters: t.InputSchema})
	}
	var e2 *apiError
	if j.tools, j.names, e2 = toolsFromFunctions("tools", fns); e2 != nil {
		return nil, e2
	}
	if tc := req.ToolChoice; tc != nil {
		switch tc.Type {
		case "auto", "":
		case "any":
			j.choice.required = true
		case "tool":
			if tc.Name == "" {
				return nil, badRequest("tool_choice.name", "tool_choice of type tool needs a name")
			}
			j.choice = forcedTool{use: true, required: true, name: tc.Name}
		case "none":
			j.choice = forcedTool{}
		default:
			return nil, badRequest("tool_choice.type", "tool_choice type %q: use auto, any, tool or none", tc.Type)
		}
		j.parallel = !tc.DisableParallelToolUse
	}
	if th := req.Thinking; th != nil {
		var on bool
		switch th.Type {
		case "enabled":
			on = true
		case "disabled":
		default:
			return nil, badRequest("thinking.type", "thinking type %q: use enabled or disabled", th.Type)
		}
		j.vars = thinkingVar(j.vars, &on)
	}
	if oc := req.OutputConfig; oc != nil && oc.Format != nil {
		if oc.Format.Type != "json_schema" {
			return nil, badRequest("output_config.format.type", "output_config.format type %q: use json_schema", oc.Format.Type)
		}
		j.con = constraintRequest{param: "output_config.format", schema: oc.Format.Schema}
		if s := bytes.TrimSpace(oc.Format.Schema); len(s) == 0 || isNull(s) {
			j.con = constraintRequest{param: "output_config.format", anyObject: true}
		}
	}
	j.sampling = samplingParams{Temperature: req.Temperature, TopP: req.TopP, TopK: req.TopK, Stop: req.StopSequences}
	return j, nil
}

// anthropicError writes e in Anthropic's shape.
func anthropicError(w http.ResponseWriter, e *apiError) {
	typ := map[int]string{
		http.StatusBadRequest: "invalid_request_error", http.StatusUnauthorized: "authentication_error",
		http.StatusNotFound: "not_found_error", http.StatusRequestEntityTooLarge: "request_too_large",
		http.StatusServiceUnavailable: "overloaded_error",
	}[e.Status]
	if typ == "" {
		typ = "api_error"
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	b, _ := json.Marshal(map[string]any{"type": "error", "error": map[string]string{"type": typ, "message": e.Message}})
	w.Write(append(b, '\n'))
}

func (s *Server) handleAnthropicMessages(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req anthropicRequest
	if e := s.readBody(w, r, &req); e != nil {
		anthropicError(w, e)
		return
	}
	j, e := anthropicJob(&req)
	if e != nil {
		anthropicError(w, e)
		return
	}
	sink := &anthropicSink{s: s, w: w, stream: req.Stream, id: newID("msg_")}
	if req.Stream {
		sink.sse = newSSE(w, s.cfg.WriteTimeout)
	}
	g, e := s.jobGeneration("messages", j, sink, req.Stream, received, anthropicError)
	if e != nil {
		anthropicError(w, e)
		return
	}
	s.generate(w, r, g)
}

type anthropicContent struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text,omitempty"`
	Thinking  *string         `json:"thinking,omitempty"`
	Signature *string         `json:"signature,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
}

type anthropicUsage struct {
	InputTokens          int `json:"input_tokens"`
	OutputTokens         int `json:"output_tokens"`
	CacheReadInputTokens int `json:"cache_read_input_tokens"`
}

type anthropicMessageOut struct {
	ID           string             `json:"id"`
	Type         string             `json:"type"`
	Role         string             `json:"role"`
	Model        string             `json:"model"`
	Content      []anthropicContent `json:"content"`
	StopReason   *string            `json:"stop_reason"`
	StopSequence *string            `json:"stop_sequence"`
	Usage        anthropicUsage     `json:"usage"`
}

// anthropicSink writes a message, or its events.
type anthropicSink struct {
	s      *Server
	w      http.ResponseWriter
	stream bool
	sse    *sse
	id     string
	// Streaming: the open block (its kind and index) and the next index.
	open    string
	index   int
	nBlocks int
	prompt  int
}

func (a *anthropicSink) event(name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return a.sse.event(name, b)
}

func (a *anthropicSink) begin(promptTokens int) error {
	a.prompt = promptTokens
	if !a.stream {
		return nil
	}
	msg := anthropicMessageOut{ID: a.id, Type: "message", Role: "assistant", Model: a.s.cfg.ModelName,
		Content: []anthropicContent{}, Usage: anthropicUsage{InputTokens: promptTokens}}
	if err := a.event("message_start", map[string]any{"type": "message_start", "message": msg}); err != nil {
		return err
	}
	return a.event("ping", map[string]string{"type": "ping"})
}

// openBlock starts a block of kind unless it is the open one.
func (a *anthropicSink) openBlock(kind string, block anthropicContent) error {
	if a.open == kind && kind != "tool_use" {
		return nil
	}
	if err := a.closeBlock(); err != nil {
		return err
	}
	a.open, a.index = kind, a.nBlocks
	a.nBlocks++
	return a.event("content_block_start", map[string]any{"type": "content_block_start", "index": a.index, "content_block": block})
}

func (a *anthropicSink) closeBlock() error {
	if a.open == "" {
		return nil
	}
	if a.open == "thinking" {
		// Anthropic signs thinking so it can be sent back untampered; ats
		// has nothing to sign with, and takes thinking back as it is.
		if err := a.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index,
			"delta": map[string]string{"type": "signature_delta", "signature": ""}}); err != nil {
			return err
		}
	}
	a.open = ""
	return a.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": a.index})
}

func (a *anthropicSink) delta(d Delta) error {
	empty := ""
	if d.Reasoning != "" {
		if err := a.openBlock("thinking", anthropicContent{Type: "thinking", Thinking: &empty, Signature: &empty}); err != nil {
			return err
		}
		if err := a.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index,
			"delta": map[string]string{"type": "thinking_delta", "thinking": d.Reasoning}}); err != nil {
			return err
		}
	}
	if d.Content != "" {
		if err := a.openBlock("text", anthropicContent{Type: "text", Text: &empty}); err != nil {
			return err
		}
		if err := a.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index,
			"delta": map[string]string{"type": "text_delta", "text": d.Content}}); err != nil {
			return err
		}
	}
	for _, c := range d.ToolCalls {
		id := anthropicToolID(c.ID)
		if err := a.openBlock("tool_use", anthropicContent{Type: "tool_use", ID: id, Name: c.Function.Name, Input: json.RawMessage("{}")}); err != nil {
			return err
		}
		if err := a.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": a.index,
			"delta": map[string]string{"type": "input_json_delta", "partial_json": string(argumentsObject(c.Function.Arguments))}}); err != nil {
			return err
		}
	}
	return nil
}

// anthropicToolID turns a tool call's id into Anthropic's form.
func anthropicToolID(id string) string {
	return "toolu_" + strings.TrimPrefix(id, defaultToolID)
}

// stopReason is Anthropic's stop_reason and stop_sequence.
func anthropicStop(res *session.GenerateResult, toolCalls int) (string, *string) {
	switch {
	case res.StopReason == session.StopLength:
		return "max_tokens", nil
	case res.StopString != "":
		return "stop_sequence", strPtr(res.StopString)
	case toolCalls > 0:
		return "tool_use", nil
	}
	return "end_turn", nil
}

func anthropicUsageOf(res *session.GenerateResult) anthropicUsage {
	return anthropicUsage{InputTokens: res.PromptTokens - res.CachedTokens, OutputTokens: len(res.Tokens), CacheReadInputTokens: res.CachedTokens}
}

func (a *anthropicSink) end(res *session.GenerateResult, reply Parsed, err error) {
	if err != nil {
		if a.s.clientGone(err) {
			return
		}
		e := a.s.errorFor(err)
		if a.stream && a.sse.started {
			a.event("error", map[string]any{"type": "error", "error": map[string]string{"type": "api_error", "message": e.Message}})
			return
		}
		anthropicError(a.w, e)
		return
	}
	reason, seq := anthropicStop(res, len(reply.ToolCalls))
	if a.stream {
		if a.closeBlock() != nil {
			return
		}
		if a.event("message_delta", map[string]any{"type": "message_delta",
			"delta": map[string]any{"stop_reason": reason, "stop_sequence": seq},
			"usage": map[string]int{"output_tokens": len(res.Tokens)}}) != nil {
			return
		}
		a.event("message_stop", map[string]string{"type": "message_stop"})
		return
	}
	out := anthropicMessageOut{ID: a.id, Type: "message", Role: "assistant", Model: a.s.cfg.ModelName,
		Content: []anthropicContent{}, StopReason: &reason, StopSequence: seq, Usage: anthropicUsageOf(res)}
	if reply.Reasoning != "" {
		empty := ""
		out.Content = append(out.Content, anthropicContent{Type: "thinking", Thinking: strPtr(reply.Reasoning), Signature: &empty})
	}
	if reply.Content != "" {
		out.Content = append(out.Content, anthropicContent{Type: "text", Text: strPtr(reply.Content)})
	}
	for _, c := range reply.ToolCalls {
		out.Content = append(out.Content, anthropicContent{Type: "tool_use", ID: anthropicToolID(c.ID), Name: c.Function.Name,
			Input: argumentsObject(c.Function.Arguments)})
	}
	writeJSON(a.w, http.StatusOK, out, a.s.cfg.WriteTimeout)
}

// event writes a named server-sent event (Anthropic's and the responses
// API's streams name each event).
func (e *sse) event(name string, data []byte) error {
	e.start()
	e.rc.SetWriteDeadline(time.Now().Add(e.timeout))
	var buf bytes.Buffer
	buf.Grow(len(name) + len(data) + 16)
	buf.WriteString("event: ")
	buf.WriteString(name)
	buf.WriteString("\ndata: ")
	buf.Write(data)
	buf.WriteString("\n\n")
	if _, err := e.w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("writing to the client: %w", err)
	}
	if err := e.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("flushing to the client: %w", err)
	}
	return nil
}

// handleAnthropicCountTokens answers POST /v1/messages/count_tokens: the
// prompt's length as the template renders it.
func (s *Server) handleAnthropicCountTokens(w http.ResponseWriter, r *http.Request) {
	var req anthropicRequest
	if e := s.readBody(w, r, &req); e != nil {
		anthropicError(w, e)
		return
	}
	if req.MaxTokens == nil {
		one := 1
		req.MaxTokens = &one // count_tokens takes no max_tokens
	}
	j, e := anthropicJob(&req)
	if e != nil {
		anthropicError(w, e)
		return
	}
	// Rendering and tokenizing take the preparation slot, as a generation's
	// do, so they stay bounded however many requests come.
	select {
	case s.prep.slot <- struct{}{}:
	case <-r.Context().Done():
		return
	}
	defer func() { <-s.prep.slot }()
	p, err := s.render(j.msgs, chat.Options{AddGenerationPrompt: true, Tools: j.tools, Vars: j.vars, Context: r.Context()})
	if err != nil {
		anthropicError(w, s.renderError(r.Context(), err, j.msgs, len(j.tools) > 0 || len(j.vars) > 0))
		return
	}
	ids, e := s.encodePrompt(p)
	if e != nil {
		anthropicError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, map[string]int{"input_tokens": len(ids)}, s.cfg.WriteTimeout)
}
