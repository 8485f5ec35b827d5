// Package constrain restricts generation to the texts a grammar accepts:
// structured output (a JSON document that a JSON Schema accepts) and forced
// tool calls. At each step a token may be sampled only if the text so far
// plus the token's bytes is still a prefix of some text the grammar
// accepts, and the end of generation only once the text is complete.
//
// A grammar is built from Exprs (literals, byte classes, sequences,
// alternatives, repetition, and the recursive JSON rules) and compiled into
// a small recursive transition network: each rule becomes a deterministic
// automaton over bytes whose transitions may call another rule (the JSON
// value, object and array rules, which nest without bound). Everything a
// schema describes is inlined into the root automaton, so only free-form
// JSON needs the stack. A parse is the current automaton state plus a
// stack of return states. Where a byte can be read in more than one way
// across rules (a called rule that could both go on and end there, as
// blanks at the end of a nested expression that its caller also allows,
// or two called rules that start alike), the matcher follows each way as a
// parse of its own, as llama.cpp's grammar engine keeps a set of stacks,
// and drops a parse at the first byte it cannot read: nothing backtracks.
// The JSON rules and schemas never need more than one parse (a called
// rule never ends where its caller could continue with the same byte), so
// their tables are deterministic. Left recursion is refused.
//
// A Vocab is the model's vocabulary as a prefix tree over the tokens' bytes.
// A Matcher walks that tree once per step from the current state, pruning a
// whole subtree as soon as its prefix is rejected, and caches the resulting
// mask per state (a JSON string's state repeats for every token inside it),
// so most steps cost a map lookup.
package constrain

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
)

// Expr is a piece of grammar: a set of byte strings. The zero Expr is
// invalid; build them with the functions below.
type Expr struct{ n *node }

type nodeKind uint8

const (
	kLit    nodeKind = iota // the bytes of lit
	kClass                  // one byte in ranges
	kSeq                    // subs in order
	kAlt                    // one of subs
	kRepeat                 // sub[0] between min and max times (max < 0: unbounded)
	kUntil                  // any bytes not containing lit, then lit
	kRef                    // a call of a recursive rule
	kList                   // subs in order, those not in req optional, sep between those present
)

type byteRange struct{ lo, hi byte }

type node struct {
	kind     nodeKind
	lit      string
	ranges   []byteRange
	subs     []*node
	min, max int
	rule     ruleID
	def      *Rule  // kRef of a rule defined with NewRule (rule is then unset)
	req      []bool // kList: which items must be present
	sep      *node  // kList: what goes between two present items
}

// Lit matches s exactly.
func Lit(s string) Expr { return Expr{&node{kind: kLit, lit: s}} }

// Range matches one byte in [lo, hi].
func Range(lo, hi byte) Expr { return Expr{&node{kind: kClass, ranges: []byteRange{{lo, hi}}}} }

// AnyOf matches one of the bytes of set.
func AnyOf(set string) Expr {
	n := &node{kind: kClass}
	for i := 0; i < len(set); i++ {
		n.ranges = append(n.ranges, byteRange{set[i], set[i]})
	}
	return Expr{n}
}

// Seq matches its parts one after the other.
func Seq(parts ...Expr) Expr {
	n := &node{kind: kSeq}
	for _, p := range parts {
		n.subs = append(n.subs, p.n)
	}
	return Expr{n}
}

// Alt matches any one of its choices.
func Alt(choices ...Expr) Expr {
	n := &node{kind: kAlt}
	for _, c := range choices {
		n.subs = append(n.subs, c.n)
	}
	return Expr{n}
}

// Opt matches e or nothing.
func Opt(e Expr) Expr { return Repeat(e, 0, 1) }

// Star matches e any number of times.
func Star(e Expr) Expr { return Repeat(e, 0, -1) }

// Repeat matches e at least min and at most max times; max < 0 means no
// upper bound.
func Repeat(e Expr, min, max int) Expr {
	return Expr{&node{kind: kRepeat, subs: []*node{e.n}, min: min, max: max}}
}

// Until matches any text that does not contain stop, followed by stop: a
// free-text section with an end marker (a reasoning block).
func Until(stop string) Expr { return Expr{&node{kind: kUntil, lit: stop}} }

// List matches items in order, separated by sep; the items whose required
// flag is false may be left out (with their separator). It describes the
// members of a JSON object whose optional properties may be missing, in a
// size linear in the number of items.
func List(items []Expr, required []bool, sep Expr) Expr {
	n := &node{kind: kList, sep: sep.n}
	for i, it := range items {
		n.subs = append(n.subs, it.n)
		n.req = append(n.req, i < len(required) && required[i])
	}
	return Expr{n}
}

