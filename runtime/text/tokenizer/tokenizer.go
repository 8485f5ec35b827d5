// Package tokenizer turns text into token ids and back for GGUF models, the
// way llama.cpp does (src/llama-vocab.cpp), so that ats feeds a model exactly
// the ids llama.cpp would:
//
//   - byte-level BPE (tokenizer.ggml.model "gpt2": GPT-2, Llama 3, Qwen2/3,
//     DeepSeek, ...) with the pre-tokenizer named by tokenizer.ggml.pre;
//   - SentencePiece BPE (tokenizer.ggml.model "llama": Llama 2, Phi-3,
//     Mistral v1, ...) with byte fallback;
//   - special tokens (control and user-defined) matched before either;
//   - detokenization, including a Stream that only ever returns whole UTF-8
//     characters while tokens arrive one at a time.
//
// A Tokenizer is safe for concurrent use.
package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/atsinfer/ats/gguf"
)

// Metadata keys read by FromGGUF.
const (
	keyModel       = "tokenizer.ggml.model"
	keyPre         = "tokenizer.ggml.pre"
	keyTokens      = "tokenizer.ggml.tokens"
	keyScores      = "tokenizer.ggml.scores"
	keyTokenType   = "tokenizer.ggml.token_type"
	keyMerges      = "tokenizer.ggml.merges"
	keyAddBOS      = "tokenizer.ggml.add_bos_token"
	keyAddEOS      = "tokenizer.ggml.add_eos_token"
	keyAddPrefix   = "tokenizer.ggml.add_space_prefix"
	keyBOS         = "tokenizer.ggml.bos_token_id"
	keyEOS         = "tokenizer.ggml.eos_token_id"
	keyEOT         = "tokenizer.ggml.eot_token_id"
	keyEOM         = "tokenizer.ggml.eom_token_id"
	keyUNK         = "tokenizer.ggml.unknown_token_id"
	keyFIMPad      = "tokenizer.ggml.fim_pad_token_id"
	keyFIMRep      = "tokenizer.ggml.fim_rep_token_id"
	keyFIMSep      = "tokenizer.ggml.fim_sep_token_id"
	keyGeneralName = "general.name"
)

// Token types of tokenizer.ggml.token_type (llama_token_type).
const (
	typeNormal      = 1
	typeUnknown     = 2
	typeControl     = 3
	typeUserDefined = 4
	typeUnused      = 5
	typeByte        = 6
)

// attr is llama.cpp's llama_token_attr, a bit set derived from the token
// type and adjusted by name-based rules at load time.
type attr uint16

const (
	attrUnknown attr = 1 << iota
	attrUnused
	attrNormal
	attrControl
	attrUserDefined
	attrByte
	attrNormalized
	attrLStrip // swallow whitespace before the token when matching it in text
	attrRStrip // swallow whitespace after it
)

type kind uint8

const (
	kindBPE kind = iota // byte-level BPE
	kindSPM             // SentencePiece
)

// Tokenizer encodes and decodes the vocabulary of one model.
type Tokenizer struct {
	kind   kind
	tokens []string // text of each id as stored in the vocabulary
	attrs  []attr
	toID   map[string]int32
	pieces []string // rendered text of each id (control tokens included)

	bos, eos, eot, eom, unk int // -1 when absent
	addBOS, addEOS          bool
	addSpacePrefix          bool // SPM: prefix text with a space (▁)
	eog                     []bool

	special specialMatcher

	maxTokenBytes int  // the most bytes of text one token covers (setLimits)
	stripping     bool // some special token swallows whitespace

	preName string // pre-tokenizer in use (BPE)
	pre     *preTokenizer
	bpe     *bpe
	spm     *spm
}

