package runtime

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/sampler"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// Session is one conversation with a model: a context whose KV cache holds
// the tokens evaluated so far, the tokenizer, and the chat template. A new
// prompt that starts with the tokens already in the cache reuses them.
type Session struct {
	Model    *Model
	Tok      *tokenizer.Tokenizer
	Template *chat.Template // loaded on first use by RenderChat
	Ctx      *Context
	cached   []int // the tokens whose keys and values are in Ctx
	warn     func(string)
}

// NewSession loads the tokenizer and chat template of m and allocates a
// context. warn receives notes such as a template fallback.
func NewSession(m *Model, opt ContextOptions, warn func(string)) (*Session, error) {
	if warn == nil {
		warn = func(string) {}
	}
	tok, err := tokenizer.FromGGUF(m.File, warn)
	if err != nil {
		return nil, fmt.Errorf("%s: tokenizer: %w", m.File.Path, err)
	}
	// llama.cpp refuses a file whose embeddings do not have a row per
	// token too; converters pad the vocabulary ([PAD] tokens) instead. A
	// row without a token would be sampled as a token with no text.
	if tok.VocabSize() != m.Hyper().NVocab {
		return nil, fmt.Errorf("%s: the tokenizer has %d tokens but token_embd.weight has %d rows; they must match (pad the vocabulary when converting, as llama.cpp's converter does)", m.File.Path, tok.VocabSize(), m.Hyper().NVocab)
	}
	c, err := m.NewContext(opt)
	if err != nil {
		return nil, err
	}
	for _, w := range ContextWarnings(m.Hyper(), c.opt) {
		warn(w)
	}
	return &Session{Model: m, Tok: tok, Ctx: c, warn: warn}, nil
}

// loadTemplate reads tokenizer.chat_template, or picks the built-in template
// of the architecture's usual family when the file has none.
func loadTemplate(m *Model, warn func(string)) (*chat.Template, error) {
	if src, err := m.File.String("tokenizer.chat_template"); err == nil {
		return chat.Load(src, warn)
	}
	family := map[string]string{"qwen2": "chatml", "qwen3": "chatml", "qwen3moe": "chatml", "llama": "llama3", "glm4": "glm4"}[m.Hyper().Arch]
	if t, ok := chat.Fallback(family); ok {
		warn(fmt.Sprintf("%s has no chat template; using the built-in %s template", m.File.Path, family))
		return t, nil
	}
	return nil, fmt.Errorf("%s has no chat template and ats knows none for %s", m.File.Path, m.Hyper().Arch)
}

// Close frees the context.
func (s *Session) Close() { s.Ctx.Close() }

// Reset forgets the cached tokens.
func (s *Session) Reset() {
	s.cached = s.cached[:0]
	s.Ctx.Truncate(0)
}

// Cached is the number of tokens whose keys and values are in the cache.
func (s *Session) Cached() int { return len(s.cached) }

// RenderChat applies the chat template to messages.
func (s *Session) RenderChat(msgs []chat.Message, opt chat.Options) (string, error) {
	p, err := s.RenderPrompt(msgs, opt)
	return p.Text, err
}

// RenderPrompt applies the chat template to messages for chat.EncodePrompt,
// which keeps the control-token texts of the messages plain text.
func (s *Session) RenderPrompt(msgs []chat.Message, opt chat.Options) (chat.Prompt, error) {
	if s.Template == nil {
		t, err := loadTemplate(s.Model, s.warn)
		if err != nil {
			return chat.Prompt{}, err
		}
		s.Template = t
	}
	if opt.BOS == "" && s.Tok.BOS() >= 0 {
		opt.BOS = s.Tok.TokenText(s.Tok.BOS())
	}
	if opt.EOS == "" && s.Tok.EOS() >= 0 {
		opt.EOS = s.Tok.TokenText(s.Tok.EOS())
	}
	opt.Tokenizer = s.Tok
	out, err := s.Template.RenderPrompt(msgs, opt)
	// A model's own template that breaks a limit (issue 13) is set aside
	// for the built-in one of its family, so a chat can go on.
	var le *chat.LimitError
	if errors.As(err, &le) && s.Template.Family() == "" {
		if fb, ok := chat.Fallback(chat.Detect(s.Template.Source())); ok {
			s.warn(fmt.Sprintf("chat template: %v; using the built-in %s template from now on", err, fb.Family()))
			s.Template = fb
			return fb.RenderPrompt(msgs, opt)
		}
	}
	return out, err
}

// EncodeChat tokenizes a prompt rendered by the chat template: special
// tokens are parsed, and BOS is added only when the tokenizer wants one and
// the template did not already write it.
func (s *Session) EncodeChat(text string) []int {
	tok := s.Tok
	addBOS := tok.AddBOS() && tok.BOS() >= 0 && !strings.HasPrefix(text, tok.TokenText(tok.BOS()))
	return tok.Encode(text, addBOS, true)
}

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

