package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
)

// The hand-written splitters must split exactly as the regexes they stand
// for (which is how llama.cpp defines them).
var splitterRefs = []struct {
	name   string
	fast   stage
	regexp string
}{
	{"gpt-2", gpt2Splitter{}, regexGPT2},
	{"llama3", gpt4Splitter{maxDigits: 3}, fmt.Sprintf(regexLlama3Fmt, "{1,3}")},
	{"qwen2", gpt4Splitter{maxDigits: 1}, fmt.Sprintf(regexLlama3Fmt, "")},
}

// splitWords splits text with one stage and returns the words.
func splitWords(st stage, text string) []string {
	var words []string
	lo := 0
	st.split(text, func(hi int) {
		words = append(words, text[lo:hi])
		lo = hi
	})
	return words
}

func checkSplitters(t *testing.T, text string) {
	t.Helper()
	for _, ref := range splitterRefs {
		want := splitWords(re(ref.regexp), text)
		got := splitWords(ref.fast, text)
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") {
			t.Errorf("%s splitter on %q:\n got %q\nwant %q", ref.name, text, got, want)
		}
	}
}

// splitterAlphabet mixes the characters the splitters treat differently:
// letters (ASCII, accented, CJK), numbers (ASCII, Arabic-Indic, ½), every
// kind of space, the contraction letters, punctuation, a mark, an emoji and
// a format character.
var splitterAlphabet = []rune("aZs'SltTreEvVmMdDéж中1٣½ \t\n\r\v\u00a0\u3000\u2028!.,-_\u0301🦙\u200b\x00")

func randomText(r *rand.Rand, n int) string {
	var b strings.Builder
	for range n {
		b.WriteRune(splitterAlphabet[r.IntN(len(splitterAlphabet))])
	}
	return b.String()
}

func TestSplittersMatchRegex(t *testing.T) {
	for _, s := range []string{"", " ", "  ", "a", "'s", "'S", "'ll", "'LL", "'Re", "x'", "don't", "DON'T",
		"12345678", " 123", "a1b2", "  hello", "hello  ", "a \n\n b", "\r\n\r\n  x", " ¡!", "\t\tfoo", "x \u3000y"} {
		checkSplitters(t, s)
	}
	if dir := testenv.SharedDirOrEmpty(); dir != "" {
		for _, name := range vocabNames {
			inp, err := os.ReadFile(filepath.Join(dir, "testdata", "vocab", "vocab-"+name+".inp"))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range splitCases(string(inp)) {
				checkSplitters(t, s)
			}
		}
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 3000 {
		checkSplitters(t, randomText(r, 1+r.IntN(24)))
	}
}

func FuzzSplitters(f *testing.F) {
	f.Add("Hello, y'all! How're you 😁 ?我想在apple工作1314151天～")
	f.Add("  \n\t 'LL 12345 ½")
	f.Fuzz(func(t *testing.T, s string) {
		checkSplitters(t, sanitizeUTF8(s))
	})
}

func TestClosestPreset(t *testing.T) {
	for name, want := range map[string]string{
		"qwen35":          "qwen2",
		"my-qwen-variant": "qwen2",
		"deepseek-coder2": "deepseek-coder",
		"gpt2-large":      "gpt-2",
		"falcon":          "default",
		"brand-new":       "llama-bpe",
	} {
		if got, _ := closestPreset(name); got != want {
			t.Errorf("closestPreset(%q) = %q, want %q", name, got, want)
		}
	}
	// Every stand-in must itself be a known preset.
	for _, name := range []string{"qwen35", "deepseek-coder2", "gpt2-large", "falcon", "x"} {
		alt, _ := closestPreset(name)
		if _, ok := presets[alt]; !ok {
			t.Errorf("closestPreset(%q) = %q, which is not a preset", name, alt)
		}
	}
}

// The regex-based pre-tokenizers split as llama.cpp documents for them.
func TestRegexPresets(t *testing.T) {
	for _, tc := range []struct {
		pre, text string
		want      []string
	}{
		{"deepseek-coder", "def foo(x):\n    return 42", []string{"def", " foo", "(", "x", "):", "\n", "   ", " return", " ", "4", "2"}},
		{"deepseek-llm", "Hello 世界 123\n", []string{"Hello", " ", "世界", " ", "123", "\n"}},
		{"default", "a+b=12345!", []string{"a", "+", "b", "=", "123", "45", "!"}},
		{"starcoder", "x=123 yz", []string{"x", "=", "1", "2", "3", " yz"}},
	} {
		p := &preTokenizer{stages: presets[tc.pre].stages()}
		var got []string
		p.words(tc.text, func(w string) { got = append(got, w) })
		if strings.Join(got, "|") != strings.Join(tc.want, "|") {
			t.Errorf("%s on %q:\n got %q\nwant %q", tc.pre, tc.text, got, tc.want)
		}
	}
}