// FromGGUF builds the tokenizer described by a model's tokenizer.ggml.*
// metadata. warn, which may be nil, receives messages about metadata that
// was accepted with a fallback (an unknown pre-tokenizer, an empty token,
// an out-of-range optional id).
func FromGGUF(f *gguf.File, warn func(string)) (*Tokenizer, error) {
	if warn == nil {
		warn = func(string) {}
	}
	model, err := f.String(keyModel)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	t := &Tokenizer{bos: -1, eos: -1, eot: -1, eom: -1, unk: -1}
	var pre preset
	switch model {
	case "gpt2":
		t.kind = kindBPE
		t.bos, t.eos = 11, 11 // llama.cpp's defaults for BPE files without ids
		name, err := optString(f, keyPre)
		if err != nil {
			return nil, err
		}
		pre, t.preName = choosePreset(name, warn)
		t.addBOS = pre.addBOS
		if pre.noBOS {
			t.bos = -1
		}
	case "llama":
		t.kind = kindSPM
		t.bos, t.eos, t.unk = 1, 2, 0
		t.addBOS = true
		t.addSpacePrefix = true
	default:
		return nil, fmt.Errorf("tokenizer: metadata key %q: unsupported tokenizer model %q (want \"gpt2\" or \"llama\")", keyModel, model)
	}

	scores, err := t.loadVocab(f, warn)
	if err != nil {
		return nil, err
	}
	if err := t.loadSpecialIDs(f, warn); err != nil {
		return nil, err
	}
	t.detectByText()

	name, err := optString(f, keyGeneralName)
	if err != nil {
		return nil, err
	}
	t.special = newSpecialMatcher(t.tokens, t.attrs)
	t.applyStripRules(strings.ToLower(name))
	t.setPieces()
	t.setLimits()

	switch t.kind {
	case kindBPE:
		merges, err := f.Strings(keyMerges)
		if err != nil {
			return nil, fmt.Errorf("tokenizer: byte-level BPE needs merges: %w", err)
		}
		if t.bpe, err = newBPE(t.tokens, t.toID, merges, pre.ignoreMerges); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		t.pre = &preTokenizer{stages: pre.stages()}
	case kindSPM:
		if scores == nil {
			scores = make([]float32, len(t.tokens))
		}
		t.spm = newSPM(t.tokens, t.toID, scores, t.unk)
	}
	return t, nil
}

// choosePreset maps tokenizer.ggml.pre to a pre-tokenizer, warning when it
// has to guess.
func choosePreset(name string, warn func(string)) (preset, string) {
	if name == "" {
		// As llama.cpp: old conversions without the key get "default".
		warn(fmt.Sprintf("tokenizer: metadata key %q is missing; using the \"default\" pre-tokenizer, tokenization may not match the model's", keyPre))
		return presetDefault, "default"
	}
	if p, ok := presets[name]; ok {
		return p, name
	}
	alt, p := closestPreset(name)
	warn(fmt.Sprintf("tokenizer: unknown pre-tokenizer %q (metadata key %q); using the closest known one, %q, tokenization may not match the model's", name, keyPre, alt))
	return p, alt
}

// loadVocab reads the tokens and their types, and returns the scores (nil
// when the file has none).
func (t *Tokenizer) loadVocab(f *gguf.File, warn func(string)) ([]float32, error) {
	tokens, err := f.Strings(keyTokens)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: %w", err)
	}
	if len(tokens) == 0 {
		return nil, fmt.Errorf("tokenizer: metadata key %q is empty", keyTokens)
	}
	if len(tokens) > 1<<30 {
		return nil, fmt.Errorf("tokenizer: metadata key %q has %d tokens, too many", keyTokens, len(tokens))
	}
	n := len(tokens)
	var types []int64
	if f.Has(keyTokenType) {
		if types, err = f.Ints(keyTokenType); err != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		if len(types) < n {
			return nil, fmt.Errorf("tokenizer: metadata key %q has %d entries for %d tokens", keyTokenType, len(types), n)
		}
	}
	var scores []float32
	if f.Has(keyScores) {
		if scores, err = readScores(f, n); err != nil {
			return nil, err
		}
	}
	t.tokens = make([]string, n)
	t.attrs = make([]attr, n)
	t.toID = make(map[string]int32, n)
	for i, s := range tokens {
		if s == "" {
			warn(fmt.Sprintf("tokenizer: metadata key %q: token %d is empty, renamed [EMPTY_%d]", keyTokens, i, i))
			s = fmt.Sprintf("[EMPTY_%d]", i)
		}
		if j, dup := t.toID[s]; dup {
			return nil, fmt.Errorf("tokenizer: metadata key %q: token %q appears twice (ids %d and %d)", keyTokens, s, j, i)
		}
		t.toID[s] = int32(i)
		t.tokens[i] = s
		t.attrs[i] = attrNormal
		if types != nil {
			t.attrs[i] = attrOfType(types[i])
		}
	}
	return scores, nil
}

