package tokenizer

import (
	"fmt"
	"strings"
	"sync"
)

// spm is a SentencePiece BPE model (tokenizer.ggml.model = "llama"),
// following llama.cpp's llm_tokenizer_spm_session: the text (spaces already
// escaped to ▁) starts as one symbol per UTF-8 character; the adjacent pair
// whose concatenation is the token with the highest score (ties: leftmost)
// is merged until no pair forms a token. Symbols that are not tokens are
// emitted byte by byte as <0xXX> tokens.
//
// The queue runs over the whole text in llama.cpp, which is slow for long
// texts. Most vocabularies only have ▁ at the start of tokens, after other ▁
// at most; then no token, and so no merge, crosses the start of a word (a ▁
// after something else), and words can be tokenized one by one with the same
// result, and remembered like BPE words.
type spm struct {
	toID       map[string]int32
	scores     []float32
	byteTok    [256]int32 // token for a raw byte, -1 when the vocabulary has none
	splitWords bool       // no token has ▁ after anything but ▁
	scratch    sync.Pool  // *spmScratch
}

const spmSpace = "\u2581"

func newSPM(tokens []string, toID map[string]int32, scores []float32, unk int) *spm {
	m := &spm{toID: toID, scores: scores, splitWords: true}
	m.scratch.New = func() any { return new(spmScratch) }
	for _, tok := range tokens {
		if !spaceOnlyLeads(tok) {
			m.splitWords = false
			break
		}
	}
	for b := 0; b < 256; b++ {
		// llama.cpp's byte_to_token: <0xXX>, else the byte itself as a token.
		id, ok := toID[fmt.Sprintf("<0x%02X>", b)]
		if !ok {
			id, ok = toID[string([]byte{byte(b)})]
		}
		if !ok {
			id = int32(unk) // llama.cpp would abort; the unknown token is kinder
		}
		m.byteTok[b] = id
	}
	return m
}

// spaceOnlyLeads reports whether every ▁ in tok after its start follows
// another ▁ (byte-wise, so invalid UTF-8 cannot fool it).
func spaceOnlyLeads(tok string) bool {
	for i := 1; i < len(tok); i++ {
		j := strings.Index(tok[i:], spmSpace)
		if j < 0 {
			return true
		}
		i += j
		if !strings.HasSuffix(tok[:i], spmSpace) {
			return false
		}
	}
	return true
}

// spmSymbol is a symbol of a word being merged: a character at first,
// then merged runs. It ends where the next live symbol starts, so only the
// start is stored (12 bytes a character, with the queue's 12-byte entries
// about 40 bytes of work memory per byte of a long word at most).
type spmSymbol struct {
	start      int32 // -1 once merged away
	prev, next int32
}

// spmBigram is a queued merge of the symbol at left with the one after it
// into a token of size bytes; it is still valid when popped exactly when
// the two symbols there now span size bytes (both only grow).
type spmBigram struct {
	score      float32
	left, size int32
}

type spmScratch struct {
	syms []spmSymbol
	heap bigramHeap
}

// encode appends the tokens of text, whose spaces must already be escaped.
// When limit is set, words stop being tokenized once it says so.
func (m *spm) encode(dst []int, text string, lim *limiter) []int {
	sc := m.scratch.Get().(*spmScratch)
	defer func() {
		if cap(sc.syms) <= maxKeptScratch {
			m.scratch.Put(sc)
		}
	}()
	tokenize := func(dst []int, word string) []int { return m.encodeWord(sc, dst, word) }
	if !m.splitWords {
		if !lim.word(len(dst), len(text)) {
			return dst
		}
		return tokenize(dst, text)
	}
	// Words start at a ▁ that follows something else. The cut points must
	// be symbol starts as encodeWord finds them (which matters for invalid
	// UTF-8), so walk the symbols the same way.
	memo := newWordMemo(len(text))
	start, prevSpace := 0, false
	for off := 0; off < len(text); {
		n := min(utf8SeqLen(text[off]), len(text)-off)
		space := text[off:off+n] == spmSpace
		if space && !prevSpace && off > start {
			if !lim.word(len(dst), off-start) {
				return dst
			}
			dst = memo.encode(dst, text[start:off], tokenize)
			start = off
		}
		prevSpace = space
		off += n
	}
	if !lim.word(len(dst), len(text)-start) {
		return dst
	}
	return memo.encode(dst, text[start:], tokenize)
}

