package kvcache

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func toks(lo, n int) []int32 {
	out := make([]int32, n)
	for i := range out {
		out[i] = int32(lo + i)
	}
	return out
}

// fill reserves and appends tokens to s.
func fill(t *testing.T, s *Seq, tokens []int32) {
	t.Helper()
	if err := s.Reserve(len(tokens)); err != nil {
		t.Fatal(err)
	}
	if err := s.Append(tokens); err != nil {
		t.Fatal(err)
	}
}

func TestSequencesShareTheCache(t *testing.T) {
	c, err := New(16*4, 4) // 16 blocks of 4
	if err != nil {
		t.Fatal(err)
	}
	a, b := c.NewSeq(), c.NewSeq()
	fill(t, a, toks(0, 10)) // 3 blocks
	fill(t, b, toks(100, 5))
	if got := (Usage{Held: 5, Free: 11}); c.Usage() != got {
		t.Fatalf("usage %+v, want %+v", c.Usage(), got)
	}
	seen := map[int32]bool{}
	for _, s := range []*Seq{a, b} {
		for _, blk := range s.Table() {
			if seen[blk] {
				t.Fatalf("block %d held twice", blk)
			}
			seen[blk] = true
		}
	}
	// One sequence can take what the other leaves.
	if err := a.Reserve(c.Rows() - 10 - 8); err != nil {
		t.Fatal(err)
	}
	if err := b.Reserve(4); !errors.Is(err, ErrFull) {
		t.Fatalf("reserve past the cache: %v, want ErrFull", err)
	}
	if b.Len() != 5 || len(b.Table()) != 2 {
		t.Fatalf("a failed reserve changed the sequence: len %d, %d blocks", b.Len(), len(b.Table()))
	}
}

func TestReusePrefixAcrossSequences(t *testing.T) {
	c, _ := New(64, 4)
	system := toks(1, 9) // two full blocks and one position
	a := c.NewSeq()
	fill(t, a, append(system, 50, 51, 52))
	a.Close() // its full blocks stay, indexed
	u := c.Usage()
	if u.Cached != 3 || u.Held != 0 {
		t.Fatalf("after close: %+v, want 3 cached (the full blocks)", u)
	}
	b := c.NewSeq()
	prompt := append(append([]int32{}, system...), 70, 71)
	if got := b.Reuse(prompt); got != 8 {
		t.Fatalf("reused %d positions, want 8 (two full blocks)", got)
	}
	if !cmp.Equal(b.Tokens(), system[:8]) {
		t.Fatalf("tokens %v", b.Tokens())
	}
	// A prompt that differs in the first block reuses nothing.
	d := c.NewSeq()
	other := append([]int32{99}, prompt[1:]...)
	if got := d.Reuse(other); got != 0 {
		t.Fatalf("reused %d of a different prompt", got)
	}
	// Shared blocks are never written: truncating into one gives it up.
	e := c.NewSeq()
	if got := e.Reuse(prompt); got != 8 {
		t.Fatalf("a third sequence reused %d, want 8", got)
	}
	if got := b.Truncate(6); got != 4 {
		t.Fatalf("truncate into a shared block kept %d, want 4", got)
	}
}

func TestReuseOwnPrefixKeepsPartialBlock(t *testing.T) {
	c, _ := New(64, 4)
	s := c.NewSeq()
	fill(t, s, toks(0, 6))
	// The next turn shares 5 tokens, then differs.
	next := append(toks(0, 5), 77, 78)
	if got := s.Reuse(next); got != 5 {
		t.Fatalf("kept %d, want 5 (its own unshared partial block)", got)
	}
	// At least one token is left to compute.
	if got := s.Reuse(toks(0, 5)); got != 4 {
		t.Fatalf("kept %d of an identical prompt, want 4", got)
	}
	// Truncating into its own full, indexed block keeps the positions and
	// takes the block out of the index.
	fill(t, s, toks(4, 8)) // positions 4..11: blocks 1 and 2 full
	if got := s.Truncate(6); got != 6 {
		t.Fatalf("truncate into its own indexed block kept %d, want 6", got)
	}
	other := s.c.NewSeq()
	if got := other.Reuse(toks(0, 12)); got != 4 {
		t.Fatalf("another sequence reused %d positions, want 4 (the block being rewritten left the index)", got)
	}
}

func TestEvictionTakesLeastRecentlyUsed(t *testing.T) {
	c, _ := New(8, 4) // 2 blocks
	a := c.NewSeq()
	fill(t, a, toks(0, 4))
	a.Close()
	b := c.NewSeq()
	fill(t, b, toks(10, 4))
	b.Close()
	// Both cached; a new sequence of 8 takes both, oldest first.
	d := c.NewSeq()
	fill(t, d, toks(20, 8))
	if u := c.Usage(); u.Held != 2 || u.Cached != 0 {
		t.Fatalf("usage %+v", u)
	}
	e := c.NewSeq()
	if got := e.Reuse(append(toks(0, 4), 1)); got != 0 {
		t.Fatalf("an evicted block was reused (%d)", got)
	}
}

func TestTypes(t *testing.T) {
	for _, tc := range []struct {
		name  string
		want  Type
		bytes int64
	}{{"f16", F16, 256}, {"Q8_0", Q8_0, 136}, {"q4_0", Q4_0, 72}, {"f32", F32, 512}} {
		got, err := ParseType(tc.name)
		if err != nil || got != tc.want || got.RowBytes(128) != tc.bytes {
			t.Errorf("%s: %v %v %d", tc.name, got, err, got.RowBytes(128))
		}
	}
	if _, err := ParseType("q5_1"); err == nil {
		t.Error("q5_1 accepted")
	}
	if err := Q8_0.CheckWidth(100); err == nil {
		t.Error("q8_0 rows of 100 accepted")
	}
}