func attrOfType(ty int64) attr {
	switch ty {
	case typeNormal:
		return attrNormal
	case typeUnknown:
		return attrUnknown
	case typeControl:
		return attrControl
	case typeUserDefined:
		return attrUserDefined
	case typeUnused:
		return attrUnused
	case typeByte:
		return attrByte
	}
	return 0 // undefined: rendered as nothing, like llama.cpp
}

// readScores reads tokenizer.ggml.scores (float32, or int32 in some
// conversions) and checks it covers every token.
func readScores(f *gguf.File, n int) ([]float32, error) {
	scores, err := f.Float32s(keyScores)
	if err != nil {
		ints, ierr := f.Ints(keyScores)
		if ierr != nil {
			return nil, fmt.Errorf("tokenizer: %w", err)
		}
		scores = make([]float32, len(ints))
		for i, v := range ints {
			scores[i] = float32(v)
		}
	}
	if len(scores) < n {
		return nil, fmt.Errorf("tokenizer: metadata key %q has %d entries for %d tokens", keyScores, len(scores), n)
	}
	return scores, nil
}

// loadSpecialIDs reads the special token ids and the add_* flags. A default
// id outside the vocabulary is dropped; an id from the metadata outside it is
// an error for BOS, EOS, EOT, EOM and UNK (the ones ats uses) and a warning
// for the others, which llama.cpp also tolerates.
func (t *Tokenizer) loadSpecialIDs(f *gguf.File, warn func(string)) error {
	n := len(t.tokens)
	for _, p := range []*int{&t.bos, &t.eos, &t.unk} {
		if *p >= n {
			*p = -1
		}
	}
	fimPad, fimRep, fimSep := -1, -1, -1
	for _, s := range []struct {
		key      string
		dst      *int
		required bool
	}{
		{keyBOS, &t.bos, true}, {keyEOS, &t.eos, true}, {keyEOT, &t.eot, true}, {keyEOM, &t.eom, true},
		{keyUNK, &t.unk, true},
		{keyFIMPad, &fimPad, false}, {keyFIMRep, &fimRep, false}, {keyFIMSep, &fimSep, false},
	} {
		if !f.Has(s.key) {
			continue
		}
		id, err := f.Int(s.key)
		if err != nil {
			return fmt.Errorf("tokenizer: %w", err)
		}
		if id < 0 || id >= int64(n) {
			if s.required {
				return fmt.Errorf("tokenizer: metadata key %q = %d is outside the vocabulary (%d tokens)", s.key, id, n)
			}
			warn(fmt.Sprintf("tokenizer: metadata key %q = %d is outside the vocabulary (%d tokens); ignored", s.key, id, n))
			continue
		}
		*s.dst = int(id)
	}
	t.eog = make([]bool, n)
	for _, id := range []int{fimPad, fimRep, fimSep} {
		if id >= 0 {
			t.eog[id] = true
		}
	}
	for _, b := range []struct {
		key string
		dst *bool
	}{{keyAddBOS, &t.addBOS}, {keyAddEOS, &t.addEOS}, {keyAddPrefix, &t.addSpacePrefix}} {
		if !f.Has(b.key) {
			continue
		}
		v, err := f.Bool(b.key)
		if err != nil {
			return fmt.Errorf("tokenizer: %w", err)
		}
		*b.dst = v
	}
	if t.addBOS && t.bos < 0 {
		return fmt.Errorf("tokenizer: metadata key %q is true but the vocabulary has no BOS token (%q)", keyAddBOS, keyBOS)
	}
	if t.addEOS && t.eos < 0 {
		return fmt.Errorf("tokenizer: metadata key %q is true but the vocabulary has no EOS token (%q)", keyAddEOS, keyEOS)
	}
	return nil
}

