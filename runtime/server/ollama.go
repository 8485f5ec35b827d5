package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"runtime/debug"
	"strings"
	"time"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/chat"
)

// ollama's API, for clients written for ollama (Open WebUI's ollama mode,
// editors' plugins, the ollama libraries): /api/chat, /api/generate,
// /api/tags, /api/show, /api/ps, /api/version, /api/embed (and the older
// /api/embeddings). Replies stream by default, as ollama's do, as one JSON
// object per line (NDJSON); errors are {"error": "message"}.

// ModelInfo describes the served model to ollama's clients.
type ModelInfo struct {
	Family        string // the architecture (qwen3, llama, ...)
	ParameterSize string // "8.2B"
	Quantization  string // "Q4_K_M"
	Size          int64  // bytes on disk
	Modified      time.Time
}

// ollamaOptions are ollama's "options": sampling, and load-time settings
// that ats takes from its own flags.
type ollamaOptions struct {
	Temperature      *float64 `json:"temperature"`
	TopK             *int     `json:"top_k"`
	TopP             *float64 `json:"top_p"`
	MinP             *float64 `json:"min_p"`
	Seed             *int64   `json:"seed"`
	NumPredict       *int     `json:"num_predict"`
	Stop             stopList `json:"stop"`
	RepeatPenalty    *float64 `json:"repeat_penalty"`
	RepeatLastN      *int     `json:"repeat_last_n"`
	PresencePenalty  *float64 `json:"presence_penalty"`
	FrequencyPenalty *float64 `json:"frequency_penalty"`
}

// ollamaLoadOptions are settings ollama applies when it loads a model;
// ats's server has loaded it already, with its flags, so they change
// nothing here and are accepted as they are (README: partial).
var ollamaLoadOptions = map[string]bool{
	"num_ctx": true, "num_batch": true, "num_gpu": true, "main_gpu": true, "num_thread": true,
	"use_mmap": true, "use_mlock": true, "numa": true, "low_vram": true, "vocab_only": true, "f16_kv": true,
	"num_keep": true,
}

// checkOptions refuses options ats cannot honour (the sampler table's, with
// ollama's names).
func checkOptions(raw json.RawMessage) *apiError {
	if len(bytes.TrimSpace(raw)) == 0 || isNull(raw) {
		return nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return badRequest("options", "options must be an object")
	}
	known := map[string]bool{"temperature": true, "top_k": true, "top_p": true, "min_p": true, "seed": true, "num_predict": true,
		"stop": true, "repeat_penalty": true, "repeat_last_n": true, "presence_penalty": true, "frequency_penalty": true}
	tables := map[string]unsupportedField{}
	for k, v := range samplerFields {
		tables[k] = v
	}
	tables["penalize_newline"] = samplerFields["penalize_nl"]
	if e := checkUnsupported(rawJSON(fields), tables); e != nil {
		e.Param = strPtr("options." + *e.Param)
		return e
	}
	for k := range fields {
		if !known[k] && !ollamaLoadOptions[k] && tables[k].why == "" {
			return badRequest("options."+k, "option %s is not one ats knows", k)
		}
	}
	return nil
}

func rawJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

func (o *ollamaOptions) sampling() samplingParams {
	return samplingParams{Temperature: o.Temperature, TopK: o.TopK, TopP: o.TopP, MinP: o.MinP, Seed: o.Seed, Stop: o.Stop,
		RepeatPenalty: o.RepeatPenalty, RepeatLastN: o.RepeatLastN, PresencePenalty: o.PresencePenalty, FrequencyPenalty: o.FrequencyPenalty}
}

// ollamaThink reads "think": a boolean, or a level (on).
func ollamaThink(raw json.RawMessage) (*bool, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || isNull(raw) {
		return nil, nil
	}
	var b bool
	if json.Unmarshal(raw, &b) == nil {
		return &b, nil
	}
	var level string
	if json.Unmarshal(raw, &level) == nil && (level == "low" || level == "medium" || level == "high") {
		on := true
		return &on, nil
	}
	return nil, badRequest("think", "think must be true, false, \"low\", \"medium\" or \"high\"")
}

// ollamaFormat reads "format": "json" or a JSON schema.
func ollamaFormat(raw json.RawMessage) (constraintRequest, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || isNull(raw) || string(raw) == `""` {
		return constraintRequest{}, nil
	}
	if string(raw) == `"json"` {
		return constraintRequest{param: "format", anyObject: true}, nil
	}
	if raw[0] != '{' {
		return constraintRequest{}, badRequest("format", "format must be \"json\" or a JSON schema object")
	}
	return constraintRequest{param: "format", schema: raw}, nil
}

