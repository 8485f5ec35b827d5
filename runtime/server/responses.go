package server

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/chat"
)

// OpenAI's Responses API: POST /v1/responses (text, streamed events,
// function tools, text.format for structured output) and
// previous_response_id, which continues a stored conversation. Responses
// are kept in memory (store: true, the default), the oldest dropped
// beyond maxStoredResponses or maxStoredBytes; GET /v1/responses/{id}
// returns one and DELETE forgets it.

type responsesRequest struct {
	Model              string          `json:"model"`
	Input              json.RawMessage `json:"input"`
	Instructions       *string         `json:"instructions"`
	MaxOutputTokens    *int            `json:"max_output_tokens"`
	Temperature        *float64        `json:"temperature"`
	TopP               *float64        `json:"top_p"`
	Stream             bool            `json:"stream"`
	Tools              []responsesTool `json:"tools"`
	ToolChoice         json.RawMessage `json:"tool_choice"`
	ParallelToolCalls  *bool           `json:"parallel_tool_calls"`
	PreviousResponseID string          `json:"previous_response_id"`
	Store              *bool           `json:"store"`
	Text               *struct {
		Format json.RawMessage `json:"format"`
	} `json:"text"`
	Reasoning *struct {
		Effort *string `json:"effort"`
	} `json:"reasoning"`
}

func (r *responsesRequest) checkRaw(body []byte) *apiError {
	return checkUnsupported(body, responsesFields)
}

var responsesFields = map[string]unsupportedField{
	"background":     {isBool(false), "ats answers while the request is open"},
	"conversation":   {isNull, "use previous_response_id"},
	"prompt":         {isNull, "ats has no stored prompts; send input and instructions"},
	"top_logprobs":   {isNumber(0), "use /v1/chat/completions for log-probabilities"},
	"max_tool_calls": {isNull, "ats does not cap the calls of a reply"},
	"truncation": {func(raw json.RawMessage) bool {
		return isNull(raw) || string(bytes.TrimSpace(raw)) == `"disabled"`
	}, "ats refuses a conversation longer than the context instead of cutting it"},
}

type responsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	Parameters  json.RawMessage `json:"parameters"`
}

// responsesItem is an input item: a message, a function call, its output,
// or reasoning.
type responsesItem struct {
	Type    string          `json:"type"`
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	CallID  string          `json:"call_id"`
	Name    string          `json:"name"`
	Args    string          `json:"arguments"`
	Output  json.RawMessage `json:"output"`
	Summary []struct {
		Text string `json:"text"`
	} `json:"summary"`
}

// responsesText joins a message's content: a string, or input_text /
// output_text parts.
func responsesText(raw json.RawMessage, param string) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		json.Unmarshal(raw, &s)
		return s, nil
	}
	var parts []struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(raw, &parts); err != nil {
		return "", badRequest(param, "%s must be a string or an array of content parts", param)
	}
	var out []string
	for i, p := range parts {
		switch p.Type {
		case "input_text", "output_text", "text":
			out = append(out, p.Text)
		default:
			return "", badRequest(param, "%s[%d] has type %q: ats serves text-only models, so only input_text and output_text parts are taken", param, i, p.Type)
		}
	}
	return strings.Join(out, "\n"), nil
}

