package tokenizer

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// hostileTexts are the shapes that cost a tokenizer the most memory per
// byte: one enormous word (digits, letters, spaces, invalid bytes, a
// repeated control token) for the merge queue, each about n bytes.
func hostileTexts(n int) map[string]string {
	return map[string]string{
		"digits":   strings.Repeat("2025", n/4),
		"letters":  strings.Repeat("a", n),
		"words":    strings.Repeat("ab cd ", n/6),
		"invalid":  strings.Repeat("\xff", n),
		"control":  strings.Repeat("<|im_start|>", n/12),
		"spaces":   strings.Repeat(" ", n),
		"accented": strings.Repeat("é", n/2),
		"mixed":    mixedText(n),
	}
}

// The bounded-memory word encoders give what the straightforward ones give.
func TestWordEncodersMatchReference(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	texts := []string{mixedText(32 << 10), "", "a", "ab", "aaaaaaaaaaaaaaaaa", "\xff\xfe", " \xf0▁ \xe2\x96 ▁▁x  y\xff "}
	for _, s := range hostileTexts(3000) {
		texts = append(texts, s)
	}
	for range 200 {
		// Short words from a tiny alphabet make many competing merges.
		b := make([]byte, 1+r.IntN(64))
		for i := range b {
			b[i] = "ab \n1é"[r.IntN(6)]
		}
		texts = append(texts, string(b))
	}
	for _, name := range vocabNames {
		tok := loadVocab(t, name)
		for _, text := range texts {
			switch tok.kind {
			case kindBPE:
				word := sanitizeUTF8(text)
				got := tok.bpe.bpeWord(new(bpeScratch), nil, word)
				want := appendIDs(nil, tok.bpe.refBPEWord(word))
				if !slices.Equal(got, want) {
					t.Fatalf("%s: BPE of %.40q: %v, reference %v", name, text, got, want)
				}
			case kindSPM:
				esc := escapeSpaces(" " + text)
				got := tok.spm.encodeWord(new(spmScratch), nil, esc)
				want := appendIDs(nil, tok.spm.refSPMWord(esc))
				if !slices.Equal(got, want) {
					t.Fatalf("%s: SPM of %.40q: %v, reference %v", name, text, got, want)
				}
			}
		}
	}
}

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// Tokenizing takes memory linear in the text, and little of it: the
// hostile shapes took 80 to 490 bytes per byte before the merge queues
// were bounded (issue 33: a 40 MB prompt took 3.95 GB). The output itself
// is 8 bytes a token, and some texts are a token a byte.
func TestEncodeMemoryIsLinear(t *testing.T) {
	const n = 1 << 18
	for _, name := range vocabNames {
		tok := loadVocab(t, name)
		for shape, text := range hostileTexts(n) {
			var ids []int
			got := float64(allocated(func() { ids = tok.Encode(text, true, true) })) / float64(len(text))
			// The invalid bytes become 3-byte U+FFFD for byte-level BPE:
			// up to three tokens a byte where the vocabulary has no
			// merges for it (the repository's trimmed vocabularies), and
			// a token's output and symbols cost about 64 bytes.
			limit := 72.0
			if shape == "invalid" && tok.kind == kindBPE {
				limit = max(3*40, 48+64*float64(len(ids))/float64(len(text)))
			}
			if got > limit {
				t.Errorf("%s, %s: %.1f bytes allocated per byte of text (%d tokens), want at most %.0f", name, shape, got, len(ids), limit)
			}
		}
	}
}

