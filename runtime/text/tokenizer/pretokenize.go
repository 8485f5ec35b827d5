package tokenizer

import (
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// A byte-level BPE model first cuts text into words with a pre-tokenizer,
// then runs BPE inside each word. llama.cpp (llm_tokenizer_bpe) defines each
// pre-tokenizer as a list of regexes applied in turn: every regex splits each
// piece left by the previous one into its matches and the gaps between them.
// The common ones (GPT-2's and the GPT-4-style split of Llama 3 and Qwen2)
// are hand-written here for speed; their regexes are kept in regexGPT2 and
// regexLlama3Fmt, and the tests check the hand-written splitters against
// them.
// The rarer ones run on regexp2, which has the lookahead these regexes need.

// Reference regexes (regexp2 syntax). \s is Unicode White_Space in regexp2,
// as in llama.cpp, which maps every non-ASCII space to \v before matching.
const (
	regexGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
	// Llama 3 and Qwen2 differ only in how many digits a number token holds:
	// \p{N}{1,3} for Llama 3, \p{N} for Qwen2 (fmt verb).
	regexLlama3Fmt = `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}%s| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// deepseekCasedLetters is the letter class of DeepSeek LLM's pre-tokenizer:
// its tokenizer.json lists the cased letters of an older Unicode version
// range by range (\p{Lu}\p{Ll}\p{Lt} would add later ones). Written with
// escapes because some of these characters (U+212A KELVIN SIGN, U+2126 OHM
// SIGN, ...) do not survive Unicode normalization of the source.
const deepseekCasedLetters = `A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}` +
	`\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}` +
	`\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}` +
	`\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}` +
	`\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}` +
	`\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}` +
	`\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}` +
	`\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}` +
	`\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}` +
	`\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}` +
	`\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}`

// cjkRun is the CJK/Hangul class both DeepSeek pre-tokenizers split out.
const cjkRun = `[\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+`

// stage is one step of a pre-tokenizer: it splits one piece of text.
type stage interface {
	// split calls emit with the end offset (relative to text) of each word
	// text splits into, in order; text is valid UTF-8.
	split(text string, emit func(end int))
}

// preset is what a tokenizer.ggml.pre name selects in llama.cpp.
type preset struct {
	stages       func() []stage
	ignoreMerges bool // a word that is itself a token skips BPE (Llama 3)
	addBOS       bool // default for tokenizer.ggml.add_bos_token
	noBOS        bool // the family has no BOS token unless the metadata names one
}

var (
	gpt2Stages    = func() []stage { return []stage{gpt2Splitter{}} }
	llama3Stages  = func() []stage { return []stage{gpt4Splitter{maxDigits: 3}} }
	qwen2Stages   = func() []stage { return []stage{gpt4Splitter{maxDigits: 1}} }
	defaultStages = func() []stage {
		return []stage{re(`[\p{P}\$\+<=>\^~\|]+`), gpt2Splitter{}, re(`\p{N}+`), re(`[0-9][0-9][0-9]`)}
	}
	digitThenGPT2 = func() []stage { return []stage{re(`\p{N}`), gpt2Splitter{}} }
	deepseekLLM   = func() []stage {
		return []stage{re(`[\r\n]`), re(`\s?[` + deepseekCasedLetters + `]+`), re(`\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+`), re(`\s+\z`), re(cjkRun), re(`\p{N}+`)}
	}
	deepseekCoder = func() []stage {
		return []stage{re(`[\r\n]`), re(`\s?\p{L}+`), re(`\s?\p{P}+`), re(cjkRun), re(`\p{N}`)}
	}
	presetDefault  = preset{stages: defaultStages}
	presetLlama3   = preset{stages: llama3Stages, ignoreMerges: true, addBOS: true}
	presetQwen2    = preset{stages: qwen2Stages}
	presetGPT2     = preset{stages: gpt2Stages}
	presetDSLLM    = preset{stages: deepseekLLM}
	presetDSCoder  = preset{stages: deepseekCoder}
	presetStarcode = preset{stages: digitThenGPT2}
)

// presets maps the tokenizer.ggml.pre names llama.cpp knows to the
// pre-tokenizers implemented here exactly.
var presets = map[string]preset{
	"default": presetDefault,

	"llama3": presetLlama3, "llama-v3": presetLlama3, "llama-bpe": presetLlama3, "falcon3": presetLlama3,
	"falcon-h1": presetLlama3, "pixtral": presetLlama3, "midm-2.0": presetLlama3, "lfm2": presetLlama3,
	"dbrx": {stages: llama3Stages}, "smaug-bpe": {stages: llama3Stages},
	"glm4": {stages: llama3Stages, noBOS: true}, "chatglm-bpe": {stages: llama3Stages, noBOS: true},

	"qwen2": presetQwen2, "deepseek-r1-qwen": presetQwen2, "megrez": presetQwen2, "stablelm2": presetQwen2,
	"kormo": presetQwen2, "hunyuan": presetQwen2, "grok-2": presetQwen2, "solar-open": presetQwen2,

	"gpt-2": presetGPT2, "phi-2": presetGPT2, "jina-es": presetGPT2, "jina-de": presetGPT2, "gigachat": presetGPT2,
	"jina-v1-en": presetGPT2, "jina-v2-es": presetGPT2, "jina-v2-de": presetGPT2, "jina-v2-code": presetGPT2,
	"roberta-bpe": presetGPT2, "mpt": presetGPT2, "olmo": presetGPT2, "jais": presetGPT2, "exaone4": presetGPT2,
	"trillion": presetGPT2, "granite-docling": presetGPT2, "mellum": presetGPT2, "a.x-4.0": presetGPT2,

	"starcoder": presetStarcode, "refact": presetStarcode, "command-r": presetStarcode, "smollm": presetStarcode,
	"codeshell": presetStarcode, "exaone": presetStarcode, "minerva-7b": presetStarcode,

	"deepseek-llm":   presetDSLLM,
	"deepseek-coder": presetDSCoder,
}

// closestPreset picks a stand-in for a pre-tokenizer name this package does
// not implement. Names llama.cpp knows map to the implemented split nearest
// to theirs; anything else gets the GPT-4-style split most BPE models since
// 2024 use (Llama 3's), which is also what a "…llama…" name suggests.
func closestPreset(name string) (string, preset) {
	n := strings.ToLower(name)
	switch {
	case strings.Contains(n, "qwen"), n == "laguna", n == "bailingmoe", n == "bailingmoe2",
		n == "llada-moe", n == "seed-coder", n == "ufakzeka", n == "exaone-moe":
		return "qwen2", presetQwen2
	case strings.Contains(n, "deepseek") && strings.Contains(n, "coder"):
		return "deepseek-coder", presetDSCoder
	case n == "gpt-2" || strings.HasPrefix(n, "gpt2") || strings.HasPrefix(n, "jina") || strings.HasPrefix(n, "phi"):
		return "gpt-2", presetGPT2
	case n == "falcon", n == "chameleon", n == "bloom", n == "poro-chat", n == "gpt3-finnish", n == "viking":
		return "default", presetDefault
	}
	return "llama-bpe", presetLlama3
}

// preTokenizer applies its stages in turn, each to every piece the previous
// stages left.
type preTokenizer struct {
	stages []stage
}

// words calls fn with each word of text, in order.
func (p *preTokenizer) words(text string, fn func(word string)) {
	p.run(0, text, fn)
}

// run splits text with stage i and hands each piece to the next stage (each
// piece is split independently, so depth first gives the same words as
// llama.cpp's stage-by-stage passes, without storing the offsets).
func (p *preTokenizer) run(i int, text string, fn func(string)) {
	lo := 0
	if i == len(p.stages)-1 {
		p.stages[i].split(text, func(end int) { fn(text[lo:end]); lo = end })
		return
	}
	p.stages[i].split(text, func(end int) { p.run(i+1, text[lo:end], fn); lo = end })
}

// scanner reads a chunk rune by rune at byte offsets, with the class of
// each rune; past the end it reads as rune -1 of class 0 (llama.cpp's
// OUT_OF_RANGE).
type scanner struct{ s string }

func (sc scanner) at(i int) (r rune, size int, cl uint8) {
	if i >= len(sc.s) {
		return -1, 0, 0
	}
	if b := sc.s[i]; b < utf8.RuneSelf {
		return rune(b), 1, bmpClasses[b]
	}
	r, size = utf8.DecodeRuneInString(sc.s[i:])
	return r, size, classOf(r)
}

// skip advances from i over runes whose class has a bit of want (want == 0:
// any class) and no bit of stop, staying within the chunk.
func (sc scanner) skip(i int, want, stop uint8) int {
	for i < len(sc.s) {
		_, size, cl := sc.at(i)
		if (want != 0 && cl&want == 0) || cl&stop != 0 {
			break
		}
		i += size
	}
	return i
}

// wordEnds reports word ends, dropping empty words.
type wordEnds struct {
	emit func(end int)
	prev int
}

func (w *wordEnds) cut(end int) {
	if end > w.prev {
		w.emit(end)
	}
	w.prev = end
}

// isContraction reports the length of an English contraction ('s 't 're 've
// 'm 'll 'd) at the start of s, 0 if none; fold also accepts upper case.
func isContraction(s string, fold bool) int {
	if len(s) < 2 || s[0] != '\'' {
		return 0
	}
	lower := func(b byte) byte {
		if fold && b >= 'A' && b <= 'Z' {
			return b + ('a' - 'A')
		}
		return b
	}
	switch c1 := lower(s[1]); c1 {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v', 'l':
		if len(s) >= 3 {
			c2 := lower(s[2])
			if (c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l') {
				return 3
			}
		}
	}
	return 0
}

// spaceRun scans the whitespace run at i: its end, and the end of its last
// \r or \n (-1 if none).
func (sc scanner) spaceRun(i int) (end, lastBreak int) {
	lastBreak = -1
	for {
		r, size, cl := sc.at(i)
		if cl&clSpace == 0 {
			return i, lastBreak
		}
		i += size
		if r == '\r' || r == '\n' {
			lastBreak = i
		}
	}
}

// endOfSpaces applies \s+(?!\S)|\s+ to a whitespace run [i, end) that does
// not start a word of another kind: a run followed by more text leaves its
// last space to start the next word; a run at the end is taken whole.
func (sc scanner) endOfSpaces(i, end int) int {
	if end == i {
		_, size, _ := sc.at(i)
		return i + size // not reached for valid input: every rune has a rule
	}
	if end < len(sc.s) {
		_, last := utf8.DecodeLastRuneInString(sc.s[i:end])
		if end-last > i {
			return end - last
		}
	}
	return end
}

const clAny = clLetter | clNumber | clSpace

// gpt2Splitter implements regexGPT2 the way llama.cpp's
// unicode_regex_split_custom_gpt2 does.
type gpt2Splitter struct{}

func (gpt2Splitter) split(text string, emit func(int)) {
	bmpClassesOnce.Do(initClasses)
	sc := scanner{text}
	w := wordEnds{emit: emit}
	for pos := 0; pos < len(text); {
		if n := isContraction(text[pos:], false); n > 0 {
			pos += n
			w.cut(pos)
			continue
		}
		// ' ?' then a run of one class: \p{L}+, \p{N}+ or [^\s\p{L}\p{N}]+.
		q := pos
		if text[pos] == ' ' {
			q++
		}
		_, _, cl := sc.at(q)
		switch {
		case cl&clLetter != 0:
			pos = sc.skip(q, clLetter, 0)
		case cl&clNumber != 0:
			pos = sc.skip(q, clNumber, 0)
		case cl&clAny == 0 && q < len(text):
			pos = sc.skip(q, 0, clAny)
		default:
			end, _ := sc.spaceRun(pos)
			pos = sc.endOfSpaces(pos, end)
		}
		w.cut(pos)
	}
}

// gpt4Splitter implements regexLlama3Fmt (the pre-tokenizer of Llama 3, Qwen2
// and many later models) the way llama.cpp's
// unicode_regex_split_custom_llama3 does; maxDigits is 3 for Llama 3 and 1
// for Qwen2. (llama.cpp runs Qwen2's variant through std::regex on text
// whose non-ASCII characters were collapsed to their class; the result is
// the same, which the tests check against regexp2.)
type gpt4Splitter struct{ maxDigits int }

func (s gpt4Splitter) split(text string, emit func(int)) {
	bmpClassesOnce.Do(initClasses)
	sc := scanner{text}
	w := wordEnds{emit: emit}
	for pos := 0; pos < len(text); {
		// (?i:'s|'t|'re|'ve|'m|'ll|'d); only ASCII letters lower-case to these.
		if n := isContraction(text[pos:], true); n > 0 {
			pos += n
			w.cut(pos)
			continue
		}
		c, size, cl := sc.at(pos)
		// [^\r\n\p{L}\p{N}]?\p{L}+
		if c != '\r' && c != '\n' && cl&clNumber == 0 {
			if _, _, next := sc.at(pos + size); cl&clLetter != 0 || next&clLetter != 0 {
				pos = sc.skip(pos+size, clLetter, 0)
				w.cut(pos)
				continue
			}
		}
		// \p{N}{1,maxDigits}
		if cl&clNumber != 0 {
			for n := 0; ; n++ {
				_, size, cl := sc.at(pos)
				if cl&clNumber == 0 {
					break
				}
				if n == s.maxDigits {
					w.cut(pos)
					n = 0
				}
				pos += size
			}
			w.cut(pos)
			continue
		}
		// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
		q := pos
		if c == ' ' {
			q++
		}
		if _, _, cl2 := sc.at(q); cl2&clAny == 0 {
			q = sc.skip(q, 0, clAny)
			for q < len(text) && (text[q] == '\r' || text[q] == '\n') {
				q++
			}
			pos = q
			w.cut(pos)
			continue
		}
		// Whitespace: \s*[\r\n]+ ends at the last line break of the run;
		// otherwise as GPT-2.
		end, lastBreak := sc.spaceRun(pos)
		if lastBreak >= 0 {
			pos = lastBreak
		} else {
			pos = sc.endOfSpaces(pos, end)
		}
		w.cut(pos)
	}
}

// regexStage splits with a regexp2 regex: matches and the gaps between them
// become words, as llama.cpp's std::regex fallback does.
type regexStage struct{ re *regexp2.Regexp }

// re compiles a built-in regex; they are constants, so failure is a bug.
func re(expr string) stage {
	r, err := regexp2.Compile(expr, regexp2.None)
	if err != nil {
		panic(fmt.Sprintf("tokenizer: bad built-in regex %q: %v", expr, err))
	}
	// A pathological input must not hang the tokenizer; on timeout the rest
	// of the piece stays one word.
	r.MatchTimeout = 10 * time.Second
	return regexStage{re: r}
}

func (s regexStage) split(text string, emit func(int)) {
	if text == "" {
		return
	}
	// regexp2 matches on runes; offs maps rune indices back to bytes.
	runes := make([]rune, 0, len(text))
	offs := make([]int, 0, len(text)+1)
	for i, r := range text {
		runes = append(runes, r)
		offs = append(offs, i)
	}
	offs = append(offs, len(text))
	w := wordEnds{emit: emit}
	m, err := s.re.FindRunesMatch(runes)
	for err == nil && m != nil {
		w.cut(offs[m.Index])
		w.cut(offs[m.Index+m.Length])
		m, err = s.re.FindNextMatch(m)
	}
	w.cut(len(text))
}
