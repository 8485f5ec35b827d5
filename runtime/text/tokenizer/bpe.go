package tokenizer

import (
	"fmt"
	"runtime"
	"strings"
	"sync"
	"unicode/utf8"
)

// bpe is a byte-level BPE model (tokenizer.ggml.model = "gpt2"), following
// llama.cpp's llm_tokenizer_bpe_session: each pre-tokenized word starts as
// one symbol per byte; the adjacent pair with the lowest merge rank (ties:
// leftmost) is merged until no pair has a rank.
//
// Symbols are tracked by id instead of by text. Merge parts and results are
// interned: a string that is a token has its token id, any other string a
// merge mentions gets an id past the vocabulary. A merge table keyed by id
// pairs then replaces llama.cpp's string-pair map.
type bpe struct {
	nTokens int32
	merges  map[uint64]bpeMerge
	byteID  [256]int32 // id of each single byte's symbol, -1 when none
	// fallback lists, per raw byte, the tokens llama.cpp emits for a final
	// symbol that is not a token: one per byte of its byte-level text that is
	// itself a one-byte token (usually none: such symbols cannot arise from a
	// consistent vocabulary).
	fallback     [256][]int32
	ignoreMerges bool
	toID         map[string]int32
	scratch      sync.Pool // *bpeScratch
}

type bpeMerge struct{ rank, result int32 }

func pairKey(l, r int32) uint64 { return uint64(uint32(l))<<32 | uint64(uint32(r)) }

// newBPE builds the model from tokenizer.ggml.merges ("left right" in
// byte-level text, lowest rank first).
func newBPE(tokens []string, toID map[string]int32, merges []string, ignoreMerges bool) (*bpe, error) {
	m := &bpe{
		nTokens:      int32(len(tokens)),
		ignoreMerges: ignoreMerges,
		toID:         toID,
	}
	// Resolving merge strings to ids is hundreds of thousands of lookups in
	// a large map, bound by memory latency: spread them over the cores.
	// Strings that are not tokens come back as notToken and are interned
	// below, in order, so the ids do not depend on the scheduling.
	const notToken = -1
	parts := make([][3]int32, len(merges)) // left, right, result
	var (
		wg      sync.WaitGroup
		errOnce sync.Once
		err     error
	)
	workers := min(runtime.GOMAXPROCS(0), len(merges)/4096+1)
	for w := range workers {
		lo, hi := w*len(merges)/workers, (w+1)*len(merges)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			var buf []byte
			for i := lo; i < hi; i++ {
				left, right, ok := splitMerge(merges[i])
				if !ok {
					errOnce.Do(func() {
						err = fmt.Errorf("metadata key %q: merge %d (%q) has no space between its two parts", keyMerges, i, merges[i])
					})
					return
				}
				p := [3]int32{notToken, notToken, notToken}
				if id, ok := toID[left]; ok {
					p[0] = id
				}
				if id, ok := toID[right]; ok {
					p[1] = id
				}
				buf = append(append(buf[:0], left...), right...)
				if id, ok := toID[string(buf)]; ok {
					p[2] = id
				}
				parts[i] = p
			}
		}()
	}
	wg.Wait()
	if err != nil {
		return nil, err
	}

	// Intern the strings that are not tokens; -2 marks one that holds a
	// character outside the byte alphabet and so can never be a symbol.
	extraID := map[string]int32{}
	nextID := m.nTokens
	intern := func(s string) int32 {
		if id, ok := extraID[s]; ok {
			return id
		}
		id := int32(-2)
		if _, ok := decodeByteLevel(s); ok {
			id = nextID
			nextID++
		}
		extraID[s] = id
		return id
	}
	for i, p := range parts {
		if p[0] != notToken && p[1] != notToken && p[2] != notToken {
			continue
		}
		left, right, _ := splitMerge(merges[i])
		if p[0] == notToken {
			p[0] = intern(left)
		}
		if p[1] == notToken {
			p[1] = intern(right)
		}
		if p[2] == notToken && p[0] >= 0 && p[1] >= 0 {
			p[2] = intern(left + right)
		}
		parts[i] = p
	}

	// Insert from the highest rank down so that, for a pair listed twice,
	// the lowest rank is the one kept (llama.cpp's emplace keeps the first).
	m.merges = make(map[uint64]bpeMerge, len(merges))
	for i := len(parts) - 1; i >= 0; i-- {
		p := parts[i]
		if p[0] < 0 || p[1] < 0 {
			continue
		}
		m.merges[pairKey(p[0], p[1])] = bpeMerge{rank: int32(i), result: p[2]}
	}

	for b := 0; b < 256; b++ {
		enc := string(byteToRune[b])
		m.byteID[b] = -1
		if id, ok := toID[enc]; ok {
			m.byteID[b] = id
		} else if id, ok := extraID[enc]; ok && id >= 0 {
			m.byteID[b] = id
		}
		for i := 0; i < len(enc); i++ {
			if id, ok := toID[enc[i:i+1]]; ok {
				m.fallback[b] = append(m.fallback[b], id)
			}
		}
	}
	m.scratch.New = func() any { return new(bpeScratch) }
	return m, nil
}

