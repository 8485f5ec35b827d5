package constrain

import (
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// byteVocab has one token per byte and an end-of-generation token 256, so
// token-level behaviour is byte-level behaviour.
func byteVocab(t testing.TB) *Vocab {
	t.Helper()
	v, err := NewVocab(257, func(id int) string { return string([]byte{byte(id)}) }, []int{256})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// pieceVocab has a token for each piece and an end-of-generation token
// after them (id len(pieces)).
func pieceVocab(t testing.TB, pieces []string) *Vocab {
	t.Helper()
	eog := len(pieces)
	v, err := NewVocab(eog+1, func(id int) string {
		if id < eog {
			return pieces[id]
		}
		return ""
	}, []int{eog})
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// maskAllows says whether mask allows token id.
func maskAllows(mask []uint64, id int) bool { return mask[id/64]>>(id%64)&1 == 1 }

func mustCompile(t testing.TB, e Expr) *Grammar {
	t.Helper()
	g, err := Compile(e)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// match reports whether text is a prefix of the grammar's language, and
// whether it is a whole text.
func match(t testing.TB, g *Grammar, text string) (prefix, complete bool) {
	t.Helper()
	m := New(g, byteVocab(t)).NewMatcher()
	if err := m.AcceptString(text); err != nil {
		return false, false
	}
	return true, m.Complete()
}

// minEnd is, per automaton state, the fewest bytes that end its rule
// (calls count their callee's fewest bytes): what tests steer by to finish
// a text.
func minEnd(g *Grammar) []int {
	minEndMu.Lock()
	defer minEndMu.Unlock()
	if d, ok := minEndCache[g]; ok {
		return d
	}
	const inf = 1 << 30
	d := make([]int, g.nStates)
	for s := range d {
		d[s] = inf
		if g.canEnd[s] {
			d[s] = 0
		}
	}
	for changed := true; changed; {
		changed = false
		for s := range d {
			for k := 0; k < g.nClasses; k++ {
				a := g.act[s*g.nClasses+k]
				opts := []int32{a}
				if a <= actCall {
					if i, multi := decodeAct(a); multi {
						opts = g.multi[i]
					}
				}
				for _, o := range opts {
					c := inf
					switch {
					case o >= 0:
						c = 1 + d[o]
					case o <= actCall:
						i, _ := decodeAct(o)
						cl := g.calls[i]
						if d[cl.start] < inf && d[cl.ret] < inf {
							c = d[cl.start] + d[cl.ret]
						}
					}
					if c < d[s] {
						d[s], changed = c, true
					}
				}
			}
		}
	}
	minEndCache[g] = d
	return d
}

var (
	minEndMu    sync.Mutex
	minEndCache = map[*Grammar][]int{}
)

// distance is the fewest bytes that complete the text from a set of
// parses.
func (m *Matcher) distance(set []state, ends []int) int {
	best := 1 << 30
	for _, st := range set {
		n := ends[st.top]
		for f := st.stack; f >= 0; f = m.frames[f].next {
			n += ends[m.frames[f].ret]
		}
		best = min(best, n)
	}
	return best
}

// randomText generates a text of g byte by byte: random allowed bytes for
// about wander bytes, then the bytes that bring the end nearest, and it
// stops when complete (at random while wandering).
func randomText(t testing.TB, g *Grammar, rng *rand.Rand, wander int) string {
	t.Helper()
	m := New(g, byteVocab(t)).NewMatcher()
	ends := minEnd(g)
	var out strings.Builder
	for step := 0; ; step++ {
		if step > wander+100000 {
			t.Fatalf("no end after %d bytes: %q", step, out.String())
		}
		if m.Complete() && (step >= wander || rng.IntN(8) == 0) {
			return out.String()
		}
		var best []byte
		bestD := 1 << 30
		var allowed []byte
		for b := 0; b < 256; b++ {
			base := len(m.frames)
			set := m.step(nil, m.cur, byte(b))
			if len(set) == 0 {
				m.frames = m.frames[:base]
				continue
			}
			allowed = append(allowed, byte(b))
			d := m.distance(set, ends)
			m.frames = m.frames[:base]
			switch {
			case d < bestD:
				best, bestD = []byte{byte(b)}, d
			case d == bestD:
				best = append(best, byte(b))
			}
		}
		if len(allowed) == 0 {
			if m.Complete() {
				return out.String()
			}
			t.Fatalf("dead end after %q", out.String())
		}
		var b byte
		if step < wander {
			b = allowed[rng.IntN(len(allowed))]
		} else {
			b = best[rng.IntN(len(best))]
		}
		if err := m.AcceptString(string([]byte{b})); err != nil {
			t.Fatal(err)
		}
		out.WriteByte(b)
	}
}

// validator compiles a JSON Schema with an independent implementation.
func validator(t testing.TB, schema string) *jsonschema.Schema {
	t.Helper()
	doc, err := jsonschema.UnmarshalJSON(strings.NewReader(schema))
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("schema.json", doc); err != nil {
		t.Fatal(err)
	}
	s, err := c.Compile("schema.json")
	if err != nil {
		t.Fatalf("schema %s: %v", schema, err)
	}
	return s
}

// validate checks text against the schema: it must parse as JSON and be
// valid.
func validate(s *jsonschema.Schema, text string) error {
	inst, err := jsonschema.UnmarshalJSON(strings.NewReader(text))
	if err != nil {
		return err
	}
	return s.Validate(inst)
}