// responsesMessages reads input: a string (one user message) or items.
func responsesMessages(raw json.RawMessage) ([]chat.Message, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("input", "input is missing")
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badRequest("input", "input: %v", err)
		}
		return []chat.Message{{Role: "user", Content: s}}, nil
	}
	var items []responsesItem
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badRequest("input", "input must be a string or an array of items")
	}
	var msgs []chat.Message
	for i, it := range items {
		param := fmt.Sprintf("input[%d]", i)
		switch it.Type {
		case "message", "":
			text, e := responsesText(it.Content, param+".content")
			if e != nil {
				return nil, e
			}
			role := it.Role
			switch role {
			case "developer":
				role = "system"
			case "system", "user", "assistant":
			default:
				return nil, badRequest(param+".role", "%s has role %q; use user, assistant, system or developer", param, it.Role)
			}
			msgs = append(msgs, chat.Message{Role: role, Content: text})
		case "function_call":
			if it.Name == "" {
				return nil, badRequest(param+".name", "%s (function_call) has no name", param)
			}
			args := it.Args
			if args == "" {
				args = "{}"
			}
			call := chat.ToolCall{ID: it.CallID, Type: "function", Function: chat.FunctionCall{Name: it.Name, Arguments: args}}
			// Calls following an assistant message belong to it.
			if n := len(msgs); n > 0 && msgs[n-1].Role == "assistant" {
				msgs[n-1].ToolCalls = append(msgs[n-1].ToolCalls, call)
			} else {
				msgs = append(msgs, chat.Message{Role: "assistant", ToolCalls: []chat.ToolCall{call}})
			}
		case "function_call_output":
			out, e := responsesText(it.Output, param+".output")
			if e != nil {
				return nil, e
			}
			msgs = append(msgs, chat.Message{Role: "tool", Content: out, ToolCallID: it.CallID})
		case "reasoning":
			// Reasoning belongs to the assistant message that follows.
			var text []string
			for _, s := range it.Summary {
				text = append(text, s.Text)
			}
			msgs = append(msgs, chat.Message{Role: "assistant", ReasoningContent: strings.Join(text, "\n")})
		default:
			return nil, badRequest(param+".type", "%s has type %q: ats takes message, function_call, function_call_output and reasoning items", param, it.Type)
		}
	}
	// Merge a reasoning item into the assistant message after it.
	var merged []chat.Message
	for _, m := range msgs {
		if n := len(merged); n > 0 && merged[n-1].Role == "assistant" && merged[n-1].Content == "" && len(merged[n-1].ToolCalls) == 0 && m.Role == "assistant" {
			m.ReasoningContent = merged[n-1].ReasoningContent + m.ReasoningContent
			merged[n-1] = m
			continue
		}
		merged = append(merged, m)
	}
	return merged, nil
}

