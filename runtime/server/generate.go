package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/constrain"
	"github.com/atsinfer/ats/runtime/text/sampler"
)

// writeJSON sends v as the whole response.
func writeJSON(w http.ResponseWriter, code int, v any, timeout time.Duration) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, internalError(fmt.Errorf("encoding the response: %w", err)))
		return
	}
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(timeout))
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	w.Write(append(b, '\n'))
}

// sse writes a server-sent event stream. Each write gets its own deadline,
// so a client that stops reading is dropped instead of holding the model.
type sse struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	started bool
}

func newSSE(w http.ResponseWriter, timeout time.Duration) *sse {
	return &sse{w: w, rc: http.NewResponseController(w), timeout: timeout}
}

func (e *sse) start() {
	if e.started {
		return
	}
	e.started = true
	h := e.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no") // nginx: do not buffer the stream
	e.w.WriteHeader(http.StatusOK)
}

func (e *sse) data(b []byte) error {
	e.start()
	e.rc.SetWriteDeadline(time.Now().Add(e.timeout)) // unsupported by some writers (tests): fine
	var buf bytes.Buffer
	buf.Grow(len(b) + 8)
	buf.WriteString("data: ")
	buf.Write(b)
	buf.WriteString("\n\n")
	if _, err := e.w.Write(buf.Bytes()); err != nil {
		return fmt.Errorf("writing to the client: %w", err)
	}
	if err := e.rc.Flush(); err != nil && !errors.Is(err, http.ErrNotSupported) {
		return fmt.Errorf("flushing to the client: %w", err)
	}
	return nil
}

func (e *sse) send(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return e.data(b)
}

func (e *sse) sendError(ae *apiError) error {
	return e.send(map[string]*apiError{"error": ae})
}

func (e *sse) done() error { return e.data([]byte("[DONE]")) }

// generation is one request's prompt and settings, and how its output is
// written (chat or completion, streamed or not).
type generation struct {
	endpoint string
	received time.Time
	prompt   []int
	opt      session.GenerateOptions
	out      output
	// progress streams the prompt's evaluation (return_progress; the
	// output is a progressOutput).
	progress bool
	// prepare, when set, does the work that grows with the request
	// (rendering the template, tokenizing): it runs once the request is
	// admitted to the queue, and sets prompt.
	prepare func(ctx context.Context) *apiError
	// fail, when set, writes an error response in the endpoint's API's
	// shape (Anthropic's, ollama's) instead of OpenAI's.
	fail func(http.ResponseWriter, *apiError)

	// Set by the worker.
	res *session.GenerateResult
	err error
}

// output writes a generation's response. begin runs when the request's
// turn comes and text receives the generated text as it becomes final,
// both on the worker; end gets the result, or the error that stopped the
// generation, on the request's goroutine once the worker is done with it.
type output interface {
	begin() error
	text(piece string) error
	end(res *session.GenerateResult, err error)
}

// progressOutput is an output that can stream the prompt's evaluation
// (on the worker, before the text).
type progressOutput interface {
	progress(p promptProgress) error
}

// generate queues g and writes its response. It returns when the response
// is complete, the client has gone, or the server has cancelled it.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, g *generation) {
	// The job's context ends when the client goes or the server gives up
	// on running requests (shutdown past its grace period).
	writeError := writeError
	if g.fail != nil {
		writeError = g.fail
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.base, cancel)
	defer stop()

	j := &job{ctx: ctx}
	j.run = func() { s.runJob(ctx, j, g) }
	if err := s.q.submit(j); err != nil {
		msg := fmt.Sprintf("the server is busy: %d requests are already waiting; try again shortly", s.cfg.QueueLimit)
		if errors.Is(err, errShuttingDown) {
			msg = "the server is shutting down"
		}
		writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: msg})
		return
	}
	if e := s.prepareJob(ctx, g); e != nil {
		s.q.withdraw(j)
		if ctx.Err() == nil {
			writeError(w, e)
			return
		}
		s.met.cancelled.Inc()
		if s.base.Err() != nil && r.Context().Err() == nil {
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: "the server is shutting down"})
		} else {
			clientGone(w)
		}
		return
	}
	s.q.markReady(j)
	if !s.q.wait(j) {
		// Left the queue before its turn: the client went away, or the
		// server is stopping while the client still listens.
		s.met.cancelled.Inc()
		if s.base.Err() != nil && r.Context().Err() == nil {
			writeError(w, &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: "the server is shutting down"})
		} else {
			clientGone(w)
		}
		return
	}
	// The end of the response is written here, after the worker has moved
	// on, so the next request need not wait for it.
	if g.err != nil && (ctx.Err() != nil && s.base.Err() == nil || isWriteError(g.err)) {
		clientGone(w) // nobody to tell
		return
	}
	g.out.end(g.res, g.err)
}

