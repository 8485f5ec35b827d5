package session

import (
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/kvcache"
)

// TestEngineDecode checks the decode step of several sequences: each
// row's logits are its sequence's alone (NMSE within 1e-4 on the CPU),
// every sequence grows by its token, and mismatched or empty arguments
// are refused before anything is computed.
func TestEngineDecode(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	nv := m.Hyper().NVocab
	e, err := NewEngine(m, Options{Threads: 2, CtxSize: 1024})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	prompts := schedPrompts(nv, 3)
	next := []int{5, 17, 5}
	seqs := make([]*kvcache.Seq, len(prompts))
	for i, p := range prompts {
		seqs[i] = e.Ctx.KV().NewSeq()
		defer seqs[i].Close()
		if _, err := e.Eval(seqs[i], p, false); err != nil {
			t.Fatal(err)
		}
	}
	got, err := e.Decode(seqs, next)
	if err != nil {
		t.Fatal(err)
	}
	got = append([]float32(nil), got...)
	if len(got) != len(seqs)*nv {
		t.Fatalf("%d logits, want %d rows of %d", len(got), len(seqs), nv)
	}
	for i, p := range prompts {
		if n := seqs[i].Len(); n != len(p)+1 {
			t.Errorf("sequence %d holds %d positions, want %d", i, n, len(p)+1)
		}
		alone := e.Ctx.KV().NewSeq()
		want, err := e.Eval(alone, append(append([]int(nil), p...), next[i]), false)
		alone.Close()
		if err != nil {
			t.Fatal(err)
		}
		if d := nmse(got[i*nv:(i+1)*nv], want); d > 1e-4 {
			t.Errorf("sequence %d: NMSE %.3g from its logits alone", i, d)
		}
	}
	for _, c := range []struct {
		seqs   []*kvcache.Seq
		tokens []int
	}{{nil, nil}, {seqs, next[:2]}, {seqs[:1], []int{nv}}} {
		before := seqs[0].Len()
		if _, err := e.Decode(c.seqs, c.tokens); err == nil {
			t.Errorf("Decode of %d sequences and tokens %v: no error", len(c.seqs), c.tokens)
		} else if !strings.Contains(err.Error(), "decode") && !strings.Contains(err.Error(), "token") {
			t.Errorf("Decode of %d sequences and tokens %v: %v", len(c.seqs), c.tokens, err)
		}
		if seqs[0].Len() != before {
			t.Errorf("a refused step grew sequence 0 from %d to %d", before, seqs[0].Len())
		}
	}
}
