package session

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/text/chat"
	"github.com/atsinfer/ats/runtime/text/constrain"
	"github.com/atsinfer/ats/runtime/text/sampler"
	"github.com/atsinfer/ats/tools/synth"
)

// benchSchema is a typical structured-output schema: free strings, numbers,
// an enum, an array and a nested object.
const benchSchema = `{"type":"object","properties":{
	"name":{"type":"string"},"age":{"type":"integer"},"email":{"type":["string","null"]},
	"plan":{"enum":["free","pro","team"]},"tags":{"type":"array","items":{"type":"string"}},
	"address":{"type":"object","properties":{"street":{"type":"string"},"city":{"type":"string"},"zip":{"type":"string"}},
		"required":["street","city","zip"],"additionalProperties":false}},
	"required":["name","age","email","plan","tags","address"],"additionalProperties":false}`

// BenchmarkConstrainedDecode measures what constrained decoding costs the
// decode speed, on the Qwen3-0.6B shape (Q4_K_M) with Qwen3's real
// vocabulary of 151,669 tokens: each iteration generates up to 64 tokens
// freely and then up to 64 under a JSON Schema (a fresh Constraint, so its
// mask cache starts empty as for a new schema), and the metrics are the
// decode rates of both and the slowdown in percent. Alternating the two in
// one loop keeps a busy machine from favouring either. The model is
// $ATS_BENCH_VOCAB_MODEL, or a synthetic one written once into the
// temporary directory (about 0.4 GB):
//
//	go test -run NONE -bench ConstrainedDecode -benchtime 20x ./runtime
func BenchmarkConstrainedDecode(b *testing.B) {
	path := os.Getenv("ATS_BENCH_VOCAB_MODEL")
	if path == "" {
		vocab := filepath.Join(testenv.SharedDir(b), "testdata", "vocab", "vocab-qwen3.gguf")
		path = filepath.Join(os.TempDir(), "ats-bench-qwen3-0.6b-q4_k_m-qwen3vocab.gguf")
		if _, err := os.Stat(path); err != nil {
			tmp := path + fmt.Sprintf(".%d.tmp", os.Getpid())
			if _, err := synth.Write(tmp, synth.Options{Preset: "qwen3-0.6b", Layout: "q4_k_m", Seed: 1, Vocab: vocab}); err != nil {
				b.Skip("cannot write the benchmark model:", err)
			}
			if err := os.Rename(tmp, path); err != nil {
				b.Fatal(err)
			}
		}
	}
	m, err := model.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	s, err := NewSession(m, Options{CtxSize: 512, Threads: 2}, func(string) {})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	text, err := s.RenderChat([]chat.Message{{Role: "user", Content: "Make up a customer record."}},
		chat.Options{AddGenerationPrompt: true, Vars: map[string]any{"enable_thinking": false}})
	if err != nil {
		b.Fatal(err)
	}
	prompt := s.EncodeChat(text)

	n := m.Hyper().NVocab
	var eog []int
	for id := range min(n, s.Tok.VocabSize()) {
		if s.Tok.IsEOG(id) {
			eog = append(eog, id)
		}
	}
	start := time.Now()
	vocab, err := constrain.NewVocab(n, func(id int) string { return s.Tok.Piece(id, false) }, eog)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("prefix tree: %d tokens, %d nodes, built in %v", n, vocab.Nodes(), time.Since(start))
	e, err := constrain.Schema([]byte(benchSchema))
	if err != nil {
		b.Fatal(err)
	}
	start = time.Now()
	g, err := constrain.Compile(e)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("grammar: %d states, compiled in %v", g.States(), time.Since(start))

	cfg := sampler.DefaultConfig()
	free := cfg
	free.LogitBias = map[int]float32{}
	for _, id := range eog { // so the free run writes all 64 tokens
		free.LogitBias[id] = float32(-1e30)
	}
	var freeTok, conTok int
	var freeDur, conDur, maskDur time.Duration
	ctx := context.Background()
	iter := 0
	var pairFree, pairCon float64 // the current iteration's rates
	var slowdowns []float64
	runFree := func() {
		res, err := s.Generate(ctx, prompt, GenerateOptions{Sampler: free, MaxTokens: 64})
		if err != nil {
			b.Fatal(err)
		}
		freeTok += len(res.Tokens) - 1
		freeDur += res.Decode
		pairFree = res.DecodeRate()
	}
	runConstrained := func() {
		con := &timedConstraint{m: constrain.New(g, vocab).NewMatcher()}
		res, err := s.Generate(ctx, prompt, GenerateOptions{Sampler: cfg, MaxTokens: 64, Constraint: con})
		if err != nil {
			b.Fatal(err)
		}
		conTok += len(res.Tokens) - 1
		conDur += res.Decode
		maskDur += con.d
		pairCon = res.DecodeRate()
		if iter == 1 {
			b.Logf("a constrained reply: %q", res.Text)
		}
	}
	for b.Loop() {
		iter++
		free.Seed, cfg.Seed = uint64(iter), uint64(iter)
		// Alternate which goes first, so neither always follows the other.
		if iter%2 == 1 {
			runFree()
			runConstrained()
		} else {
			runConstrained()
			runFree()
		}
		slowdowns = append(slowdowns, 100*(1-pairCon/pairFree))
	}
	fr := float64(freeTok) / freeDur.Seconds()
	cr := float64(conTok) / conDur.Seconds()
	b.ReportMetric(fr, "free_tok/s")
	b.ReportMetric(cr, "json_tok/s")
	b.ReportMetric(100*(1-cr/fr), "slowdown_%")
	// The median of the iterations' slowdowns, which a burst of load on
	// the machine during a few of them does not move.
	slices.Sort(slowdowns)
	b.ReportMetric(slowdowns[len(slowdowns)/2], "median_slowdown_%")
	// The constraint's own share of the constrained decode time, which a
	// busy machine slows down as much as the rest.
	b.ReportMetric(100*maskDur.Seconds()/conDur.Seconds(), "constraint_%")
}

// timedConstraint measures the time spent in a constraint.
type timedConstraint struct {
	m *constrain.Matcher
	d time.Duration
}

func (t *timedConstraint) Allowed() ([]uint64, error) {
	start := time.Now()
	defer func() { t.d += time.Since(start) }()
	return t.m.Allowed()
}

func (t *timedConstraint) Accept(tok int) error {
	start := time.Now()
	defer func() { t.d += time.Since(start) }()
	return t.m.Accept(tok)
}