// runJob runs on the worker: the only place the session is used. It
// streams the text as it comes and leaves the result in g.
func (s *Server) runJob(ctx context.Context, j *job, g *generation) {
	s.met.queueWait.Observe(j.started.Sub(j.enqueued).Seconds())
	defer func() {
		if p := recover(); p != nil {
			// A fault reading the weights: the model file was most likely
			// truncated under the running generation.
			if e := s.checkModelFile(); e != nil {
				g.res, g.err = nil, e
				return
			}
			s.q.onPanic(p)
			g.res, g.err = nil, fmt.Errorf("internal error: %v", p)
		}
	}()
	if err := ctx.Err(); err != nil {
		s.met.cancelled.Inc()
		g.err = err
		return
	}
	if e := s.checkModelFile(); e != nil {
		g.err = e
		return
	}
	if err := g.out.begin(); err != nil {
		s.met.cancelled.Inc()
		g.err = err
		return
	}
	var first time.Time
	opt := g.opt
	opt.OnText = g.out.text
	if po, ok := g.out.(progressOutput); ok && g.progress {
		start, cached := time.Now(), -1
		opt.OnPrompt = func(done, total int) {
			if cached < 0 {
				cached = done // the first report: the tokens reused
			}
			// A client that left shows at the next text write.
			_ = po.progress(promptProgress{Total: total, Cache: cached, Processed: done, TimeMS: time.Since(start).Milliseconds()})
		}
	}
	opt.OnToken = func(int) {
		if first.IsZero() {
			first = time.Now()
		}
	}
	if hook := s.testHookToken; hook != nil {
		// In the step, so that it holds the model, not only the delivery.
		onLogits := opt.OnLogits
		opt.OnLogits = func(tok int, logits []float32) {
			if onLogits != nil {
				onLogits(tok, logits)
			}
			hook()
		}
	}
	res, err := s.gen(ctx, g.prompt, opt)
	if errors.Is(err, session.ErrStepPanicked) {
		if e := s.checkModelFile(); e != nil {
			err = e // the model file was truncated under the step
		} else {
			s.q.onPanic(err)
		}
	}
	g.res, g.err = res, err
	if res != nil {
		s.met.observeGeneration(res, g.received, first)
		s.cfg.Log.Info("generation", "endpoint", g.endpoint, "prompt_tokens", res.PromptTokens, "cached_tokens", res.CachedTokens,
			"generated", len(res.Tokens), "stop", res.StopReason,
			"prefill_tps", fmt.Sprintf("%.1f", res.PrefillRate()), "decode_tps", fmt.Sprintf("%.1f", res.DecodeRate()))
	}
	if err != nil && (ctx.Err() != nil || isWriteError(err)) {
		// The client left (or the server gave up on the request).
		s.met.cancelled.Inc()
	}
}

// writeErr marks errors from writing to the client.
type writeErr struct{ error }

func (e writeErr) Unwrap() error { return e.error }

func isWriteError(err error) bool {
	var we writeErr
	return errors.As(err, &we)
}

// errorFor explains why a generation stopped early.
func (s *Server) errorFor(err error) *apiError {
	switch {
	case s.base.Err() != nil:
		return &apiError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Message: "the server is shutting down; the request was cancelled"}
	case errors.Is(err, session.ErrContextFull):
		return withCode(badRequest("messages", "%v", err), "context_length_exceeded")
	case errors.Is(err, constrain.ErrAmbiguous):
		// The request's grammar reads the text in ever more ways.
		return badRequest("", "%v", err)
	case errors.Is(err, sampler.ErrNoCandidates):
		// Penalties and logit_bias together left no token to draw.
		return badRequest("logit_bias", "%v: the request's logit_bias and penalties leave no token that can be generated", err)
	}
	return asAPIError(err)
}

func usageOf(res *session.GenerateResult) *usage {
	u := &usage{PromptTokens: res.PromptTokens, CompletionTokens: len(res.Tokens)}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	u.PromptTokensDetails.CachedTokens = res.CachedTokens
	return u
}

