package tokenizer

import (
	"bytes"
	"errors"
	"slices"
	"sort"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/atsinfer/ats/gguf"
)

func TestSpecialTokens(t *testing.T) {
	tok := loadVocab(t, "qwen3")
	imStart, _ := tok.Lookup("<|im_start|>")
	imEnd, _ := tok.Lookup("<|im_end|>")
	think, _ := tok.Lookup("<think>")
	if imStart != 151644 || imEnd != 151645 || think != 151667 {
		t.Fatalf("Lookup: <|im_start|>=%d <|im_end|>=%d <think>=%d", imStart, imEnd, think)
	}

	text := "<|im_start|>user\nHi there<|im_end|>\n"
	parsed := tok.Encode(text, false, true)
	if parsed[0] != imStart || !slices.Contains(parsed, imEnd) {
		t.Errorf("parseSpecial=true: %v lacks the control tokens", parsed)
	}
	want := append([]int{imStart}, tok.Encode("user\nHi there", false, false)...)
	want = append(append(want, imEnd), tok.Encode("\n", false, false)...)
	if !slices.Equal(parsed, want) {
		t.Errorf("parseSpecial=true:\n got %v\nwant %v", parsed, want)
	}
	if got := tok.DecodeSpecial(parsed); got != text {
		t.Errorf("DecodeSpecial = %q, want %q", got, text)
	}
	if got := tok.Decode(parsed); got != "user\nHi there\n" {
		t.Errorf("Decode hides control tokens: got %q", got)
	}

	literal := tok.Encode(text, false, false)
	if slices.Contains(literal, imStart) || slices.Contains(literal, imEnd) {
		t.Errorf("parseSpecial=false matched control tokens: %v", literal)
	}
	if got := tok.Decode(literal); got != text {
		t.Errorf("Decode(literal) = %q, want %q", got, text)
	}

	// User-defined tokens are matched even without parsing (llama.cpp and
	// Hugging Face agree), and always render as their text.
	for _, parse := range []bool{false, true} {
		ids := tok.Encode("a<think>b</think>", false, parse)
		if !slices.Contains(ids, think) {
			t.Errorf("parseSpecial=%v: <think> not matched: %v", parse, ids)
		}
		if got := tok.Decode(ids); got != "a<think>b</think>" {
			t.Errorf("Decode = %q", got)
		}
	}
	if tok.Piece(imEnd, false) != "" || tok.Piece(imEnd, true) != "<|im_end|>" || !tok.IsControl(imEnd) {
		t.Errorf("Piece(<|im_end|>): %q / %q", tok.Piece(imEnd, false), tok.Piece(imEnd, true))
	}
	if tok.Piece(think, false) != "<think>" || tok.IsControl(think) {
		t.Errorf("Piece(<think>, false) = %q", tok.Piece(think, false))
	}
}