// Token texts llama.cpp recognises when the metadata does not name them.
var (
	eotTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
		"<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"}
	eomTexts    = []string{"<|eom_id|>"}
	fimPreTexts = []string{"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"}
	fimSufTexts = []string{"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"}
	fimMidTexts = []string{"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"}
	fimPadTexts = []string{"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}
	fimRepTexts = []string{"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}
	fimSepTexts = []string{"<|file_sep|>"}
	// Tokens that end generation, whatever the metadata says.
	eogTexts = []string{"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
		"<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
		"<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["}
)

// detectByText mirrors llama.cpp's name-based fixes of the metadata: it
// finds EOT/EOM/FIM tokens by their text, marks them (and every token that
// ends generation) as control tokens, and builds the end-of-generation set.
func (t *Tokenizer) detectByText() {
	lookup := func(texts []string) int {
		best := -1
		for _, s := range texts {
			if id, ok := t.toID[s]; ok && (best < 0 || int(id) < best) {
				best = int(id) // lowest id: llama.cpp's pick depends on hash order
			}
		}
		return best
	}
	control := func(id int) {
		if id >= 0 {
			t.attrs[id] |= attrControl
		}
	}
	markAll := func(texts []string) int {
		for _, s := range texts {
			if id, ok := t.toID[s]; ok {
				control(int(id))
			}
		}
		return lookup(texts)
	}
	if t.eot < 0 {
		t.eot = markAll(eotTexts)
	}
	if t.eom < 0 {
		t.eom = markAll(eomTexts)
	}
	markAll(fimPreTexts)
	markAll(fimSufTexts)
	markAll(fimMidTexts)
	for _, texts := range [][]string{fimPadTexts, fimRepTexts, fimSepTexts} {
		if id := markAll(texts); id >= 0 {
			t.eog[id] = true
		}
	}
	for _, s := range eogTexts {
		if id, ok := t.toID[s]; ok {
			t.eog[id] = true
			control(int(id))
		}
	}
	// gpt-oss: these structure tokens are always rendered.
	for _, s := range []string{"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"} {
		if id, ok := t.toID[s]; ok {
			t.attrs[id] = attrUserDefined
		}
	}
	for _, id := range []int{t.eos, t.eot, t.eom} {
		if id >= 0 {
			t.eog[id] = true
		}
	}
	// o200k_harmony and solar-open use <|end|> between messages, not at the
	// end of generation.
	has := func(s string) bool { id, ok := t.toID[s]; return ok && t.eog[id] }
	if end, ok := t.toID["<|end|>"]; ok && t.eog[end] &&
		((has("<|return|>") && has("<|call|>")) || ((has("<|call|>") || has("<|calls|>")) && has("<|flush|>"))) {
		t.eog[end] = false
		t.attrs[end] = attrUserDefined
	}
	// Gemma 4 and PaddleOCR: </s> is an ordinary token there.
	if s, ok := t.toID["</s>"]; ok && has("<|tool_response>") {
		t.eog[s] = false
		t.attrs[s] = attrNormal
	}
}

// applyStripRules sets the per-model whitespace-stripping attributes
// llama.cpp hard-codes (they are missing from GGUF files).
func (t *Tokenizer) applyStripRules(modelName string) {
	set := func(text string, a attr, on bool) {
		if id, ok := t.toID[text]; ok {
			if on {
				t.attrs[id] |= a
			} else {
				t.attrs[id] &^= a
			}
		}
	}
	switch {
	case slices.Contains([]string{"jina-v2-de", "jina-v2-es", "jina-v2-code"}, t.preName):
		set("<mask>", attrLStrip, true)
	case strings.Contains(modelName, "phi-3") || strings.Contains(modelName, "phi3"):
		for _, id := range t.special.ids {
			t.attrs[id] |= attrRStrip
		}
		set("</s>", attrRStrip, true)
		for _, s := range []string{"<unk>", "<s>", "<|endoftext|>"} {
			set(s, attrRStrip, false)
		}
	}
}

// optString reads an optional string key ("" when absent).
func optString(f *gguf.File, key string) (string, error) {
	s, err := f.String(key)
	var missing *gguf.MissingKeyError
	if errors.As(err, &missing) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("tokenizer: %w", err)
	}
	return s, nil
}

// Encode returns the token ids of text. addBOS prepends the BOS token (when
// the vocabulary has one; AddBOS says whether the model wants it); EOS is
// never appended (callers that honour AddEOS append EOS themselves).
// parseSpecial lets control tokens written in the text (<|im_start|>) become
// their ids; without it they are tokenized as plain text. User-defined
// tokens (Qwen's <think>, ...) are always matched, as in llama.cpp.
func (t *Tokenizer) Encode(text string, addBOS, parseSpecial bool) []int {
	ids, _ := t.EncodeWith(text, EncodeOptions{AddBOS: addBOS, ParseSpecial: parseSpecial})
	return ids
}