// splitMerge splits "left right" at the first space after the first byte,
// as llama.cpp does, so that a left part that is a space still parses.
func splitMerge(s string) (left, right string, ok bool) {
	if len(s) < 2 {
		return "", "", false
	}
	j := strings.IndexByte(s[1:], ' ')
	if j < 0 {
		return "", "", false
	}
	return s[:j+1], s[j+2:], true
}

type bpeSymbol struct {
	id         int32 // interned id, -1 for a byte no merge or token knows
	start, n   int32 // byte range in the word; n == 0 once merged away
	prev, next int32
}

type bpePair struct {
	rank, left, right int32
	lid, rid          int32 // symbol ids when the pair was queued
	result            int32 // id of the merged symbol
}

type bpeScratch struct {
	syms []bpeSymbol
	heap []bpePair
	enc  []byte
	ids  []int32
}

// encode appends the tokens of text, split into words by pre.
func (m *bpe) encode(dst []int, pre *preTokenizer, text string) []int {
	sc := m.scratch.Get().(*bpeScratch)
	defer m.scratch.Put(sc)
	memo := newWordMemo(len(text))
	tokenize := func(word string) []int32 { return m.bpeWord(sc, word) }
	pre.words(text, func(word string) { dst = memo.encode(dst, word, tokenize) })
	return dst
}

// bpeWord runs BPE on word; the result aliases sc.ids.
func (m *bpe) bpeWord(sc *bpeScratch, word string) []int32 {
	out := sc.ids[:0]
	if m.ignoreMerges {
		// Llama 3: a word that is a token is taken whole, even where the
		// merges would split it differently.
		sc.enc = sc.enc[:0]
		for i := 0; i < len(word); i++ {
			sc.enc = utf8.AppendRune(sc.enc, byteToRune[word[i]])
		}
		if id, ok := m.toID[string(sc.enc)]; ok {
			sc.ids = append(out, id)
			return sc.ids
		}
	}
	syms := sc.syms[:0]
	for i := 0; i < len(word); i++ {
		syms = append(syms, bpeSymbol{id: m.byteID[word[i]], start: int32(i), n: 1, prev: int32(i) - 1, next: int32(i) + 1})
	}
	if len(syms) > 0 {
		syms[len(syms)-1].next = -1
	}
	h := pairHeap(sc.heap[:0])
	push := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		a, b := syms[l].id, syms[r].id
		if a < 0 || b < 0 {
			return
		}
		if mg, ok := m.merges[pairKey(a, b)]; ok {
			h.push(bpePair{rank: mg.rank, left: l, right: r, lid: a, rid: b, result: mg.result})
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
	sc.syms, sc.heap, sc.ids = syms, h, out
	return out
}

// pairHeap is a binary min-heap ordered by (rank, left), llama.cpp's
// llm_bigram_bpe order.
type pairHeap []bpePair

func (h pairHeap) less(i, j int) bool {
	return h[i].rank < h[j].rank || (h[i].rank == h[j].rank && h[i].left < h[j].left)
}

func (h *pairHeap) push(p bpePair) {
	*h = append(*h, p)
	s := *h
	for i := len(s) - 1; i > 0; {
		parent := (i - 1) / 2
		if !s.less(i, parent) {
			break
		}
		s[i], s[parent] = s[parent], s[i]
		i = parent
	}
}

func (h *pairHeap) pop() bpePair {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s = s[:last]
	for i := 0; ; {
		l, r, min := 2*i+1, 2*i+2, i
		if l < len(s) && s.less(l, min) {
			min = l
		}
		if r < len(s) && s.less(r, min) {
			min = r
		}
		if min == i {
			break
		}
		s[i], s[min] = s[min], s[i]
		i = min
	}
	*h = s
	return top
}
