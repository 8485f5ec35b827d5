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

type spmSymbol struct {
	start, n   int32 // byte range; n == 0 once merged away
	prev, next int32
}

type spmBigram struct {
	score       float32
	left, right int32
	size        int32
}

type spmScratch struct {
	syms []spmSymbol
	heap bigramHeap
	ids  []int32
}

// encode appends the tokens of text, whose spaces must already be escaped.
func (m *spm) encode(dst []int, text string) []int {
	sc := m.scratch.Get().(*spmScratch)
	defer m.scratch.Put(sc)
	tokenize := func(word string) []int32 { return m.encodeWord(sc, word) }
	if !m.splitWords {
		return appendIDs(dst, tokenize(text))
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
			dst = memo.encode(dst, text[start:off], tokenize)
			start = off
		}
		prevSpace = space
		off += n
	}
	return memo.encode(dst, text[start:], tokenize)
}

// encodeWord runs the merge queue over one word (or the whole text); the
// result aliases sc.ids.
func (m *spm) encodeWord(sc *spmScratch, text string) []int32 {
	out := sc.ids[:0]
	if text == "" {
		return out
	}
	syms := sc.syms[:0]
	for off := 0; off < len(text); {
		n := min(utf8SeqLen(text[off]), len(text)-off)
		i := int32(len(syms))
		syms = append(syms, spmSymbol{start: int32(off), n: int32(n), prev: i - 1, next: i + 1})
		off += n
	}
	syms[len(syms)-1].next = -1

	h := sc.heap[:0]
	tryAdd := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		s := text[syms[l].start : syms[r].start+syms[r].n]
		id, ok := m.toID[s]
		if !ok {
			return
		}
		h.push(spmBigram{score: m.scores[id], left: l, right: r, size: int32(len(s))})
	}
	for i := int32(1); i < int32(len(syms)); i++ {
		tryAdd(i-1, i)
	}
	for len(h) > 0 {
		b := h.pop()
		l, r := &syms[b.left], &syms[b.right]
		if l.n == 0 || r.n == 0 || l.n+r.n != b.size {
			continue // one side already merged elsewhere
		}
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = b.left
		}
		tryAdd(l.prev, b.left)
		tryAdd(b.left, l.next)
	}
	// A merged symbol is always a token (it was found as one when queued),
	// so llama.cpp's re-segmentation of non-token symbols reduces to the
	// byte fallback for single characters the vocabulary lacks.
	for i := int32(0); i >= 0; i = syms[i].next {
		s := syms[i]
		piece := text[s.start : s.start+s.n]
		if id, ok := m.toID[piece]; ok {
			out = append(out, id)
			continue
		}
		for j := 0; j < len(piece); j++ {
			if id := m.byteTok[piece[j]]; id >= 0 {
				out = append(out, id)
			}
		}
	}
	sc.syms, sc.heap, sc.ids = syms, h, out
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
	for i := 0; ; {
		l, r, best := 2*i+1, 2*i+2, i
		if l < len(s) && s.before(l, best) {
			best = l
		}
		if r < len(s) && s.before(r, best) {
			best = r
		}
		if best == i {
			break
		}
		s[i], s[best] = s[best], s[i]
		i = best
	}
	*h = s
	return top
}
