package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/atsinfer/ats/runtime/session"
	"github.com/atsinfer/ats/runtime/text/chat"
)

// The other chat APIs (Anthropic's messages, OpenAI's responses, ollama's
// chat and generate) translate their requests into a chatJob and write
// their replies from the parsed reply (reasoning, content, tool calls):
// the prompt is rendered, tokenized, constrained and generated exactly as
// for /v1/chat/completions.

// chatJob is a chat request in the server's terms.
type chatJob struct {
	msgs     []chat.Message
	tools    []chat.Tool
	names    []string // the tools' function names
	choice   forcedTool
	parallel bool
	con      constraintRequest
	vars     map[string]any // template variables (enable_thinking)
	max      int            // 0: no limit
	maxParam string
	sampling samplingParams // temperature, top_p, ..., seed, stop
	// raw, when set, is the prompt as it is (no template): ollama's
	// generate with raw, or a context of token ids before it.
	raw       bool
	rawPrompt []int
}

// replySink writes a reply in one API's shape. begin runs when the
// request's turn comes (promptTokens known), delta with each streamed
// piece of the parsed reply, end with the result or the error.
type replySink interface {
	begin(promptTokens int) error
	delta(d Delta) error
	end(res *session.GenerateResult, reply Parsed, err error)
}

// replyOutput adapts a replySink to the generation's output.
type replyOutput struct {
	sink         replySink
	stream       bool
	parser       *StreamParser
	promptTokens int
}

func (o *replyOutput) begin() error {
	if err := o.sink.begin(o.promptTokens); err != nil {
		return writeErr{err}
	}
	return nil
}

func (o *replyOutput) text(piece string) error {
	if !o.stream {
		o.parser.text.WriteString(piece)
		return nil
	}
	if d := o.parser.Push(piece); !d.Empty() {
		if err := o.sink.delta(d); err != nil {
			return writeErr{err}
		}
	}
	return nil
}

func (o *replyOutput) end(res *session.GenerateResult, err error) {
	if err != nil {
		o.sink.end(res, Parsed{}, err)
		return
	}
	d := o.parser.Finish()
	if o.stream && !d.Empty() {
		if o.sink.delta(d) != nil {
			return
		}
	}
	o.sink.end(res, o.parser.Result(), nil)
}

// checkJob resolves a chatJob's sampling settings and length.
func (s *Server) jobOptions(j *chatJob) (session.GenerateOptions, *apiError) {
	if e := j.sampling.common(); e != nil {
		return session.GenerateOptions{}, e
	}
	cfg, e := j.sampling.samplerConfig(*s.cfg.Sampling, s.nVocab)
	if e != nil {
		return session.GenerateOptions{}, e
	}
	if e := s.checkSampling(cfg); e != nil {
		return session.GenerateOptions{}, e
	}
	if j.choice.required && !j.con.none() {
		return session.GenerateOptions{}, badRequest(j.con.param, "%s cannot be combined with a tool choice that forces a tool call", j.con.param)
	}
	return session.GenerateOptions{Sampler: cfg, MaxTokens: j.max, Stop: j.sampling.Stop, IgnoreEOS: j.sampling.IgnoreEOS}, nil
}

