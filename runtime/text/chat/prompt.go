package chat

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/atsinfer/ats/internal/jinja"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// A prompt mixes the template's own text, whose control tokens
// (<|im_start|>, <|eot_id|>) must become their ids, with the conversation's
// text, whose control-token texts must not: a user who writes
// "<|im_start|>system" would otherwise open a system turn of their own.
//
// The template cannot be told which of its output came from where, and
// templates slice, strip, test and concatenate the messages' strings, so
// marking the strings' bounds would change what the template does. Instead,
// before rendering, each control-token text in the conversation's strings
// (messages, tool calls, tools, template variables) is replaced by one
// character of Unicode's supplementary private use area that stands for it;
// after rendering, each such character is put back and its bytes recorded
// in Prompt.Plain, which the tokenizer keeps plain. The strings change only
// where they hold a control token's text, which no template looks for in a
// message. Roles are left alone: the server accepts only the known ones,
// and some templates build their markers from them ('<|' + role + '|>').

// Prompt is a rendered conversation, ready for EncodePrompt.
type Prompt struct {
	Text string
	// Plain lists, in order, the ranges of Text that came from the
	// conversation and hold the text of a control token: they are
	// tokenized as plain text. Empty unless Options.Tokenizer was set.
	Plain []tokenizer.Range
}

// placeholderFirst and placeholderLast bound the characters that stand for
// control-token texts: Supplementary Private Use Area-A, which no script
// uses.
const (
	placeholderFirst = 0xF0000
	placeholderLast  = 0xFFFFD
)

// ErrTooManyPlaceholders says a conversation holds more distinct control
// token texts (and private use characters) than a rendering can stand in
// for.
var ErrTooManyPlaceholders = errors.New("chat: the conversation holds more than 65534 distinct control-token texts and private-use characters")

// protector stands placeholders in for the control-token texts of the
// strings of one rendering.
type protector struct {
	tok    *tokenizer.Tokenizer
	avoid  map[rune]bool // placeholders the template's own text uses
	runes  map[string]rune
	byRune map[rune]string
	next   rune
}

func newProtector(tok *tokenizer.Tokenizer, avoid map[rune]bool) *protector {
	if tok == nil {
		return nil
	}
	return &protector{tok: tok, avoid: avoid, next: placeholderFirst}
}

func isPlaceholder(r rune) bool { return r >= placeholderFirst && r <= placeholderLast }

// placeholderRunes finds the private use characters in s that could be
// taken for placeholders.
func placeholderRunes(s string) []tokenizer.Range {
	var out []tokenizer.Range
	for i := 0; ; {
		j := strings.IndexByte(s[i:], 0xF3) // the lead byte of U+F0000..U+FFFFF
		if j < 0 {
			return out
		}
		i += j
		r, size := utf8.DecodeRuneInString(s[i:])
		if isPlaceholder(r) {
			out = append(out, tokenizer.Range{Start: i, End: i + size})
		}
		i += size
	}
}

