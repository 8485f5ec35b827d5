package constrain

import (
	"errors"
	"fmt"
	"math/bits"
	"slices"
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

// state is one parse of the text: the current automaton state and the
// stack of return states, a linked list in the Matcher's frame arena
// (immutable once written, so a state is a value that is cheap to copy).
type state struct {
	top   int32
	stack int32 // index of the top frame, -1 for an empty stack
	depth int32
}

type frame struct{ ret, next int32 }

// maxStack bounds the nesting of free-form JSON (two frames a level).
const maxStack = 1024

// maxParses bounds the parses a Matcher follows at once. A grammar that
// reads a text in one way at each byte has one; one whose rules may end
// where their callers go on with the same byte (blanks at the end of a
// nested expression and after it) has a few. Only a grammar ambiguous
// without bound (a text that nests in ways that double at each byte)
// reaches it, and the generation then fails with ErrAmbiguous.
const maxParses = 64

// maxReadSteps bounds the work of reading one byte from one set of parses
// (calls, returns and branches).
const maxReadSteps = 1 << 16

// ErrAmbiguous is wrapped by the error of a generation whose text the
// grammar reads in more than maxParses ways at once.
var ErrAmbiguous = errors.New("constrain: the grammar reads the text in too many ways at once")

// Matcher follows one generation through a Constraint. It keeps every
// parse of the text so far (the set of automaton states and stacks a
// grammar can be in, as llama.cpp's grammar engine keeps its stacks): a
// byte is allowed if some parse can read it. It is not safe for
// concurrent use.
type Matcher struct {
	c      *Constraint
	cur    []state // the parses of the text so far, at least one
	frames []frame
	mask   []uint64
	// The walk's sets of parses, depth by depth: the set at depth d is
	// pool[off[d]:off[d+1]].
	pool  []state
	off   []int32
	walkU []int8 // UTF-8 text state of the walk's path at each depth, -1 once not text
	// Reading one byte: the parses met through branches (to stop at one
	// met before), the steps left, and whether the work or the parses ran
	// over their bounds.
	seen     []state
	budget   int
	overflow bool
	bufA     []state
	bufB     []state
	key      []byte
	keys     []string
	ended    bool
	text     []byte // the accepted text, for errors
}

// NewMatcher starts a generation at the beginning of the grammar.
func (c *Constraint) NewMatcher() *Matcher {
	return &Matcher{
		c:     c,
		cur:   []state{{top: c.g.root, stack: -1}},
		mask:  make([]uint64, (c.v.size+63)/64),
		off:   make([]int32, c.v.maxDepth+2),
		walkU: make([]int8, c.v.maxDepth+1),
	}
}

// read appends to dst the parses st becomes by reading a byte of class k
// (none when it cannot read it). Calls push frames on the arena.
func (m *Matcher) read(dst []state, st state, k int) []state {
	g := m.c.g
	for {
		if m.budget--; m.budget < 0 {
			m.overflow = true
			return dst
		}
		a := g.act[int(st.top)*g.nClasses+k]
		switch {
		case a >= 0:
			return append(dst, state{top: a, stack: st.stack, depth: st.depth})
		case a == actReject:
			return dst
		case a == actPop:
			if st.stack < 0 {
				return dst
			}
			f := m.frames[st.stack]
			st = state{top: f.ret, stack: f.next, depth: st.depth - 1}
			continue
		}
		i, multi := decodeAct(a)
		if !multi {
			var ok bool
			if st, ok = m.call(st, i); !ok {
				return dst
			}
			continue
		}
		// A parse met before while reading this byte (the same state and
		// stack: a rule that matched nothing, ended and called again)
		// has nothing new to add.
		for _, o := range m.seen {
			if m.sameParse(o, st) {
				return dst
			}
		}
		m.seen = append(m.seen, st)
		for _, o := range g.multi[i] {
			next := st
			switch {
			case o >= 0:
				dst = append(dst, state{top: o, stack: st.stack, depth: st.depth})
				continue
			case o == actPop:
				if st.stack < 0 {
					continue
				}
				f := m.frames[st.stack]
				next = state{top: f.ret, stack: f.next, depth: st.depth - 1}
			default:
				ci, _ := decodeAct(o)
				var ok bool
				if next, ok = m.call(st, ci); !ok {
					continue
				}
			}
			dst = m.read(dst, next, k)
		}
		return dst
	}
}

// call pushes the return state of calls[i] and enters the callee.
func (m *Matcher) call(st state, i int32) (state, bool) {
	if st.depth >= maxStack {
		return st, false
	}
	cl := m.c.g.calls[i]
	m.frames = append(m.frames, frame{ret: cl.ret, next: st.stack})
	return state{top: cl.start, stack: int32(len(m.frames) - 1), depth: st.depth + 1}, true
}

// step appends to dst the parses of src after byte b, without repeats.
func (m *Matcher) step(dst, src []state, b byte) []state {
	k := int(m.c.g.class[b])
	m.seen = m.seen[:0]
	m.budget = maxReadSteps
	n := len(dst)
	for _, st := range src {
		dst = m.read(dst, st, k)
	}
	return m.unique(dst, n)
}

// unique removes the repeats among dst[from:] (the same state and the same
// stack, wherever their frames are).
func (m *Matcher) unique(dst []state, from int) []state {
	if len(dst)-from < 2 {
		return dst
	}
	out := dst[:from+1]
	for _, st := range dst[from+1:] {
		dup := false
		for _, o := range out[from:] {
			if m.sameParse(o, st) {
				dup = true
				break
			}
		}
		if !dup {
			out = append(out, st)
		}
	}
	if len(out)-from > maxParses {
		m.overflow = true
	}
	return out
}

func (m *Matcher) sameParse(a, b state) bool {
	if a.top != b.top || a.depth != b.depth {
		return false
	}
	for x, y := a.stack, b.stack; x != y; x, y = m.frames[x].next, m.frames[y].next {
		if m.frames[x].ret != m.frames[y].ret {
			return false
		}
	}
	return true
}

// complete reports whether the text that led to st is a whole text of the
// grammar: every pending rule may end there.
func (m *Matcher) complete(st state) bool {
	g := m.c.g
	s, f := st.top, st.stack
	for {
		if !g.canEnd[s] {
			return false
		}
		if f < 0 {
			return true
		}
		s, f = m.frames[f].ret, m.frames[f].next
	}
}

func (m *Matcher) completeSet(set []state) bool {
	for _, st := range set {
		if m.complete(st) {
			return true
		}
	}
	return false
}

// Complete reports whether the text so far is a whole text of the grammar,
// so the generation may end here.
func (m *Matcher) Complete() bool { return m.completeSet(m.cur) }

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
	m.key = m.stateKey(m.key[:0])
	c.mu.Lock()
	e := c.cache[string(m.key)]
	c.mu.Unlock()
	if e == nil {
		var err error
		if e, err = m.compute(); err != nil {
			return nil, err
		}
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

// stateKey appends the identity of the current parses, which decide what
// may follow: each one's state and its stack's return states, in an order
// that does not depend on how they were found.
func (m *Matcher) stateKey(dst []byte) []byte {
	put := func(dst []byte, v int32) []byte {
		return append(dst, byte(v), byte(v>>8), byte(v>>16), byte(v>>24))
	}
	one := func(dst []byte, st state) []byte {
		dst = put(dst, st.top)
		for f := st.stack; f >= 0; f = m.frames[f].next {
			dst = put(dst, m.frames[f].ret)
		}
		return dst
	}
	if len(m.cur) == 1 {
		return one(dst, m.cur[0])
	}
	m.keys = m.keys[:0]
	for _, st := range m.cur {
		m.keys = append(m.keys, string(one(nil, st)))
	}
	slices.Sort(m.keys)
	dst = put(dst, -int32(len(m.keys))) // no state is negative: a set's key is not one parse's
	for _, k := range m.keys {
		dst = put(dst, int32(len(k)))
		dst = append(dst, k...)
	}
	return dst
}

// compute walks the prefix tree from the current parses and returns the
// mask. An empty entry means nothing is allowed.
func (m *Matcher) compute() (*maskEntry, error) {
	v, g := m.c.v, m.c.g
	mask := make([]uint64, len(m.mask))
	base := len(m.frames)
	defer func() { m.frames = m.frames[:base] }() // frames pushed by the walk are garbage after it
	nodes, nc, act, class := v.nodes, g.nClasses, g.act, &g.class
	loops := g.textLoop
	walkU, off := m.walkU, m.off
	m.pool = append(m.pool[:0], m.cur...)
	off[0], off[1] = 0, int32(len(m.cur))
	walkU[0] = 0
	m.overflow = false
	// Inside a JSON string every text token is allowed: start from them,
	// and skip the subtrees they make up instead of marking them.
	rootText := len(m.cur) == 1 && loops[m.cur[0].top]
	if rootText {
		copy(mask, v.textMask)
	}
	for i := 0; i < len(nodes); {
		n := &nodes[i]
		d := int(n.depth)
		lo, hi := off[d-1], off[d]
		pool := m.pool[:hi]
		moved := false
		if hi-lo == 1 {
			parent := pool[lo]
			if n.text && loops[parent.top] {
				// Every token of the subtree is allowed and leaves the
				// state as it is.
				if !rootText || walkU[d-1] != 0 || parent.top != m.cur[0].top {
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
			// The common cases, one parse and a plain transition or a
			// byte it cannot read, inline.
			a := act[int(parent.top)*nc+int(class[n.b])]
			if a == actReject {
				i = int(n.skip)
				continue
			}
			if a >= 0 {
				pool = append(pool, state{top: a, stack: parent.stack, depth: parent.depth})
				moved = true
			}
		}
		if !moved {
			k := int(class[n.b])
			m.seen = m.seen[:0]
			m.budget = maxReadSteps
			for j := lo; j < hi; j++ {
				pool = m.read(pool, pool[j], k)
			}
			pool = m.unique(pool, int(hi))
			if m.overflow {
				return nil, m.ambiguous()
			}
			if len(pool) == int(hi) {
				m.pool = pool
				i = int(n.skip)
				continue
			}
		}
		m.pool = pool
		off[d+1] = int32(len(pool))
		if u := walkU[d-1]; u >= 0 {
			walkU[d] = int8(utf8Next(uint8(u), n.b))
		} else {
			walkU[d] = -1
		}
		for _, t := range v.toks[n.tok0:n.tok1] {
			mask[t>>6] |= 1 << (t & 63)
		}
		i++
	}
	if m.Complete() {
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
		return &maskEntry{}, nil
	case n < len(mask): // fewer ids than words: keep the list
		e := &maskEntry{ids: make([]int32, 0, n)}
		for w, x := range mask {
			for x != 0 {
				e.ids = append(e.ids, int32(w*64+bits.TrailingZeros64(x)))
				x &= x - 1
			}
		}
		return e, nil
	}
	return &maskEntry{bits: mask}, nil
}

func (m *Matcher) ambiguous() error {
	return fmt.Errorf("%w: more than %d parses (or %d steps for one byte) after %q; make the grammar's rules end in one way", ErrAmbiguous, maxParses, maxReadSteps, tail(m.text))
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
	base := len(m.frames)
	m.overflow = false
	cur := m.cur
	for i := 0; i < len(p); i++ {
		buf := &m.bufA
		if i%2 == 1 {
			buf = &m.bufB
		}
		*buf = m.step((*buf)[:0], cur, p[i])
		cur = *buf
		if m.overflow {
			m.frames = m.frames[:base]
			return m.ambiguous()
		}
		if len(cur) == 0 {
			m.frames = m.frames[:base]
			return fmt.Errorf("%w: %q cannot follow %q", ErrNotAllowed, p, tail(m.text))
		}
	}
	m.cur = append(m.cur[:0], cur...)
	m.text = append(m.text, p...)
	if len(m.text) > 256 {
		m.text = append(m.text[:0], m.text[len(m.text)-64:]...)
	}
	m.compact()
	return nil
}

// compact copies the live stacks to the front of the arena once popped
// frames have piled up.
func (m *Matcher) compact() {
	depth := 0
	for _, st := range m.cur {
		depth += int(st.depth)
	}
	if len(m.frames) < 4096 || len(m.frames) < 4*depth {
		return
	}
	fresh := make([]frame, 0, depth+64)
	moved := map[int32]int32{-1: -1}
	var move func(f int32) int32
	move = func(f int32) int32 {
		if to, ok := moved[f]; ok {
			return to
		}
		next := move(m.frames[f].next)
		fresh = append(fresh, frame{ret: m.frames[f].ret, next: next})
		to := int32(len(fresh) - 1)
		moved[f] = to
		return to
	}
	for i := range m.cur {
		m.cur[i].stack = move(m.cur[i].stack)
	}
	m.frames = fresh
}