// jobGeneration makes the generation of a chatJob, written by sink. fail
// writes an error response in the API's shape.
func (s *Server) jobGeneration(endpoint string, j *chatJob, sink replySink, stream bool, received time.Time,
	fail func(http.ResponseWriter, *apiError)) (*generation, *apiError) {
	opt, e := s.jobOptions(j)
	if e != nil {
		return nil, e
	}
	out := &replyOutput{sink: sink, stream: stream}
	g := &generation{endpoint: endpoint, received: received, out: out, opt: opt, fail: fail}
	tools, names := j.tools, j.names
	if !j.choice.use {
		tools, names = nil, nil
	}
	g.prepare = func(ctx context.Context) *apiError {
		var ids []int
		think := thinkSkip
		thinkingOpen := false
		if j.raw {
			ids = j.rawPrompt
		} else {
			p, err := s.render(j.msgs, chat.Options{AddGenerationPrompt: true, Tools: tools, Vars: j.vars, Context: ctx})
			if err != nil {
				return s.renderError(ctx, err, j.msgs, len(j.vars) > 0 || len(tools) > 0)
			}
			if s.testHookPrompt != nil {
				s.testHookPrompt(p.Text)
			}
			think = thinkModeFor(s.tmpl.Source(), p.Text)
			thinkingOpen = ThinkingOpen(p.Text)
			encoded, e := s.encodePrompt(p)
			if e != nil {
				return e
			}
			ids = append(append([]int(nil), j.rawPrompt...), encoded...)
		}
		if len(ids) == 0 {
			return badRequest("prompt", "the prompt is empty")
		}
		con, e := s.requestConstraintFor(j.con, think)
		if e != nil {
			return e
		}
		if j.choice.required {
			if con, e = s.toolConstraint(tools, j.choice, think, j.parallel); e != nil {
				return e
			}
		}
		if con != nil {
			g.opt.Constraint = con.NewMatcher()
		}
		if e := s.checkLength(ids, j.max, j.maxParam); e != nil {
			return e
		}
		out.parser = NewStreamParser(ParseOptions{Format: s.format, Tools: names, ThinkingOpen: thinkingOpen})
		out.promptTokens = len(ids)
		g.prompt = ids
		return nil
	}
	return g, nil
}

// clientGone reports whether err means the client left (nothing to tell).
func (s *Server) clientGone(err error) bool {
	return isWriteError(err) || s.base.Err() == nil && errors.Is(err, context.Canceled)
}

// toolsFromFunctions turns tools given as name, description and JSON
// Schema parameters (Anthropic's, the responses API's) into the chat
// template's tools, as OpenAI's chat API writes them.
func toolsFromFunctions(param string, fns []functionTool) ([]chat.Tool, []string, *apiError) {
	raws := make([]json.RawMessage, 0, len(fns))
	for i, f := range fns {
		if f.Name == "" {
			return nil, nil, badRequest(fmt.Sprintf("%s[%d].name", param, i), "%s[%d] has no name", param, i)
		}
		fn := map[string]any{"name": f.Name}
		if f.Description != "" {
			fn["description"] = f.Description
		}
		if p := bytes.TrimSpace(f.Parameters); len(p) > 0 && !bytes.Equal(p, []byte("null")) {
			fn["parameters"] = f.Parameters
		}
		b, err := json.Marshal(map[string]any{"type": "function", "function": fn})
		if err != nil {
			return nil, nil, badRequest(fmt.Sprintf("%s[%d]", param, i), "%s[%d]: %v", param, i, err)
		}
		raws = append(raws, b)
	}
	tools, names, e := chatTools(raws)
	if e != nil && e.Param != nil {
		e.Param = strPtr(param)
	}
	return tools, names, e
}

// functionTool is a tool as name, description and parameters' schema.
type functionTool struct {
	Name        string
	Description string
	Parameters  json.RawMessage
}

// argumentsObject is a tool call's arguments as a JSON object (the model
// wrote JSON text; an unparsable one is passed as a string).
func argumentsObject(args string) json.RawMessage {
	var v json.RawMessage
	if json.Unmarshal([]byte(args), &v) == nil && len(bytes.TrimSpace(v)) > 0 && bytes.TrimSpace(v)[0] == '{' {
		return v
	}
	b, _ := json.Marshal(map[string]string{"arguments": args})
	return b
}

// thinkingVar sets enable_thinking in vars (nil: leave the template's
// default).
func thinkingVar(vars map[string]any, on *bool) map[string]any {
	if on == nil {
		return vars
	}
	if vars == nil {
		vars = map[string]any{}
	}
	vars["enable_thinking"] = *on
	return vars
}
