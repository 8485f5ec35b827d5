package session

import (
	"errors"
	"fmt"
	"strings"

	"github.com/atsinfer/ats/runtime/kvcache"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// Session is one conversation with a model: an engine whose KV cache
// holds, in one sequence, the tokens evaluated so far, the tokenizer, and
// the chat template. A new prompt that starts with the tokens already in
// the cache reuses them.
type Session struct {
	*Engine
	Tok      *tokenizer.Tokenizer
	Template *chat.Template // loaded on first use by RenderChat
	seq      *kvcache.Seq
	warn     func(string)
}

// NewSession loads the tokenizer and chat template of m and opens an
// engine for it. warn receives notes such as a template fallback.
func NewSession(m *model.Model, opt Options, warn func(string)) (*Session, error) {
	if warn == nil {
		warn = func(string) {}
	}
	tok, err := LoadTokenizer(m, warn)
	if err != nil {
		return nil, err
	}
	e, err := NewEngine(m, opt)
	if err != nil {
		return nil, err
	}
	for _, w := range ContextWarnings(m.Hyper(), e.opt) {
		warn(w)
	}
	return &Session{Engine: e, Tok: tok, seq: e.Ctx.KV().NewSeq(), warn: warn}, nil
}

// LoadTokenizer reads m's tokenizer and checks it against the model.
func LoadTokenizer(m *model.Model, warn func(string)) (*tokenizer.Tokenizer, error) {
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
	return tok, nil
}

// loadTemplate reads tokenizer.chat_template, or picks the built-in template
// of the architecture's usual family when the file has none.
func loadTemplate(m *model.Model, warn func(string)) (*chat.Template, error) {
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

// Close frees the engine.
func (s *Session) Close() {
	s.seq.Close()
	s.Engine.Close()
}

// Reset forgets the cached tokens.
func (s *Session) Reset() { s.seq.Truncate(0) }

// Cached is the number of tokens whose keys and values are in the cache.
func (s *Session) Cached() int { return s.seq.Len() }

// Truncate forgets every token from position n on (fewer are kept when n
// falls inside a block shared with another sequence), and returns how
// many are kept.
func (s *Session) Truncate(n int) (int, error) {
	if n < 0 || n > s.seq.Len() {
		return 0, fmt.Errorf("truncate to %d: the session holds %d tokens", n, s.seq.Len())
	}
	return s.seq.Truncate(n), nil
}

// Eval feeds tokens after those in the cache and returns their logits:
// one row of NVocab per token when all is set, else the last token's row
// (valid until the next evaluation when one step computed them).
func (s *Session) Eval(tokens []int, all bool) ([]float32, error) {
	if err := s.checkTokens(tokens); err != nil {
		return nil, err
	}
	return s.Engine.Eval(s.seq, tokens, all)
}

// checkTokens validates tokens for Eval: non-empty, in the vocabulary.
func (s *Session) checkTokens(tokens []int) error {
	nv := s.Model.Hyper().NVocab
	if len(tokens) == 0 {
		return errors.New("eval: no tokens")
	}
	for i, t := range tokens {
		if t < 0 || t >= nv {
			return fmt.Errorf("eval: token %d (at %d) is outside the vocabulary of %d", t, i, nv)
		}
	}
	return nil
}

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
