package constrain

import (
	"errors"
	"fmt"
	"slices"
	"strings"
)

// Vocab is a model's vocabulary as a prefix tree over the tokens' bytes,
// stored in preorder so that a walk is a loop over an array: each node
// knows its depth and where its subtree ends, so a rejected prefix skips
// its whole subtree at once. A Vocab is immutable and safe for concurrent
// use; build it once per model.
type Vocab struct {
	size     int // logits per step (the model's vocabulary, >= the tokenizer's)
	nodes    []trieNode
	toks     []int32 // the tokens ending at each node: toks[node.tok0:node.tok1]
	eog      []int32 // end-of-generation tokens
	isEOG    []bool
	text     string  // every token's piece, concatenated
	off      []int32 // token id's piece is text[off[id]:off[id+1]]
	maxDepth int
	// textMask has the tokens whose whole piece is text (see utf8Next): a
	// state that reads any text allows at least these.
	textMask []uint64
}

type trieNode struct {
	b          byte
	text       bool   // every token of the subtree, from here on, is text (see utf8Next)
	depth      uint16 // 1 for the first byte of a token
	skip       int32  // the index just past this node's subtree
	tok0, tok1 int32
}

// maxTokenBytes bounds a token's piece (the trie's depth).
const maxTokenBytes = 1 << 15

// NewVocab builds the prefix tree of a vocabulary of size tokens (the
// length of the logits). piece(id) is the text a token adds to the output
// (as the generation writes it); tokens with an empty piece can never be
// chosen under a constraint, except the end-of-generation tokens eog, which
// are allowed where the text is complete.
func NewVocab(size int, piece func(id int) string, eog []int) (*Vocab, error) {
	if size <= 0 {
		return nil, fmt.Errorf("constrain: vocabulary size %d", size)
	}
	v := &Vocab{size: size, isEOG: make([]bool, size), off: make([]int32, size+1)}
	for _, id := range eog {
		if id < 0 || id >= size {
			return nil, fmt.Errorf("constrain: end-of-generation token %d outside the vocabulary [0, %d)", id, size)
		}
		if !v.isEOG[id] {
			v.isEOG[id] = true
			v.eog = append(v.eog, int32(id))
		}
	}
	if len(v.eog) == 0 {
		return nil, errors.New("constrain: the vocabulary has no end-of-generation token, so a constrained text could never end")
	}
	var b strings.Builder
	var ids []int32
	for id := range size {
		v.off[id] = int32(b.Len())
		if v.isEOG[id] {
			continue
		}
		p := piece(id)
		if len(p) > maxTokenBytes {
			return nil, fmt.Errorf("constrain: token %d has %d bytes, more than %d", id, len(p), maxTokenBytes)
		}
		if p != "" {
			b.WriteString(p)
			ids = append(ids, int32(id))
		}
	}
	v.off[size] = int32(b.Len())
	v.text = b.String()
	if len(v.text) > 1<<30 {
		return nil, fmt.Errorf("constrain: the vocabulary's pieces hold %d bytes, too many", len(v.text))
	}
	slices.SortFunc(ids, func(a, b int32) int {
		if c := strings.Compare(v.piece(int(a)), v.piece(int(b))); c != 0 {
			return c
		}
		return int(a - b)
	})
	// Sorted pieces: each token shares a prefix with the one before it and
	// adds nodes for the rest, in preorder.
	var path []int32 // node index at each depth-1
	prev := ""
	for _, id := range ids {
		p := v.piece(int(id))
		l := 0
		for l < len(p) && l < len(prev) && p[l] == prev[l] {
			l++
		}
		for len(path) > l { // close the subtrees that end here
			v.nodes[path[len(path)-1]].skip = int32(len(v.nodes))
			path = path[:len(path)-1]
		}
		for i := l; i < len(p); i++ {
			path = append(path, int32(len(v.nodes)))
			v.nodes = append(v.nodes, trieNode{b: p[i], depth: uint16(i + 1), tok0: int32(len(v.toks)), tok1: int32(len(v.toks))})
		}
		n := &v.nodes[path[len(path)-1]]
		if n.tok1 != int32(len(v.toks)) {
			// Tokens ending at a node are added while it is the deepest node.
			return nil, fmt.Errorf("constrain: internal error: token %d's node is not contiguous", id)
		}
		v.toks = append(v.toks, id)
		n.tok1++
		v.maxDepth = max(v.maxDepth, len(p))
		prev = p
	}
	for _, n := range path {
		v.nodes[n].skip = int32(len(v.nodes))
	}
	// Text subtrees, children before parents: textFrom[i] has bit u set
	// when every token of node i's subtree, read from node i on in UTF-8
	// state u, stays valid text.
	textFrom := make([]uint8, len(v.nodes))
	for i := len(v.nodes) - 1; i >= 0; i-- {
		n := &v.nodes[i]
		var ok uint8
		for u := range uint8(utf8States) {
			next := utf8Next(u, n.b)
			if next < 0 {
				continue
			}
			all := true
			for c := int32(i + 1); all && c < n.skip; c = v.nodes[c].skip {
				all = textFrom[c]>>next&1 == 1
			}
			if all {
				ok |= 1 << u
			}
		}
		textFrom[i] = ok
		n.text = ok&1 == 1
	}
	v.textMask = make([]uint64, (size+63)/64)
	for _, id := range ids {
		u, p := 0, v.piece(int(id))
		for i := 0; i < len(p) && u >= 0; i++ {
			u = utf8Next(uint8(u), p[i])
		}
		if u >= 0 {
			v.textMask[id>>6] |= 1 << (id & 63)
		}
	}
	return v, nil
}

