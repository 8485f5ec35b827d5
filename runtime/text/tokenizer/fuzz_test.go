package tokenizer

import (
	"strings"
	"testing"
	"unicode/utf8"
)

// checkStream feeds ids to a Stream: every chunk must be valid UTF-8 when the
// pieces form valid text, and the chunks together must be the pieces.
func checkStream(t *testing.T, tok *Tokenizer, ids []int) {
	t.Helper()
	var all, pieces strings.Builder
	s := tok.NewStream(false)
	for _, id := range ids {
		c := s.Add(id)
		pieces.WriteString(tok.Piece(id, false))
		if !utf8.ValidString(c) && utf8.ValidString(pieces.String()) {
			t.Fatalf("stream chunk %q is not valid UTF-8", c)
		}
		all.WriteString(c)
	}
	all.WriteString(s.Flush())
	if all.String() != pieces.String() {
		t.Fatalf("stream gave %q, pieces are %q", all.String(), pieces.String())
	}
}

// FuzzBPERoundTrip: byte-level BPE loses nothing on valid UTF-8.
func FuzzBPERoundTrip(f *testing.F) {
	tok := loadVocab(f, "qwen3")
	for _, c := range readCases(f, "qwen3") {
		f.Add(c.text)
	}
	f.Add("<|im_start|>user\nhi<|im_end|><think>x</think>")
	f.Fuzz(func(t *testing.T, s string) {
		// llama.cpp turns each byte of invalid UTF-8 into U+FFFD before
		// byte-level BPE, so that is what comes back.
		want := sanitizeUTF8(s)
		ids := tok.Encode(s, false, false)
		if got := tok.Decode(ids); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
		}
		// Parsed control tokens come back when rendered.
		if got := tok.DecodeSpecial(tok.Encode(s, false, true)); got != want {
			t.Fatalf("DecodeSpecial(Encode(%q, parse)) = %q", s, got)
		}
		checkStream(t, tok, ids)
	})
}

// FuzzSPMRoundTrip: SentencePiece round-trips valid UTF-8, up to what the
// format cannot represent: the space prefix it adds (Decode drops it again)
// and the ▁ character, which is how it spells a space.
func FuzzSPMRoundTrip(f *testing.F) {
	tok := loadVocab(f, "llama-spm")
	for _, c := range readCases(f, "llama-spm") {
		f.Add(c.text)
	}
	f.Add("<s>hi</s> <unk>")
	f.Fuzz(func(t *testing.T, s string) {
		// Byte fallback keeps invalid bytes too, but a stray lead byte
		// swallows the bytes after it, an escaped space's ▁ included, which
		// then comes back as ▁: test valid text.
		s = sanitizeUTF8(s)
		want := strings.ReplaceAll(s, "\u2581", " ")
		ids := tok.Encode(s, false, false)
		// SPM merges may spell a control token out of plain text ("<s>"),
		// as llama.cpp's do; render control tokens to get the text back.
		if got := tok.DecodeSpecial(ids); got != want {
			t.Fatalf("Decode(Encode(%q)) = %q (ids %v)", s, got, ids)
		}
		checkStream(t, tok, ids)
	})
}
