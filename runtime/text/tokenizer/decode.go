package tokenizer

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// appendPiece appends what llama.cpp's token_to_piece gives with
// special=true: the text a token stands for. Control, unknown and
// user-defined tokens render as their vocabulary text; normal tokens are
// un-escaped (▁ → space for SPM, the byte-level alphabet → bytes for BPE);
// SPM byte tokens <0xXX> become that byte; unused and undefined tokens
// render as nothing. A piece may hold part of a UTF-8 character.
func (t *Tokenizer) appendPiece(dst []byte, id int) []byte {
	text, a := t.tokens[id], t.attrs[id]
	switch {
	case a&(attrUnknown|attrControl|attrUserDefined) != 0:
		return append(dst, text...)
	case a&attrNormal != 0:
		if t.kind == kindSPM {
			return append(dst, strings.ReplaceAll(text, spmSpace, " ")...)
		}
		if out, ok := appendByteLevel(dst, text); ok {
			return out
		}
		return appendUnknownBytes(dst, text)
	case a&attrByte != 0:
		if b, ok := parseByteToken(text); ok {
			return append(dst, b)
		}
	}
	return dst
}

// setPieces renders every token once; the pieces share one allocation.
func (t *Tokenizer) setPieces() {
	var buf []byte
	ends := make([]int, len(t.tokens))
	for id := range t.tokens {
		buf = t.appendPiece(buf, id)
		ends[id] = len(buf)
	}
	all := string(buf)
	t.pieces = make([]string, len(t.tokens))
	start := 0
	for id, end := range ends {
		t.pieces[id] = all[start:end]
		start = end
	}
}

// appendUnknownBytes is llama.cpp's llama_decode_text for a byte-level token
// with characters outside the alphabet (possible only in a hand-edited
// vocabulary): they are spelled out rather than dropped.
func appendUnknownBytes(dst []byte, text string) []byte {
	for _, r := range text {
		if c, ok := byteOfRune(r); ok {
			dst = append(dst, c)
			continue
		}
		dst = append(dst, "[UNK_BYTE_0x"...)
		for _, c := range []byte(string(r)) {
			dst = fmt.Appendf(dst, "%02x", c)
		}
		dst = append(dst, text...)
		dst = append(dst, ']')
	}
	return dst
}

// parseByteToken reads the byte of an SPM byte token "<0xXX>".
func parseByteToken(s string) (byte, bool) {
	if len(s) != 6 || s[:3] != "<0x" || s[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(s[3:5]) {
		switch {
		case c >= '0' && c <= '9':
			v = v<<4 | (c - '0')
		case c >= 'A' && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		case c >= 'a' && c <= 'f':
			v = v<<4 | (c - 'a' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

// Piece returns the text of one token: llama.cpp's token_to_piece. With
// special false, control and unknown tokens (<|im_end|>, <s>) render as "".
// The piece may be an incomplete UTF-8 sequence (a byte token, or part of an
// emoji); use a Stream to print tokens as they arrive. Ids outside the
// vocabulary render as "".
func (t *Tokenizer) Piece(id int, special bool) string {
	if id < 0 || id >= len(t.pieces) {
		return ""
	}
	if !special && t.attrs[id]&(attrUnknown|attrControl) != 0 {
		return ""
	}
	return t.pieces[id]
}

// Decode returns the text of ids, with control tokens rendered as nothing.
// For SentencePiece vocabularies that add a space prefix, the first token
// loses one leading space, so Decode(Encode(s, false, false)) == s for valid
// UTF-8 (and, for SentencePiece, text without ▁, its spelling of a space).
//
// It is llama.cpp's llama_detokenize with remove_special and unparse_special
// false. (llama.cpp also "cleans" spaces before punctuation there for some
// BPE vocabularies; ats keeps the text exact, as llama.cpp's streamed
// output does.)
func (t *Tokenizer) Decode(ids []int) string { return t.decode(ids, false) }

// DecodeSpecial is Decode with control tokens rendered as their text
// (<|im_end|>, <s>).
func (t *Tokenizer) DecodeSpecial(ids []int) string { return t.decode(ids, true) }

func (t *Tokenizer) decode(ids []int, special bool) string {
	var b strings.Builder
	removeSpace := t.addSpacePrefix
	for _, id := range ids {
		p := t.Piece(id, special)
		if removeSpace && strings.HasPrefix(p, " ") {
			p = p[1:]
		}
		removeSpace = false // only the first token, even when it renders as ""
		b.WriteString(p)
	}
	return b.String()
}

// Stream turns tokens into text as they are generated. A token may end in
// the middle of a UTF-8 character (byte-level BPE splits emoji and CJK
// characters over several tokens; SPM spells rare characters as byte
// tokens), so Add holds such a tail back until a later token completes it.
// Bytes that cannot start or continue a valid character are passed through
// unchanged, so the concatenated output always equals the decoded bytes.
type Stream struct {
	t       *Tokenizer
	special bool
	pending []byte
}

// NewStream returns a Stream; special renders control tokens as their text.
// Unlike Decode it keeps the leading space of the first piece, as
// llama.cpp's generation output does.
func (t *Tokenizer) NewStream(special bool) *Stream { return &Stream{t: t, special: special} }

// Add appends a token and returns the text that is now complete (possibly "").
func (s *Stream) Add(id int) string {
	s.pending = append(s.pending, s.t.Piece(id, s.special)...)
	n := completeUTF8(s.pending)
	if n == 0 {
		return ""
	}
	out := string(s.pending[:n])
	s.pending = s.pending[:copy(s.pending, s.pending[n:])]
	return out
}

// Flush returns whatever is held back (an unfinished character, as raw
// bytes) and resets the stream.
func (s *Stream) Flush() string {
	out := string(s.pending)
	s.pending = s.pending[:0]
	return out
}

// completeUTF8 returns the length of the longest prefix of p that does not
// end inside a character that more bytes could still complete.
func completeUTF8(p []byte) int {
	// A character has at most 4 bytes: look back for its first byte.
	for i := len(p) - 1; i >= 0 && i >= len(p)-utf8.UTFMax; i-- {
		if utf8.RuneStart(p[i]) {
			// FullRune is false only for a valid but unfinished prefix.
			if !utf8.FullRune(p[i:]) {
				return i
			}
			break
		}
	}
	return len(p)
}
