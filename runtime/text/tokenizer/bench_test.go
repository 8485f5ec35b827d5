package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
)

// mixedText builds about n bytes of text that looks like what a model is
// fed: English prose, Go and Python code, numbers, Chinese and Japanese, and
// emoji, from a fixed seed so every run measures the same input.
func mixedText(n int) string {
	r := rand.New(rand.NewPCG(42, 7))
	words := strings.Fields(`the model keeps in GPU memory the weight tensors that buy the most time per byte
		and runs the rest on the CPU or streams them just in time while it re-decides as the machine gets busier
		a tokenizer turns text into numbers which is only the first of many steps between a prompt and an answer
		I've you're they'll we'd it's don't won't Hello World Café naïve résumé coöperate`)
	code := []string{
		"func (t *Tokenizer) Encode(text string, addBOS bool) []int {\n\tvar out []int\n\treturn out\n}\n",
		"for i := 0; i < len(xs); i++ {\n\tsum += xs[i] * 0.5\n}\n",
		"def forward(self, x):\n    return self.proj(torch.relu(x)) + 1e-6\n",
		"if err != nil {\n\treturn fmt.Errorf(\"load %s: %w\", path, err)\n}\n",
		"<div class=\"row\"><span id='n42'>&nbsp;</span></div>\n",
	}
	cjk := []string{"我想在苹果公司工作。", "今天天气很好，我们去公园散步吧！", "東京は日本の首都です。", "한국어도 조금 합니다.", "模型的权重放在显存里。"}
	emoji := []string{"🦙", "😁", "👍🏽", "🚀✨", "❤️", "🇯🇵", "👨‍👩‍👧"}
	var b strings.Builder
	for b.Len() < n {
		switch k := r.IntN(10); {
		case k < 5: // a sentence of prose
			m := 5 + r.IntN(15)
			for i := range m {
				if i > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(words[r.IntN(len(words))])
			}
			b.WriteString(". ")
			if r.IntN(4) == 0 {
				b.WriteString("\n\n")
			}
		case k < 7:
			b.WriteString(code[r.IntN(len(code))])
		case k < 8: // numbers, dates, amounts
			fmt.Fprintf(&b, "%d items at $%d.%02d on 2024-%02d-%02d (%.3f%%) ", r.IntN(100000), r.IntN(1000), r.IntN(100), 1+r.IntN(12), 1+r.IntN(28), r.Float64()*100)
		case k < 9:
			b.WriteString(cjk[r.IntN(len(cjk))])
		default:
			b.WriteString(emoji[r.IntN(len(emoji))])
			b.WriteByte(' ')
		}
	}
	return b.String()
}

// skipTrimmed skips a benchmark on a byte-level BPE vocabulary with fewer
// merges than half its tokens: the repository's copies keep only the merges
// their tests need (testdata/README.md), and a real vocabulary has about as
// many merges as tokens or more, which is what the speed depends on.
func skipTrimmed(b *testing.B, f *gguf.File) {
	b.Helper()
	merges, err := f.Strings(keyMerges)
	if err != nil {
		return // not a BPE vocabulary
	}
	tokens, err := f.Strings(keyTokens)
	if err != nil {
		b.Fatal(err)
	}
	if len(merges) < len(tokens)/2 {
		b.Skipf("%s has %d merges for %d tokens, trimmed for the tests: benchmark with the full vocabularies (ATS_SHARED=DIR, DIR/testdata/vocab)", f.Path, len(merges), len(tokens))
	}
}

// loadBenchVocab is loadVocab for a benchmark, which needs the full
// vocabulary.
func loadBenchVocab(b *testing.B, name string) *Tokenizer {
	b.Helper()
	f, err := gguf.Open(filepath.Join(testenv.SharedDir(b), "testdata", "vocab", "vocab-"+name+".gguf"))
	if err != nil {
		b.Fatal(err)
	}
	skipTrimmed(b, f)
	f.Close()
	return loadVocab(b, name)
}

func BenchmarkEncode(b *testing.B) {
	text := mixedText(1 << 20)
	for _, name := range []string{"qwen3", "llama3", "llama-spm"} {
		b.Run(name, func(b *testing.B) {
			tok := loadBenchVocab(b, name)
			b.SetBytes(int64(len(text)))
			var n int
			for b.Loop() {
				n = len(tok.Encode(text, false, false))
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

func BenchmarkDecodeStream(b *testing.B) {
	text := mixedText(1 << 20)
	tok := loadBenchVocab(b, "qwen3")
	ids := tok.Encode(text, false, false)
	b.SetBytes(int64(len(text)))
	for b.Loop() {
		s := tok.NewStream(false)
		for _, id := range ids {
			_ = s.Add(id)
		}
	}
	b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
}

// BenchmarkFromGGUF measures building a tokenizer from an open file (the
// part of model loading that is the tokenizer's).
func BenchmarkFromGGUF(b *testing.B) {
	for _, name := range []string{"qwen3", "llama3"} {
		b.Run(name, func(b *testing.B) {
			f, err := gguf.Open(filepath.Join(testenv.SharedDir(b), "testdata", "vocab", "vocab-"+name+".gguf"))
			if err != nil {
				b.Fatal(err)
			}
			defer f.Close()
			skipTrimmed(b, f)
			for b.Loop() {
				if _, err := FromGGUF(f, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