// Phi-3's special tokens swallow the whitespace after them, as llama.cpp
// hard-codes for that model.
func TestPhi3RStrip(t *testing.T) {
	tok := loadVocab(t, "phi-3")
	user, _ := tok.Lookup("<|user|>")
	end, _ := tok.Lookup("<|end|>")
	got := tok.Encode("<|user|>\n  Hi<|end|>\n", false, true)
	want := append([]int{user}, tok.Encode("Hi", false, false)...)
	want = append(want, end)
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestBOS(t *testing.T) {
	for _, tc := range []struct {
		name        string
		bos, eos    int
		addBOS      bool
		eogs, other []int
	}{
		{"qwen3", 11, 151645, false, []int{151643, 151645, 151662, 151663, 151664}, []int{151644, 151667, 0, 11}},
		{"llama3", 128000, 128001, true, []int{128001, 128009}, []int{128000, 128006, 13}},
		{"gpt-2", 50256, 50256, false, []int{50256}, []int{0}},
		{"llama-spm", 1, 2, true, []int{2}, []int{0, 1, 13}},
		{"phi-3", 1, 32000, true, []int{32000, 32007}, []int{1, 32001, 32010}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := loadVocab(t, tc.name)
			if tok.BOS() != tc.bos || tok.EOS() != tc.eos || tok.AddBOS() != tc.addBOS || tok.AddEOS() {
				t.Errorf("BOS=%d EOS=%d AddBOS=%v AddEOS=%v, want %d %d %v false", tok.BOS(), tok.EOS(), tok.AddBOS(), tok.AddEOS(), tc.bos, tc.eos, tc.addBOS)
			}
			plain := tok.Encode("Hello world", false, false)
			withBOS := tok.Encode("Hello world", true, false)
			if !slices.Equal(withBOS, append([]int{tc.bos}, plain...)) {
				t.Errorf("Encode with BOS = %v, without = %v", withBOS, plain)
			}
			if got := tok.Encode("", true, false); !slices.Equal(got, []int{tc.bos}) {
				t.Errorf("Encode(\"\", BOS) = %v", got)
			}
			for _, id := range tc.eogs {
				if !tok.IsEOG(id) {
					t.Errorf("IsEOG(%d %q) = false", id, tok.TokenText(id))
				}
			}
			for _, id := range append(tc.other, -1, tok.VocabSize()) {
				if tok.IsEOG(id) {
					t.Errorf("IsEOG(%d %q) = true", id, tok.TokenText(id))
				}
			}
		})
	}
	// llama.cpp's detokenizer removes the SPM space prefix from the first
	// token only; a leading BOS (rendered as nothing) uses up that removal.
	spm := loadVocab(t, "llama-spm")
	if got := spm.Decode(spm.Encode("Hello", true, false)); got != " Hello" {
		t.Errorf("SPM Decode(BOS Hello) = %q, want %q", got, " Hello")
	}
	if got := spm.DecodeSpecial(spm.Encode("Hello", true, false)); got != "<s> Hello" {
		t.Errorf("SPM DecodeSpecial(BOS Hello) = %q, want %q", got, "<s> Hello")
	}
}

// streamAll feeds ids to a Stream and returns each Add's output and the
// Flush output.
func streamAll(tok *Tokenizer, ids []int, special bool) (chunks []string, rest string) {
	s := tok.NewStream(special)
	for _, id := range ids {
		chunks = append(chunks, s.Add(id))
	}
	return chunks, s.Flush()
}

func TestStreamHoldsIncompleteCharacters(t *testing.T) {
	for _, tc := range []struct{ vocab, text string }{
		{"qwen3", "Llamas 🦙 and 世界 — ça va? 😁👍🏽"},
		{"llama3", "emoji 🦙🦙 and Κ𝔸ℤ"},
		{"llama-spm", "🦙 byte fallback ꙮ"},
		{"phi-3", "🦙 ꙮ!"},
	} {
		t.Run(tc.vocab, func(t *testing.T) {
			tok := loadVocab(t, tc.vocab)
			ids := tok.Encode(tc.text, false, false)
			chunks, rest := streamAll(tok, ids, false)
			held := 0
			for i, c := range chunks {
				if !utf8.ValidString(c) {
					t.Errorf("Add(%d) returned invalid UTF-8 %q", ids[i], c)
				}
				if c == "" && tok.Piece(ids[i], false) != "" {
					held++
				}
			}
			if held == 0 {
				t.Errorf("no token was held back; the test text should split characters: %v", ids)
			}
			got := strings.Join(chunks, "") + rest
			want := tc.text
			if tok.addSpacePrefix {
				want = " " + want // the stream keeps the SPM prefix space
			}
			if got != want || rest != "" {
				t.Errorf("streamed %q (rest %q), want %q", got, rest, want)
			}
		})
	}
}