// responsesFormat reads text.format into response_format's terms.
func responsesFormat(raw json.RawMessage) (constraintRequest, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return constraintRequest{}, nil
	}
	var f struct {
		Type   string          `json:"type"`
		Schema json.RawMessage `json:"schema"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		return constraintRequest{}, badRequest("text.format", "text.format must be an object with a type")
	}
	switch f.Type {
	case "text", "":
		return constraintRequest{}, nil
	case "json_object":
		return constraintRequest{param: "text.format", anyObject: true}, nil
	case "json_schema":
		s := bytes.TrimSpace(f.Schema)
		if len(s) == 0 || bytes.Equal(s, []byte("null")) {
			return constraintRequest{param: "text.format", anyObject: true}, nil
		}
		return constraintRequest{param: "text.format", schema: s}, nil
	}
	return constraintRequest{}, badRequest("text.format", "text.format type %q: use text, json_object or json_schema", f.Type)
}

// storedResponse is a response kept for previous_response_id and GET.
type storedResponse struct {
	conversation []chat.Message // the input and the reply
	body         []byte         // the response object
	size         int
}

// Bounds on the responses kept in memory.
const (
	maxStoredResponses = 256
	maxStoredBytes     = 64 << 20
)

// responseStore keeps the latest responses, oldest out first.
type responseStore struct {
	mu    sync.Mutex
	byID  map[string]*storedResponse
	order []string
	bytes int
}

func (st *responseStore) get(id string) (*storedResponse, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.byID[id]
	return r, ok
}

func (st *responseStore) put(id string, r *storedResponse) {
	for _, m := range r.conversation {
		r.size += len(m.Content) + len(m.ReasoningContent) + 64
		for _, c := range m.ToolCalls {
			r.size += len(c.Function.Arguments) + len(c.Function.Name)
		}
	}
	r.size += len(r.body)
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.byID == nil {
		st.byID = map[string]*storedResponse{}
	}
	st.byID[id] = r
	st.order = append(st.order, id)
	st.bytes += r.size
	for len(st.order) > 0 && (len(st.order) > maxStoredResponses || st.bytes > maxStoredBytes) {
		old := st.order[0]
		st.order = st.order[1:]
		if o, ok := st.byID[old]; ok {
			st.bytes -= o.size
			delete(st.byID, old)
		}
	}
}

func (st *responseStore) delete(id string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	r, ok := st.byID[id]
	if ok {
		st.bytes -= r.size
		delete(st.byID, id)
		for i, o := range st.order {
			if o == id {
				st.order = append(st.order[:i], st.order[i+1:]...)
				break
			}
		}
	}
	return ok
}

func (s *Server) handleResponses(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req responsesRequest
	if e := s.readBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	j, sink, e := s.responsesJob(&req, w, received)
	if e != nil {
		writeError(w, e)
		return
	}
	g, e := s.jobGeneration("responses", j, sink, req.Stream, received, nil)
	if e != nil {
		writeError(w, e)
		return
	}
	s.generate(w, r, g)
}

func (s *Server) responsesJob(req *responsesRequest, w http.ResponseWriter, received time.Time) (*chatJob, *responsesSink, *apiError) {
	j := &chatJob{choice: forcedTool{use: true}, parallel: req.ParallelToolCalls == nil || *req.ParallelToolCalls, maxParam: "max_output_tokens"}
	var history []chat.Message
	if req.PreviousResponseID != "" {
		prev, ok := s.responses.get(req.PreviousResponseID)
		if !ok {
			return nil, nil, withCode(badRequest("previous_response_id", "previous response %q is not stored here (the server keeps the latest %d, in memory, and only those made with store true)", req.PreviousResponseID, maxStoredResponses), "previous_response_not_found")
		}
		history = prev.conversation
	}
	input, e := responsesMessages(req.Input)
	if e != nil {
		return nil, nil, e
	}
	if req.Instructions != nil && *req.Instructions != "" {
		// Instructions apply to this response only (not carried over by
		// previous_response_id), as OpenAI's.
		var rest []chat.Message
		for _, m := range history {
			if m.Role != "system" {
				rest = append(rest, m)
			}
		}
		history = append([]chat.Message{{Role: "system", Content: *req.Instructions}}, rest...)
	}
	j.msgs = append(append([]chat.Message(nil), history...), input...)
	var fns []functionTool
	for i, t := range req.Tools {
		if t.Type != "function" {
			return nil, nil, badRequest(fmt.Sprintf("tools[%d].type", i), "tools[%d] has type %q: ats runs only function tools", i, t.Type)
		}
		fns = append(fns, functionTool{Name: t.Name, Description: t.Description, Parameters: t.Parameters})
	}
	if j.tools, j.names, e = toolsFromFunctions("tools", fns); e != nil {
		return nil, nil, e
	}
	// tool_choice: "auto", "none", "required" or {"type": "function", "name": ...}.
	if tc := bytes.TrimSpace(req.ToolChoice); len(tc) > 0 && tc[0] == '{' {
		var named struct {
			Type string `json:"type"`
			Name string `json:"name"`
		}
		if json.Unmarshal(tc, &named) != nil || named.Type != "function" || named.Name == "" {
			return nil, nil, badRequest("tool_choice", "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}")
		}
		j.choice = forcedTool{use: true, required: true, name: named.Name}
	} else if j.choice, e = toolChoice(tc); e != nil {
		return nil, nil, e
	}
	if req.Text != nil {
		if j.con, e = responsesFormat(req.Text.Format); e != nil {
			return nil, nil, e
		}
	}
	if req.Reasoning != nil && req.Reasoning.Effort != nil {
		switch *req.Reasoning.Effort {
		case "none":
			off := false
			j.vars = thinkingVar(j.vars, &off)
		case "minimal", "low", "medium", "high":
		default:
			return nil, nil, badRequest("reasoning.effort", "reasoning.effort %q: use none, minimal, low, medium or high", *req.Reasoning.Effort)
		}
	}
	if req.MaxOutputTokens != nil {
		if *req.MaxOutputTokens < 1 {
			return nil, nil, badRequest("max_output_tokens", "max_output_tokens is %d; it must be at least 1", *req.MaxOutputTokens)
		}
		j.max = *req.MaxOutputTokens
	}
	j.sampling = samplingParams{Temperature: req.Temperature, TopP: req.TopP}
	sink := &responsesSink{s: s, w: w, stream: req.Stream, req: req, id: newID("resp_"), created: received.Unix(),
		store: req.Store == nil || *req.Store, conversation: j.msgs}
	if req.Stream {
		sink.sse = newSSE(w, s.cfg.WriteTimeout)
	}
	return j, sink, nil
}

type responsesContent struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations,omitempty"`
}