// protect replaces the control-token texts of s (and any private use
// characters it has, so that every placeholder in the output is one of
// ours) with placeholders.
func (p *protector) protect(s string) (string, error) {
	if p == nil {
		return s, nil
	}
	ranges := mergeRanges(p.tok.FindControl(s), placeholderRunes(s))
	if len(ranges) == 0 {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	last := 0
	for _, r := range ranges {
		ph, err := p.placeholder(s[r.Start:r.End])
		if err != nil {
			return "", err
		}
		b.WriteString(s[last:r.Start])
		b.WriteRune(ph)
		last = r.End
	}
	b.WriteString(s[last:])
	return b.String(), nil
}

func (p *protector) placeholder(text string) (rune, error) {
	if r, ok := p.runes[text]; ok {
		return r, nil
	}
	for p.avoid[p.next] {
		p.next++
	}
	if p.next > placeholderLast {
		return 0, ErrTooManyPlaceholders
	}
	if p.runes == nil {
		p.runes, p.byRune = map[string]rune{}, map[rune]string{}
	}
	r := p.next
	p.next++
	p.runes[text], p.byRune[r] = r, text
	return r, nil
}

// mergeRanges merges two ordered lists of ranges, joining those that
// overlap (not those that touch: each placeholder's text must stay one
// control token's or one character's, so that tojson can tell whether it
// needs escaping).
func mergeRanges(a, b []tokenizer.Range) []tokenizer.Range {
	if len(b) == 0 {
		return a
	}
	all := make([]tokenizer.Range, 0, len(a)+len(b))
	for len(a) > 0 || len(b) > 0 {
		var r tokenizer.Range
		if len(b) == 0 || len(a) > 0 && a[0].Start <= b[0].Start {
			r, a = a[0], a[1:]
		} else {
			r, b = b[0], b[1:]
		}
		if n := len(all); n > 0 && r.Start < all[n-1].End {
			all[n-1].End = max(all[n-1].End, r.End)
			continue
		}
		all = append(all, r)
	}
	return all
}

// protectValue returns v with every string in it (dict keys included)
// protected. It builds new lists and dicts: v may be the caller's.
func (p *protector) protectValue(v jinja.Value, depth int) (jinja.Value, error) {
	if p == nil {
		return v, nil
	}
	if depth > 1000 {
		return jinja.Undefined(), errors.New("chat: a value nests more than 1000 levels deep")
	}
	switch {
	case v.IsString():
		s, err := p.protect(v.AsString())
		return jinja.NewString(s), err
	case v.IsList():
		l := v.AsList()
		items := make([]jinja.Value, l.Len())
		for i := range items {
			var err error
			if items[i], err = p.protectValue(l.Get(i), depth+1); err != nil {
				return jinja.Undefined(), err
			}
		}
		return jinja.NewList(items), nil
	case v.IsDict():
		d := jinja.NewDict()
		src := v.AsDict()
		for _, k := range src.OrderedKeys() {
			e, _ := src.Get(k)
			pk, err := p.protect(k)
			if err != nil {
				return jinja.Undefined(), err
			}
			pe, err := p.protectValue(e, depth+1)
			if err != nil {
				return jinja.Undefined(), err
			}
			d.AsDict().Set(pk, pe)
		}
		return d, nil
	}
	return v, nil
}

// restore puts the texts back for the placeholders in out and records
// where they are. The prompt may not grow past maxOutput (0: no limit) on
// the way: a placeholder is 4 bytes, its text may be tens.
func (p *protector) restore(out string, maxOutput int) (Prompt, error) {
	if p == nil || len(p.byRune) == 0 {
		return Prompt{Text: out}, nil
	}
	size := len(out)
	for _, r := range placeholderRunes(out) {
		c, _ := utf8.DecodeRuneInString(out[r.Start:])
		if text, ok := p.byRune[c]; ok {
			size += len(text) - (r.End - r.Start)
		}
	}
	if maxOutput > 0 && size > maxOutput {
		return Prompt{}, &LimitError{Limit: "output size", Max: int64(maxOutput),
			What: fmt.Sprintf("the prompt of %d bytes with the conversation's control-token texts put back", size)}
	}
	var b strings.Builder
	b.Grow(size)
	var plain []tokenizer.Range
	for i := 0; i < len(out); {
		j := strings.IndexByte(out[i:], 0xF3)
		if j < 0 {
			b.WriteString(out[i:])
			break
		}
		b.WriteString(out[i : i+j])
		i += j
		r, size := utf8.DecodeRuneInString(out[i:])
		text, ok := p.byRune[r]
		if !ok {
			b.WriteByte(out[i]) // not ours; the rest of it is not 0xF3
			i++
			continue
		}
		start := b.Len()
		b.WriteString(text)
		if n := len(plain); n > 0 && plain[n-1].End == start {
			plain[n-1].End = b.Len()
		} else {
			plain = append(plain, tokenizer.Range{Start: start, End: b.Len()})
		}
		i += size
	}
	return Prompt{Text: b.String(), Plain: plain}, nil
}

// text gives the text placeholder r stands for (for tojson, which must
// escape that text, not the placeholder).
func (p *protector) text(r rune) (string, bool) {
	if p == nil {
		return "", false
	}
	t, ok := p.byRune[r]
	return t, ok
}

// placeholderRunesOf lists the private use characters a template's source
// holds, which placeholders must not be.
func placeholderRunesOf(src string) map[rune]bool {
	var avoid map[rune]bool
	for _, r := range placeholderRunes(src) {
		if avoid == nil {
			avoid = map[rune]bool{}
		}
		c, _ := utf8.DecodeRuneInString(src[r.Start:])
		avoid[c] = true
	}
	return avoid
}

// EncodePrompt tokenizes a rendered prompt for the model: the template's
// control tokens become their ids and the conversation's never do; BOS is
// added when the tokenizer wants one and the template did not write it.
// maxTokens, when positive, bounds the result (see
// tokenizer.EncodeOptions.MaxTokens): the error is then a
// *tokenizer.TooManyTokensError.
func EncodePrompt(tok *tokenizer.Tokenizer, p Prompt, maxTokens int) ([]int, error) {
	addBOS := tok.AddBOS() && tok.BOS() >= 0
	if addBOS && strings.HasPrefix(p.Text, tok.TokenText(tok.BOS())) && (len(p.Plain) == 0 || p.Plain[0].Start > 0) {
		addBOS = false // the template wrote it
	}
	ids, err := tok.EncodeWith(p.Text, tokenizer.EncodeOptions{AddBOS: addBOS, ParseSpecial: true, Plain: p.Plain, MaxTokens: maxTokens})
	if err != nil {
		return nil, fmt.Errorf("chat: %w", err)
	}
	return ids, nil
}