func TestStreamByteTokens(t *testing.T) {
	tok := loadVocab(t, "llama-spm")
	b := func(x byte) int { return int(tok.spm.byteTok[x]) }
	// 🦙 is F0 9F A6 99: three tokens give nothing, the fourth the character.
	chunks, rest := streamAll(tok, []int{b(0xF0), b(0x9F), b(0xA6), b(0x99), b('!')}, false)
	if want := []string{"", "", "", "🦙", "!"}; !slices.Equal(chunks, want) || rest != "" {
		t.Errorf("chunks %q rest %q, want %q", chunks, rest, want)
	}
	// A byte that can never start a character is not held; an unfinished
	// character at the end comes out of Flush.
	chunks, rest = streamAll(tok, []int{b(0xFF), b('a'), b(0xE4), b(0xB8)}, false)
	if want := []string{"\xff", "a", "", ""}; !slices.Equal(chunks, want) || rest != "\xe4\xb8" {
		t.Errorf("chunks %q rest %q", chunks, rest)
	}
	// Control tokens: nothing unless asked.
	if chunks, _ := streamAll(tok, []int{1, 2}, false); strings.Join(chunks, "") != "" {
		t.Errorf("control tokens rendered: %q", chunks)
	}
	if chunks, _ := streamAll(tok, []int{1, 2}, true); strings.Join(chunks, "") != "<s></s>" {
		t.Errorf("control tokens with special: %q", chunks)
	}
}

func TestPieceOutOfRange(t *testing.T) {
	tok := loadVocab(t, "gpt-2")
	for _, id := range []int{-1, tok.VocabSize(), 1 << 40} {
		if tok.Piece(id, true) != "" || tok.TokenText(id) != "" || tok.IsControl(id) {
			t.Errorf("id %d: not empty", id)
		}
	}
	if got := tok.Decode([]int{-5, 15496, 1 << 30}); got != "Hello" {
		t.Errorf("Decode with bad ids = %q", got)
	}
}

// tinyVocab is a small byte-level BPE vocabulary: the 256 byte characters,
// a few merged tokens and one control token.
func tinyVocab() map[string]gguf.Value {
	var tokens []string
	for b := 0; b < 256; b++ {
		tokens = append(tokens, string(byteToRune[b]))
	}
	tokens = append(tokens, "he", "ll", "hell", "hello", "<|endoftext|>")
	types := make([]int32, len(tokens))
	for i := range types {
		types[i] = typeNormal
	}
	types[len(types)-1] = typeControl
	return map[string]gguf.Value{
		"general.architecture": gguf.String("llama"),
		keyModel:               gguf.String("gpt2"),
		keyPre:                 gguf.String("qwen2"),
		keyTokens:              gguf.MustArray(tokens),
		keyTokenType:           gguf.MustArray(types),
		keyMerges:              gguf.MustArray([]string{"h e", "l l", "he ll", "hell o"}),
		keyEOS:                 gguf.Uint32(uint32(len(tokens) - 1)),
		keyAddBOS:              gguf.Bool(false),
	}
}