// The recursive rules a grammar may call. Everything else is inlined.
type ruleID int32

const (
	ruleRoot ruleID = iota
	ruleValue
	ruleObject
	ruleArray
	nRules
)

func ref(r ruleID) Expr { return Expr{&node{kind: kRef, rule: r}} }

// Rule is a named rule that may refer to itself, directly or through other
// rules (a grammar's nesting: an expression in parentheses inside an
// expression). Define gives its body; Ref calls it. Every other part of a
// grammar is inlined where it is used, so only rules that recur need to be
// Rules. A Rule may match the empty text, and may end where its caller goes
// on with the same byte; it must not call itself before reading a byte
// (left recursion, which Compile refuses).
type Rule struct {
	name string
	body *node
}

// NewRule makes an undefined rule called name (for errors).
func NewRule(name string) *Rule { return &Rule{name: name} }

// Define sets the rule's body.
func (r *Rule) Define(e Expr) { r.body = e.n }

// Ref is a call of the rule.
func (r *Rule) Ref() Expr { return Expr{&node{kind: kRef, def: r}} }

// Name is the rule's name.
func (r *Rule) Name() string { return r.name }

// JSONValue matches any JSON value (no whitespace around it).
func JSONValue() Expr { return ref(ruleValue) }

// JSONObject matches any JSON object.
func JSONObject() Expr { return ref(ruleObject) }

// JSONArray matches any JSON array.
func JSONArray() Expr { return ref(ruleArray) }

// ruleBody defines the recursive rules: RFC 8259 JSON with the whitespace
// of ws between tokens.
func ruleBody(r ruleID) Expr {
	switch r {
	case ruleValue:
		return Alt(jsonString(), jsonNumber(), Lit("true"), Lit("false"), Lit("null"), JSONObject(), JSONArray())
	case ruleObject:
		member := Seq(jsonString(), ws(), Lit(":"), ws(), JSONValue(), ws())
		return Seq(Lit("{"), ws(), Alt(Lit("}"), Seq(member, Star(Seq(Lit(","), ws(), member)), Lit("}"))))
	case ruleArray:
		item := Seq(JSONValue(), ws())
		return Seq(Lit("["), ws(), Alt(Lit("]"), Seq(item, Star(Seq(Lit(","), ws(), item)), Lit("]"))))
	}
	panic(fmt.Sprintf("constrain: no body for rule %d", r))
}

// maxIndent bounds the blanks after a newline between JSON tokens, as
// llama.cpp's json-schema-to-grammar does: enough for pretty-printed
// output, too little for a model to lose itself in whitespace.
const maxIndent = 20

// ws is the whitespace allowed between JSON tokens: nothing, a space, or
// one or two newlines followed by up to maxIndent spaces or tabs.
func ws() Expr {
	return Opt(Alt(Lit(" "), Seq(Lit("\n"), Opt(Lit("\n")), Repeat(AnyOf(" \t"), 0, maxIndent))))
}

// WS is the whitespace allowed between JSON tokens, for grammars that put
// JSON inside other text (tool-call formats).
func WS() Expr { return ws() }