// encodeWord runs the merge queue over one word (or the whole text) and
// appends its tokens to out.
func (m *spm) encodeWord(sc *spmScratch, out []int, text string) []int {
	if text == "" {
		return out
	}
	syms := sc.syms[:0]
	if cap(syms) < len(text) {
		syms = make([]spmSymbol, 0, len(text)) // at most one symbol a byte
	}
	for off := 0; off < len(text); {
		n := min(utf8SeqLen(text[off]), len(text)-off)
		i := int32(len(syms))
		syms = append(syms, spmSymbol{start: int32(off), prev: i - 1, next: i + 1})
		off += n
	}
	syms[len(syms)-1].next = -1
	end := func(i int32) int32 {
		if nx := syms[i].next; nx >= 0 {
			return syms[nx].start
		}
		return int32(len(text))
	}

	valid := func(b spmBigram) bool {
		l := syms[b.left]
		return l.start >= 0 && l.next >= 0 && end(l.next)-l.start == b.size
	}
	h := sc.heap[:0]
	if cap(h) < len(syms) {
		h = make(bigramHeap, 0, len(syms))
	}
	alive := len(syms)
	tryAdd := func(l int32) {
		if l < 0 || syms[l].next < 0 {
			return
		}
		s := text[syms[l].start:end(syms[l].next)]
		id, ok := m.toID[s]
		if !ok {
			return
		}
		// Drop stale bigrams rather than grow the queue once they are
		// half of it.
		if len(h) == cap(h) && len(h) > 2*alive+64 {
			h = h.compact(valid)
		}
		h.push(spmBigram{score: m.scores[id], left: l, size: int32(len(s))})
	}
	for i := int32(0); i+1 < int32(len(syms)); i++ {
		tryAdd(i)
	}
	for len(h) > 0 {
		b := h.pop()
		if !valid(b) {
			continue // one side already merged elsewhere
		}
		l := &syms[b.left]
		r := l.next
		l.next = syms[r].next
		syms[r].start = -1
		if l.next >= 0 {
			syms[l.next].prev = b.left
		}
		alive--
		tryAdd(l.prev)
		tryAdd(b.left)
	}
	// A merged symbol is always a token (it was found as one when queued),
	// so llama.cpp's re-segmentation of non-token symbols reduces to the
	// byte fallback for single characters the vocabulary lacks.
	for i := int32(0); i >= 0; i = syms[i].next {
		piece := text[syms[i].start:end(i)]
		if id, ok := m.toID[piece]; ok {
			out = append(out, int(id))
			continue
		}
		for j := 0; j < len(piece); j++ {
			if id := m.byteTok[piece[j]]; id >= 0 {
				out = append(out, int(id))
			}
		}
	}
	sc.syms, sc.heap = syms, h
	return out
}

// escapeSpaces is llama.cpp's llama_escape_whitespace: SentencePiece
// vocabularies spell a space as U+2581 (▁).
func escapeSpaces(s string) string { return strings.ReplaceAll(s, " ", spmSpace) }

// bigramHeap is a binary max-heap ordered by score, then by leftmost
// position, llama.cpp's llm_bigram_spm order.
type bigramHeap []spmBigram

func (h bigramHeap) before(i, j int) bool {
	return h[i].score > h[j].score || (h[i].score == h[j].score && h[i].left < h[j].left)
}

func (h *bigramHeap) push(b spmBigram) {
	*h = append(*h, b)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s.before(i, parent) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

func (h *bigramHeap) pop() spmBigram {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	s.down(0)
	*h = s
	return top
}

func (h bigramHeap) down(i int) {
	for {
		l, r, best := 2*i+1, 2*i+2, i
		if l < len(h) && h.before(l, best) {
			best = l
		}
		if r < len(h) && h.before(r, best) {
			best = r
		}
		if best == i {
			return
		}
		h[i], h[best] = h[best], h[i]
		i = best
	}
}

// compact keeps the entries valid reports true for and restores the heap
// order.
func (h bigramHeap) compact(valid func(spmBigram) bool) bigramHeap {
	s := h[:0]
	for _, b := range h {
		if valid(b) {
			s = append(s, b)
		}
	}
	for i := len(s)/2 - 1; i >= 0; i-- {
		s.down(i)
	}
	return s
}