type ollamaToolCall struct {
	Function struct {
		Index     *int            `json:"index,omitempty"`
		Name      string          `json:"name"`
		Arguments json.RawMessage `json:"arguments"`
	} `json:"function"`
}

type ollamaMessage struct {
	Role      string           `json:"role"`
	Content   string           `json:"content"`
	Thinking  string           `json:"thinking,omitempty"`
	Images    []string         `json:"images,omitempty"`
	ToolCalls []ollamaToolCall `json:"tool_calls,omitempty"`
	ToolName  string           `json:"tool_name,omitempty"`
}

type ollamaChatRequest struct {
	Model     string            `json:"model"`
	Messages  []ollamaMessage   `json:"messages"`
	Tools     []json.RawMessage `json:"tools"`
	Format    json.RawMessage   `json:"format"`
	Options   json.RawMessage   `json:"options"`
	Stream    *bool             `json:"stream"`
	Think     json.RawMessage   `json:"think"`
	KeepAlive json.RawMessage   `json:"keep_alive"`
}

type ollamaGenerateRequest struct {
	Model     string          `json:"model"`
	Prompt    string          `json:"prompt"`
	Suffix    string          `json:"suffix"`
	System    string          `json:"system"`
	Template  string          `json:"template"`
	Context   []int           `json:"context"`
	Raw       bool            `json:"raw"`
	Images    []string        `json:"images"`
	Format    json.RawMessage `json:"format"`
	Options   json.RawMessage `json:"options"`
	Stream    *bool           `json:"stream"`
	Think     json.RawMessage `json:"think"`
	KeepAlive json.RawMessage `json:"keep_alive"`
}

// ollamaError writes {"error": "message"}, as ollama does.
func ollamaError(w http.ResponseWriter, e *apiError) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	if e.Status == http.StatusServiceUnavailable {
		h.Set("Retry-After", "1")
	}
	w.WriteHeader(e.Status)
	msg := e.Message
	if e.Param != nil && !strings.Contains(msg, *e.Param) {
		msg = *e.Param + ": " + msg
	}
	b, _ := json.Marshal(map[string]string{"error": msg})
	w.Write(append(b, '\n'))
}

// ollamaSampling applies options to a job.
func ollamaSampling(j *chatJob, raw json.RawMessage) *apiError {
	if e := checkOptions(raw); e != nil {
		return e
	}
	var opt ollamaOptions
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &opt); err != nil {
			return badRequest("options", "options: %v", err)
		}
	}
	j.sampling = opt.sampling()
	j.maxParam = "options.num_predict"
	if opt.NumPredict != nil {
		switch n := *opt.NumPredict; {
		case n == -1 || n == -2: // ollama: no limit, or fill the context
		case n < 1:
			return badRequest("options.num_predict", "num_predict is %d; it must be at least 1 (or -1 for no limit)", n)
		default:
			j.max = n
		}
	}
	return nil
}

func (s *Server) handleOllamaChat(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req ollamaChatRequest
	if e := s.readBody(w, r, &req); e != nil {
		ollamaError(w, e)
		return
	}
	j := &chatJob{choice: forcedTool{use: true}, parallel: true}
	if len(req.Messages) == 0 {
		// ollama loads the model and answers done: the model is loaded.
		s.ollamaLoaded(w, received, "message", nil)
		return
	}
	for i, m := range req.Messages {
		param := fmt.Sprintf("messages[%d]", i)
		if len(m.Images) > 0 {
			ollamaError(w, badRequest(param+".images", "ats serves text-only models; %s has images", param))
			return
		}
		msg := chat.Message{Role: m.Role, Content: m.Content, ReasoningContent: m.Thinking, Name: m.ToolName}
		switch m.Role {
		case "system", "user", "assistant", "tool":
		default:
			ollamaError(w, badRequest(param+".role", "%s has role %q; use system, user, assistant or tool", param, m.Role))
			return
		}
		for k, tc := range m.ToolCalls {
			args, err := argumentsText(tc.Function.Arguments)
			if err != nil || tc.Function.Name == "" {
				ollamaError(w, badRequest(param+".tool_calls", "%s.tool_calls[%d] needs a function name and arguments object", param, k))
				return
			}
			msg.ToolCalls = append(msg.ToolCalls, chat.ToolCall{ID: fmt.Sprintf("call_%d_%d", i, k), Type: "function",
				Function: chat.FunctionCall{Name: tc.Function.Name, Arguments: args}})
		}
		j.msgs = append(j.msgs, msg)
	}
	var e *apiError
	if j.tools, j.names, e = chatTools(req.Tools); e != nil {
		ollamaError(w, e)
		return
	}
	if j.con, e = ollamaFormat(req.Format); e != nil {
		ollamaError(w, e)
		return
	}
	think, e := ollamaThink(req.Think)
	if e != nil {
		ollamaError(w, e)
		return
	}
	j.vars = thinkingVar(j.vars, think)
	if e := ollamaSampling(j, req.Options); e != nil {
		ollamaError(w, e)
		return
	}
	stream := req.Stream == nil || *req.Stream
	sink := &ollamaSink{s: s, w: w, stream: stream, chat: true, received: received, nd: newNDJSON(w, s.cfg.WriteTimeout)}
	g, e := s.jobGeneration("ollama_chat", j, sink, stream, received, ollamaError)
	if e != nil {
		ollamaError(w, e)
		return
	}
	s.generate(w, r, g)
}

