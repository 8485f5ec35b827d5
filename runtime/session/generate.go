package session

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/atsinfer/ats/runtime/text/sampler"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// GenerateOptions control one generation.
type GenerateOptions struct {
	Sampler   sampler.Config
	MaxTokens int      // 0: until end of generation or the context is full
	Stop      []string // stop strings, not emitted
	// OnText receives the generated text as it becomes safe to show
	// (complete UTF-8, not part of a possible stop string). Returning an
	// error stops the generation with that error.
	OnText func(string) error
	// OnToken, when set, is called with each sampled token id.
	OnToken func(int)
	// Special renders control tokens as text.
	Special bool
	// Constraint, when set, restricts each step to the tokens it allows
	// (constrained decoding: structured output, forced tool calls); each
	// sampled token is passed to its Accept.
	Constraint TokenConstraint
	// OnLogits, when set, is called after each draw with the token drawn
	// and the step's logits as the model gave them (before penalties,
	// bias and any constraint), for log-probabilities. The slice is only
	// valid during the call.
	OnLogits func(token int, logits []float32)
	// OnPrompt, when set, is called as the prompt's evaluation advances:
	// done of total prompt tokens are in the cache (those reused from an
	// earlier request count at once), on the caller's goroutine.
	OnPrompt func(done, total int)
	// IgnoreEOS keeps generating past the end of the turn: the end tokens
	// are never drawn (llama.cpp's ignore_eos, for benchmarks).
	IgnoreEOS bool
}

// TokenConstraint decides which tokens may come next
// (runtime/text/constrain's Matcher is one).
type TokenConstraint interface {
	// Allowed returns the tokens allowed now as a bit set over the
	// vocabulary (token t is bit t%64 of word t/64). The caller only reads
	// it, and only until Accept.
	Allowed() ([]uint64, error)
	// Accept advances past a sampled token.
	Accept(token int) error
}

// Stop reasons.
const (
	StopEOG       = "stop"      // the model ended its turn, or a stop string matched
	StopLength    = "length"    // MaxTokens reached or the context is full
	StopCancelled = "cancelled" // the caller's context was cancelled
)

// GenerateResult reports one generation.
type GenerateResult struct {
	Text          string
	Tokens        []int
	PromptTokens  int
	CachedTokens  int // prompt tokens whose cache was reused
	StopReason    string
	StopString    string // the stop string that ended the text, if one did
	Prefill       time.Duration
	Decode        time.Duration
	FirstToken    time.Duration // from the call to the first sampled token
	Seed          uint64
	ContextTokens int // tokens in the cache at the end
}

// PrefillRate is prompt tokens evaluated per second.
func (r *GenerateResult) PrefillRate() float64 {
	n := r.PromptTokens - r.CachedTokens
	if r.Prefill <= 0 || n <= 0 {
		return 0
	}
	return float64(n) / r.Prefill.Seconds()
}

// DecodeRate is generated tokens per second after the first.
func (r *GenerateResult) DecodeRate() float64 {
	if r.Decode <= 0 || len(r.Tokens) < 2 {
		return 0
	}
	return float64(len(r.Tokens)-1) / r.Decode.Seconds()
}

// Generation is one request's decoding, apart from where its logits come
// from: the sampler (with penalties that see the prompt), the constraint,
// the text stream and stop strings. Whoever runs the model feeds it each
// step's logits (Take) and evaluates the token it returns: Session.Generate
// alone, the Scheduler together with other requests.
type Generation struct {
	opt         GenerateOptions
	tok         *tokenizer.Tokenizer
	smp         *sampler.Sampler
	stream      *tokenizer.Stream
	stops       *sampler.StopMatcher
	text        []byte
	res         *GenerateResult
	start       time.Time
	decodeStart time.Time
	finished    bool
	// noEOG allows every token but the end ones (IgnoreEOS); allowed is
	// its intersection with a constraint's set.
	noEOG, allowed []uint64
}

// NewGeneration starts decoding after prompt (whose first cached tokens'
// keys and values were reused), for a vocabulary of nvocab logits. start
// is when the request began (time to first token counts from it).
func NewGeneration(tok *tokenizer.Tokenizer, nvocab int, prompt []int, cached int, opt GenerateOptions, start time.Time) (*Generation, error) {
	smp, err := sampler.New(opt.Sampler, nvocab)
	if err != nil {
		return nil, err
	}
	for _, t := range prompt {
		smp.Accept(t) // penalties see the prompt too, as llama.cpp's do
	}
	g := &Generation{opt: opt, tok: tok, smp: smp, stream: tok.NewStream(opt.Special), stops: sampler.NewStopMatcher(opt.Stop),
		res: &GenerateResult{PromptTokens: len(prompt), CachedTokens: cached, Seed: smp.Seed()}, start: start}
	if opt.IgnoreEOS {
		g.noEOG = make([]uint64, (nvocab+63)/64)
		for t := range nvocab {
			if !tok.IsEOG(t) {
				g.noEOG[t/64] |= 1 << (t % 64)
			}
		}
	}
	return g, nil
}

// Prefilled marks the end of the prompt's evaluation (its first logits are
// about to be taken).
func (g *Generation) Prefilled() {
	g.res.Prefill = time.Since(g.start)
	g.decodeStart = time.Now()
}

// Result is the generation's result so far.
func (g *Generation) Result() *GenerateResult { return g.res }

// emit passes generated text through the stop matcher to OnText.
func (g *Generation) emit(piece string) error {
	out, stopped := g.stops.Push(piece)
	g.text = append(g.text, out...)
	if out != "" && g.opt.OnText != nil {
		if err := g.opt.OnText(out); err != nil {
			return err
		}
	}
	if stopped {
		g.res.StopReason = StopEOG
		g.res.StopString = g.stops.Matched()
	}
	return nil
}