// Text is what a JSON string holds between its quotes without escapes:
// valid UTF-8 of no control characters, quotes or backslashes. A Matcher
// takes a subtree of text tokens whole where its state reads any text and
// comes back to itself (the inside of a JSON string), instead of walking
// it. utf8Next is the automaton of its valid prefixes: state 0 is between
// characters; the others expect continuation bytes (1: one more; 2: two
// more; 3: after E0; 4: after ED; 5: three more; 6: after F0; 7: after F4).
const utf8States = 8

func utf8Next(u uint8, b byte) int {
	switch u {
	case 0:
		switch {
		case b >= 0x20 && b < 0x80:
			if b == '"' || b == '\\' {
				return -1
			}
			return 0
		case b >= 0xC2 && b <= 0xDF:
			return 1
		case b == 0xE0:
			return 3
		case b == 0xED:
			return 4
		case b >= 0xE1 && b <= 0xEF:
			return 2
		case b == 0xF0:
			return 6
		case b >= 0xF1 && b <= 0xF3:
			return 5
		case b == 0xF4:
			return 7
		}
		return -1
	case 1, 2, 5:
		if b >= 0x80 && b <= 0xBF {
			return (int(u) + 1) / 3 // one continuation fewer: 1 to 0, 2 to 1, 5 to 2
		}
	case 3:
		if b >= 0xA0 && b <= 0xBF {
			return 1
		}
	case 4:
		if b >= 0x80 && b <= 0x9F {
			return 1
		}
	case 6:
		if b >= 0x90 && b <= 0xBF {
			return 2
		}
	case 7:
		if b >= 0x80 && b <= 0x8F {
			return 2
		}
	}
	return -1
}

func (v *Vocab) piece(id int) string { return v.text[v.off[id]:v.off[id+1]] }

// Size is the number of tokens (the length of the logits and of masks in
// bits).
func (v *Vocab) Size() int { return v.size }

// Nodes is the number of nodes of the prefix tree.
func (v *Vocab) Nodes() int { return len(v.nodes) }

// IsEOG reports whether id ends the generation.
func (v *Vocab) IsEOG(id int) bool { return id >= 0 && id < v.size && v.isEOG[id] }