func (s *Server) handleOllamaGenerate(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req ollamaGenerateRequest
	if e := s.readBody(w, r, &req); e != nil {
		ollamaError(w, e)
		return
	}
	switch {
	case len(req.Images) > 0:
		ollamaError(w, badRequest("images", "ats serves text-only models"))
		return
	case req.Suffix != "":
		ollamaError(w, badRequest("suffix", "suffix (fill in the middle) is not supported by ats"))
		return
	case req.Template != "":
		ollamaError(w, badRequest("template", "ats renders prompts with the model's own chat template (Jinja); a Go template cannot be given"))
		return
	}
	if req.Prompt == "" && len(req.Context) == 0 {
		s.ollamaLoaded(w, received, "response", nil)
		return
	}
	j := &chatJob{choice: forcedTool{use: true}}
	for i, id := range req.Context {
		if id < 0 || id >= s.nVocab {
			ollamaError(w, badRequest("context", "context[%d] is token %d, outside the vocabulary of %d", i, id, s.nVocab))
			return
		}
	}
	j.rawPrompt = req.Context
	if req.Raw {
		j.raw = true
		j.rawPrompt = append(append([]int(nil), req.Context...), s.sess.Tok.Encode(req.Prompt, len(req.Context) == 0 && s.sess.Tok.AddBOS(), false)...)
	} else {
		if req.System != "" {
			j.msgs = append(j.msgs, chat.Message{Role: "system", Content: req.System})
		}
		j.msgs = append(j.msgs, chat.Message{Role: "user", Content: req.Prompt})
	}
	var e *apiError
	if j.con, e = ollamaFormat(req.Format); e != nil {
		ollamaError(w, e)
		return
	}
	think, e := ollamaThink(req.Think)
	if e != nil {
		ollamaError(w, e)
		return
	}
	j.vars = thinkingVar(j.vars, think)
	if e := ollamaSampling(j, req.Options); e != nil {
		ollamaError(w, e)
		return
	}
	stream := req.Stream == nil || *req.Stream
	sink := &ollamaSink{s: s, w: w, stream: stream, received: received, nd: newNDJSON(w, s.cfg.WriteTimeout)}
	g, e := s.jobGeneration("ollama_generate", j, sink, stream, received, ollamaError)
	if e != nil {
		ollamaError(w, e)
		return
	}
	sink.g = g
	s.generate(w, r, g)
}

// ollamaLoaded answers a request without a prompt: ollama loads the model
// and says done.
func (s *Server) ollamaLoaded(w http.ResponseWriter, received time.Time, field string, _ any) {
	out := map[string]any{"model": s.cfg.ModelName, "created_at": received.UTC().Format(time.RFC3339Nano), "done": true, "done_reason": "load"}
	if field == "message" {
		out["message"] = map[string]string{"role": "assistant", "content": ""}
	} else {
		out["response"] = ""
	}
	writeJSON(w, http.StatusOK, out, s.cfg.WriteTimeout)
}

// ndjson writes newline-delimited JSON, flushing each line.
type ndjson struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
}

func newNDJSON(w http.ResponseWriter, timeout time.Duration) *ndjson {
	return &ndjson{w: w, rc: http.NewResponseController(w), timeout: timeout}
}