func timingsOf(res *session.GenerateResult) *timings {
	return &timings{
		CacheN:             res.CachedTokens,
		PromptN:            res.PromptTokens - res.CachedTokens,
		PromptMS:           float64(res.Prefill) / 1e6,
		PromptPerSecond:    res.PrefillRate(),
		PredictedN:         len(res.Tokens),
		PredictedMS:        float64(res.Decode) / 1e6,
		PredictedPerSecond: res.DecodeRate(),
	}
}

// checkLength rejects a prompt the context cannot hold, or a max_tokens
// it cannot hold with the prompt.
func (s *Server) checkLength(prompt []int, max int, maxParam string) *apiError {
	n, ctx := len(prompt), s.sess.CtxSize()
	if n >= ctx {
		return withCode(badRequest("messages", "the prompt has %d tokens, but the context holds %d (and needs room for at least one generated token); shorten the prompt or start the server with a larger --ctx-size", n, ctx), "context_length_exceeded")
	}
	if max > ctx-n { // not n+max > ctx: max may be near MaxInt
		return withCode(badRequest(maxParam, "%s is %d, but the context holds %d tokens and the prompt uses %d, so at most %d can be generated", maxParam, max, ctx, n, ctx-n), "context_length_exceeded")
	}
	return nil
}

// reservedVars are template variables a request may not set through
// chat_template_kwargs, since the server sets them.
var reservedVars = map[string]bool{
	"messages": true, "tools": true, "add_generation_prompt": true,
	"bos_token": true, "eos_token": true, "raise_exception": true, "strftime_now": true, "tojson": true,
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req chatRequest
	if e := s.readBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	g, e := s.chatGeneration(w, &req, received)
	if e != nil {
		writeError(w, e)
		return
	}
	s.generate(w, r, g)
}

// readBody decodes the request body under the read timeout.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request, v any) *apiError {
	rc := http.NewResponseController(w)
	rc.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout))
	e := decodeBody(w, r, s.cfg.MaxBodyBytes, s.bodies, v)
	if e != nil {
		// The body may be unread (too large, too slow): close the
		// connection after the error rather than wait for the rest.
		w.Header().Set("Connection", "close")
		return e
	}
	// No deadline while generating: an expired one would make the server
	// think the client left.
	rc.SetReadDeadline(time.Time{})
	return nil
}