// Take samples the next token from a step's logits and streams its text.
// It returns the token to evaluate next, or done when the generation has
// ended (end of generation, a stop string, MaxTokens; the result then says
// why). room is how many more tokens the sequence's cache can take: at 0
// the generation ends with StopLength.
func (g *Generation) Take(logits []float32, room int) (next int, done bool, err error) {
	var allowed []uint64
	if g.opt.Constraint != nil {
		if allowed, err = g.opt.Constraint.Allowed(); err != nil {
			return 0, true, fmt.Errorf("constrained decoding: %w", err)
		}
	}
	if g.noEOG != nil {
		if allowed == nil {
			allowed = g.noEOG
		} else {
			g.allowed = append(g.allowed[:0], allowed...)
			for i := range g.allowed {
				g.allowed[i] &= g.noEOG[i]
			}
			allowed = g.allowed
		}
	}
	tok, err := g.smp.SampleMasked(logits, allowed)
	if err != nil {
		return 0, true, err
	}
	if g.opt.OnLogits != nil {
		g.opt.OnLogits(tok, logits)
	}
	if g.opt.Constraint != nil {
		if err := g.opt.Constraint.Accept(tok); err != nil {
			return 0, true, fmt.Errorf("constrained decoding: %w", err)
		}
	}
	if len(g.res.Tokens) == 0 {
		g.res.FirstToken = time.Since(g.start)
	}
	g.smp.Accept(tok)
	if g.opt.OnToken != nil {
		g.opt.OnToken(tok)
	}
	if g.tok.IsEOG(tok) {
		g.res.StopReason = StopEOG
		return 0, true, nil
	}
	g.res.Tokens = append(g.res.Tokens, tok)
	if err := g.emit(g.stream.Add(tok)); err != nil {
		return 0, true, err
	}
	if g.res.StopReason == StopEOG {
		return 0, true, nil
	}
	if g.opt.MaxTokens > 0 && len(g.res.Tokens) >= g.opt.MaxTokens || room <= 0 {
		g.res.StopReason = StopLength
		return 0, true, nil
	}
	return tok, false, nil
}

// Finish emits what the stream and the stop matcher still hold back and
// completes the result; reason, when set, is the stop reason (a cancelled
// request). contextTokens is the tokens in the sequence's cache.
func (g *Generation) Finish(reason string, contextTokens int) (*GenerateResult, error) {
	if g.finished {
		return g.res, nil
	}
	g.finished = true
	if reason != "" {
		g.res.StopReason = reason
	}
	var err error
	if !g.stops.Stopped() {
		err = g.emit(g.stream.Flush())
	}
	if err == nil && !g.stops.Stopped() {
		rest := g.stops.Flush()
		g.text = append(g.text, rest...)
		if rest != "" && g.opt.OnText != nil {
			err = g.opt.OnText(rest)
		}
	}
	g.res.Text = string(g.text)
	if !g.decodeStart.IsZero() {
		g.res.Decode = time.Since(g.decodeStart)
	}
	g.res.ContextTokens = contextTokens
	return g.res, err
}

// Generate evaluates prompt (reusing the cached prefix it shares with the
// previous call) and samples until end of generation, a stop string,
// MaxTokens, a full context, or cancellation.
func (s *Session) Generate(ctx context.Context, prompt []int, opt GenerateOptions) (*GenerateResult, error) {
	start := time.Now()
	if len(prompt) == 0 {
		return nil, errors.New("generate: empty prompt")
	}
	if err := s.checkTokens(prompt); err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	if len(prompt) >= s.CtxSize() {
		return nil, fmt.Errorf("%w: the prompt has %d tokens, the context holds %d", ErrContextFull, len(prompt), s.CtxSize())
	}
	// Reuse the longest cached prefix, but evaluate at least one token to
	// get fresh logits.
	keep := s.seq.Reuse(tokensOf(prompt))
	g, err := NewGeneration(s.Tok, s.Model.Hyper().NVocab, prompt, keep, opt, start)
	if err != nil {
		return nil, err
	}
	if opt.OnPrompt != nil {
		opt.OnPrompt(keep, len(prompt))
	}
	logits, err := s.evalCancellable(ctx, prompt[keep:], func(done int) {
		if opt.OnPrompt != nil {
			opt.OnPrompt(keep+done, len(prompt))
		}
	})
	if err != nil {
		return g.res, err
	}
	g.Prefilled()
	for {
		if err := ctx.Err(); err != nil {
			r, _ := g.Finish(StopCancelled, s.seq.Len())
			return r, err
		}
		tok, done, err := g.Take(logits, s.seq.Room())
		if err != nil {
			return g.res, err
		}
		if done {
			return g.Finish("", s.seq.Len())
		}
		logits, err = s.Engine.Eval(s.seq, []int{tok}, false) // valid until the next eval; Take only reads it
		if err != nil {
			return g.res, err
		}
	}
}

// evalCancellable evaluates tokens in slices so a cancelled request stops
// between batches of a long prompt; progress hears of each slice.
func (s *Session) evalCancellable(ctx context.Context, tokens []int, progress func(done int)) ([]float32, error) {
	var logits []float32
	step := s.Ctx.Batch()
	for i := 0; i < len(tokens); i += step {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		chunk := tokens[i:min(len(tokens), i+step)]
		l, err := s.Engine.Eval(s.seq, chunk, false)
		if err != nil {
			return nil, err
		}
		logits = l
		progress(i + len(chunk))
	}
	return logits, nil
}