type responsesOutputItem struct {
	Type      string             `json:"type"`
	ID        string             `json:"id"`
	Status    string             `json:"status,omitempty"`
	Role      string             `json:"role,omitempty"`
	Content   []responsesContent `json:"content,omitempty"`
	Summary   []responsesContent `json:"summary,omitempty"`
	CallID    string             `json:"call_id,omitempty"`
	Name      string             `json:"name,omitempty"`
	Arguments *string            `json:"arguments,omitempty"`
}

type responsesUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

type responseObject struct {
	ID                 string                `json:"id"`
	Object             string                `json:"object"`
	CreatedAt          int64                 `json:"created_at"`
	Status             string                `json:"status"`
	Model              string                `json:"model"`
	Output             []responsesOutputItem `json:"output"`
	IncompleteDetails  any                   `json:"incomplete_details"`
	Error              any                   `json:"error"`
	PreviousResponseID *string               `json:"previous_response_id"`
	Instructions       *string               `json:"instructions"`
	MaxOutputTokens    *int                  `json:"max_output_tokens"`
	Temperature        *float64              `json:"temperature"`
	TopP               *float64              `json:"top_p"`
	ParallelToolCalls  bool                  `json:"parallel_tool_calls"`
	ToolChoice         any                   `json:"tool_choice"`
	Tools              []responsesTool       `json:"tools"`
	Store              bool                  `json:"store"`
	Usage              *responsesUsage       `json:"usage"`
}

// responsesSink writes a response, or its events.
type responsesSink struct {
	s            *Server
	w            http.ResponseWriter
	stream       bool
	sse          *sse
	req          *responsesRequest
	id           string
	created      int64
	store        bool
	conversation []chat.Message
	seq          int
	// Streaming: the open item (reasoning or message) and the items so far.
	open  *responsesOutputItem
	items []responsesOutputItem
}

func (rs *responsesSink) object(status string) *responseObject {
	o := &responseObject{ID: rs.id, Object: "response", CreatedAt: rs.created, Status: status, Model: rs.s.cfg.ModelName,
		Output: []responsesOutputItem{}, Instructions: rs.req.Instructions, MaxOutputTokens: rs.req.MaxOutputTokens,
		Temperature: rs.req.Temperature, TopP: rs.req.TopP, ParallelToolCalls: rs.req.ParallelToolCalls == nil || *rs.req.ParallelToolCalls,
		ToolChoice: "auto", Tools: rs.req.Tools, Store: rs.store}
	if o.Tools == nil {
		o.Tools = []responsesTool{}
	}
	if rs.req.PreviousResponseID != "" {
		o.PreviousResponseID = &rs.req.PreviousResponseID
	}
	if tc := bytes.TrimSpace(rs.req.ToolChoice); len(tc) > 0 {
		o.ToolChoice = json.RawMessage(tc)
	}
	return o
}

func (rs *responsesSink) event(typ string, fields map[string]any) error {
	fields["type"] = typ
	fields["sequence_number"] = rs.seq
	rs.seq++
	b, err := json.Marshal(fields)
	if err != nil {
		return err
	}
	return rs.sse.event(typ, b)
}

func (rs *responsesSink) begin(int) error {
	if !rs.stream {
		return nil
	}
	if err := rs.event("response.created", map[string]any{"response": rs.object("in_progress")}); err != nil {
		return err
	}
	return rs.event("response.in_progress", map[string]any{"response": rs.object("in_progress")})
}