// jsonString matches a JSON string of valid UTF-8.
func jsonString() Expr {
	cont := Range(0x80, 0xBF)
	utf8Char := Alt(
		Range(0x20, 0x21), Range(0x23, 0x5B), Range(0x5D, 0x7F), // ASCII but " and \
		Seq(Range(0xC2, 0xDF), cont),
		Seq(Lit("\xE0"), Range(0xA0, 0xBF), cont),
		Seq(Range(0xE1, 0xEC), cont, cont),
		Seq(Lit("\xED"), Range(0x80, 0x9F), cont),
		Seq(Range(0xEE, 0xEF), cont, cont),
		Seq(Lit("\xF0"), Range(0x90, 0xBF), cont, cont),
		Seq(Range(0xF1, 0xF3), cont, cont, cont),
		Seq(Lit("\xF4"), Range(0x80, 0x8F), cont, cont),
	)
	hex := Alt(Range('0', '9'), Range('a', 'f'), Range('A', 'F'))
	escape := Seq(Lit(`\`), Alt(AnyOf(`"\/bfnrt`), Seq(Lit("u"), hex, hex, hex, hex)))
	return Seq(Lit(`"`), Star(Alt(utf8Char, escape)), Lit(`"`))
}

// Digits bound the integer, fraction and exponent parts of numbers, as
// llama.cpp does: more than float64 or int64 can hold is noise.
const (
	maxIntDigits  = 16
	maxFracDigits = 16
	maxExpDigits  = 3
)

func jsonInteger() Expr {
	return Seq(Opt(Lit("-")), Alt(Lit("0"), Seq(Range('1', '9'), Repeat(Range('0', '9'), 0, maxIntDigits-1))))
}

func jsonNumber() Expr {
	frac := Seq(Lit("."), Repeat(Range('0', '9'), 1, maxFracDigits))
	exp := Seq(AnyOf("eE"), Opt(AnyOf("+-")), Repeat(Range('0', '9'), 1, maxExpDigits))
	return Seq(jsonInteger(), Opt(frac), Opt(exp))
}

// ErrGrammar is wrapped by errors about a grammar that cannot be compiled.
var ErrGrammar = errors.New("constrain: invalid grammar")

// Grammar is a compiled grammar. It is immutable and safe for concurrent
// use.
type Grammar struct {
	nClasses int
	class    [256]uint8
	// act[s*nClasses+c] is what state s does with a byte of class c:
	// >= 0 go to that state, actReject, actPop (the state may end its rule:
	// return to the caller and retry the byte there), callAct(k) (call
	// calls[k]), or multiAct(j): each of the actions multi[j], which the
	// matcher follows side by side.
	act       []int32
	accepting []bool
	canEnd    []bool // the state can end its rule without reading a byte (accepting, or past calls of rules that match nothing)
	calls     []call
	multi     [][]int32
	textLoop  []bool // the state reads any text and comes back to itself (see utf8Next)
	root      int32  // the root rule's start state
	nStates   int
}

type call struct {
	start int32 // the callee's start state, which then reads the byte
	ret   int32 // where the caller continues once the callee ends
}

const (
	actReject int32 = -1
	actPop    int32 = -2
	actCall   int32 = -3 // actCall - 2k calls calls[k]; actCall - 2j - 1 is multi[j]
)

func callAct(k int32) int32  { return actCall - 2*k }
func multiAct(j int32) int32 { return actCall - 2*j - 1 }

// decodeAct reads an action below actPop: the index of its call, or of its
// multi entry when multi is set.
func decodeAct(a int32) (i int32, multi bool) {
	d := actCall - a
	return d >> 1, d&1 == 1
}

// States is the number of automaton states (all rules).
func (g *Grammar) States() int { return g.nStates }

// Compile turns root into a Grammar.
func Compile(root Expr) (*Grammar, error) {
	if root.n == nil {
		return nil, fmt.Errorf("%w: empty expression", ErrGrammar)
	}
	c := &compiler{ruleIDs: map[*Rule]ruleID{}, names: map[ruleID]string{}}
	// The rules the root needs, transitively.
	bodies := map[ruleID]*node{ruleRoot: root.n}
	queue := []ruleID{ruleRoot}
	for len(queue) > 0 {
		r := queue[0]
		queue = queue[1:]
		var err error
		walkRefs(bodies[r], map[*node]bool{}, func(n *node) {
			callee := n.rule
			if n.def != nil {
				id, ok := c.ruleIDs[n.def]
				if !ok {
					if n.def.body == nil {
						err = fmt.Errorf("%w: rule %q is used but not defined", ErrGrammar, n.def.name)
						return
					}
					id = nRules + ruleID(len(c.ruleIDs))
					c.ruleIDs[n.def] = id
					c.names[id] = n.def.name
					bodies[id] = n.def.body
					queue = append(queue, id)
				}
				return
			}
			if _, ok := bodies[callee]; !ok {
				bodies[callee] = ruleBody(callee).n
				queue = append(queue, callee)
			}
		})
		if err != nil {
			return nil, err
		}
	}
	rules := make([]ruleID, 0, len(bodies))
	for r, body := range bodies {
		if size(body) > maxNFAStates {
			return nil, fmt.Errorf("%w: the grammar is too large (more than %d states)", ErrGrammar, maxNFAStates)
		}
		rules = append(rules, r)
	}
	slices.Sort(rules)
	c.nfaRules = make(map[ruleID][2]int32)
	for _, r := range rules {
		start := c.newState()
		end, err := c.build(bodies[r], start)
		if err != nil {
			return nil, err
		}
		c.nfaRules[r] = [2]int32{start, end}
	}
	return c.determinize(rules)
}

// walkRefs calls f on every kRef node under n, once each (parts of a
// grammar may be shared, as inlined rules are).
func walkRefs(n *node, seen map[*node]bool, f func(*node)) {
	if seen[n] {
		return
	}
	seen[n] = true
	if n.kind == kRef {
		f(n)
	}
	for _, s := range n.subs {
		walkRefs(s, seen, f)
	}
	if n.sep != nil {
		walkRefs(n.sep, seen, f)
	}
}

// ruleName names rule r in errors.
func (c *compiler) ruleName(r ruleID) string {
	switch r {
	case ruleRoot:
		return "root"
	case ruleValue:
		return "JSON value"
	case ruleObject:
		return "JSON object"
	case ruleArray:
		return "JSON array"
	}
	return fmt.Sprintf("%q", c.names[r])
}

// The NFA: states with byte-range edges, epsilon edges and call edges.
type nfaState struct {
	eps   []int32
	edges []nfaEdge
	calls []nfaCall
}

type nfaEdge struct {
	lo, hi byte
	to     int32
}

type nfaCall struct {
	rule ruleID
	to   int32
}

type compiler struct {
	states   []nfaState
	nfaRules map[ruleID][2]int32 // start, end
	ruleIDs  map[*Rule]ruleID    // the Rules the grammar calls
	names    map[ruleID]string   // their names
}

// maxNFAStates bounds the automaton a request can make the server build.
const maxNFAStates = 1 << 18

// size estimates the NFA states of n (an upper bound for all but Until,
// which is small), so an oversized grammar is refused before it is built.
func size(n *node) int {
	total := 1
	switch n.kind {
	case kLit:
		total += len(n.lit)
	case kUntil:
		total += len(n.lit) + 1
	case kRepeat:
		copies := n.max
		if copies < 0 {
			copies = n.min + 1
		}
		sub := size(n.subs[0])
		if copies > 0 && sub > maxNFAStates/copies {
			return maxNFAStates + 1
		}
		total += copies * sub
	case kList:
		total += 3*len(n.subs) + len(n.subs)*size(n.sep)
	}
	for _, sub := range n.subs {
		if n.kind != kRepeat {
			total += size(sub)
		}
		if total > maxNFAStates {
			return maxNFAStates + 1
		}
	}
	return total
}

func (c *compiler) newState() int32 {
	c.states = append(c.states, nfaState{})
	return int32(len(c.states) - 1)
}

func (c *compiler) eps(from, to int32) { c.states[from].eps = append(c.states[from].eps, to) }

// build adds n to the NFA starting at from and returns its end state. It
// only adds edges out of from and among new states, so from may be shared
// (the start of several alternatives) without creating paths n does not
// describe.
func (c *compiler) build(n *node, from int32) (int32, error) {
	if len(c.states) > maxNFAStates {
		return 0, fmt.Errorf("%w: the grammar is too large (more than %d states)", ErrGrammar, maxNFAStates)
	}
	switch n.kind {
	case kLit:
		cur := from
		for i := 0; i < len(n.lit); i++ {
			next := c.newState()
			c.states[cur].edges = append(c.states[cur].edges, nfaEdge{n.lit[i], n.lit[i], next})
			cur = next
		}
		if cur == from { // the empty literal: a fresh end all the same
			cur = c.newState()
			c.eps(from, cur)
		}
		return cur, nil
	case kClass:
		if len(n.ranges) == 0 {
			return 0, fmt.Errorf("%w: an empty byte class matches nothing", ErrGrammar)
		}
		next := c.newState()
		for _, r := range n.ranges {
			if r.lo > r.hi {
				return 0, fmt.Errorf("%w: byte range %#x-%#x is empty", ErrGrammar, r.lo, r.hi)
			}
			c.states[from].edges = append(c.states[from].edges, nfaEdge{r.lo, r.hi, next})
		}
		return next, nil
	case kSeq:
		cur := from
		for _, s := range n.subs {
			var err error
			if cur, err = c.build(s, cur); err != nil {
				return 0, err
			}
		}
		if cur == from {
			cur = c.newState()
			c.eps(from, cur)
		}
		return cur, nil
	case kAlt:
		if len(n.subs) == 0 {
			return 0, fmt.Errorf("%w: an alternative with no choices matches nothing", ErrGrammar)
		}
		end := c.newState()
		for _, s := range n.subs {
			e, err := c.build(s, from)
			if err != nil {
				return 0, err
			}
			c.eps(e, end)
		}
		return end, nil
	case kRepeat:
		if n.min < 0 || n.max >= 0 && n.max < n.min {
			return 0, fmt.Errorf("%w: repeat {%d,%d}", ErrGrammar, n.min, n.max)
		}
		cur := from
		for range n.min {
			var err error
			if cur, err = c.build(n.subs[0], cur); err != nil {
				return 0, err
			}
		}
		if n.max < 0 {
			// A fresh loop head, so the loop holds only the repeated part.
			head := c.newState()
			c.eps(cur, head)
			e, err := c.build(n.subs[0], head)
			if err != nil {
				return 0, err
			}
			c.eps(e, head)
			return head, nil
		}
		end := c.newState()
		c.eps(cur, end)
		for range n.max - n.min {
			e, err := c.build(n.subs[0], cur)
			if err != nil {
				return 0, err
			}
			c.eps(e, end)
			cur = e
		}
		return end, nil
	case kUntil:
		return c.buildUntil(n.lit, from)
	case kList:
		return c.buildList(n, from)
	case kRef:
		next := c.newState()
		r := n.rule
		if n.def != nil {
			r = c.ruleIDs[n.def]
		}
		c.states[from].calls = append(c.states[from].calls, nfaCall{r, next})
		return next, nil
	}
	return 0, fmt.Errorf("%w: unknown node kind %d", ErrGrammar, n.kind)
}

// buildList adds a list whose items may be optional. first[i] is "no item
// yet, at item i", rest[i] "some item written, at item i"; both lead to
// item i (rest[i] through the separator), so each item is built once.
func (c *compiler) buildList(n *node, from int32) (int32, error) {
	first, rest := from, c.newState()
	for i, it := range n.subs {
		pre := c.newState()
		c.eps(first, pre)
		sepEnd, err := c.build(n.sep, rest)
		if err != nil {
			return 0, err
		}
		c.eps(sepEnd, pre)
		itemEnd, err := c.build(it, pre)
		if err != nil {
			return 0, err
		}
		nextFirst, nextRest := c.newState(), c.newState()
		c.eps(itemEnd, nextRest)
		if !n.req[i] {
			c.eps(first, nextFirst)
			c.eps(rest, nextRest)
		}
		first, rest = nextFirst, nextRest
	}
	end := c.newState()
	c.eps(first, end)
	c.eps(rest, end)
	return end, nil
}

// buildUntil adds the automaton of "any text without stop, then stop": the
// states count how much of stop the text ends with (Knuth-Morris-Pratt), and
// reaching all of it ends the part.
func (c *compiler) buildUntil(stop string, from int32) (int32, error) {
	if stop == "" {
		return 0, fmt.Errorf("%w: Until needs a non-empty end marker", ErrGrammar)
	}
	// fail[i]: the longest proper border of stop[:i+1].
	fail := make([]int, len(stop))
	for i, k := 1, 0; i < len(stop); i++ {
		for k > 0 && stop[i] != stop[k] {
			k = fail[k-1]
		}
		if stop[i] == stop[k] {
			k++
		}
		fail[i] = k
	}
	next := func(j int, b byte) int {
		for j > 0 && stop[j] != b {
			j = fail[j-1]
		}
		if stop[j] == b {
			j++
		}
		return j
	}
	st := make([]int32, len(stop)+1)
	for i := range st {
		st[i] = c.newState()
	}
	c.eps(from, st[0])
	for j := range len(stop) {
		lo := 0
		for b := 0; b <= 256; b++ {
			if b < 256 && b > lo && next(j, byte(b)) == next(j, byte(lo)) {
				continue
			}
			if b == 256 || b > lo {
				c.states[st[j]].edges = append(c.states[st[j]].edges, nfaEdge{byte(lo), byte(b - 1), st[next(j, byte(lo))]})
				lo = b
			}
		}
	}
	return st[len(stop)], nil
}

// closure adds the states reachable by epsilon edges, sorted.
func (c *compiler) closure(set []int32, seen []bool) []int32 {
	out := set[:0:0]
	stack := append([]int32(nil), set...)
	for _, s := range set {
		seen[s] = true
	}
	for len(stack) > 0 {
		s := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		out = append(out, s)
		for _, t := range c.states[s].eps {
			if !seen[t] {
				seen[t] = true
				stack = append(stack, t)
			}
		}
	}
	for _, s := range out {
		seen[s] = false
	}
	slices.Sort(out)
	return out
}

func setKey(set []int32) string {
	var b strings.Builder
	b.Grow(4 * len(set))
	for _, s := range set {
		b.WriteByte(byte(s))
		b.WriteByte(byte(s >> 8))
		b.WriteByte(byte(s >> 16))
		b.WriteByte(byte(s >> 24))
	}
	return b.String()
}

// maxDFAStates bounds the compiled automaton (its table is states x byte
// classes of int32).
const maxDFAStates = 50_000

type dfaCall struct {
	rule ruleID
	ret  int32
}

// determinize turns each rule's NFA into a DFA by the subset construction
// (a call edge becomes a call whose return state is the set of the call
// edges' targets) and fills the action table.
func (c *compiler) determinize(rules []ruleID) (*Grammar, error) {
	g := &Grammar{}
	// Byte classes: bytes no edge tells apart share a class.
	var bound [257]bool
	bound[0] = true
	for _, s := range c.states {
		for _, e := range s.edges {
			bound[e.lo] = true
			bound[int(e.hi)+1] = true
		}
	}
	var classLo []byte
	for b := 0; b < 256; b++ {
		if bound[b] {
			classLo = append(classLo, byte(b))
		}
		g.class[b] = uint8(len(classLo) - 1)
	}
	nc := len(classLo)
	g.nClasses = nc

	seen := make([]bool, len(c.states))
	ids := map[string]int32{}
	var sets [][]int32
	var owner []ruleID
	intern := func(set []int32, r ruleID) (int32, error) {
		k := setKey(set)
		if id, ok := ids[k]; ok {
			return id, nil
		}
		if len(sets) >= maxDFAStates {
			return 0, fmt.Errorf("%w: the grammar is too large (more than %d automaton states)", ErrGrammar, maxDFAStates)
		}
		id := int32(len(sets))
		ids[k] = id
		sets = append(sets, set)
		owner = append(owner, r)
		return id, nil
	}
	startOf := map[ruleID]int32{}
	for _, r := range rules {
		id, err := intern(c.closure([]int32{c.nfaRules[r][0]}, seen), r)
		if err != nil {
			return nil, err
		}
		startOf[r] = id
	}
	var trans []int32 // [state*nc+class], -1 none
	var accepting []bool
	var stateCalls [][]dfaCall
	targets := make([][]int32, nc)
	for i := 0; i < len(sets); i++ {
		set, r := sets[i], owner[i]
		end := c.nfaRules[r][1]
		for k := range targets {
			targets[k] = targets[k][:0]
		}
		byRule := map[ruleID][]int32{}
		acc := false
		for _, s := range set {
			if s == end {
				acc = true
			}
			for _, e := range c.states[s].edges {
				for k := g.class[e.lo]; ; k++ {
					targets[k] = append(targets[k], e.to)
					if k == g.class[e.hi] {
						break
					}
				}
			}
			for _, cl := range c.states[s].calls {
				byRule[cl.rule] = append(byRule[cl.rule], cl.to)
			}
		}
		accepting = append(accepting, acc)
		row := make([]int32, nc)
		for k := range row {
			row[k] = -1
			if len(targets[k]) == 0 {
				continue
			}
			t := slices.Compact(slices.Sorted(slices.Values(targets[k])))
			id, err := intern(c.closure(t, seen), r)
			if err != nil {
				return nil, err
			}
			row[k] = id
		}
		trans = append(trans, row...)
		var calls []dfaCall
		for _, callee := range slices.Sorted(maps.Keys(byRule)) {
			t := slices.Compact(slices.Sorted(slices.Values(byRule[callee])))
			id, err := intern(c.closure(t, seen), r)
			if err != nil {
				return nil, err
			}
			calls = append(calls, dfaCall{callee, id})
		}
		stateCalls = append(stateCalls, calls)
	}
	nStates, trans, accepting, stateCalls, block := minimize(nc, trans, accepting, stateCalls, startOf)
	owners := make([][]ruleID, nStates) // the rules whose states merged into each state
	for old, b := range block {
		if !slices.Contains(owners[b], owner[old]) {
			owners[b] = append(owners[b], owner[old])
		}
	}

	an := analyze(nc, trans, accepting, stateCalls, owners, startOf)
	if r, ok := an.leftRecursive(); ok {
		return nil, fmt.Errorf("%w: rule %s is left-recursive (it can call itself before reading a byte)", ErrGrammar, c.ruleName(r))
	}

	// The action of each state on each byte class: every way the state
	// can take the byte (go to a state, call a rule, end its own rule). One
	// way is stored as it is; several make a multi entry, and the matcher
	// follows each of them (it keeps every parse of the text, see
	// Matcher). Where a rule could both go on and end, ending is one of
	// the ways only if the byte can follow the rule (FOLLOW), so that
	// grammars without such places get the deterministic table.
	g.act = make([]int32, nStates*nc)
	callIndex := map[[2]int32]int32{}
	multiIndex := map[string]int32{}
	var opts []int32
	for s := range nStates {
		follow := an.followState(int32(s))
		for k := range nc {
			opts = opts[:0]
			if t := trans[s*nc+k]; t >= 0 {
				opts = append(opts, t)
			}
			for _, cl := range stateCalls[s] {
				st := startOf[cl.rule]
				// The callee reads the byte, or matches nothing and the
				// caller (or, past it, what follows the caller) reads it.
				if !an.first[st].has(k) && !(an.canEnd[st] && (an.first[cl.ret].has(k) || an.canEnd[cl.ret] && follow.has(k))) {
					continue
				}
				key := [2]int32{st, cl.ret}
				ci, ok := callIndex[key]
				if !ok {
					ci = int32(len(g.calls))
					callIndex[key] = ci
					g.calls = append(g.calls, call{start: key[0], ret: key[1]})
				}
				opts = append(opts, callAct(ci))
			}
			if accepting[s] && (len(opts) == 0 || follow.has(k)) {
				opts = append(opts, actPop)
			}
			a := actReject
			switch len(opts) {
			case 0:
			case 1:
				a = opts[0]
			default:
				key := setKey(opts)
				j, ok := multiIndex[key]
				if !ok {
					j = int32(len(g.multi))
					multiIndex[key] = j
					g.multi = append(g.multi, slices.Clone(opts))
				}
				a = multiAct(j)
			}
			g.act[s*nc+k] = a
		}
	}
	g.accepting = accepting
	g.canEnd = an.canEnd
	g.textLoop = make([]bool, nStates)
	for s := range nStates {
		g.textLoop[s] = g.readsText(int32(s))
	}
	g.root = startOf[ruleRoot]
	g.nStates = nStates
	return g, nil
}

// classSet is a set of byte classes (at most 256).
type classSet [4]uint64

func (c *classSet) has(k int) bool { return c[k>>6]>>(k&63)&1 == 1 }
func (c *classSet) add(k int)      { c[k>>6] |= 1 << (k & 63) }

// union adds o to c and reports whether c grew.
func (c *classSet) union(o *classSet) bool {
	grew := false
	for i := range c {
		if n := c[i] | o[i]; n != c[i] {
			c[i], grew = n, true
		}
	}
	return grew
}

// analysis is what the action table needs to know about the rules, on
// the minimized automaton.
type analysis struct {
	// canEnd[s]: state s can end its rule without reading a byte (it
	// accepts, or calls a rule that can match nothing and returns to a
	// state that can end).
	canEnd []bool
	// first[s]: the classes s can read next, directly, as the first byte
	// of a rule it calls, or past a call of a rule that can match nothing.
	first []classSet
	// follow[r]: the classes that can be read right after a call of r
	// returns (where its caller may end, what follows the caller too).
	follow  map[ruleID]*classSet
	owners  [][]ruleID // the rules each state belongs to
	calls   [][]dfaCall
	startOf map[ruleID]int32
}

func analyze(nc int, trans []int32, accepting []bool, calls [][]dfaCall, owners [][]ruleID, startOf map[ruleID]int32) *analysis {
	n := len(accepting)
	an := &analysis{canEnd: slices.Clone(accepting), first: make([]classSet, n), follow: map[ruleID]*classSet{},
		owners: owners, calls: calls, startOf: startOf}
	for changed := true; changed; {
		changed = false
		for s := range n {
			if an.canEnd[s] {
				continue
			}
			for _, cl := range calls[s] {
				if an.canEnd[startOf[cl.rule]] && an.canEnd[cl.ret] {
					an.canEnd[s], changed = true, true
					break
				}
			}
		}
	}
	for s := range n {
		for k := range nc {
			if trans[s*nc+k] >= 0 {
				an.first[s].add(k)
			}
		}
	}
	for changed := true; changed; {
		changed = false
		for s := range n {
			for _, cl := range calls[s] {
				st := startOf[cl.rule]
				if an.first[s].union(&an.first[st]) {
					changed = true
				}
				if an.canEnd[st] && an.first[s].union(&an.first[cl.ret]) {
					changed = true
				}
			}
		}
	}
	for r := range startOf {
		an.follow[r] = new(classSet)
	}
	for changed := true; changed; {
		changed = false
		for s := range n {
			for _, cl := range calls[s] {
				dst := an.follow[cl.rule]
				if dst.union(&an.first[cl.ret]) {
					changed = true
				}
				if an.canEnd[cl.ret] {
					for _, o := range owners[cl.ret] {
						if dst.union(an.follow[o]) {
							changed = true
						}
					}
				}
			}
		}
	}
	return an
}

// followState is what may be read after the rules state s belongs to end.
func (an *analysis) followState(s int32) classSet {
	var f classSet
	for _, o := range an.owners[s] {
		f.union(an.follow[o])
	}
	return f
}

// leftRecursive finds a rule that can call itself before reading a byte
// (directly, through other rules, or past rules that can match nothing):
// a parse of it would never end.
func (an *analysis) leftRecursive() (ruleID, bool) {
	rules := slices.Sorted(maps.Keys(an.startOf))
	left := map[ruleID][]ruleID{} // the rules each rule can call before reading a byte
	for _, r := range rules {
		seen := map[int32]bool{an.startOf[r]: true}
		stack := []int32{an.startOf[r]}
		for len(stack) > 0 {
			s := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			for _, cl := range an.calls[s] {
				if !slices.Contains(left[r], cl.rule) {
					left[r] = append(left[r], cl.rule)
				}
				if an.canEnd[an.startOf[cl.rule]] && !seen[cl.ret] {
					seen[cl.ret] = true
					stack = append(stack, cl.ret)
				}
			}
		}
	}
	const (
		unseen = iota
		active
		done
	)
	color := map[ruleID]int{}
	var found ruleID
	var visit func(r ruleID) bool
	visit = func(r ruleID) bool {
		color[r] = active
		for _, c := range left[r] {
			switch color[c] {
			case active:
				found = c
				return true
			case unseen:
				if visit(c) {
					return true
				}
			}
		}
		color[r] = done
		return false
	}
	for _, r := range rules {
		if color[r] == unseen && visit(r) {
			return found, true
		}
	}
	return 0, false
}

// readsText reports whether state s takes every text character (see
// utf8Next) by plain transitions and comes back to s after each: the inside
// of a JSON string. It follows the pairs of automaton state and UTF-8
// state a character's bytes go through.
func (g *Grammar) readsText(s int32) bool {
	type pair struct {
		st int32
		u  uint8
	}
	seen := map[pair]bool{{s, 0}: true}
	queue := []pair{{s, 0}}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		for b := 0; b < 256; b++ {
			u := utf8Next(p.u, byte(b))
			if u < 0 {
				continue
			}
			t := g.act[int(p.st)*g.nClasses+int(g.class[b])]
			if t < 0 || u == 0 && t != s {
				return false
			}
			if next := (pair{t, uint8(u)}); u != 0 && !seen[next] {
				if len(seen) > 64 { // not a character loop
					return false
				}
				seen[next] = true
				queue = append(queue, next)
			}
		}
	}
	return true
}

// minimize merges the states that behave alike (Moore's partition
// refinement): same acceptance, and for each byte class and each call,
// successors in the same block. Fewer states mean fewer masks to compute,
// and a JSON string's characters all lead back to one state. It rewrites
// startOf and returns the new tables.
func minimize(nc int, trans []int32, accepting []bool, calls [][]dfaCall, startOf map[ruleID]int32) (int, []int32, []bool, [][]dfaCall, []int32) {
	n := len(accepting)
	block := make([]int32, n)
	for s := range n {
		if accepting[s] {
			block[s] = 1
		}
	}
	nBlocks := 0
	sig := make([]byte, 0, 4*(nc+8))
	for {
		ids := map[string]int32{}
		next := make([]int32, n)
		for s := range n {
			sig = sig[:0]
			put := func(v int32) { sig = append(sig, byte(v), byte(v>>8), byte(v>>16), byte(v>>24)) }
			put(block[s])
			for k := range nc {
				t := trans[s*nc+k]
				if t >= 0 {
					t = block[t]
				}
				put(t)
			}
			for _, c := range calls[s] {
				put(int32(c.rule))
				put(block[c.ret])
			}
			id, ok := ids[string(sig)]
			if !ok {
				id = int32(len(ids))
				ids[string(sig)] = id
			}
			next[s] = id
		}
		block = next
		if len(ids) == nBlocks {
			break
		}
		nBlocks = len(ids)
	}
	newTrans := make([]int32, nBlocks*nc)
	newAcc := make([]bool, nBlocks)
	newCalls := make([][]dfaCall, nBlocks)
	done := make([]bool, nBlocks)
	for s := range n {
		b := block[s]
		if done[b] {
			continue
		}
		done[b] = true
		newAcc[b] = accepting[s]
		for k := range nc {
			t := trans[s*nc+k]
			if t >= 0 {
				t = block[t]
			}
			newTrans[int(b)*nc+k] = t
		}
		for _, c := range calls[s] {
			newCalls[b] = append(newCalls[b], dfaCall{c.rule, block[c.ret]})
		}
	}
	for r, s := range startOf {
		startOf[r] = block[s]
	}
	return nBlocks, newTrans, newAcc, newCalls, block
}
