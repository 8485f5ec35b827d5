package tokenizer

import (
	"container/heap"
	"unicode/utf8"
)

// Reference forms of the word encoders, to check the bounded-memory ones
// against (TestWordEncodersMatchReference).

type refBPESymbol struct {
	id         int32
	start, n   int32
	prev, next int32
}

type refBPEPair struct {
	rank, left, right int32
	lid, rid          int32
	result            int32
}

type refPairHeap []refBPEPair

func (h refPairHeap) Len() int { return len(h) }
func (h refPairHeap) Less(i, j int) bool {
	return h[i].rank < h[j].rank || (h[i].rank == h[j].rank && h[i].left < h[j].left)
}
func (h refPairHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *refPairHeap) Push(x any)        { *h = append(*h, x.(refBPEPair)) }
func (h *refPairHeap) Pop() any          { s := *h; x := s[len(s)-1]; *h = s[:len(s)-1]; return x }
func (h *refPairHeap) push(p refBPEPair) { heap.Push(h, p) }
func (h *refPairHeap) pop() refBPEPair   { return heap.Pop(h).(refBPEPair) }

type spmRefSymbol struct {
	start, n   int32
	prev, next int32
}

type refSPMBigram struct {
	score       float32
	left, right int32
	size        int32
}

type refBigramHeap []refSPMBigram

func (h refBigramHeap) Len() int { return len(h) }
func (h refBigramHeap) Less(i, j int) bool {
	return h[i].score > h[j].score || (h[i].score == h[j].score && h[i].left < h[j].left)
}
func (h refBigramHeap) Swap(i, j int)        { h[i], h[j] = h[j], h[i] }
func (h *refBigramHeap) Push(x any)          { *h = append(*h, x.(refSPMBigram)) }
func (h *refBigramHeap) Pop() any            { s := *h; x := s[len(s)-1]; *h = s[:len(s)-1]; return x }
func (h *refBigramHeap) push(b refSPMBigram) { heap.Push(h, b) }
func (h *refBigramHeap) pop() refSPMBigram   { return heap.Pop(h).(refSPMBigram) }

// refBPEWord is bpeWord as it was before its memory was bounded: one
// symbol per byte with its own length, and every queued pair kept until
// popped, the straightforward form of llama.cpp's algorithm.
func (m *bpe) refBPEWord(word string) []int32 {
	var out []int32
	if m.ignoreMerges {
		// Llama 3: a word that is a token is taken whole, even where the
		// merges would split it differently.
		var enc []byte
		for i := 0; i < len(word); i++ {
			enc = utf8.AppendRune(enc, byteToRune[word[i]])
		}
		if id, ok := m.toID[string(enc)]; ok {
			return append(out, id)
		}
	}
	var syms []refBPESymbol
	for i := 0; i < len(word); i++ {
		syms = append(syms, refBPESymbol{id: m.byteID[word[i]], start: int32(i), n: 1, prev: int32(i) - 1, next: int32(i) + 1})
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	var h refPairHeap
	push := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		a, b := syms[l].id, syms[r].id
		if a < 0 || b < 0 {
			return
		}
		if mg, ok := m.merges[pairKey(a, b)]; ok {
			h.push(refBPEPair{rank: mg.rank, left: l, right: r, lid: a, rid: b, result: mg.result})
		}
	}
	for i := int32(1); i < int32(len(syms)); i++ {
		push(i-1, i)
	}
	for len(h) > 0 {
		p := h.pop()
		l, r := &syms[p.left], &syms[p.right]
		// Stale: one side was merged away or grew since the pair was queued.
		if l.n == 0 || r.n == 0 || l.id != p.lid || r.id != p.rid {
			continue
		}
		l.id = p.result
		l.n += r.n
		r.n = 0
		l.next = r.next
		if r.next >= 0 {
			syms[r.next].prev = p.left
		}
		push(l.prev, p.left)
		push(p.left, l.next)
	}
	for i := int32(0); len(syms) > 0 && i >= 0; i = syms[i].next {
		s := syms[i]
		if s.id >= 0 && s.id < m.nTokens {
			out = append(out, s.id)
			continue
		}
		for j := s.start; j < s.start+s.n; j++ {
			out = append(out, m.fallback[word[j]]...)
		}
	}
	return out
}

// refSPMWord is encodeWord as it was before its memory was bounded.
func (m *spm) refSPMWord(text string) []int32 {
	var out []int32
	if text == "" {
		return out
	}
	var syms []spmRefSymbol
	for off := 0; off < len(text); {
		n := min(utf8SeqLen(text[off]), len(text)-off)
		i := int32(len(syms))
		syms = append(syms, spmRefSymbol{start: int32(off), n: int32(n), prev: i - 1, next: i + 1})
		off += n
	}
	syms[len(syms)-1].next = -1

	var h refBigramHeap
	tryAdd := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		s := text[syms[l].start : syms[r].start+syms[r].n]
		id, ok := m.toID[s]
		if !ok {
			return
		}
		h.push(refSPMBigram{score: m.scores[id], left: l, right: r, size: int32(len(s))})
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
	return out
}