// Generate evaluates prompt (reusing the cached prefix it shares with the
// previous call) and samples until end of generation, a stop string,
// MaxTokens, a full context, or cancellation.
func (s *Session) Generate(ctx context.Context, prompt []int, opt GenerateOptions) (*GenerateResult, error) {
	start := time.Now()
	if len(prompt) == 0 {
		return nil, errors.New("generate: empty prompt")
	}
	if len(prompt) >= s.Ctx.CtxSize() {
		return nil, fmt.Errorf("%w: the prompt has %d tokens, the context holds %d", ErrContextFull, len(prompt), s.Ctx.CtxSize())
	}
	smp, err := sampler.New(opt.Sampler, s.Model.Hyper().NVocab)
	if err != nil {
		return nil, err
	}
	res := &GenerateResult{PromptTokens: len(prompt), Seed: smp.Seed()}
	// Reuse the longest cached prefix, but evaluate at least one token to
	// get fresh logits.
	keep := 0
	for keep < len(s.cached) && keep < len(prompt)-1 && s.cached[keep] == prompt[keep] {
		keep++
	}
	if err := s.Ctx.Truncate(keep); err != nil {
		return nil, err
	}
	s.cached = s.cached[:keep]
	res.CachedTokens = keep
	for _, t := range prompt {
		smp.Accept(t) // penalties see the prompt too, as llama.cpp's do
	}
	logits, err := s.evalCancellable(ctx, prompt[keep:])
	if err != nil {
		return res, err
	}
	res.Prefill = time.Since(start)
	decodeStart := time.Now()
	stream := s.Tok.NewStream(opt.Special)
	stops := sampler.NewStopMatcher(opt.Stop)
	var text []byte
	emit := func(piece string) error {
		out, stopped := stops.Push(piece)
		text = append(text, out...)
		if out != "" && opt.OnText != nil {
			if err := opt.OnText(out); err != nil {
				return err
			}
		}
		if stopped {
			res.StopReason = StopEOG
		}
		return nil
	}
	// finish emits what the stream and the stop matcher still hold back.
	finish := func() (*GenerateResult, error) {
		if !stops.Stopped() {
			if err := emit(stream.Flush()); err != nil {
				return res, err
			}
		}
		if !stops.Stopped() {
			rest := stops.Flush()
			text = append(text, rest...)
			if rest != "" && opt.OnText != nil {
				if err := opt.OnText(rest); err != nil {
					return res, err
				}
			}
		}
		res.Text = string(text)
		res.Decode = time.Since(decodeStart)
		res.ContextTokens = s.Ctx.Pos()
		return res, nil
	}
	for {
		if err := ctx.Err(); err != nil {
			res.StopReason = StopCancelled
			r, _ := finish()
			return r, err
		}
		var allowed []uint64
		if opt.Constraint != nil {
			if allowed, err = opt.Constraint.Allowed(); err != nil {
				return res, fmt.Errorf("constrained decoding: %w", err)
			}
		}
		tok, err := smp.SampleMasked(logits, allowed)
		if err != nil {
			return res, err
		}
		if opt.OnLogits != nil {
			opt.OnLogits(tok, logits)
		}
		if opt.Constraint != nil {
			if err := opt.Constraint.Accept(tok); err != nil {
				return res, fmt.Errorf("constrained decoding: %w", err)
			}
		}
		if len(res.Tokens) == 0 {
			res.FirstToken = time.Since(start)
		}
		smp.Accept(tok)
		if opt.OnToken != nil {
			opt.OnToken(tok)
		}
		if s.Tok.IsEOG(tok) {
			res.StopReason = StopEOG
			return finish()
		}
		res.Tokens = append(res.Tokens, tok)
		if err := emit(stream.Add(tok)); err != nil {
			return res, err
		}
		if res.StopReason == StopEOG {
			return finish()
		}
		if opt.MaxTokens > 0 && len(res.Tokens) >= opt.MaxTokens || s.Ctx.Pos() >= s.Ctx.CtxSize() {
			res.StopReason = StopLength
			return finish()
		}
		logits, err = s.Ctx.EvalView([]int{tok}, false) // valid until the next eval; Sample only reads it
		if err != nil {
			return res, err
		}
		s.cached = append(s.cached, tok)
	}
}

// evalCancellable evaluates tokens in slices so a cancelled request stops
// between batches of a long prompt, and records them as cached.
func (s *Session) evalCancellable(ctx context.Context, tokens []int) ([]float32, error) {
	var logits []float32
	step := s.Ctx.opt.Batch
	for i := 0; i < len(tokens); i += step {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		chunk := tokens[i:min(len(tokens), i+step)]
		l, err := s.Ctx.EvalView(chunk, false)
		if err != nil {
			return nil, err
		}
		s.cached = append(s.cached, chunk...)
		logits = l
	}
	return logits, nil
}
