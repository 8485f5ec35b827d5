package constrain

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"sync"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

var (
	realVocabs  = map[string]*Vocab{}
	realVocabMu sync.Mutex
)

// realVocab loads the vocabulary of a tokenizer fixture (vocab-NAME.gguf)
// as a constrained generation sees it.
func realVocab(t testing.TB, name string) *Vocab {
	t.Helper()
	realVocabMu.Lock()
	defer realVocabMu.Unlock()
	if v, ok := realVocabs[name]; ok {
		return v
	}
	f, err := gguf.Open(filepath.Join(testenv.SharedDir(t), "testdata", "vocab", "vocab-"+name+".gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	var eog []int
	for id := range tok.VocabSize() {
		if tok.IsEOG(id) {
			eog = append(eog, id)
		}
	}
	v, err := NewVocab(tok.VocabSize(), func(id int) string { return tok.Piece(id, false) }, eog)
	if err != nil {
		t.Fatal(err)
	}
	realVocabs[name] = v
	return v
}

// tokenDistance is how many bytes would be left to complete the text after
// token id, or -1 when the token is not allowed (0 for any allowed token
// when ends is nil).
func (m *Matcher) tokenDistance(id int, ends []int) int {
	if m.c.v.isEOG[id] {
		return 0
	}
	base := len(m.frames)
	defer func() { m.frames = m.frames[:base] }()
	set := slices.Clone(m.cur)
	p := m.c.v.piece(id)
	for i := 0; len(set) > 0 && i < len(p); i++ {
		set = m.step(nil, set, p[i])
	}
	if len(set) == 0 || p == "" {
		return -1
	}
	if ends == nil {
		return 0
	}
	return m.distance(set, ends)
}

// generate runs a constrained generation on random logits: for wander
// tokens the most likely allowed token, then the allowed token that leaves
// the least to write, until an end-of-generation token is chosen.
func generate(t testing.TB, c *Constraint, rng *rand.Rand, wander int) string {
	t.Helper()
	text, _ := generateTokens(t, c, rng, wander)
	return text
}

// generateTokens is generate, with the tokens chosen (the end of
// generation last).
func generateTokens(t testing.TB, c *Constraint, rng *rand.Rand, wander int) (string, []int) {
	t.Helper()
	var toks []int
	m := c.NewMatcher()
	ends := minEnd(c.g)
	v := c.v
	logits := make([]float32, v.size)
	var text []byte
	for step := 0; ; step++ {
		if step > wander+2000 {
			t.Fatalf("no end after %d tokens: %q", step, text)
		}
		mask, err := m.Allowed()
		if err != nil {
			t.Fatalf("after %q: %v", text, err)
		}
		best, bestScore := -1, math.Inf(1)
		for id := range v.size {
			if !maskAllows(mask, id) {
				continue
			}
			var score float64
			if step < wander {
				logits[id] = float32(rng.NormFloat64())
				score = -float64(logits[id])
				if v.isEOG[id] {
					score += 3 // make ending early unlikely
				}
			} else if v.isEOG[id] {
				score = math.Inf(-1) // the text is complete: end it
			} else {
				d := m.tokenDistance(id, ends)
				if d < 0 {
					t.Fatalf("after %q: token %d (%q) is in the mask but not allowed", text, id, v.piece(id))
				}
				// Fewest bytes left, then the longest token, then random.
				score = float64(d)*1e6 - float64(len(v.piece(id)))*1e3 + rng.Float64()
			}
			if score < bestScore {
				best, bestScore = id, score
			}
		}
		if err := m.Accept(best); err != nil {
			t.Fatalf("after %q: %v", text, err)
		}
		toks = append(toks, best)
		if v.isEOG[best] {
			return string(text), toks
		}
		text = append(text, v.piece(best)...)
	}
}

// TestRealVocabularyGenerationValidates generates under each schema with
// the Qwen3 and Llama 3 vocabularies on random logits; every text must
// parse and validate.
func TestRealVocabularyGenerationValidates(t *testing.T) {
	for _, name := range []string{"qwen3", "llama3"} {
		v := realVocab(t, name)
		rng := rand.New(rand.NewPCG(7, uint64(len(name))))
		for _, tc := range schemaCases {
			e, err := Schema([]byte(tc.schema))
			if err != nil {
				t.Fatal(err)
			}
			c := New(mustCompile(t, e), v)
			val := validator(t, tc.schema)
			for i := range 3 {
				text := generate(t, c, rng, rng.IntN(40))
				if !json.Valid([]byte(text)) {
					t.Fatalf("%s, %s, run %d: not JSON: %q", name, tc.name, i, text)
				}
				if err := validate(val, text); err != nil {
					t.Fatalf("%s, %s, run %d: %q does not validate: %v", name, tc.name, i, text, err)
				}
			}
		}
	}
}

// TestRealVocabularyMask checks the tree walk against trying each token on
// its own, for states inside and between JSON tokens.
func TestRealVocabularyMask(t *testing.T) {
	v := realVocab(t, "qwen3")
	e, err := Schema([]byte(schemaCases[0].schema))
	if err != nil {
		t.Fatal(err)
	}
	c := New(mustCompile(t, e), v)
	for _, prefix := range []string{"", "{", `{"name": "Ad`, `{"name": "A\`, `{"name": "A\n`, `{"name": "A\"`, `{"name": "A\u00e9`, `{"name": "A\u00`, "{\"name\": \"\xe4", "{\"name\": \"\xe4\xb8",
		`{"name":"Ada","age":3`, `{"name":"Ada","age":3,"email":null,"tags":["x"]`, `{"name":"Ada","age":3,"email":null,"tags":["x", "y`} {
		m := c.NewMatcher()
		if err := m.AcceptString(prefix); err != nil {
			t.Fatal(err)
		}
		mask, err := m.Allowed()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for id := range v.size {
			got := maskAllows(mask, id)
			want := m.tokenDistance(id, minEnd(c.g)) >= 0 && (v.piece(id) != "" || v.isEOG[id] && m.Complete())
			if got != want {
				t.Fatalf("after %q: token %d (%q) allowed %v, want %v", prefix, id, v.piece(id), got, want)
			}
			if got {
				n++
			}
		}
		t.Logf("after %q: %d tokens allowed", prefix, n)
	}
}

// BenchmarkMask measures one mask from an empty cache with the Qwen3
// vocabulary (151,669 tokens): inside a JSON string (nearly every token
// allowed, so the walk visits nearly the whole tree), between JSON tokens
// (most subtrees pruned at their first byte), and a cached state.
func BenchmarkMask(b *testing.B) {
	v := realVocab(b, "qwen3")
	e, err := Schema([]byte(schemaCases[0].schema))
	if err != nil {
		b.Fatal(err)
	}
	g := mustCompile(b, e)
	for _, bc := range []struct {
		name, prefix string
		cached       bool
	}{
		{"string", `{"name": "Ad`, false},
		{"structure", `{"name":"Ada","age":3`, false},
		{"cached", `{"name": "Ad`, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := New(g, v)
			m := c.NewMatcher()
			if err := m.AcceptString(bc.prefix); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if !bc.cached {
					c.mu.Lock()
					clear(c.cache)
					c.mu.Unlock()
				}
				if _, err := m.Allowed(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkConstrainedSteps measures the constraint's whole cost per
// generated token (mask and accept) over generations on random logits with
// a fresh cache each, as a server request sees it.
func BenchmarkConstrainedSteps(b *testing.B) {
	v := realVocab(b, "qwen3")
	e, err := Schema([]byte(schemaCases[2].schema))
	if err != nil {
		b.Fatal(err)
	}
	g := mustCompile(b, e)
	rng := rand.New(rand.NewPCG(1, 1))
	logits := make([]float32, v.size)
	tokens := 0
	var m *Matcher
	for b.Loop() {
		if m == nil || m.Ended() {
			m = New(g, v).NewMatcher()
		}
		mask, err := m.Allowed()
		if err != nil {
			b.Fatal(err)
		}
		// The most likely allowed token of random logits (an end once the
		// text is complete, so runs stay short).
		best, bestL := -1, float32(math.Inf(-1))
		for id := range v.size {
			if !maskAllows(mask, id) {
				continue
			}
			if v.isEOG[id] {
				best = id
				break
			}
			if logits[id] = float32(rng.NormFloat64()); logits[id] > bestL {
				best, bestL = id, logits[id]
			}
		}
		if err := m.Accept(best); err != nil {
			b.Fatal(err)
		}
		tokens++
	}
	b.ReportMetric(float64(b.Elapsed().Microseconds())/float64(tokens), "µs/token")
}