func (s *Server) chatGeneration(w http.ResponseWriter, req *chatRequest, received time.Time) (*generation, *apiError) {
	if e := req.common(); e != nil {
		return nil, e
	}
	msgs, e := chatMessages(req.Messages)
	if e != nil {
		return nil, e
	}
	lp, e := chatLogprobsRequest(req.Logprobs, req.TopLogprobs)
	if e != nil {
		return nil, e
	}
	creq, e := requestConstraint(req.ResponseFormat, req.Grammar, req.JSONSchema)
	if e != nil {
		return nil, e
	}
	choice, e := toolChoice(req.ToolChoice)
	if e != nil {
		return nil, e
	}
	if choice.required && !creq.none() {
		return nil, badRequest(creq.param, "%s cannot be combined with a tool_choice that forces a tool call", creq.param)
	}
	tools, names, e := chatTools(req.Tools)
	if e != nil {
		return nil, e
	}
	if !choice.use {
		tools, names = nil, nil
	}
	vars := map[string]any{}
	for k, raw := range req.ChatTemplateKwargs {
		if reservedVars[k] {
			return nil, badRequest("chat_template_kwargs", "chat_template_kwargs may not set %q; the server sets it", k)
		}
		if chat.ReservedVar(k) {
			return nil, badRequest("chat_template_kwargs", "chat_template_kwargs may not set %q: it would hide the template engine's own %s", k, k)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, badRequest("chat_template_kwargs", "chat_template_kwargs[%q]: %v", k, err)
		}
		vars[k] = v
	}
	if req.ReasoningEffort != nil {
		switch *req.ReasoningEffort {
		case "none":
			// Only where the request did not say otherwise.
			if _, set := vars["enable_thinking"]; !set {
				vars["enable_thinking"] = false
			}
		case "minimal", "low", "medium", "high":
			// The templates ats knows have no levels: thinking stays on.
		default:
			return nil, badRequest("reasoning_effort", "reasoning_effort %q: use none, minimal, low, medium or high", *req.ReasoningEffort)
		}
	}
	maxParam, maxV := "max_tokens", nPredict(req.MaxTokens, req.NPredict)
	if req.MaxTokens == nil && req.NPredict != nil {
		maxParam = "n_predict"
	}
	if req.MaxCompletionTokens != nil {
		maxParam, maxV = "max_completion_tokens", req.MaxCompletionTokens
	}
	max, e := maxTokens(maxParam, maxV, 0)
	if e != nil {
		return nil, e
	}
	cfg, e := req.samplerConfig(*s.cfg.Sampling, s.nVocab)
	if e != nil {
		return nil, e
	}
	if e := s.checkSampling(cfg); e != nil {
		return nil, e
	}
	out := &chatOutput{
		s: s, w: w, stream: req.Stream, logprobs: lp,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		id:           newID("chatcmpl-"),
		created:      received.Unix(),
	}
	if req.Stream {
		out.sse = newSSE(w, s.cfg.WriteTimeout)
	}
	g := &generation{endpoint: "chat", received: received, out: out, progress: req.Stream && req.ReturnProgress,
		opt: session.GenerateOptions{Sampler: cfg, MaxTokens: max, Stop: req.Stop, IgnoreEOS: req.IgnoreEOS}}
	if lp.on {
		g.opt.OnLogits = out.onLogits
	}
	g.prepare = func(ctx context.Context) *apiError {
		p, err := s.render(msgs, chat.Options{AddGenerationPrompt: true, Tools: tools, Vars: vars, Context: ctx})
		if err != nil {
			return s.renderError(ctx, err, msgs, len(vars) > 0 || len(tools) > 0)
		}
		prompt := p.Text
		if s.testHookPrompt != nil {
			s.testHookPrompt(prompt)
		}
		think := thinkModeFor(s.tmpl.Source(), prompt)
		con, e := s.requestConstraintFor(creq, think)
		if e != nil {
			return e
		}
		if choice.required {
			parallel := req.ParallelToolCalls == nil || *req.ParallelToolCalls
			if con, e = s.toolConstraint(tools, choice, think, parallel); e != nil {
				return e
			}
		}
		if con != nil {
			g.opt.Constraint = con.NewMatcher()
		}
		ids, e := s.encodePrompt(p)
		if e != nil {
			return e
		}
		if e := s.checkLength(ids, max, maxParam); e != nil {
			return e
		}
		out.parser = NewStreamParser(ParseOptions{Format: s.format, Tools: names, ThinkingOpen: ThinkingOpen(prompt)})
		g.prompt = ids
		return nil
	}
	return g, nil
}

// chatOutput writes a chat completion.
type chatOutput struct {
	s            *Server
	w            http.ResponseWriter
	stream       bool
	includeUsage bool
	sse          *sse
	parser       *StreamParser
	id           string
	created      int64
	logprobs     logprobsRequest
	// The scheduler's step records log-probabilities (onLogits) while the
	// worker streams text: lpMu guards both lists.
	lpMu      sync.Mutex
	lpAll     []tokenLogprob // every step's (not streamed)
	lpPending []tokenLogprob // steps not yet sent (streamed)
	lpScratch []float32      // stepLogprobs'
}

// onLogits records a step's log-probabilities (on the scheduler's
// goroutine, during the step).
func (o *chatOutput) onLogits(tok int, logits []float32) {
	if o.s.sess.Tok.IsEOG(tok) {
		return // the end of the turn is no part of the reply's text
	}
	e := chatEntry(o.s.sess.Tok, stepLogprobs(logits, tok, o.logprobs.top, &o.lpScratch))
	o.lpMu.Lock()
	defer o.lpMu.Unlock()
	if o.stream {
		o.lpPending = append(o.lpPending, e)
	} else {
		o.lpAll = append(o.lpAll, e)
	}
}

// takeLogprobs is what a streamed chunk carries: the steps since the last
// one.
func (o *chatOutput) takeLogprobs() *chatLogprobs {
	o.lpMu.Lock()
	defer o.lpMu.Unlock()
	if !o.logprobs.on || len(o.lpPending) == 0 {
		return nil
	}
	l := &chatLogprobs{Content: o.lpPending}
	o.lpPending = nil
	return l
}

func (o *chatOutput) chunk(choices []chatChoice) *chatCompletion {
	return &chatCompletion{ID: o.id, Object: "chat.completion.chunk", Created: o.created, Model: o.s.cfg.ModelName,
		SystemFingerprint: o.s.fp, Choices: choices}
}

