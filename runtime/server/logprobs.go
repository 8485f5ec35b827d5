package server

import (
	"bytes"
	"encoding/json"
	"math"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// Log-probabilities (logprobs, top_logprobs) are those of the model's own
// distribution at each step: the softmax of the raw logits, before
// temperature, penalties, logit_bias and any constraint. That is what
// OpenAI reports and what llama-server reports by default
// (post_sampling_probs false), so the numbers do not depend on the
// sampling settings, and a token forced by structured output may show a
// low probability: the model would not have chosen it on its own.

// maxTopLogprobs bounds top_logprobs (OpenAI's limit for chat).
const maxTopLogprobs = 20

// tokenProb is one token and its log-probability.
type tokenProb struct {
	id      int
	logprob float64
}

// logprobStep is what one draw contributes: the token drawn and the most
// likely tokens.
type logprobStep struct {
	tokenProb
	top []tokenProb
}

// stepLogprobs computes the log-probability of tok and the n most likely
// tokens from raw logits, in ops' vector kernels over scratch (grown to
// len(logits) and kept by the caller: one request's steps come one at a
// time). NaN logits count as impossible, +Inf as the largest float. It
// runs on the scheduler's goroutine during a step, so every request of
// the batch waits for it: a scalar float64 softmax over 152k logits took
// 1.5 ms a token (2 cores of a Xeon).
func stepLogprobs(logits []float32, tok, n int, scratch *[]float32) logprobStep {
	if cap(*scratch) < len(logits) {
		*scratch = make([]float32, len(logits))
	}
	x := (*scratch)[:len(logits)]
	ops.SanitizeLogits(x, logits)
	maxL := ops.MaxF32(x)
	if math.IsInf(float64(maxL), -1) {
		return logprobStep{tokenProb: tokenProb{tok, math.Inf(-1)}} // every logit NaN or -Inf
	}
	top := bestLogits(x, n)
	// The exponentials' sum in float64 across chunks: one float32 sum
	// over 152k terms drifted by 1e-5.
	var sum float64
	for lo := 0; lo < len(x); lo += 1024 {
		sum += float64(ops.ExpShift(x[lo:min(lo+1024, len(x))], maxL)) // x is spent
	}
	logZ := float64(maxL) + math.Log(sum)
	lp := func(id int) float64 {
		l := logits[id]
		if l != l {
			return math.Inf(-1)
		}
		return float64(min(l, math.MaxFloat32)) - logZ
	}
	st := logprobStep{tokenProb: tokenProb{tok, lp(tok)}}
	for i := range top {
		top[i].logprob = lp(top[i].id)
	}
	st.top = top
	return st
}

// bestLogits returns the n tokens of the largest logits x (no NaN), best
// first, equal logits in id order: a short sorted list (n <= 20) that a
// newcomer enters only above its last, the vector scan skipping every
// token that does not. Nil for n <= 0.
func bestLogits(x []float32, n int) []tokenProb {
	if n <= 0 {
		return nil
	}
	top := make([]tokenProb, 0, n+1)
	thr := float32(math.Inf(-1))
	for id := 0; id < len(x); id++ {
		if id += ops.FirstAbove(x[id:], thr); id == len(x) {
			break
		}
		l := x[id]
		i := len(top)
		for i > 0 && x[top[i-1].id] < l {
			i--
		}
		top = append(top, tokenProb{})
		copy(top[i+1:], top[i:])
		top[i] = tokenProb{id: id}
		if len(top) > n {
			top = top[:n]
		}
		if len(top) == n {
			thr = x[top[n-1].id]
		}
	}
	return top
}

// logprobValue keeps log-probabilities finite for JSON: an impossible
// token (-Inf, a NaN logit) gets -9999, the value OpenAI documents for a
// very unlikely token.
func logprobValue(lp float64) float64 {
	if math.IsInf(lp, -1) || math.IsNaN(lp) {
		return -9999
	}
	return lp
}

// Chat: choices[].logprobs = {"content": [...], "refusal": null}.
type chatLogprobs struct {
	Content []tokenLogprob `json:"content"`
	Refusal []tokenLogprob `json:"refusal"`
}

type tokenLogprob struct {
	ID          int          `json:"id"` // llama-server's extra: the token id
	Token       string       `json:"token"`
	Logprob     float64      `json:"logprob"`
	Bytes       []int        `json:"bytes"`
	TopLogprobs []topLogprob `json:"top_logprobs"`
}

type topLogprob struct {
	ID      int     `json:"id"`
	Token   string  `json:"token"`
	Logprob float64 `json:"logprob"`
	Bytes   []int   `json:"bytes"`
}

func pieceBytes(p string) []int {
	b := make([]int, len(p))
	for i := range len(p) {
		b[i] = int(p[i])
	}
	return b
}

// chatEntry renders a step in the chat shape.
func chatEntry(tok *tokenizer.Tokenizer, st logprobStep) tokenLogprob {
	p := tok.Piece(st.id, false)
	e := tokenLogprob{ID: st.id, Token: p, Logprob: logprobValue(st.logprob), Bytes: pieceBytes(p), TopLogprobs: []topLogprob{}}
	for _, t := range st.top {
		tp := tok.Piece(t.id, false)
		e.TopLogprobs = append(e.TopLogprobs, topLogprob{ID: t.id, Token: tp, Logprob: logprobValue(t.logprob), Bytes: pieceBytes(tp)})
	}
	return e
}

// Completions: the legacy object of parallel lists.
type completionLogprobs struct {
	Tokens        []string             `json:"tokens"`
	TokenLogprobs []float64            `json:"token_logprobs"`
	TopLogprobs   []map[string]float64 `json:"top_logprobs"`
	TextOffset    []int                `json:"text_offset"`
}

// add appends a step whose text starts at offset in the returned text.
func (l *completionLogprobs) add(tok *tokenizer.Tokenizer, st logprobStep, offset int) {
	l.Tokens = append(l.Tokens, tok.Piece(st.id, false))
	l.TokenLogprobs = append(l.TokenLogprobs, logprobValue(st.logprob))
	top := make(map[string]float64, len(st.top))
	for _, t := range st.top {
		p := tok.Piece(t.id, false)
		if _, dup := top[p]; !dup { // the likelier of two tokens with one text
			top[p] = logprobValue(t.logprob)
		}
	}
	l.TopLogprobs = append(l.TopLogprobs, top)
	l.TextOffset = append(l.TextOffset, offset)
}

// logprobsRequest is a request's logprobs settings.
type logprobsRequest struct {
	on  bool
	top int
}

// chatLogprobsRequest reads logprobs and top_logprobs of a chat request.
func chatLogprobsRequest(logprobs *bool, top *int) (logprobsRequest, *apiError) {
	r := logprobsRequest{on: logprobs != nil && *logprobs}
	if top != nil {
		if *top < 0 || *top > maxTopLogprobs {
			return r, badRequest("top_logprobs", "top_logprobs is %d; it must be between 0 and %d", *top, maxTopLogprobs)
		}
		if !r.on {
			return r, badRequest("top_logprobs", "top_logprobs needs \"logprobs\": true")
		}
		r.top = *top
	}
	return r, nil
}

// completionLogprobsRequest reads logprobs of a completion request: null,
// or how many of the most likely tokens to list (0 lists none but still
// gives the chosen token's log-probability).
func completionLogprobsRequest(raw json.RawMessage, echo bool) (logprobsRequest, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return logprobsRequest{}, nil
	}
	var n int
	if err := json.Unmarshal(raw, &n); err != nil || n < 0 || n > maxTopLogprobs {
		return logprobsRequest{}, badRequest("logprobs", "logprobs must be an integer between 0 and %d (how many of the most likely tokens to list)", maxTopLogprobs)
	}
	if echo {
		return logprobsRequest{}, badRequest("logprobs", "logprobs with echo (log-probabilities of the prompt) is not supported")
	}
	return logprobsRequest{on: true, top: n}, nil
}