// openItem starts an output item of typ (reasoning or message) unless it
// is the open one.
func (rs *responsesSink) openItem(typ string) error {
	if rs.open != nil && rs.open.Type == typ {
		return nil
	}
	if err := rs.closeItem(); err != nil {
		return err
	}
	it := &responsesOutputItem{Type: typ, Status: "in_progress"}
	if typ == "message" {
		it.ID, it.Role, it.Content = newID("msg_"), "assistant", []responsesContent{}
	} else {
		it.ID, it.Summary = newID("rs_"), []responsesContent{}
	}
	rs.open = it
	idx := len(rs.items)
	if err := rs.event("response.output_item.added", map[string]any{"output_index": idx, "item": it}); err != nil {
		return err
	}
	part := responsesContent{Type: "output_text", Annotations: []any{}}
	if typ == "reasoning" {
		part = responsesContent{Type: "reasoning_text"}
	}
	return rs.event("response.content_part.added", map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0, "part": part})
}

func (rs *responsesSink) closeItem() error {
	it := rs.open
	if it == nil {
		return nil
	}
	rs.open = nil
	idx := len(rs.items)
	it.Status = "completed"
	text := ""
	if len(it.Content) > 0 {
		text = it.Content[0].Text
	}
	doneType, partType := "response.output_text.done", "output_text"
	if it.Type == "reasoning" {
		doneType, partType = "response.reasoning_text.done", "reasoning_text"
	}
	if err := rs.event(doneType, map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0, "text": text}); err != nil {
		return err
	}
	part := responsesContent{Type: partType, Text: text}
	if partType == "output_text" {
		part.Annotations = []any{}
	}
	if err := rs.event("response.content_part.done", map[string]any{"item_id": it.ID, "output_index": idx, "content_index": 0, "part": part}); err != nil {
		return err
	}
	final := *it
	if it.Type == "reasoning" {
		// The reasoning's text is its content; the summary stays empty.
		final.Content = []responsesContent{{Type: "reasoning_text", Text: text}}
	}
	rs.items = append(rs.items, final)
	return rs.event("response.output_item.done", map[string]any{"output_index": idx, "item": final})
}

func (rs *responsesSink) appendText(piece, typ, deltaType string) error {
	if err := rs.openItem(typ); err != nil {
		return err
	}
	it := rs.open
	if len(it.Content) == 0 {
		it.Content = []responsesContent{{Type: "output_text", Annotations: []any{}}}
	}
	it.Content[0].Text += piece
	return rs.event(deltaType, map[string]any{"item_id": it.ID, "output_index": len(rs.items), "content_index": 0, "delta": piece})
}

func (rs *responsesSink) delta(d Delta) error {
	if d.Reasoning != "" {
		if err := rs.appendText(d.Reasoning, "reasoning", "response.reasoning_text.delta"); err != nil {
			return err
		}
	}
	if d.Content != "" {
		if err := rs.appendText(d.Content, "message", "response.output_text.delta"); err != nil {
			return err
		}
	}
	for _, c := range d.ToolCalls {
		if err := rs.closeItem(); err != nil {
			return err
		}
		empty := ""
		it := responsesOutputItem{Type: "function_call", ID: newID("fc_"), Status: "in_progress", CallID: c.ID, Name: c.Function.Name, Arguments: &empty}
		idx := len(rs.items)
		if err := rs.event("response.output_item.added", map[string]any{"output_index": idx, "item": it}); err != nil {
			return err
		}
		if err := rs.event("response.function_call_arguments.delta", map[string]any{"item_id": it.ID, "output_index": idx, "delta": c.Function.Arguments}); err != nil {
			return err
		}
		if err := rs.event("response.function_call_arguments.done", map[string]any{"item_id": it.ID, "output_index": idx, "arguments": c.Function.Arguments}); err != nil {
			return err
		}
		args := c.Function.Arguments
		it.Arguments, it.Status = &args, "completed"
		rs.items = append(rs.items, it)
		if err := rs.event("response.output_item.done", map[string]any{"output_index": idx, "item": it}); err != nil {
			return err
		}
	}
	return nil
}