func (o *chatOutput) begin() error {
	if !o.stream {
		return nil
	}
	err := o.sse.send(o.chunk([]chatChoice{{Delta: &deltaOut{Role: "assistant", Content: strPtr("")}}}))
	if err != nil {
		return writeErr{err}
	}
	return nil
}

func (o *chatOutput) progress(p promptProgress) error {
	c := o.chunk([]chatChoice{})
	c.PromptProgress = &p
	if err := o.sse.send(c); err != nil {
		return writeErr{err}
	}
	return nil
}

func (o *chatOutput) text(piece string) error {
	if !o.stream {
		o.parser.text.WriteString(piece)
		return nil
	}
	return o.sendDelta(o.parser.Push(piece))
}

func (o *chatOutput) sendDelta(d Delta) error {
	if d.Empty() {
		return nil
	}
	delta := &deltaOut{}
	if d.Reasoning != "" {
		delta.ReasoningContent = strPtr(d.Reasoning)
	}
	if d.Content != "" {
		delta.Content = strPtr(d.Content)
	}
	for i, c := range d.ToolCalls {
		idx := d.FirstIndex + i
		delta.ToolCalls = append(delta.ToolCalls, toolCallOut{Index: &idx, ID: c.ID, Type: "function",
			Function: functionOut{Name: c.Function.Name, Arguments: c.Function.Arguments}})
	}
	if err := o.sse.send(o.chunk([]chatChoice{{Delta: delta, Logprobs: o.takeLogprobs()}})); err != nil {
		return writeErr{err}
	}
	return nil
}

func finishReason(res *session.GenerateResult, toolCalls int) string {
	if res.StopReason == session.StopLength {
		return "length"
	}
	if toolCalls > 0 {
		return "tool_calls"
	}
	return "stop"
}

func (o *chatOutput) end(res *session.GenerateResult, err error) {
	if !o.stream {
		if err != nil {
			if o.s.base.Err() == nil && errors.Is(err, context.Canceled) {
				return // the client left
			}
			writeError(o.w, o.s.errorFor(err))
			return
		}
		o.parser.Finish()
		parsed := o.parser.Result()
		msg := &messageOut{Role: "assistant", ReasoningContent: parsed.Reasoning}
		if parsed.Content != "" || len(parsed.ToolCalls) == 0 {
			msg.Content = strPtr(parsed.Content)
		}
		for _, c := range parsed.ToolCalls {
			msg.ToolCalls = append(msg.ToolCalls, toolCallOut{ID: c.ID, Type: "function",
				Function: functionOut{Name: c.Function.Name, Arguments: c.Function.Arguments}})
		}
		resp := &chatCompletion{ID: o.id, Object: "chat.completion", Created: o.created, Model: o.s.cfg.ModelName,
			SystemFingerprint: o.s.fp, Usage: usageOf(res), Timings: timingsOf(res),
			Choices: []chatChoice{{Message: msg, FinishReason: strPtr(finishReason(res, len(parsed.ToolCalls)))}}}
		if o.logprobs.on {
			o.lpMu.Lock()
			resp.Choices[0].Logprobs = &chatLogprobs{Content: append([]tokenLogprob{}, o.lpAll...)}
			o.lpMu.Unlock()
		}
		writeJSON(o.w, http.StatusOK, resp, o.s.cfg.WriteTimeout)
		return
	}
	if err != nil {
		if isWriteError(err) || o.s.base.Err() == nil && errors.Is(err, context.Canceled) {
			return // the client left
		}
		if !o.sse.started {
			writeError(o.w, o.s.errorFor(err))
			return
		}
		o.sse.sendError(o.s.errorFor(err))
		return
	}
	if o.sendDelta(o.parser.Finish()) != nil {
		return
	}
	last := o.chunk([]chatChoice{{Delta: &deltaOut{}, FinishReason: strPtr(finishReason(res, len(o.parser.Result().ToolCalls))),
		Logprobs: o.takeLogprobs()}})
	last.Timings = timingsOf(res)
	if o.sse.send(last) != nil {
		return
	}
	if o.includeUsage {
		u := o.chunk([]chatChoice{})
		u.Usage = usageOf(res)
		if o.sse.send(u) != nil {
			return
		}
	}
	o.sse.done()
}

