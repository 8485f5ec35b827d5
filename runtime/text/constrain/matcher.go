package constrain

import (
	"errors"
	"fmt"
	"math/bits"
	"sync"
)

// ErrNotAllowed is wrapped by Accept's error for a token the grammar does
// not allow at that point.
var ErrNotAllowed = errors.New("constrain: token not allowed by the grammar")

// ErrDeadEnd is wrapped by Allowed's error when no token of the vocabulary
// can continue the text (the vocabulary cannot spell what the grammar
// needs next).
var ErrDeadEnd = errors.New("constrain: no token of the vocabulary can continue the text")

// Constraint is a grammar over a vocabulary. It caches the mask of each
// state it has seen, and is safe for concurrent use: several Matchers (one
// per generation) may share it, and a server may keep it for the next
// request with the same schema.
type Constraint struct {
	g *Grammar
	v *Vocab

	mu         sync.Mutex
	cache      map[string]*maskEntry
	cacheBytes int
}

// maskEntry is a cached mask: the allowed ids when they are few, else the
// bit set.
type maskEntry struct {
	ids  []int32
	bits []uint64
}

// maxCacheBytes bounds one Constraint's mask cache; past it the cache
// starts over (the states of a generation move on, so old entries are the
// least likely to be needed again).
const maxCacheBytes = 32 << 20

// New binds a grammar to a vocabulary.
func New(g *Grammar, v *Vocab) *Constraint {
	return &Constraint{g: g, v: v, cache: map[string]*maskEntry{}}
}

// Grammar returns the constraint's grammar.
func (c *Constraint) Grammar() *Grammar { return c.g }

// Vocab returns the constraint's vocabulary.
func (c *Constraint) Vocab() *Vocab { return c.v }

// state is where the automaton is: the current state and the stack of
// return states, a linked list in the Matcher's frame arena (immutable
// once written, so a state is a value that is cheap to copy).
type state struct {
	top   int32
	stack int32 // index of the top frame, -1 for an empty stack
	depth int32
}

type frame struct{ ret, next int32 }

// maxStack bounds the nesting of free-form JSON (two frames a level).
const maxStack = 1024

// Matcher follows one generation through a Constraint. It is not safe for
// concurrent use.
type Matcher struct {
	c      *Constraint
	st     state
	frames []frame
	mask   []uint64
	walk   []state
	walkU  []int8 // UTF-8 text state of the walk's path at each depth, -1 once not text
	key    []byte
	ended  bool
	text   []byte // the accepted text, for errors
}

// NewMatcher starts a generation at the beginning of the grammar.
func (c *Constraint) NewMatcher() *Matcher {
	return &Matcher{
		c:     c,
		st:    state{top: c.g.root, stack: -1},
		mask:  make([]uint64, (c.v.size+63)/64),
		walk:  make([]state, c.v.maxDepth+1),
		walkU: make([]int8, c.v.maxDepth+1),
	}
}

// step reads one byte.
func (m *Matcher) step(st state, b byte) (state, bool) {
	g := m.c.g
	k := int(g.class[b])
	for {
		a := g.act[int(st.top)*g.nClasses+k]
		switch {
		case a >= 0:
			st.top = a
			return st, true
		case a == actReject:
			return st, false
		case a == actPop:
			if st.stack < 0 {
				return st, false
			}
			f := m.frames[st.stack]
			st.top, st.stack, st.depth = f.ret, f.next, st.depth-1
		default:
			if st.depth >= maxStack {
				return st, false
			}
			cl := g.calls[actCall-a]
			m.frames = append(m.frames, frame{ret: cl.ret, next: st.stack})
			st.top, st.stack, st.depth = cl.start, int32(len(m.frames)-1), st.depth+1
		}
	}
}

// complete reports whether the text that led to st is a whole text of the
// grammar: every pending rule may end there.
func (m *Matcher) complete(st state) bool {
	g := m.c.g
	s, f := st.top, st.stack
	for {
		if !g.accepting[s] {
			return false
		}
		if f < 0 {
			return true
		}
		s, f = m.frames[f].ret, m.frames[f].next
	}
}

// Complete reports whether the text so far is a whole text of the grammar,
// so the generation may end here.
func (m *Matcher) Complete() bool { return m.complete(m.st) }

// Ended reports whether an end-of-generation token was accepted.
func (m *Matcher) Ended() bool { return m.ended }

// Allowed returns the tokens that may come next as a bit set over the
// vocabulary (token t is bit t%64 of word t/64). The slice belongs to the
// Matcher (or the Constraint's cache): read it, do not change it; it is
// valid until the next call.
func (m *Matcher) Allowed() ([]uint64, error) {
	if m.ended {
		return nil, fmt.Errorf("%w: the generation has already ended", ErrNotAllowed)
	}
	c := m.c
	m.key = m.stateKey(m.key[:0], m.st)
	c.mu.Lock()
	e := c.cache[string(m.key)]
	c.mu.Unlock()
	if e == nil {
		e = m.compute()
		if len(e.ids) == 0 && e.bits == nil {
			return nil, fmt.Errorf("%w after %q", ErrDeadEnd, tail(m.text))
		}
		size := 8*len(e.bits) + 4*len(e.ids) + len(m.key) + 64
		c.mu.Lock()
		if c.cacheBytes+size > maxCacheBytes {
			clear(c.cache)
			c.cacheBytes = 0
		}
		c.cache[string(m.key)] = e
		c.cacheBytes += size
		c.mu.Unlock()
	}
	if e.bits != nil {
		return e.bits, nil
	}
	clear(m.mask)
	for _, id := range e.ids {
		m.mask[id>>6] |= 1 << (id & 63)
	}
	return m.mask, nil
}