// fileOf writes metadata to an in-memory GGUF file.
func fileOf(t *testing.T, kv map[string]gguf.Value) *gguf.File {
	t.Helper()
	var buf bytes.Buffer
	w := gguf.NewWriter(&buf)
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		w.Set(k, kv[k])
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Parse("tiny.gguf", buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestTinyVocab(t *testing.T) {
	tok, err := FromGGUF(fileOf(t, tinyVocab()), nil)
	if err != nil {
		t.Fatal(err)
	}
	hello, _ := tok.Lookup("hello")
	if got := tok.Encode("hello", false, false); !slices.Equal(got, []int{hello}) {
		t.Errorf("Encode(hello) = %v, want [%d]", got, hello)
	}
	// "hel" merges h+e only: "he" then "l".
	he, _ := tok.Lookup("he")
	l, _ := tok.Lookup("l")
	if got := tok.Encode("hel", false, false); !slices.Equal(got, []int{he, l}) {
		t.Errorf("Encode(hel) = %v", got)
	}
	eos := tok.EOS()
	if !tok.IsEOG(eos) || tok.BOS() != 11 || tok.Pre() != "qwen2" {
		t.Errorf("EOS %d EOG %v BOS %d pre %q", eos, tok.IsEOG(eos), tok.BOS(), tok.Pre())
	}
	if got := tok.Encode("x<|endoftext|>", false, true); got[len(got)-1] != eos {
		t.Errorf("special token not parsed: %v", got)
	}
}

func TestUnknownPreTokenizerWarns(t *testing.T) {
	for _, tc := range []struct{ pre, wantPre, wantMsg string }{
		{"brand-new-pre", "llama-bpe", `unknown pre-tokenizer "brand-new-pre"`},
		{"qwen35", "qwen2", `using the closest known one, "qwen2"`},
		{"", "default", "is missing"},
	} {
		kv := tinyVocab()
		if tc.pre == "" {
			delete(kv, keyPre)
		} else {
			kv[keyPre] = gguf.String(tc.pre)
		}
		var warnings []string
		tok, err := FromGGUF(fileOf(t, kv), func(s string) { warnings = append(warnings, s) })
		if err != nil {
			t.Fatal(err)
		}
		if tok.Pre() != tc.wantPre {
			t.Errorf("pre %q: using %q, want %q", tc.pre, tok.Pre(), tc.wantPre)
		}
		if len(warnings) != 1 || !strings.Contains(warnings[0], tc.wantMsg) || !strings.Contains(warnings[0], keyPre) {
			t.Errorf("pre %q: warnings %q, want one containing %q", tc.pre, warnings, tc.wantMsg)
		}
		if got := tok.Decode(tok.Encode("hello hello", false, false)); got != "hello hello" {
			t.Errorf("pre %q: round trip gave %q", tc.pre, got)
		}
	}
}

func TestBadMetadata(t *testing.T) {
	for _, tc := range []struct {
		name   string
		mutate func(kv map[string]gguf.Value)
		want   string // in the error
	}{
		{"no model", func(kv map[string]gguf.Value) { delete(kv, keyModel) }, keyModel},
		{"model type", func(kv map[string]gguf.Value) { kv[keyModel] = gguf.Uint32(2) }, keyModel},
		{"unsupported model", func(kv map[string]gguf.Value) { kv[keyModel] = gguf.String("bert") }, `"bert"`},
		{"no tokens", func(kv map[string]gguf.Value) { delete(kv, keyTokens) }, keyTokens},
		{"empty tokens", func(kv map[string]gguf.Value) { kv[keyTokens] = gguf.MustArray([]string{}) }, keyTokens},
		{"tokens not strings", func(kv map[string]gguf.Value) { kv[keyTokens] = gguf.MustArray([]int32{1, 2}) }, keyTokens},
		{"duplicate token", func(kv map[string]gguf.Value) {
			kv[keyTokens] = gguf.MustArray([]string{"a", "b", "a"})
			kv[keyTokenType] = gguf.MustArray([]int32{1, 1, 1})
			kv[keyEOS] = gguf.Uint32(1)
		}, "twice"},
		{"short token_type", func(kv map[string]gguf.Value) { kv[keyTokenType] = gguf.MustArray([]int32{1, 1}) }, keyTokenType},
		{"token_type not ints", func(kv map[string]gguf.Value) { kv[keyTokenType] = gguf.MustArray([]string{"x"}) }, keyTokenType},
		{"short scores", func(kv map[string]gguf.Value) { kv[keyScores] = gguf.MustArray([]float32{0}) }, keyScores},
		{"no merges", func(kv map[string]gguf.Value) { delete(kv, keyMerges) }, keyMerges},
		{"merge without space", func(kv map[string]gguf.Value) { kv[keyMerges] = gguf.MustArray([]string{"h e", "ll"}) }, "merge 1"},
		{"empty merge", func(kv map[string]gguf.Value) { kv[keyMerges] = gguf.MustArray([]string{""}) }, keyMerges},
		{"eos out of range", func(kv map[string]gguf.Value) { kv[keyEOS] = gguf.Uint32(1 << 20) }, keyEOS},
		{"bos negative", func(kv map[string]gguf.Value) { kv[keyBOS] = gguf.Int32(-1) }, keyBOS},
		{"bos not a number", func(kv map[string]gguf.Value) { kv[keyBOS] = gguf.String("1") }, keyBOS},
		{"add_bos not bool", func(kv map[string]gguf.Value) { kv[keyAddBOS] = gguf.Uint8(1) }, keyAddBOS},
		{"pre not string", func(kv map[string]gguf.Value) { kv[keyPre] = gguf.Uint32(1) }, keyPre},
		{"add_eos without eos", func(kv map[string]gguf.Value) {
			kv[keyModel] = gguf.String("llama")
			kv[keyTokens] = gguf.MustArray([]string{"<unk>", "<s>"})
			kv[keyTokenType] = gguf.MustArray([]int32{2, 3})
			delete(kv, keyEOS)
			kv[keyAddEOS] = gguf.Bool(true)
		}, keyAddEOS},
	} {
		t.Run(tc.name, func(t *testing.T) {
			kv := tinyVocab()
			tc.mutate(kv)
			_, err := FromGGUF(fileOf(t, kv), nil)
			if err == nil {
				t.Fatal("no error")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not mention %q", err, tc.want)
			}
		})
	}
	// A missing key keeps gguf's typed error reachable.
	kv := tinyVocab()
	delete(kv, keyTokens)
	_, err := FromGGUF(fileOf(t, kv), nil)
	var missing *gguf.MissingKeyError
	if !errors.As(err, &missing) || missing.Key != keyTokens {
		t.Errorf("error %v is not a MissingKeyError for %q", err, keyTokens)
	}
}

// An optional id out of range is dropped with a warning, as llama.cpp does.
func TestOptionalIDOutOfRange(t *testing.T) {
	kv := tinyVocab()
	kv[keyFIMPad] = gguf.Uint32(1 << 20)
	var warnings []string
	if _, err := FromGGUF(fileOf(t, kv), func(s string) { warnings = append(warnings, s) }); err != nil {
		t.Fatal(err)
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], keyFIMPad) {
		t.Errorf("warnings %q", warnings)
	}
}

// Tokenizing SentencePiece text word by word must give what llama.cpp's
// single queue over the whole text gives.
func TestSPMWordsMatchWholeText(t *testing.T) {
	if !spaceOnlyLeads("▁▁a") || spaceOnlyLeads("a▁") || spaceOnlyLeads("▁x▁") || !spaceOnlyLeads("x") {
		t.Error("spaceOnlyLeads")
	}
	texts := []string{mixedText(64 << 10), " \xf0▁ \xe2\x96 ▁▁x  y\xff ", "   ", "a  b\n\n c"}
	for _, c := range readCases(t, "llama-spm") {
		texts = append(texts, c.text)
	}
	for _, name := range []string{"llama-spm", "phi-3"} {
		tok := loadVocab(t, name)
		if !tok.spm.splitWords {
			t.Fatalf("%s: expected a vocabulary with ▁ only at token starts", name)
		}
		sc := new(spmScratch)
		for _, text := range texts {
			esc := escapeSpaces(" " + text)
			got := tok.spm.encode(nil, esc, nil)
			want := tok.spm.encodeWord(sc, nil, esc)
			if !slices.Equal(got, want) {
				t.Errorf("%s: %.60q: word by word differs from whole text", name, text)
			}
		}
	}
}

// A Tokenizer is shared by all requests of a server.
func TestConcurrentEncode(t *testing.T) {
	tok := loadVocab(t, "qwen3")
	text := mixedText(32 << 10)
	want := tok.Encode(text, false, true)
	errs := make(chan string, 4)
	for range 4 {
		go func() {
			for range 3 {
				if got := tok.Encode(text, false, true); !slices.Equal(got, want) {
					errs <- "concurrent Encode differs"
					return
				}
			}
			errs <- ""
		}()
	}
	for range 4 {
		if e := <-errs; e != "" {
			t.Error(e)
		}
	}
}

// A byte-level token with a character outside the byte alphabet renders as
// llama.cpp's llama_decode_text spells it.
func TestUnknownByteLevelCharacter(t *testing.T) {
	kv := tinyVocab()
	tokens := kv[keyTokens].Data().([]string)
	tokens = append(slices.Clone(tokens), "a中")
	kv[keyTokens] = gguf.MustArray(tokens)
	kv[keyTokenType] = gguf.MustArray(append(kv[keyTokenType].Data().([]int32), typeNormal))
	tok, err := FromGGUF(fileOf(t, kv), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tok.Piece(len(tokens)-1, false), "a[UNK_BYTE_0xe4b8ada中]"; got != want {
		t.Errorf("Piece = %q, want %q", got, want)
	}
}