func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request) {
	received := time.Now()
	var req completionRequest
	if e := s.readBody(w, r, &req); e != nil {
		writeError(w, e)
		return
	}
	g, e := s.completionGeneration(w, &req, received)
	if e != nil {
		writeError(w, e)
		return
	}
	s.generate(w, r, g)
}

// completionPrompt reads "prompt": a string, one string in an array, token
// ids, or one array of token ids in an array. It returns the tokens and
// the text (for echo).
func (s *Server) completionPrompt(raw json.RawMessage) ([]int, string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, "", badRequest("prompt", "prompt is missing")
	}
	var text string
	if err := json.Unmarshal(raw, &text); err == nil {
		ids, e := s.encodeText(text, "prompt")
		return ids, text, e
	}
	var texts []string
	if err := json.Unmarshal(raw, &texts); err == nil {
		if len(texts) != 1 {
			return nil, "", badRequest("prompt", "prompt has %d strings; ats completes one prompt per request", len(texts))
		}
		ids, e := s.encodeText(texts[0], "prompt")
		return ids, texts[0], e
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err != nil {
		var batches [][]int
		if err := json.Unmarshal(raw, &batches); err != nil || len(batches) != 1 {
			return nil, "", badRequest("prompt", "prompt must be a string, an array with one string, or an array of token ids")
		}
		ids = batches[0]
	}
	for _, id := range ids {
		if id < 0 || id >= s.nVocab {
			return nil, "", badRequest("prompt", "prompt token %d is outside the vocabulary [0, %d)", id, s.nVocab)
		}
	}
	return ids, s.sess.Tok.Decode(ids), nil
}

// defaultCompletionTokens is OpenAI's default max_tokens for
// /v1/completions.
const defaultCompletionTokens = 16

func (s *Server) completionGeneration(w http.ResponseWriter, req *completionRequest, received time.Time) (*generation, *apiError) {
	if e := req.common(); e != nil {
		return nil, e
	}
	if req.Suffix != nil && *req.Suffix != "" {
		return nil, badRequest("suffix", "suffix (fill in the middle) is not supported by ats")
	}
	if req.BestOf != nil && *req.BestOf != 1 {
		return nil, badRequest("best_of", "best_of must be 1 or absent")
	}
	lp, e := completionLogprobsRequest(req.Logprobs, req.Echo)
	if e != nil {
		return nil, e
	}
	maxParam := "max_tokens"
	if req.MaxTokens == nil && req.NPredict != nil {
		maxParam = "n_predict"
	}
	max, e := maxTokens(maxParam, nPredict(req.MaxTokens, req.NPredict), defaultCompletionTokens)
	if e != nil {
		return nil, e
	}
	creq, e := requestConstraint(nil, req.Grammar, req.JSONSchema)
	if e != nil {
		return nil, e
	}
	cfg, e := req.samplerConfig(*s.cfg.Sampling, s.nVocab)
	if e != nil {
		return nil, e
	}
	if e := s.checkSampling(cfg); e != nil {
		return nil, e
	}
	out := &completionOutput{s: s, w: w, stream: req.Stream,
		includeUsage: req.StreamOptions != nil && req.StreamOptions.IncludeUsage,
		id:           newID("cmpl-"), created: received.Unix(), logprobs: lp}
	if req.Stream {
		out.sse = newSSE(w, s.cfg.WriteTimeout)
	}
	g := &generation{endpoint: "completion", received: received, out: out, progress: req.Stream && req.ReturnProgress,
		opt: session.GenerateOptions{Sampler: cfg, MaxTokens: max, Stop: req.Stop, IgnoreEOS: req.IgnoreEOS}}
	if lp.on {
		g.opt.OnLogits = out.onLogits
	}
	g.prepare = func(context.Context) *apiError {
		ids, text, e := s.completionPrompt(req.Prompt)
		if e != nil {
			return e
		}
		if len(ids) == 0 {
			return badRequest("prompt", "the prompt is empty")
		}
		if !creq.none() {
			con, e := s.requestConstraintFor(creq, thinkSkip)
			if e != nil {
				return e
			}
			g.opt.Constraint = con.NewMatcher()
		}
		if e := s.checkLength(ids, max, "max_tokens"); e != nil {
			if e.Param != nil && *e.Param == "messages" {
				e.Param = strPtr("prompt")
			}
			return e
		}
		if req.Echo {
			out.echo = text
		}
		out.offset = len(out.echo)
		g.prompt = ids
		return nil
	}
	return g, nil
}

