package tokenizer

import (
	"fmt"
	"strings"
)

// Range is the bytes [Start, End) of a text.
type Range struct{ Start, End int }

// EncodeOptions say how EncodeWith tokenizes a text.
type EncodeOptions struct {
	// AddBOS prepends the BOS token (when the vocabulary has one).
	AddBOS bool
	// ParseSpecial lets control tokens written in the text become their
	// ids (see Encode).
	ParseSpecial bool
	// Plain lists ranges of the text, in order and not overlapping, where
	// control tokens are never parsed, even with ParseSpecial: a control
	// token's text that overlaps one stays plain text. A chat prompt's
	// ranges are the bytes that came from the messages, so that only the
	// template's own markers are special (chat.Prompt).
	Plain []Range
	// MaxTokens, when positive, bounds the result: EncodeWith stops with
	// a *TooManyTokensError as soon as it knows the text needs more, and
	// before it spends the time and memory of a longer text. Work memory
	// is linear in the text, a few tens of bytes per byte of the longest
	// word at most, and the bound keeps the text itself to what MaxTokens
	// tokens can cover.
	MaxTokens int
}

// TooManyTokensError says a text needs more tokens than EncodeOptions
// allowed.
type TooManyTokensError struct {
	Max   int // the limit
	Bytes int // the text's length
}

func (e *TooManyTokensError) Error() string {
	return fmt.Sprintf("a text of %d bytes needs more than %d tokens", e.Bytes, e.Max)
}

// limiter stops encoding once the tokens would pass MaxTokens; a nil one
// never does.
type limiter struct {
	max      int
	perToken int // the most bytes of text one token covers
	bytes    int
	err      *TooManyTokensError
}

// word reports whether a word of n bytes is to be tokenized when have
// tokens are out already: false once the limit is broken, by the tokens
// so far or because the word alone needs more than are left (a token
// covers at most perToken bytes of it), so a huge word is never worked on.
func (l *limiter) word(have, n int) bool {
	if l == nil {
		return true
	}
	if l.err == nil && (have > l.max || (n+l.perToken-1)/l.perToken > l.max-have) {
		l.err = &TooManyTokensError{Max: l.max, Bytes: l.bytes}
	}
	return l.err == nil
}

// EncodeWith returns the token ids of text as o says. Its only error is a
// *TooManyTokensError, when o.MaxTokens is set.
func (t *Tokenizer) EncodeWith(text string, o EncodeOptions) ([]int, error) {
	var lim *limiter
	if o.MaxTokens > 0 {
		lim = &limiter{max: o.MaxTokens, perToken: t.maxTokenBytes, bytes: len(text)}
		// Every token covers at most perToken bytes, except the whitespace
		// a special token with a strip rule swallows: a text longer than
		// that allows cannot fit, and is refused before any work.
		covered := len(text)
		if t.stripping {
			covered -= countCSpace(text)
		}
		if !lim.word(0, covered) {
			return nil, lim.err
		}
	}
	n := len(text)/4 + 8 // about 4 bytes per token in English
	if lim != nil {
		n = min(n, o.MaxTokens+1)
	}
	out := make([]int, 0, n)
	if o.AddBOS && t.bos >= 0 {
		out = append(out, t.bos)
	}
	if text == "" {
		return out, nil
	}
	prevSpecial := true // SPM: the first fragment gets the space prefix
	for _, fr := range t.special.partition(text, o.ParseSpecial, o.Plain, t.attrs) {
		if lim != nil && !lim.word(len(out), 0) {
			break
		}
		if fr.token >= 0 {
			out = append(out, fr.token)
			prevSpecial = true
			continue
		}
		raw := text[fr.start:fr.end]
		if !lim.word(len(out), len(raw)) {
			break // before the copies below
		}
		switch t.kind {
		case kindSPM:
			if t.addSpacePrefix && prevSpecial {
				raw = " " + raw
			}
			out = t.spm.encode(out, escapeSpaces(raw), lim)
		case kindBPE:
			out = t.encodeBPE(out, raw, lim)
		}
		prevSpecial = false
	}
	if !lim.word(len(out), 0) {
		return nil, lim.err
	}
	return out, nil
}

// countCSpace counts the bytes a strip rule may swallow.
func countCSpace(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		if isCSpace(s[i]) {
			n++
		}
	}
	return n
}

// setLimits records what EncodeWith's bound needs: the most bytes of text
// a token covers (its vocabulary text, or what it decodes to, whichever is
// longer), and whether special tokens swallow whitespace. A vocabulary that
// drops bytes it has no token for (no byte tokens) could fit a text the
// bound refuses; real ones have byte tokens.
func (t *Tokenizer) setLimits() {
	t.maxTokenBytes = 1
	for id, s := range t.tokens {
		t.maxTokenBytes = max(t.maxTokenBytes, len(s), len(t.pieces[id]))
	}
	for _, a := range t.attrs {
		if a&(attrLStrip|attrRStrip) != 0 {
			t.stripping = true
		}
	}
}

// MaxTokenBytes is the most bytes of text one token can stand for: a text
// of n bytes needs at least n/MaxTokenBytes() tokens (except for whitespace
// that special tokens with a strip rule swallow, as Phi-3's do).
func (t *Tokenizer) MaxTokenBytes() int { return t.maxTokenBytes }

// FindControl returns where the texts of control (and unknown) tokens
// occur in s, the tokens that EncodeOptions.ParseSpecial decides about, as
// ranges in order; overlapping occurrences form one range.
// User-defined tokens are not looked for: they are matched in any text.
func (t *Tokenizer) FindControl(s string) []Range {
	m := &t.special
	var out []Range
	add := func(start, end int) {
		if n := len(out); n > 0 && start < out[n-1].End {
			out[n-1].End = max(out[n-1].End, end)
			return
		}
		out = append(out, Range{start, end})
	}
	control := func(k int32) bool { return t.attrs[m.ids[k]]&(attrControl|attrUnknown) != 0 }
	for i := 0; i < len(s); i++ {
		b := s[i]
		if !m.lead[b] {
			continue
		}
		for _, k := range m.single[b] {
			if control(k) {
				add(i, i+1)
			}
		}
		if i+1 < len(s) {
			for _, k := range m.byPair[uint16(b)<<8|uint16(s[i+1])] {
				if control(k) && strings.HasPrefix(s[i:], m.texts[k]) {
					add(i, i+len(m.texts[k]))
				}
			}
		}
	}
	return out
}
