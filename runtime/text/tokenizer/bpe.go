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
	nTokens     int32
	maxTokenLen int // bytes of the longest token's text
	merges      map[uint64]bpeMerge
	byteID      [256]int32 // id of each single byte's symbol, -1 when none
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
		maxTokenLen:  maxLen(tokens),
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

// bpeSymbol is a symbol of a word being merged. Symbols start as one per
// byte, and symbol i always starts at byte i (merging keeps the left
// symbol), so it ends where the next live one starts: no offsets or
// lengths are stored. With the queue's 8-byte entries that keeps a long
// word to about 30 bytes of work memory per byte.
type bpeSymbol struct {
	id         int32 // interned id; -1 for a byte no merge or token knows; deadSymbol once merged away
	prev, next int32
}

const deadSymbol = -3

// bpePair is a queued merge of the symbol at left with the one after it.
// The rank names the merge, so the pair is still valid when popped exactly
// when the two symbols there now have that merge's rank.
type bpePair struct{ rank, left int32 }

type bpeScratch struct {
	syms []bpeSymbol
	heap []bpePair
	enc  []byte
}

// maxKeptScratch is the most symbols a pooled scratch keeps between calls:
// a huge word's buffers go to the garbage collector instead of staying
// in the pool.
const maxKeptScratch = 1 << 16

// encode appends the tokens of text, split into words by pre. When limit
// is set, words stop being tokenized once it says so.
func (m *bpe) encode(dst []int, pre *preTokenizer, text string, lim *limiter) []int {
	sc := m.scratch.Get().(*bpeScratch)
	defer func() {
		if cap(sc.syms) <= maxKeptScratch {
			m.scratch.Put(sc)
		}
	}()
	memo := newWordMemo(len(text))
	tokenize := func(dst []int, word string) []int { return m.bpeWord(sc, dst, word) }
	pre.words(text, func(word string) {
		if lim.word(len(dst), len(word)) {
			dst = memo.encode(dst, word, tokenize)
		}
	})
	return dst
}

// bpeWord runs BPE on word and appends its tokens to out.
func (m *bpe) bpeWord(sc *bpeScratch, out []int, word string) []int {
	if m.ignoreMerges && len(word) <= m.maxTokenLen {
		// Llama 3: a word that is a token is taken whole, even where the
		// merges would split it differently.
		sc.enc = sc.enc[:0]
		for i := 0; i < len(word); i++ {
			sc.enc = utf8.AppendRune(sc.enc, byteToRune[word[i]])
		}
		if id, ok := m.toID[string(sc.enc)]; ok {
			return append(out, int(id))
		}
	}
	n := int32(len(word))
	syms := sc.syms[:0]
	if cap(syms) < len(word) {
		syms = make([]bpeSymbol, 0, len(word))
	}
	for i := range n {
		syms = append(syms, bpeSymbol{id: m.byteID[word[i]], prev: i - 1, next: i + 1})
	}
	if n > 0 {
		syms[n-1].next = -1
	}
	// rankAt is the rank of merging the symbol at l with the next one, -1
	// when they have none.
	rankAt := func(l int32) (bpeMerge, bool) {
		r := syms[l].next
		if r < 0 {
			return bpeMerge{}, false
		}
		a, b := syms[l].id, syms[r].id
		if a < 0 || b < 0 {
			return bpeMerge{}, false
		}
		mg, ok := m.merges[pairKey(a, b)]
		return mg, ok
	}
	valid := func(q bpePair) bool {
		if syms[q.left].id == deadSymbol {
			return false
		}
		mg, ok := rankAt(q.left)
		return ok && mg.rank == q.rank
	}
	h := pairHeap(sc.heap[:0])
	if cap(h) < len(word) {
		h = make(pairHeap, 0, len(word))
	}
	alive := n
	push := func(l int32) {
		if l < 0 {
			return
		}
		if mg, ok := rankAt(l); ok {
			// Stale pairs pile up in long words: rather than grow the
			// queue, drop them once they are half of it, so it stays
			// within about twice the live symbols.
			if len(h) == cap(h) && len(h) > 2*int(alive)+64 {
				h = h.compact(valid)
			}
			h.push(bpePair{rank: mg.rank, left: l})
		}
	}
	for i := int32(0); i+1 < n; i++ {
		push(i)
	}
	for len(h) > 0 {
		p := h.pop()
		l := &syms[p.left]
		if l.id == deadSymbol {
			continue
		}
		mg, ok := rankAt(p.left)
		if !ok || mg.rank != p.rank {
			continue // stale: one side changed since the pair was queued
		}
		r := l.next
		l.id = mg.result
		l.next = syms[r].next
		syms[r].id = deadSymbol
		if l.next >= 0 {
			syms[l.next].prev = p.left
		}
		alive--
		push(l.prev)
		push(p.left)
	}
	for i := int32(0); n > 0 && i >= 0; i = syms[i].next {
		s := syms[i]
		if s.id >= 0 && s.id < m.nTokens {
			out = append(out, int(s.id))
			continue
		}
		end := n
		if s.next >= 0 {
			end = s.next
		}
		for j := i; j < end; j++ {
			out = appendIDs(out, m.fallback[word[j]])
		}
	}
	sc.syms, sc.heap = syms, h
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
	s.down(0)
	*h = s
	return top
}

// compact keeps the entries valid reports true for and restores the heap
// order.
func (h pairHeap) compact(valid func(bpePair) bool) pairHeap {
	s := h[:0]
	for _, p := range h {
		if valid(p) {
			s = append(s, p)
		}
	}
	for i := len(s)/2 - 1; i >= 0; i-- {
		s.down(i)
	}
	return s
}

func (h pairHeap) down(i int) {
	for {
		l, r, min := 2*i+1, 2*i+2, i
		if l < len(h) && h.less(l, min) {
			min = l
		}
		if r < len(h) && h.less(r, min) {
			min = r
		}
		if min == i {
			return
		}
		h[i], h[min] = h[min], h[i]
		i = min
	}
}

func maxLen(ss []string) int {
	n := 0
	for _, s := range ss {
		n = max(n, len(s))
	}
	return n
}
