package tokenizer

import (
	"sync"
	"unicode"
	"unicode/utf8"
)

// Character classes the pre-tokenizers test. llama.cpp derives its tables
// from the Unicode general categories (\p{L}, \p{N}) and the White_Space
// property (\s); Go's unicode package carries the same data (Unicode 15), so
// the two agree except for characters assigned after that version.
const (
	clLetter uint8 = 1 << iota // \p{L}
	clNumber                   // \p{N}
	clSpace                    // \s (White_Space: \t \n \v \f \r, space, U+0085, U+00A0, U+1680, ...)
)

// bmpClasses caches the classes of the Basic Multilingual Plane, where almost
// all text lives: one table lookup instead of three binary searches per rune.
var (
	bmpClasses     [0x10000]uint8
	bmpClassesOnce sync.Once
)

func initClasses() {
	for r := rune(0); r < 0x10000; r++ {
		bmpClasses[r] = computeClass(r)
	}
}

func computeClass(r rune) uint8 {
	var c uint8
	if unicode.IsLetter(r) {
		c |= clLetter
	}
	if unicode.IsNumber(r) {
		c |= clNumber
	}
	if unicode.IsSpace(r) {
		c |= clSpace
	}
	return c
}

// classOf returns the classes of r. Callers must have run bmpClassesOnce.
func classOf(r rune) uint8 {
	if uint32(r) < 0x10000 {
		return bmpClasses[r]
	}
	return computeClass(r)
}

// isCSpace is C's isspace in the "C" locale, which llama.cpp uses when it
// strips whitespace around special tokens.
func isCSpace(b byte) bool {
	return b == ' ' || (b >= '\t' && b <= '\r')
}

// utf8SeqLen is llama.cpp's unicode_len_utf8: the sequence length announced
// by a lead byte, judged from its high nibble only (continuation and invalid
// bytes count as 1). The SentencePiece tokenizer cuts its input into
// "characters" this way, so invalid UTF-8 still splits deterministically.
func utf8SeqLen(b byte) int {
	switch b >> 4 {
	case 0xC, 0xD:
		return 2
	case 0xE:
		return 3
	case 0xF:
		return 4
	}
	return 1
}

// sanitizeUTF8 replaces every byte that does not start a valid UTF-8
// sequence with U+FFFD, one replacement per byte, as llama.cpp's
// unicode_cpts_from_utf8 does before byte-level BPE. Valid text is returned
// unchanged without copying.
func sanitizeUTF8(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	b := make([]byte, 0, len(s)+8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b = utf8.AppendRune(b, utf8.RuneError)
		} else {
			b = append(b, s[i:i+n]...)
		}
		i += n
	}
	return string(b)
}

// GPT-2's byte-level alphabet: every byte value is given a printable
// character so that vocabularies and merges can be stored as text. Bytes that
// are printable Latin-1 map to themselves; the other 68 (controls, space,
// DEL, NBSP, soft hyphen...) map in order to U+0100, U+0101, ... U+0143.
var (
	byteToRune [256]rune
	// runeToByte inverts byteToRune for runes below len(runeToByte); -1
	// marks a rune outside the alphabet.
	runeToByte [0x144]int16
)

func init() {
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	n := rune(0)
	for b := 0; b < 256; b++ {
		r := rune(b)
		printable := (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if !printable {
			r = 0x100 + n
			n++
		}
		byteToRune[b] = r
		runeToByte[r] = int16(b)
	}
}

// byteOfRune returns the byte a character of the alphabet stands for.
func byteOfRune(r rune) (byte, bool) {
	if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
		return 0, false
	}
	return byte(runeToByte[r]), true
}

// appendByteLevel appends the raw bytes a byte-level text stands for; ok is
// false (and dst returned as given) when a character is outside the alphabet.
func appendByteLevel(dst []byte, s string) (_ []byte, ok bool) {
	n := len(dst)
	for _, r := range s {
		b, in := byteOfRune(r)
		if !in {
			return dst[:n], false
		}
		dst = append(dst, b)
	}
	return dst, true
}

// decodeByteLevel turns a byte-level token text back into the raw bytes it
// stands for.
func decodeByteLevel(s string) (raw string, ok bool) {
	b, ok := appendByteLevel(make([]byte, 0, len(s)), s)
	return string(b), ok
}