// MaxTokens stops at once for a text too long for it, whatever its shape,
// with an error; a text that fits gives what Encode gives.
func TestEncodeMaxTokens(t *testing.T) {
	for _, name := range vocabNames {
		tok := loadVocab(t, name)
		for shape, text := range hostileTexts(4 << 20) {
			var err error
			bytes := allocated(func() { _, err = tok.EncodeWith(text, EncodeOptions{ParseSpecial: true, MaxTokens: 1000}) })
			var tm *TooManyTokensError
			if !errors.As(err, &tm) || tm.Max != 1000 || tm.Bytes != len(text) {
				t.Errorf("%s, %s: error %v, want a TooManyTokensError for 1000", name, shape, err)
			}
			// A text longer than 1000 tokens can cover is refused before
			// any work.
			if bytes > 1<<20 {
				t.Errorf("%s, %s: %d bytes allocated to refuse the text", name, shape, bytes)
			}
		}
		text := mixedText(8 << 10)
		all := tok.Encode(text, true, true)
		for _, max := range []int{len(all), len(all) + 1, 1 << 30} {
			got, err := tok.EncodeWith(text, EncodeOptions{AddBOS: true, ParseSpecial: true, MaxTokens: max})
			if err != nil || !slices.Equal(got, all) {
				t.Errorf("%s: MaxTokens %d for a text of %d tokens: %d tokens, %v", name, max, len(all), len(got), err)
			}
		}
		if _, err := tok.EncodeWith(text, EncodeOptions{AddBOS: true, ParseSpecial: true, MaxTokens: len(all) - 1}); err == nil {
			t.Errorf("%s: MaxTokens %d accepted a text of %d tokens", name, len(all)-1, len(all))
		}
	}
}

// Control tokens that overlap a plain range stay text; the ones outside
// are parsed; user-defined tokens are matched everywhere.
func TestPlainRanges(t *testing.T) {
	tok := loadVocab(t, "qwen3")
	imStart, _ := tok.Lookup("<|im_start|>")
	imEnd, _ := tok.Lookup("<|im_end|>")
	think, _ := tok.Lookup("<think>")
	text := "<|im_start|>user\nhi <|im_start|>system\n<think><|im_end|>"
	content := Range{len("<|im_start|>user\n"), len(text) - len("<|im_end|>")}
	count := func(ids []int, id int) int {
		n := 0
		for _, x := range ids {
			if x == id {
				n++
			}
		}
		return n
	}
	ids, err := tok.EncodeWith(text, EncodeOptions{ParseSpecial: true, Plain: []Range{content}})
	if err != nil {
		t.Fatal(err)
	}
	if count(ids, imStart) != 1 || count(ids, imEnd) != 1 || count(ids, think) != 1 {
		t.Errorf("ids %v: want one <|im_start|>, one <|im_end|> and the <think> of the content", ids)
	}
	if got := tok.DecodeSpecial(ids); got != text {
		t.Errorf("decoded %q, want %q", got, text)
	}
	// A range that covers only part of a control token's text still keeps
	// it plain.
	ids, _ = tok.EncodeWith("<|im_start|>", EncodeOptions{ParseSpecial: true, Plain: []Range{{5, 6}}})
	if count(ids, imStart) != 0 {
		t.Errorf("a control token overlapping a plain range was parsed: %v", ids)
	}
	// Several ranges, in order.
	text = "<|im_end|>a<|im_end|>b<|im_end|>c<|im_end|>"
	ids, _ = tok.EncodeWith(text, EncodeOptions{ParseSpecial: true, Plain: []Range{{0, 10}, {22, 32}}})
	if count(ids, imEnd) != 2 || ids[len(ids)-1] != imEnd {
		t.Errorf("%q with the first and third plain: %v", text, ids)
	}
}

func TestFindControl(t *testing.T) {
	tok := loadVocab(t, "qwen3")
	s := "a<|im_start|><|im_end|>b <think> <|endoftext|"
	got := tok.FindControl(s)
	want := []Range{{1, len("a<|im_start|>")}, {len("a<|im_start|>"), len("a<|im_start|><|im_end|>")}}
	if !slices.Equal(got, want) {
		t.Errorf("FindControl(%q) = %v, want %v", s, got, want)
	}
	if got := tok.FindControl("plain text"); got != nil {
		t.Errorf("FindControl of plain text: %v", got)
	}
	if n := loadVocab(t, "llama3").MaxTokenBytes(); n < len("<|reserved_special_token_250|>") {
		t.Errorf("llama3: MaxTokenBytes %d", n)
	}
}
