package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"sync/atomic"

	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/sampler"
)

// Bounds on what one request may make the server do (issue 13). Each is
// checked before the work it bounds, and breaking one is a 400 that says
// which.

// bigPrompt is the size of a rendered prompt (bytes) past which the
// server hands memory back to the operating system once it is idle:
// tokenizing takes about a hundred bytes per byte of text, and without a
// further collection the Go runtime would keep that peak for minutes.
const bigPrompt = 1 << 20

// preparation serialises the work that grows with a request (rendering the
// chat template, tokenizing) so that at most one request does it at a
// time: with the queue limit, that bounds the memory requests can take,
// however many arrive at once.
type preparation struct {
	slot    chan struct{}
	bigWork atomic.Bool // a big prompt was prepared since the last release
}

func newPreparation() *preparation {
	return &preparation{slot: make(chan struct{}, 1)}
}

// prepareJob runs g.prepare, if any, once it has the preparation slot. A
// request whose context ends while it waits returns the context's error.
func (s *Server) prepareJob(ctx context.Context, g *generation) *apiError {
	if g.prepare == nil {
		return nil
	}
	select {
	case s.prep.slot <- struct{}{}:
	case <-ctx.Done():
		return asAPIError(ctx.Err())
	}
	defer func() { <-s.prep.slot }()
	if err := ctx.Err(); err != nil {
		return asAPIError(err)
	}
	return g.prepare(ctx)
}

// noteWork records the size of a prepared prompt.
func (s *Server) noteWork(promptBytes int) {
	if promptBytes >= bigPrompt {
		s.prep.bigWork.Store(true)
	}
}

// idle runs when the model has nothing to do: after big prompts it
// collects the garbage they left and returns the memory to the system, so
// the process shrinks back after a burst.
func (s *Server) idle() {
	if s.prep.bigWork.Swap(false) {
		go debug.FreeOSMemory()
	}
}

// checkSampling checks what the sampler accepts but a request may still not
// ask for: a penalty window beyond the context (every token the sequence
// can hold is "all": use -1), and a logit_bias that bans every token.
func (s *Server) checkSampling(cfg sampler.Config) *apiError {
	ctx := s.sess.CtxSize()
	if cfg.RepeatLastN > ctx {
		return badRequest("repeat_last_n", "repeat_last_n is %d, but the context holds only %d tokens; use at most %d (or -1 for all of them)", cfg.RepeatLastN, ctx, ctx)
	}
	banned := 0
	for _, b := range cfg.LogitBias {
		if math.IsInf(float64(b), -1) {
			banned++
		}
	}
	if banned >= s.nVocab {
		return badRequest("logit_bias", "logit_bias bans every one of the %d tokens of the vocabulary, so nothing can be generated", s.nVocab)
	}
	return nil
}

// renderError explains why the chat template failed on a request. The
// template rendered a plain conversation when the server started, so a
// failure is the request's doing (a 400, never a 500): a conversation the
// template refuses, one so large that it breaks the template's limits, a
// field in a shape the template cannot take (tool-call arguments that are
// not a JSON object, for templates that iterate them), or
// chat_template_kwargs or tools it cannot take (withInputs).
func (s *Server) renderError(ctx context.Context, err error, msgs []chat.Message, withInputs bool) *apiError {
	var te *chat.TemplateError
	var le *chat.LimitError
	switch {
	case errors.As(err, &te):
		return badRequest("messages", "the model's chat template rejects this conversation: %s", te.Msg)
	case errors.As(err, &le):
		return withCode(badRequest("messages", "the model's chat template broke its %s limit on this request: %v", le.Limit, le), "template_limit_exceeded")
	case ctx.Err() != nil:
		return asAPIError(ctx.Err())
	case errors.Is(err, chat.ErrTooManyPlaceholders):
		return badRequest("messages", "%v", err)
	}
	if param := argumentsNotObject(msgs); param != "" {
		return badRequest(param, "%s is not a JSON object, and the model's chat template needs one there: %v", param, err)
	}
	if withInputs {
		return badRequest("chat_template_kwargs", "the model's chat template failed on this request's chat_template_kwargs or tools: %v", err)
	}
	return badRequest("messages", "the model's chat template failed on this conversation: %v", err)
}

// argumentsNotObject names the first tool call whose arguments are not a
// JSON object ("" when all are): templates that iterate the arguments
// (.items()) fail on anything else.
func argumentsNotObject(msgs []chat.Message) string {
	for i, m := range msgs {
		for j, c := range m.ToolCalls {
			var obj map[string]json.RawMessage
			if json.Unmarshal([]byte(c.Function.Arguments), &obj) != nil || obj == nil {
				return fmt.Sprintf("messages[%d].tool_calls[%d].function.arguments", i, j)
			}
		}
	}
	return ""
}
