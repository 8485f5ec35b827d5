package tokenizer

import (
	"cmp"
	"slices"
	"strings"
)

// specialMatcher cuts special tokens out of text before the tokenizer model
// sees it, with the result of llama.cpp's tokenizer_st_partition: special
// tokens are tried longest first; each one is matched left to right in the
// text fragments still unclaimed, and splits them. Control and unknown
// tokens take part only when special tokens are parsed; user-defined ones
// always do (as in Hugging Face tokenizers).
//
// llama.cpp rescans the text once per special token; with hundreds of them
// (Llama 3 has 256) that is slow for long texts, so here one pass finds every
// occurrence of every special token first, and the partition then replays
// llama.cpp's order over those occurrences only.
type specialMatcher struct {
	ids   []int32  // control, user-defined and unknown tokens, longest first
	texts []string // their texts
	// Candidates by leading bytes: two-byte prefix for texts of two bytes or
	// more, first byte for one-byte texts.
	byPair  map[uint16][]int32
	single  [256][]int32
	lead    [256]bool
	anyUser bool // some special token takes part even without parsing
}

func newSpecialMatcher(tokens []string, attrs []attr) specialMatcher {
	m := specialMatcher{byPair: map[uint16][]int32{}}
	for id, a := range attrs {
		if a&(attrControl|attrUserDefined|attrUnknown) != 0 {
			m.ids = append(m.ids, int32(id))
		}
	}
	// Longest first, as llama.cpp; among equal lengths by id, where llama.cpp's
	// std::sort leaves the order unspecified.
	slices.SortStableFunc(m.ids, func(a, b int32) int { return cmp.Compare(len(tokens[b]), len(tokens[a])) })
	for k, id := range m.ids {
		s := tokens[id]
		m.texts = append(m.texts, s)
		m.lead[s[0]] = true
		if len(s) == 1 {
			m.single[s[0]] = append(m.single[s[0]], int32(k))
		} else {
			key := uint16(s[0])<<8 | uint16(s[1])
			m.byPair[key] = append(m.byPair[key], int32(k))
		}
		if attrs[id]&(attrControl|attrUnknown) == 0 {
			m.anyUser = true
		}
	}
	return m
}

// fragment is a run of raw text [start, end) or, when token >= 0, a special
// token.
type fragment struct{ start, end, token int }

type specialHit struct{ k, pos int } // k indexes m.ids

// partition splits text into raw fragments and special tokens; attrs are the
// tokenizer's (their strip bits are set after the matcher is built). With
// parseSpecial, control tokens are matched except where they overlap a
// range of plain (sorted, not overlapping).
func (m *specialMatcher) partition(text string, parseSpecial bool, plain []Range, attrs []attr) []fragment {
	whole := []fragment{{0, len(text), -1}}
	if len(m.ids) == 0 || (!parseSpecial && !m.anyUser) {
		return whole
	}
	usable := func(k int32) bool {
		return parseSpecial || attrs[m.ids[k]]&(attrControl|attrUnknown) == 0
	}
	// inPlain reports whether a control token at [i, i+n) overlaps a plain
	// range; positions only grow, so p only moves forward.
	p := 0
	inPlain := func(k int32, i int) bool {
		if attrs[m.ids[k]]&(attrControl|attrUnknown) == 0 {
			return false // user-defined tokens are matched anywhere
		}
		for p < len(plain) && plain[p].End <= i {
			p++
		}
		return p < len(plain) && plain[p].Start < i+len(m.texts[k])
	}
	var hits []specialHit
	for i := 0; i < len(text); i++ {
		b := text[i]
		if !m.lead[b] {
			continue
		}
		for _, k := range m.single[b] {
			if usable(k) && !inPlain(k, i) {
				hits = append(hits, specialHit{int(k), i})
			}
		}
		if i+1 < len(text) {
			for _, k := range m.byPair[uint16(b)<<8|uint16(text[i+1])] {
				if usable(k) && strings.HasPrefix(text[i:], m.texts[k]) && !inPlain(k, i) {
					hits = append(hits, specialHit{int(k), i})
				}
			}
		}
	}
	if len(hits) == 0 {
		return whole
	}
	slices.SortFunc(hits, func(a, b specialHit) int {
		return cmp.Or(cmp.Compare(a.k, b.k), cmp.Compare(a.pos, b.pos))
	})

	frags := whole
	for len(hits) > 0 {
		k := hits[0].k
		n := 1
		for n < len(hits) && hits[n].k == k {
			n++
		}
		frags = m.split(frags, text, k, hits[:n], attrs)
		hits = hits[n:]
	}
	return frags
}

// split claims the occurrences (sorted positions) of special token k in the
// raw fragments of frags, leftmost first, as llama.cpp does for one token.
func (m *specialMatcher) split(frags []fragment, text string, k int, occ []specialHit, attrs []attr) []fragment {
	id := int(m.ids[k])
	size := len(m.texts[k])
	a := attrs[id]
	out := make([]fragment, 0, len(frags)+2*len(occ))
	j := 0
	for _, fr := range frags {
		if fr.token >= 0 {
			out = append(out, fr)
			continue
		}
		start, end := fr.start, fr.end
		for ; j < len(occ); j++ {
			p := occ[j].pos
			if p < start {
				continue // inside text claimed earlier
			}
			if p+size > end {
				break // belongs to a later fragment, if any
			}
			left := p
			if a&attrLStrip != 0 {
				for left > start && isCSpace(text[left-1]) {
					left--
				}
			}
			if left > start {
				out = append(out, fragment{start, left, -1})
			}
			out = append(out, fragment{p, p + size, id})
			start = p + size
			if a&attrRStrip != 0 {
				for start < end && isCSpace(text[start]) {
					start++
				}
			}
		}
		if start < end {
			out = append(out, fragment{start, end, -1})
		}
	}
	return out
}
