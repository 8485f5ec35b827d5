package tokenizer

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
)

// The fixture vocabularies in <shared>/testdata/vocab and what they cover.
var vocabNames = []string{"qwen3", "llama3", "gpt-2", "llama-spm", "phi-3"}

// caseSeparator separates the cases of a .inp file (llama.cpp's
// test-tokenizer-0 format).
const caseSeparator = "\n__ggml_vocab_test__\n"

// splitCases splits a .inp file; the file ends with a separator.
func splitCases(s string) []string {
	return strings.Split(strings.TrimSuffix(s, caseSeparator), caseSeparator)
}

var loaded sync.Map // vocab name -> *Tokenizer

// loadVocab returns the tokenizer of vocab-<name>.gguf, loading it once per
// test binary (the big vocabularies take a while to index).
func loadVocab(tb testing.TB, name string) *Tokenizer {
	tb.Helper()
	if t, ok := loaded.Load(name); ok {
		return t.(*Tokenizer)
	}
	path := filepath.Join(testenv.SharedDir(tb), "testdata", "vocab", "vocab-"+name+".gguf")
	f, err := gguf.Open(path)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	t, err := FromGGUF(f, func(msg string) { tb.Logf("warning: %s", msg) })
	if err != nil {
		tb.Fatalf("%s: %v", path, err)
	}
	loaded.Store(name, t)
	return t
}

// vocabCase is one string of a .inp file and the ids llama.cpp gave it.
type vocabCase struct {
	text string
	want []int
}

func readCases(tb testing.TB, name string) []vocabCase {
	tb.Helper()
	dir := filepath.Join(testenv.SharedDir(tb), "testdata", "vocab")
	inp, err := os.ReadFile(filepath.Join(dir, "vocab-"+name+".inp"))
	if err != nil {
		tb.Fatal(err)
	}
	out, err := os.ReadFile(filepath.Join(dir, "vocab-"+name+".out"))
	if err != nil {
		tb.Fatal(err)
	}
	texts := splitCases(string(inp))
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	if len(texts) != len(lines) {
		tb.Fatalf("vocab-%s: %d cases in .inp but %d lines in .out", name, len(texts), len(lines))
	}
	cases := make([]vocabCase, len(texts))
	for i, text := range texts {
		var want []int
		for _, f := range strings.Fields(lines[i]) {
			id, err := strconv.Atoi(f)
			if err != nil {
				tb.Fatalf("vocab-%s.out line %d: %v", name, i+1, err)
			}
			want = append(want, id)
		}
		cases[i] = vocabCase{text, want}
	}
	return cases
}

// TestVocabFixtures checks every case of every fixture against llama.cpp's
// ids (no BOS, special tokens not parsed).
func TestVocabFixtures(t *testing.T) {
	for _, name := range vocabNames {
		t.Run(name, func(t *testing.T) {
			tok := loadVocab(t, name)
			cases := readCases(t, name)
			for i, c := range cases {
				got := tok.Encode(c.text, false, false)
				if fmt.Sprint(got) != fmt.Sprint(c.want) {
					t.Errorf("case %d %q:\n got %v\nwant %v", i, c.text, got, c.want)
				}
			}
		})
	}
}

// TestVocabRoundTrip decodes each fixture's ids back to the text.
func TestVocabRoundTrip(t *testing.T) {
	for _, name := range vocabNames {
		t.Run(name, func(t *testing.T) {
			tok := loadVocab(t, name)
			for i, c := range readCases(t, name) {
				if got := tok.Decode(c.want); got != c.text {
					t.Errorf("case %d: Decode = %q, want %q", i, got, c.text)
				}
			}
		})
	}
}
