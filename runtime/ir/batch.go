package ir

import "fmt"

// Batch is the input of one step: tokens of one or more sequences, each at
// its position in its sequence, and the rows whose logits are wanted. It
// flows unchanged through the executor into every backend and kernel: a
// prompt chunk is the batch of one sequence's next tokens, a decode step
// the batch of each sequence's next token, and one sequence decoding alone
// is the batch of one.
//
// Tokens of one sequence are contiguous in the batch, at consecutive
// positions. Every token stores its key and value rows in its sequence's
// cache at its position and attends to its sequence's positions up to its
// own.
type Batch struct {
	Tokens []int32 // token ids
	Pos    []int32 // each token's position in its sequence
	Seq    []int32 // each token's sequence: an index into Tables
	// Tables holds, for each sequence of the step, its KV block table:
	// position p of sequence s lives in cache row
	// Tables[s][p/Block]*Block + p%Block (runtime/kvcache).
	Tables [][]int32
	Block  int
	// Logits lists the rows whose logits are wanted, ascending: the
	// output head runs on those rows only (none for a prompt chunk that
	// is not the end of its prompt).
	Logits []int32
	// Hidden asks for those rows' final hidden states (the output
	// matrix's input, Program.Hidden) instead of their logits: the step
	// stops before the output matrix (embeddings).
	Hidden bool
}

// Len is the number of tokens.
func (b *Batch) Len() int { return len(b.Tokens) }

// Decode says whether the batch is a decode step: each sequence of it has
// one token, so the step reads every weight for a handful of rows (the
// executor promotes weights for such steps, and the GPU replays a graph
// captured for its size).
func (b *Batch) Decode() bool { return len(b.Tokens) > 0 && len(b.Tables) == len(b.Tokens) }

// AllLogits says whether every row's logits are wanted.
func (b *Batch) AllLogits() bool { return len(b.Logits) == len(b.Tokens) }

// Cell is the cache row of token t.
func (b *Batch) Cell(t int) int {
	p := int(b.Pos[t])
	return int(b.Tables[b.Seq[t]][p/b.Block])*b.Block + p%b.Block
}

// Runs calls f for each run of consecutive tokens [lo, hi) of one
// sequence.
func (b *Batch) Runs(f func(seq, lo, hi int)) {
	for lo := 0; lo < len(b.Tokens); {
		hi := lo + 1
		for hi < len(b.Tokens) && b.Seq[hi] == b.Seq[lo] {
			hi++
		}
		f(int(b.Seq[lo]), lo, hi)
		lo = hi
	}
}

// Check reports what is wrong with the batch for a vocabulary of nvocab
// tokens and caches of rows rows: lengths that disagree, tokens outside
// the vocabulary, a sequence split or out of order, positions past a
// table, logits rows out of order.
func (b *Batch) Check(nvocab, rows int) error {
	n := len(b.Tokens)
	switch {
	case n == 0:
		return fmt.Errorf("batch: no tokens")
	case len(b.Pos) != n || len(b.Seq) != n:
		return fmt.Errorf("batch: %d tokens, %d positions, %d sequence ids", n, len(b.Pos), len(b.Seq))
	case b.Block <= 0:
		return fmt.Errorf("batch: KV block size %d", b.Block)
	}
	seen := make([]bool, len(b.Tables))
	for t := 0; t < n; t++ {
		tok, s, p := b.Tokens[t], int(b.Seq[t]), int(b.Pos[t])
		if tok < 0 || int(tok) >= nvocab {
			return fmt.Errorf("batch: token %d (row %d) is outside the vocabulary of %d", tok, t, nvocab)
		}
		if s < 0 || s >= len(b.Tables) {
			return fmt.Errorf("batch: row %d belongs to sequence %d of %d", t, s, len(b.Tables))
		}
		if t > 0 && int(b.Seq[t-1]) == s {
			if int(b.Pos[t-1])+1 != p {
				return fmt.Errorf("batch: row %d of sequence %d is at position %d after %d", t, s, p, b.Pos[t-1])
			}
		} else if seen[s] {
			return fmt.Errorf("batch: the rows of sequence %d are not contiguous", s)
		}
		seen[s] = true
		if p < 0 || p/b.Block >= len(b.Tables[s]) {
			return fmt.Errorf("batch: row %d at position %d is past its sequence's %d blocks", t, p, len(b.Tables[s]))
		}
		if cell := b.Cell(t); cell < 0 || cell >= rows {
			return fmt.Errorf("batch: row %d maps to cache row %d of %d", t, cell, rows)
		}
	}
	for i, r := range b.Logits {
		if r < 0 || int(r) >= n || (i > 0 && r <= b.Logits[i-1]) {
			return fmt.Errorf("batch: logits rows %v are not ascending rows of the batch", b.Logits)
		}
	}
	return nil
}