// outputItems are a whole reply's items (not streamed).
func outputItems(reply Parsed) []responsesOutputItem {
	var items []responsesOutputItem
	if reply.Reasoning != "" {
		items = append(items, responsesOutputItem{Type: "reasoning", ID: newID("rs_"), Status: "completed", Summary: []responsesContent{},
			Content: []responsesContent{{Type: "reasoning_text", Text: reply.Reasoning}}})
	}
	if reply.Content != "" || len(reply.ToolCalls) == 0 {
		items = append(items, responsesOutputItem{Type: "message", ID: newID("msg_"), Status: "completed", Role: "assistant",
			Content: []responsesContent{{Type: "output_text", Text: reply.Content, Annotations: []any{}}}})
	}
	for _, c := range reply.ToolCalls {
		args := c.Function.Arguments
		items = append(items, responsesOutputItem{Type: "function_call", ID: newID("fc_"), Status: "completed", CallID: c.ID, Name: c.Function.Name, Arguments: &args})
	}
	return items
}

func (rs *responsesSink) end(res *session.GenerateResult, reply Parsed, err error) {
	if err != nil {
		if rs.s.clientGone(err) {
			return
		}
		e := rs.s.errorFor(err)
		if rs.stream && rs.sse.started {
			o := rs.object("failed")
			o.Error = map[string]string{"code": "server_error", "message": e.Message}
			rs.event("response.failed", map[string]any{"response": o})
			return
		}
		writeError(rs.w, e)
		return
	}
	status := "completed"
	o := rs.object(status)
	if res.StopReason == session.StopLength {
		o.Status = "incomplete"
		o.IncompleteDetails = map[string]string{"reason": "max_output_tokens"}
	}
	u := &responsesUsage{InputTokens: res.PromptTokens, OutputTokens: len(res.Tokens), TotalTokens: res.PromptTokens + len(res.Tokens)}
	u.InputTokensDetails.CachedTokens = res.CachedTokens
	o.Usage = u
	if rs.stream {
		if rs.closeItem() != nil {
			return
		}
		o.Output = rs.items
	} else {
		o.Output = outputItems(reply)
	}
	if o.Output == nil {
		o.Output = []responsesOutputItem{}
	}
	body, _ := json.Marshal(o)
	if rs.store {
		msg := chat.Message{Role: "assistant", Content: reply.Content, ReasoningContent: reply.Reasoning, ToolCalls: reply.ToolCalls}
		conv := append(append([]chat.Message(nil), rs.conversation...), msg)
		rs.s.responses.put(rs.id, &storedResponse{conversation: conv, body: body})
	}
	if rs.stream {
		typ := "response.completed"
		if o.Status == "incomplete" {
			typ = "response.incomplete"
		}
		rs.event(typ, map[string]any{"response": json.RawMessage(body)})
		return
	}
	http.NewResponseController(rs.w).SetWriteDeadline(time.Now().Add(rs.s.cfg.WriteTimeout))
	rs.w.Header().Set("Content-Type", "application/json")
	rs.w.WriteHeader(http.StatusOK)
	rs.w.Write(append(body, '\n'))
}

// handleStoredResponse answers GET and DELETE /v1/responses/{id}.
func (s *Server) handleStoredResponse(w http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/v1/responses/")
	if r.Method == http.MethodDelete {
		if !s.responses.delete(id) {
			writeError(w, &apiError{Status: http.StatusNotFound, Type: typeNotFound, Message: fmt.Sprintf("no stored response %q", id)})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"id": id, "object": "response", "deleted": true}, s.cfg.WriteTimeout)
		return
	}
	st, ok := s.responses.get(id)
	if !ok {
		writeError(w, &apiError{Status: http.StatusNotFound, Type: typeNotFound, Message: fmt.Sprintf("no stored response %q (the server keeps the latest %d in memory)", id, maxStoredResponses)})
		return
	}
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.WriteTimeout))
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(st.body, '\n'))
}