// encodeBPE appends the tokens of a fragment free of special tokens.
func (t *Tokenizer) encodeBPE(dst []int, text string, lim *limiter) []int {
	// llama.cpp reads text as code points, turning each byte of invalid
	// UTF-8 into U+FFFD before byte-level encoding.
	return t.bpe.encode(dst, t.pre, sanitizeUTF8(text), lim)
}

// wordMemo remembers, within one Encode call, the tokens of each word seen.
// Words repeat (text draws on a small set of them) and a map lookup is much
// cheaper than BPE. Short texts skip it, as making the map would cost more
// than it saves; the memory lives only as long as the call, so there is no
// lock and no growth across calls.
type wordMemo struct {
	words map[string]idSpan // nil: not remembering
	arena []int32
}

type idSpan struct{ off, n int32 } // a word's tokens in arena

const (
	memoMinText    = 512
	memoMaxEntries = 1 << 18
	memoMaxWord    = 256
)

func newWordMemo(textLen int) *wordMemo {
	if textLen < memoMinText {
		return &wordMemo{}
	}
	return &wordMemo{words: make(map[string]idSpan, 256)}
}

// encode appends the tokens of word, from memory or from tokenize (which
// appends them to dst). Words longer than memoMaxWord are not remembered:
// they seldom repeat, and would cost their length again in the arena.
func (c *wordMemo) encode(dst []int, word string, tokenize func(dst []int, word string) []int) []int {
	if sp, ok := c.words[word]; ok {
		return appendIDs(dst, c.arena[sp.off:sp.off+sp.n])
	}
	start := len(dst)
	dst = tokenize(dst, word)
	if c.words != nil && len(c.words) < memoMaxEntries && len(word) <= memoMaxWord {
		c.words[word] = idSpan{int32(len(c.arena)), int32(len(dst) - start)}
		for _, id := range dst[start:] {
			c.arena = append(c.arena, int32(id))
		}
	}
	return dst
}

func appendIDs(dst []int, ids []int32) []int {
	for _, id := range ids {
		dst = append(dst, int(id))
	}
	return dst
}

// BOS is the beginning-of-sequence token, -1 if none. (For byte-level BPE
// files that name none, llama.cpp's default id 11 applies.)
func (t *Tokenizer) BOS() int { return t.bos }

// EOS is the end-of-sequence token, -1 if none.
func (t *Tokenizer) EOS() int { return t.eos }

// AddBOS reports whether the model expects BOS before a prompt
// (tokenizer.ggml.add_bos_token, or the tokenizer family's default).
func (t *Tokenizer) AddBOS() bool { return t.addBOS }

// AddEOS reports whether the model expects EOS after a prompt.
func (t *Tokenizer) AddEOS() bool { return t.addEOS }

// IsEOG reports whether id ends generation: EOS, EOT, EOM, and tokens such
// as <|im_end|>, <|eot_id|>, <|endoftext|> found by their text.
func (t *Tokenizer) IsEOG(id int) bool { return id >= 0 && id < len(t.eog) && t.eog[id] }

// VocabSize is the number of tokens.
func (t *Tokenizer) VocabSize() int { return len(t.tokens) }

// TokenText is the text of id as stored in the vocabulary (byte-level or ▁
// escaped), "" for an id outside it.
func (t *Tokenizer) TokenText(id int) string {
	if id < 0 || id >= len(t.tokens) {
		return ""
	}
	return t.tokens[id]
}

// Lookup returns the id of a token given its vocabulary text, such as
// "<|im_end|>".
func (t *Tokenizer) Lookup(text string) (int, bool) {
	id, ok := t.toID[text]
	return int(id), ok
}

// IsControl reports whether id is a control or unknown token, which Decode
// renders as nothing unless asked.
func (t *Tokenizer) IsControl(id int) bool {
	return id >= 0 && id < len(t.attrs) && t.attrs[id]&(attrControl|attrUnknown) != 0
}

// Pre names the pre-tokenizer in use ("" for SentencePiece vocabularies).
func (t *Tokenizer) Pre() string { return t.preName }