// completionOutput writes a text completion.
type completionOutput struct {
	s            *Server
	w            http.ResponseWriter
	stream       bool
	includeUsage bool
	sse          *sse
	echo         string
	id           string
	created      int64
	buf          strings.Builder
	logprobs     logprobsRequest
	offset       int // where the next token's text starts in the returned text (onLogits's)
	// The scheduler's step records log-probabilities (onLogits) while the
	// worker streams text: lpMu guards both.
	lpMu      sync.Mutex
	lpAll     completionLogprobs // every step's (not streamed)
	lpPending completionLogprobs // steps not yet sent (streamed)
	lpScratch []float32          // stepLogprobs'
}

// onLogits records a step's log-probabilities (on the scheduler's
// goroutine, during the step).
func (o *completionOutput) onLogits(tok int, logits []float32) {
	t := o.s.sess.Tok
	if t.IsEOG(tok) {
		return
	}
	st := stepLogprobs(logits, tok, o.logprobs.top, &o.lpScratch)
	o.lpMu.Lock()
	defer o.lpMu.Unlock()
	if o.stream {
		o.lpPending.add(t, st, o.offset)
	} else {
		o.lpAll.add(t, st, o.offset)
	}
	o.offset += len(t.Piece(tok, false))
}

// takeLogprobs is what a streamed chunk carries: the steps since the last
// one.
func (o *completionOutput) takeLogprobs() *completionLogprobs {
	if !o.logprobs.on {
		return nil
	}
	o.lpMu.Lock()
	defer o.lpMu.Unlock()
	l := o.lpPending
	o.lpPending = completionLogprobs{}
	if l.Tokens == nil {
		l = completionLogprobs{Tokens: []string{}, TokenLogprobs: []float64{}, TopLogprobs: []map[string]float64{}, TextOffset: []int{}}
	}
	return &l
}

func (o *completionOutput) chunk(text string, finish *string) *textCompletion {
	return &textCompletion{ID: o.id, Object: "text_completion", Created: o.created, Model: o.s.cfg.ModelName,
		SystemFingerprint: o.s.fp, Choices: []completionChoice{{Text: text, FinishReason: finish}}}
}

func (o *completionOutput) begin() error {
	if !o.stream || o.echo == "" {
		return nil
	}
	if err := o.sse.send(o.chunk(o.echo, nil)); err != nil {
		return writeErr{err}
	}
	return nil
}

func (o *completionOutput) progress(p promptProgress) error {
	c := o.chunk("", nil)
	c.Choices = []completionChoice{}
	c.PromptProgress = &p
	if err := o.sse.send(c); err != nil {
		return writeErr{err}
	}
	return nil
}

func (o *completionOutput) text(piece string) error {
	if !o.stream {
		o.buf.WriteString(piece)
		return nil
	}
	c := o.chunk(piece, nil)
	c.Choices[0].Logprobs = o.takeLogprobs()
	if err := o.sse.send(c); err != nil {
		return writeErr{err}
	}
	return nil
}

func (o *completionOutput) end(res *session.GenerateResult, err error) {
	if err != nil {
		if isWriteError(err) || o.s.base.Err() == nil && errors.Is(err, context.Canceled) {
			return
		}
		if o.stream && o.sse.started {
			o.sse.sendError(o.s.errorFor(err))
			return
		}
		writeError(o.w, o.s.errorFor(err))
		return
	}
	finish := strPtr(finishReason(res, 0))
	if !o.stream {
		resp := o.chunk(o.echo+o.buf.String(), finish)
		resp.Usage, resp.Timings = usageOf(res), timingsOf(res)
		if o.logprobs.on {
			o.lpMu.Lock()
			o.lpPending = o.lpAll
			o.lpMu.Unlock()
			resp.Choices[0].Logprobs = o.takeLogprobs()
		}
		writeJSON(o.w, http.StatusOK, resp, o.s.cfg.WriteTimeout)
		return
	}
	last := o.chunk("", finish)
	last.Timings = timingsOf(res)
	last.Choices[0].Logprobs = o.takeLogprobs()
	if o.sse.send(last) != nil {
		return
	}
	if o.includeUsage {
		u := o.chunk("", nil)
		u.Choices = []completionChoice{}
		u.Usage = usageOf(res)
		if o.sse.send(u) != nil {
			return
		}
	}
	o.sse.done()
}