func (n *ndjson) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	if !n.started {
		n.started = true
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.w.WriteHeader(http.StatusOK)
	}
	n.rc.SetWriteDeadline(time.Now().Add(n.timeout))
	if _, err := n.w.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("writing to the client: %w", err)
	}
	if err := n.rc.Flush(); err != nil && err != http.ErrNotSupported {
		return fmt.Errorf("flushing to the client: %w", err)
	}
	return nil
}

// ollamaSink writes a chat or generate reply.
type ollamaSink struct {
	s        *Server
	w        http.ResponseWriter
	stream   bool
	chat     bool
	received time.Time
	nd       *ndjson
	g        *generation // generate: the prompt, for "context"
}

func (o *ollamaSink) begin(int) error { return nil }

func (o *ollamaSink) line(done bool) map[string]any {
	return map[string]any{"model": o.s.cfg.ModelName, "created_at": time.Now().UTC().Format(time.RFC3339Nano), "done": done}
}

func ollamaCalls(calls []chat.ToolCall, first int) []ollamaToolCall {
	var out []ollamaToolCall
	for i, c := range calls {
		var tc ollamaToolCall
		idx := first + i
		tc.Function.Index = &idx
		tc.Function.Name = c.Function.Name
		tc.Function.Arguments = argumentsObject(c.Function.Arguments)
		out = append(out, tc)
	}
	return out
}

func (o *ollamaSink) body(m map[string]any, reasoning, content string, calls []ollamaToolCall) {
	if o.chat {
		m["message"] = ollamaMessage{Role: "assistant", Content: content, Thinking: reasoning, ToolCalls: calls}
	} else {
		m["response"] = content
		if reasoning != "" {
			m["thinking"] = reasoning
		}
	}
}

func (o *ollamaSink) delta(d Delta) error {
	m := o.line(false)
	o.body(m, d.Reasoning, d.Content, ollamaCalls(d.ToolCalls, d.FirstIndex))
	return o.nd.send(m)
}

func (o *ollamaSink) end(res *session.GenerateResult, reply Parsed, err error) {
	if err != nil {
		if o.s.clientGone(err) {
			return
		}
		e := o.s.errorFor(err)
		if o.stream && o.nd.started {
			o.nd.send(map[string]string{"error": e.Message})
			return
		}
		ollamaError(o.w, e)
		return
	}
	m := o.line(true)
	if o.stream {
		o.body(m, "", "", nil)
	} else {
		o.body(m, reply.Reasoning, reply.Content, ollamaCalls(reply.ToolCalls, 0))
	}
	reason := "stop"
	if res.StopReason == session.StopLength {
		reason = "length"
	}
	m["done_reason"] = reason
	total := time.Since(o.received)
	m["total_duration"] = total.Nanoseconds()
	m["load_duration"] = 0
	m["prompt_eval_count"] = res.PromptTokens - res.CachedTokens
	m["prompt_eval_duration"] = res.Prefill.Nanoseconds()
	m["eval_count"] = len(res.Tokens)
	m["eval_duration"] = res.Decode.Nanoseconds()
	if !o.chat && o.g != nil {
		// The conversation as tokens, for a next request's context.
		m["context"] = append(append([]int{}, o.g.prompt...), res.Tokens...)
	}
	if o.stream {
		o.nd.send(m)
		return
	}
	writeJSON(o.w, http.StatusOK, m, o.s.cfg.WriteTimeout)
}

// ollamaDetails is a model's "details".
func (s *Server) ollamaDetails() map[string]any {
	info := s.modelDescription()
	return map[string]any{"parent_model": "", "format": "gguf", "family": info.Family, "families": []string{info.Family},
		"parameter_size": info.ParameterSize, "quantization_level": info.Quantization}
}

// modelDescription is Config.Models, or what the file says.
func (s *Server) modelDescription() ModelInfo {
	if s.cfg.Models != nil {
		return *s.cfg.Models
	}
	m := s.sess.Model
	info := ModelInfo{Family: m.Hyper().Arch, Size: m.File.Size()}
	var n uint64
	for _, t := range m.File.Tensors {
		c := uint64(1)
		for _, d := range t.Dims {
			c *= d
		}
		n += c
	}
	info.ParameterSize = fmt.Sprintf("%.2fB", float64(n)/1e9)
	if fi, err := os.Stat(m.File.Path); err == nil {
		info.Modified = fi.ModTime()
	}
	return info
}

// digest is a stable id of the served model (ollama shows a sha256).
func (s *Server) digest() string {
	info := s.modelDescription()
	h := sha256.Sum256([]byte(fmt.Sprintf("%s|%d|%d", s.sess.Model.File.Path, info.Size, info.Modified.UnixNano())))
	return hex.EncodeToString(h[:])
}

