package session

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/runtime/text/sampler"
)

func oracleSession(t *testing.T, name string) (*Session, *oracleLogits) {
	t.Helper()
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	m, err := model.Open(filepath.Join(dir, name+".gguf"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	s, err := NewSession(m, Options{Threads: 2, CtxSize: 128}, func(string) {})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s, loadOracle(t, filepath.Join(dir, name+".logits.json"))
}

var greedy = func() sampler.Config {
	c := sampler.DefaultConfig()
	c.Temperature = 0
	return c
}()

func TestGenerateGreedyMatchesOracle(t *testing.T) {
	s, want := oracleSession(t, "tiny-qwen3-f16")
	res, err := s.Generate(context.Background(), want.Prompt, GenerateOptions{Sampler: greedy, MaxTokens: len(want.Generated)})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want.Generated, res.Tokens); diff != "" {
		t.Fatalf("greedy tokens differ from llama.cpp's (-want +got):\n%s", diff)
	}
	if res.StopReason != StopLength || res.PromptTokens != len(want.Prompt) || res.CachedTokens != 0 {
		t.Errorf("result %+v", res)
	}
}

// TestPromptCache checks that a prompt extending the previous one reuses
// the cache and produces what a fresh session would.
func TestPromptCache(t *testing.T) {
	s, want := oracleSession(t, "tiny-qwen3-q5_k_m")
	first, err := s.Generate(context.Background(), want.Prompt[:10], GenerateOptions{Sampler: greedy, MaxTokens: 3})
	if err != nil {
		t.Fatal(err)
	}
	// The next turn: the old prompt, the reply, and more tokens.
	next := append(append(append([]int{}, want.Prompt[:10]...), first.Tokens...), 300, 301, 302)
	got, err := s.Generate(context.Background(), next, GenerateOptions{Sampler: greedy, MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if got.CachedTokens != 10+len(first.Tokens)-1 {
		// The last generated token was sampled but never evaluated.
		t.Errorf("reused %d cached tokens, want %d", got.CachedTokens, 10+len(first.Tokens)-1)
	}
	fresh, _ := oracleSession(t, "tiny-qwen3-q5_k_m")
	ref, err := fresh.Generate(context.Background(), next, GenerateOptions{Sampler: greedy, MaxTokens: 5})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(ref.Tokens, got.Tokens); diff != "" {
		t.Fatalf("cached continuation differs from a fresh one:\n%s", diff)
	}
	// A different prompt shares only its first tokens.
	other := append([]int{}, want.Prompt[:4]...)
	other = append(other, 7, 8)
	r3, err := s.Generate(context.Background(), other, GenerateOptions{Sampler: greedy, MaxTokens: 2})
	if err != nil {
		t.Fatal(err)
	}
	if r3.CachedTokens != 4 {
		t.Errorf("reused %d tokens of a diverging prompt, want 4", r3.CachedTokens)
	}
}

func TestGenerateStopsAndCancels(t *testing.T) {
	s, want := oracleSession(t, "tiny-qwen3-q5_k_m")
	full, err := s.Generate(context.Background(), want.Prompt, GenerateOptions{Sampler: greedy, MaxTokens: 12})
	if err != nil {
		t.Fatal(err)
	}
	if len(full.Text) < 4 {
		t.Skipf("generated text %q too short to cut", full.Text)
	}
	stop := full.Text[2:4]
	var streamed string
	res, err := s.Generate(context.Background(), want.Prompt, GenerateOptions{Sampler: greedy, MaxTokens: 12, Stop: []string{stop},
		OnText: func(t string) error { streamed += t; return nil }})
	if err != nil {
		t.Fatal(err)
	}
	if res.StopReason != StopEOG || res.Text != full.Text[:strings.Index(full.Text, stop)] || streamed != res.Text {
		t.Errorf("stop %q: reason %q, text %q, streamed %q; full text %q", stop, res.StopReason, res.Text, streamed, full.Text)
	}

	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	res, err = s.Generate(ctx, want.Prompt, GenerateOptions{Sampler: greedy, MaxTokens: 50,
		OnToken: func(int) {
			if n++; n == 3 {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) || res.StopReason != StopCancelled || len(res.Tokens) != 3 {
		t.Errorf("cancel after 3 tokens: err %v, reason %q, %d tokens", err, res.StopReason, len(res.Tokens))
	}

	long := make([]int, 200)
	if _, err := s.Generate(context.Background(), long, GenerateOptions{Sampler: greedy}); !errors.Is(err, ErrContextFull) {
		t.Errorf("200-token prompt in a 128-token context: %v", err)
	}
	res, err = s.Generate(context.Background(), want.Prompt, GenerateOptions{Sampler: greedy})
	if err != nil || res.StopReason != StopLength && res.StopReason != StopEOG {
		t.Errorf("unbounded generation: %v, %+v", err, res)
	}
}

// scripted allows one token per step, from a list, then only the end of
// generation.
type scripted struct {
	n, eog   int
	script   []int
	accepted []int
	mask     []uint64
}

func (c *scripted) Allowed() ([]uint64, error) {
	clear(c.mask)
	id := c.eog
	if len(c.accepted) < len(c.script) {
		id = c.script[len(c.accepted)]
	}
	c.mask[id/64] |= 1 << (id % 64)
	return c.mask, nil
}

func (c *scripted) Accept(tok int) error {
	c.accepted = append(c.accepted, tok)
	return nil
}

func TestGenerateConstraintAndLogits(t *testing.T) {
	s, want := oracleSession(t, "tiny-qwen3-q5_k_m")
	n := s.Model.Hyper().NVocab
	c := &scripted{n: n, eog: s.Tok.EOS(), script: []int{300, 301, 7, 300}, mask: make([]uint64, (n+63)/64)}
	var seen []int
	cfg := sampler.DefaultConfig()
	cfg.Seed = 1
	res, err := s.Generate(context.Background(), want.Prompt, GenerateOptions{Sampler: cfg, MaxTokens: 20, Constraint: c,
		OnLogits: func(tok int, logits []float32) {
			if len(logits) != n {
				t.Errorf("OnLogits got %d logits, want %d", len(logits), n)
			}
			seen = append(seen, tok)
		}})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(c.script, res.Tokens); diff != "" {
		t.Errorf("tokens differ from the constraint's script (-want +got):\n%s", diff)
	}
	if res.StopReason != StopEOG {
		t.Errorf("stop reason %q, want %q", res.StopReason, StopEOG)
	}
	all := append(append([]int(nil), c.script...), c.eog)
	if diff := cmp.Diff(all, c.accepted); diff != "" {
		t.Errorf("Accept calls (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(all, seen); diff != "" {
		t.Errorf("OnLogits calls (-want +got):\n%s", diff)
	}
}