func tail(b []byte) string {
	if len(b) > 40 {
		return "..." + string(b[len(b)-40:])
	}
	return string(b)
}

// stateKey appends the identity of st: its state and its stack's return
// states, which together decide what may follow.
func (m *Matcher) stateKey(dst []byte, st state) []byte {
	put := func(v int32) {
		dst = append(dst, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	}
	put(st.top)
	for f := st.stack; f >= 0; f = m.frames[f].next {
		put(m.frames[f].ret)
	}
	return dst
}

// compute walks the prefix tree from the current state and returns the
// mask. An empty entry means nothing is allowed.
func (m *Matcher) compute() *maskEntry {
	v, g := m.c.v, m.c.g
	mask := make([]uint64, len(m.mask))
	base := len(m.frames)
	nodes, nc, act, class := v.nodes, g.nClasses, g.act, &g.class
	loops := g.textLoop
	walk, walkU := m.walk, m.walkU
	walk[0], walkU[0] = m.st, 0
	// Inside a JSON string every text token is allowed: start from them,
	// and skip the subtrees they make up instead of marking them.
	rootText := loops[m.st.top]
	if rootText {
		copy(mask, v.textMask)
	}
	for i := 0; i < len(nodes); {
		n := &nodes[i]
		parent := walk[n.depth-1]
		if n.text && loops[parent.top] {
			// Every token of the subtree is allowed and leaves the
			// state as it is.
			if !rootText || walkU[n.depth-1] != 0 || parent.top != m.st.top {
				// Not already in the mask: the path here is not all text.
				end := int32(len(v.toks))
				if int(n.skip) < len(nodes) {
					end = nodes[n.skip].tok0
				}
				for _, t := range v.toks[n.tok0:end] {
					mask[t>>6] |= 1 << (t & 63)
				}
			}
			i = int(n.skip)
			continue
		}
		// The common case, a plain transition, inline.
		a := act[int(parent.top)*nc+int(class[n.b])]
		var s state
		if a >= 0 {
			s = state{top: a, stack: parent.stack, depth: parent.depth}
		} else {
			var ok bool
			if s, ok = m.step(parent, n.b); !ok {
				i = int(n.skip)
				continue
			}
		}
		walk[n.depth] = s
		if u := walkU[n.depth-1]; u >= 0 {
			walkU[n.depth] = int8(utf8Next(uint8(u), n.b))
		} else {
			walkU[n.depth] = -1
		}
		for _, t := range v.toks[n.tok0:n.tok1] {
			mask[t>>6] |= 1 << (t & 63)
		}
		i++
	}
	m.frames = m.frames[:base] // frames pushed by the walk are garbage now
	if m.complete(m.st) {
		for _, t := range v.eog {
			mask[t>>6] |= 1 << (t & 63)
		}
	}
	n := 0
	for _, w := range mask {
		n += bits.OnesCount64(w)
	}
	switch {
	case n == 0:
		return &maskEntry{}
	case n < len(mask): // fewer ids than words: keep the list
		e := &maskEntry{ids: make([]int32, 0, n)}
		for w, x := range mask {
			for x != 0 {
				e.ids = append(e.ids, int32(w*64+bits.TrailingZeros64(x)))
				x &= x - 1
			}
		}
		return e
	}
	return &maskEntry{bits: mask}
}

// Accept advances past a sampled token.
func (m *Matcher) Accept(tok int) error {
	v := m.c.v
	if tok < 0 || tok >= v.size {
		return fmt.Errorf("%w: token %d is outside the vocabulary [0, %d)", ErrNotAllowed, tok, v.size)
	}
	if m.ended {
		return fmt.Errorf("%w: token %d after the end of generation", ErrNotAllowed, tok)
	}
	if v.isEOG[tok] {
		if !m.Complete() {
			return fmt.Errorf("%w: end of generation before the text is complete (after %q)", ErrNotAllowed, tail(m.text))
		}
		m.ended = true
		return nil
	}
	p := v.piece(tok)
	if p == "" {
		return fmt.Errorf("%w: token %d has no text", ErrNotAllowed, tok)
	}
	if err := m.advance(p); err != nil {
		return fmt.Errorf("token %d: %w", tok, err)
	}
	return nil
}

// AcceptString advances past text, as if tokens spelling it had been
// accepted (a forced prefix, or tests).
func (m *Matcher) AcceptString(text string) error {
	if m.ended {
		return fmt.Errorf("%w: text after the end of generation", ErrNotAllowed)
	}
	return m.advance(text)
}

func (m *Matcher) advance(p string) error {
	st := m.st
	for i := 0; i < len(p); i++ {
		var ok bool
		if st, ok = m.step(st, p[i]); !ok {
			return fmt.Errorf("%w: %q cannot follow %q", ErrNotAllowed, p, tail(m.text))
		}
	}
	m.st = st
	m.text = append(m.text, p...)
	if len(m.text) > 256 {
		m.text = append(m.text[:0], m.text[len(m.text)-64:]...)
	}
	m.compact()
	return nil
}

// compact copies the live stack to the front of the arena once popped
// frames have piled up.
func (m *Matcher) compact() {
	if len(m.frames) < 4096 || len(m.frames) < 4*int(m.st.depth) {
		return
	}
	var chain []int32
	for f := m.st.stack; f >= 0; f = m.frames[f].next {
		chain = append(chain, m.frames[f].ret)
	}
	fresh := make([]frame, 0, len(chain)+64)
	next := int32(-1)
	for i := len(chain) - 1; i >= 0; i-- {
		fresh = append(fresh, frame{ret: chain[i], next: next})
		next = int32(len(fresh) - 1)
	}
	m.frames = fresh
	m.st.stack = next
}