func (s *Server) ollamaModelEntry() map[string]any {
	info := s.modelDescription()
	return map[string]any{"name": s.cfg.ModelName, "model": s.cfg.ModelName, "modified_at": info.Modified.UTC().Format(time.RFC3339Nano),
		"size": info.Size, "digest": s.digest(), "details": s.ollamaDetails()}
}

func (s *Server) handleOllamaTags(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"models": []any{s.ollamaModelEntry()}}, s.cfg.WriteTimeout)
}

func (s *Server) handleOllamaPS(w http.ResponseWriter, r *http.Request) {
	e := s.ollamaModelEntry()
	delete(e, "modified_at")
	e["size_vram"] = s.cfg.Placement().WeightBytes["gpu"]
	e["context_length"] = s.sess.CtxSize()
	// ats keeps the model loaded until the server stops.
	e["expires_at"] = time.Now().Add(100 * 365 * 24 * time.Hour).UTC().Format(time.RFC3339)
	writeJSON(w, http.StatusOK, map[string]any{"models": []any{e}}, s.cfg.WriteTimeout)
}

func (s *Server) handleOllamaVersion(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": atsVersion()}, s.cfg.WriteTimeout)
}

func (s *Server) handleOllamaShow(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Model   string `json:"model"`
		Name    string `json:"name"`
		Verbose bool   `json:"verbose"`
	}
	if e := s.readBody(w, r, &req); e != nil {
		ollamaError(w, e)
		return
	}
	name := req.Model
	if name == "" {
		name = req.Name
	}
	if name != "" && name != s.cfg.ModelName && strings.TrimSuffix(name, ":latest") != s.cfg.ModelName {
		ollamaError(w, &apiError{Status: http.StatusNotFound, Message: fmt.Sprintf("model %q not found; this server serves %q", name, s.cfg.ModelName)})
		return
	}
	h := s.sess.Model.Hyper()
	arch := h.Arch
	info := map[string]any{
		"general.architecture":                     arch,
		"general.parameter_count":                  0,
		arch + ".context_length":                   h.NCtxTrain,
		arch + ".embedding_length":                 h.NEmbd,
		arch + ".block_count":                      h.NLayer,
		arch + ".attention.head_count":             h.NHead,
		arch + ".attention.head_count_kv":          h.NKVHead,
		arch + ".feed_forward_length":              h.NFF,
		"tokenizer.ggml.model":                     "",
		"ats.context_length":                       s.sess.CtxSize(),
		arch + ".attention.layer_norm_rms_epsilon": h.RMSEps,
	}
	if v, err := s.sess.Model.File.String("tokenizer.ggml.model"); err == nil {
		info["tokenizer.ggml.model"] = v
	}
	var n uint64
	for _, t := range s.sess.Model.File.Tensors {
		c := uint64(1)
		for _, d := range t.Dims {
			c *= d
		}
		n += c
	}
	info["general.parameter_count"] = n
	caps := []string{"completion"}
	if s.format != FormatHermes || strings.Contains(s.tmpl.Source(), "tools") {
		caps = append(caps, "tools")
	}
	if strings.Contains(s.tmpl.Source(), thinkClose) {
		caps = append(caps, "thinking")
	}
	if s.cfg.Embeddings {
		caps = append(caps, "embedding")
	}
	def := s.cfg.Sampling
	params := fmt.Sprintf("temperature %g\ntop_k %d\ntop_p %g\nmin_p %g\nrepeat_penalty %g\nnum_ctx %d",
		def.Temperature, def.TopK, def.TopP, def.MinP, def.RepeatPenalty, s.sess.CtxSize())
	info2 := s.modelDescription()
	writeJSON(w, http.StatusOK, map[string]any{
		"license": "", "modelfile": "# ats serves " + s.sess.Model.File.Path + "\nFROM " + s.sess.Model.File.Path + "\n",
		"parameters": params, "template": s.tmpl.Source(), "details": s.ollamaDetails(), "model_info": info,
		"capabilities": caps, "modified_at": info2.Modified.UTC().Format(time.RFC3339Nano),
	}, s.cfg.WriteTimeout)
}

// atsVersion is ats's version for /api/version, as a bare semantic
// version (clients parse it): the module's, or 0.0.0 for a build from a
// checkout.
func atsVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok && strings.HasPrefix(bi.Main.Version, "v") {
		return strings.TrimPrefix(bi.Main.Version, "v")
	}
	return "0.0.0"
}
