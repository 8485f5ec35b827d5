package constrain

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// GBNF is llama.cpp's grammar notation: rules `name ::= alternatives`,
// where an alternative is a sequence of string literals ("..."), character
// classes ([a-z], [^"\\]), the any-character dot, rule names and
// parenthesised groups, each optionally followed by *, +, ?, {m}, {m,} or
// {m,n}; # starts a comment; a rule ends at a line break outside
// parentheses. Literals and classes take the escapes \n \r \t \\ \" \[ \]
// \- \xHH \uHHHH \UHHHHHHHH. Characters are Unicode code points, matched as
// their UTF-8 bytes. Generation starts at the rule called root.
//
// GBNF compiles into the same automaton as a JSON schema: the rules that
// do not recur are inlined, and those that do become called Rules. So a
// grammar has the limits of Rule: left recursion is refused with an error
// that names the rule. llama.cpp's token references (<[id]>, <token>) are
// refused too.

// ParseGBNF compiles a GBNF grammar's text into an Expr of its root rule.
func ParseGBNF(text string) (Expr, error) {
	p := &gbnfParser{src: text, line: 1}
	rules, order, err := p.parse()
	if err != nil {
		return Expr{}, err
	}
	if _, ok := rules["root"]; !ok {
		return Expr{}, fmt.Errorf("%w: GBNF: there is no rule called root (generation starts there)", ErrGrammar)
	}
	return buildGBNF(rules, order)
}

// gAST is a parsed GBNF expression.
type gAST struct {
	kind     byte // 'l' literal, 'c' class, 'r' rule name, 's' sequence, 'a' alternatives, '*' repetition
	lit      string
	ranges   []runeRange
	negate   bool
	name     string
	line     int
	subs     []*gAST
	min, max int
}

type runeRange struct{ lo, hi rune }

type gbnfParser struct {
	src  string
	pos  int
	line int
}

func (p *gbnfParser) errorf(format string, args ...any) error {
	return fmt.Errorf("%w: GBNF line %d: %s", ErrGrammar, p.line, fmt.Sprintf(format, args...))
}

// space skips blanks and comments; line breaks too when newlines is set.
func (p *gbnfParser) space(newlines bool) {
	for p.pos < len(p.src) {
		c := p.src[p.pos]
		switch {
		case c == ' ' || c == '\t' || c == '\r':
			p.pos++
		case c == '#':
			for p.pos < len(p.src) && p.src[p.pos] != '\n' {
				p.pos++
			}
		case c == '\n' && newlines:
			p.pos++
			p.line++
		default:
			return
		}
	}
}

func isNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func (p *gbnfParser) name() string {
	start := p.pos
	for p.pos < len(p.src) && isNameByte(p.src[p.pos]) {
		p.pos++
	}
	return p.src[start:p.pos]
}

// maxGBNFBytes bounds a grammar's text, maxGBNFRepeat a {m,n} count and
// maxGBNFDepth the nesting of parentheses.
const (
	maxGBNFBytes  = 256 << 10
	maxGBNFRepeat = 1000
	maxGBNFDepth  = 100
)

func (p *gbnfParser) parse() (map[string]*gAST, []string, error) {
	if len(p.src) > maxGBNFBytes {
		return nil, nil, fmt.Errorf("%w: GBNF: the grammar has %d bytes, more than %d", ErrGrammar, len(p.src), maxGBNFBytes)
	}
	rules := map[string]*gAST{}
	var order []string
	for {
		p.space(true)
		if p.pos >= len(p.src) {
			break
		}
		line := p.line
		name := p.name()
		if name == "" {
			return nil, nil, p.errorf("expected a rule name, found %q", p.rest())
		}
		p.space(false)
		if !strings.HasPrefix(p.src[p.pos:], "::=") {
			return nil, nil, p.errorf("expected ::= after the rule name %q", name)
		}
		p.pos += 3
		p.space(true) // the body may start on the next line
		body, err := p.alternatives(0)
		if err != nil {
			return nil, nil, err
		}
		p.space(false)
		if p.pos < len(p.src) && p.src[p.pos] != '\n' {
			return nil, nil, p.errorf("unexpected %q in rule %q", p.rest(), name)
		}
		if _, dup := rules[name]; dup {
			return nil, nil, fmt.Errorf("%w: GBNF line %d: rule %q is defined twice", ErrGrammar, line, name)
		}
		rules[name] = body
		order = append(order, name)
	}
	if len(rules) == 0 {
		return nil, nil, fmt.Errorf("%w: GBNF: the grammar has no rules", ErrGrammar)
	}
	return rules, order, nil
}

func (p *gbnfParser) rest() string {
	r := p.src[p.pos:]
	if i := strings.IndexByte(r, '\n'); i >= 0 {
		r = r[:i]
	}
	if len(r) > 20 {
		r = r[:20] + "..."
	}
	return r
}

// alternatives reads seq ("|" seq)*; inside parentheses (depth > 0) line
// breaks are blanks.
func (p *gbnfParser) alternatives(depth int) (*gAST, error) {
	if depth > maxGBNFDepth {
		return nil, p.errorf("parentheses nest deeper than %d", maxGBNFDepth)
	}
	alt := &gAST{kind: 'a'}
	for {
		seq, err := p.sequence(depth)
		if err != nil {
			return nil, err
		}
		alt.subs = append(alt.subs, seq)
		p.space(depth > 0)
		if p.pos < len(p.src) && p.src[p.pos] == '|' {
			p.pos++
			// An alternative may continue on the next line.
			p.space(true)
			continue
		}
		break
	}
	if len(alt.subs) == 1 {
		return alt.subs[0], nil
	}
	return alt, nil
}

func (p *gbnfParser) sequence(depth int) (*gAST, error) {
	seq := &gAST{kind: 's'}
	for {
		p.space(depth > 0)
		if p.pos >= len(p.src) {
			break
		}
		c := p.src[p.pos]
		var item *gAST
		var err error
		switch {
		case c == '"':
			item, err = p.literal()
		case c == '[':
			item, err = p.class()
		case c == '.':
			p.pos++
			item = &gAST{kind: 'c', ranges: []runeRange{{0, utf8.MaxRune}}}
		case c == '(':
			p.pos++
			if item, err = p.alternatives(depth + 1); err == nil {
				p.space(true)
				if p.pos >= len(p.src) || p.src[p.pos] != ')' {
					return nil, p.errorf("a group is not closed with )")
				}
				p.pos++
			}
		case c == '<' || c == '!' && p.pos+1 < len(p.src) && p.src[p.pos+1] == '<':
			return nil, p.errorf("token references (%s) are not supported by ats; write the token's text as a literal", p.rest())
		case isNameByte(c):
			save, line := p.pos, p.line
			name := p.name()
			p.space(false)
			if strings.HasPrefix(p.src[p.pos:], "::=") {
				// The next rule starts here (a rule that ended without a
				// line break is not GBNF, but be clear about it).
				p.pos, p.line = save, line
				return nil, p.errorf("rule %q starts before the previous rule's line ends", name)
			}
			item = &gAST{kind: 'r', name: name, line: line}
		default:
			if len(seq.subs) == 0 && c != '|' && c != ')' && c != '\n' {
				return nil, p.errorf("unexpected %q", p.rest())
			}
			return seq, nil
		}
		if err != nil {
			return nil, err
		}
		if item, err = p.repetition(item); err != nil {
			return nil, err
		}
		seq.subs = append(seq.subs, item)
	}
	return seq, nil
}

func (p *gbnfParser) repetition(item *gAST) (*gAST, error) {
	if p.pos >= len(p.src) {
		return item, nil
	}
	rep := func(min, max int) *gAST { return &gAST{kind: '*', subs: []*gAST{item}, min: min, max: max} }
	switch p.src[p.pos] {
	case '*':
		p.pos++
		return rep(0, -1), nil
	case '+':
		p.pos++
		return rep(1, -1), nil
	case '?':
		p.pos++
		return rep(0, 1), nil
	case '{':
		end := strings.IndexByte(p.src[p.pos:], '}')
		if end < 0 {
			return nil, p.errorf("a repetition {m,n} is not closed with }")
		}
		spec := p.src[p.pos+1 : p.pos+end]
		p.pos += end + 1
		lo, hi, comma := strings.Cut(spec, ",")
		min, err := strconv.Atoi(strings.TrimSpace(lo))
		if err != nil || min < 0 {
			return nil, p.errorf("repetition {%s}: want {m}, {m,} or {m,n}", spec)
		}
		max := min
		if comma {
			max = -1
			if h := strings.TrimSpace(hi); h != "" {
				if max, err = strconv.Atoi(h); err != nil || max < min {
					return nil, p.errorf("repetition {%s}: want {m}, {m,} or {m,n} with m <= n", spec)
				}
			}
		}
		if min > maxGBNFRepeat || max > maxGBNFRepeat {
			return nil, p.errorf("repetition {%s}: at most %d", spec, maxGBNFRepeat)
		}
		return rep(min, max), nil
	}
	return item, nil
}

// char reads one character of a literal or class, with its escapes.
func (p *gbnfParser) char() (rune, error) {
	if p.pos >= len(p.src) {
		return 0, p.errorf("the grammar ends inside a literal or class")
	}
	c := p.src[p.pos]
	if c == '\n' {
		return 0, p.errorf("a literal or class runs to the end of the line")
	}
	if c != '\\' {
		r, n := utf8.DecodeRuneInString(p.src[p.pos:])
		if r == utf8.RuneError && n <= 1 {
			return 0, p.errorf("invalid UTF-8")
		}
		p.pos += n
		return r, nil
	}
	if p.pos+1 >= len(p.src) {
		return 0, p.errorf("the grammar ends in an escape")
	}
	e := p.src[p.pos+1]
	p.pos += 2
	hex := func(n int) (rune, error) {
		if p.pos+n > len(p.src) {
			return 0, p.errorf("\\%c needs %d hex digits", e, n)
		}
		v, err := strconv.ParseUint(p.src[p.pos:p.pos+n], 16, 32)
		if err != nil || v > utf8.MaxRune {
			return 0, p.errorf("\\%c%s is not a character", e, p.src[p.pos:p.pos+n])
		}
		p.pos += n
		return rune(v), nil
	}
	switch e {
	case 'n':
		return '\n', nil
	case 'r':
		return '\r', nil
	case 't':
		return '\t', nil
	case 'x':
		return hex(2)
	case 'u':
		return hex(4)
	case 'U':
		return hex(8)
	case '\\', '"', '[', ']', '-', '^':
		return rune(e), nil
	}
	return 0, p.errorf("unknown escape \\%c", e)
}

func (p *gbnfParser) literal() (*gAST, error) {
	p.pos++ // "
	var b strings.Builder
	for {
		if p.pos < len(p.src) && p.src[p.pos] == '"' {
			p.pos++
			return &gAST{kind: 'l', lit: b.String()}, nil
		}
		r, err := p.char()
		if err != nil {
			return nil, err
		}
		b.WriteRune(r)
	}
}

func (p *gbnfParser) class() (*gAST, error) {
	p.pos++ // [
	n := &gAST{kind: 'c'}
	if p.pos < len(p.src) && p.src[p.pos] == '^' {
		n.negate = true
		p.pos++
	}
	for {
		if p.pos < len(p.src) && p.src[p.pos] == ']' {
			p.pos++
			break
		}
		lo, err := p.char()
		if err != nil {
			return nil, err
		}
		hi := lo
		if p.pos+1 < len(p.src) && p.src[p.pos] == '-' && p.src[p.pos+1] != ']' {
			p.pos++
			if hi, err = p.char(); err != nil {
				return nil, err
			}
			if hi < lo {
				return nil, p.errorf("class range %q-%q is empty", lo, hi)
			}
		}
		n.ranges = append(n.ranges, runeRange{lo, hi})
	}
	if !n.negate && len(n.ranges) == 0 {
		return nil, p.errorf("the class [] matches nothing")
	}
	return n, nil
}

// buildGBNF turns the parsed rules into an Expr: the rules on a cycle of
// references become Rules, the others are inlined.
func buildGBNF(rules map[string]*gAST, order []string) (Expr, error) {
	refs := map[string][]string{}
	var missing error
	for _, name := range order {
		walkGAST(rules[name], func(a *gAST) {
			if a.kind != 'r' {
				return
			}
			if _, ok := rules[a.name]; !ok && missing == nil {
				missing = fmt.Errorf("%w: GBNF line %d: rule %q is used but not defined", ErrGrammar, a.line, a.name)
			}
			refs[name] = append(refs[name], a.name)
		})
	}
	if missing != nil {
		return Expr{}, missing
	}
	recursive := cyclicRules(order, refs)
	b := &gbnfBuilder{rules: rules, recursive: map[string]*Rule{}, inlined: map[string]Expr{}}
	for _, name := range order {
		if recursive[name] {
			b.recursive[name] = NewRule(name)
		}
	}
	for _, name := range order {
		if r := b.recursive[name]; r != nil {
			r.Define(b.expr(rules[name]))
		}
	}
	return b.ref("root"), nil
}

type gbnfBuilder struct {
	rules     map[string]*gAST
	recursive map[string]*Rule
	inlined   map[string]Expr
}

func (b *gbnfBuilder) ref(name string) Expr {
	if r := b.recursive[name]; r != nil {
		return r.Ref()
	}
	if e, ok := b.inlined[name]; ok {
		return e
	}
	e := b.expr(b.rules[name])
	b.inlined[name] = e
	return e
}

func (b *gbnfBuilder) expr(a *gAST) Expr {
	switch a.kind {
	case 'l':
		return Lit(a.lit)
	case 'c':
		rs := normalizeRanges(a.ranges)
		if a.negate {
			rs = complementRanges(rs)
		}
		return utf8Ranges(rs)
	case 'r':
		return b.ref(a.name)
	case 's':
		parts := make([]Expr, len(a.subs))
		for i, s := range a.subs {
			parts[i] = b.expr(s)
		}
		if len(parts) == 1 {
			return parts[0]
		}
		return Seq(parts...)
	case 'a':
		parts := make([]Expr, len(a.subs))
		for i, s := range a.subs {
			parts[i] = b.expr(s)
		}
		return Alt(parts...)
	case '*':
		return Repeat(b.expr(a.subs[0]), a.min, a.max)
	}
	panic(fmt.Sprintf("constrain: GBNF node kind %q", a.kind))
}

func walkGAST(a *gAST, f func(*gAST)) {
	f(a)
	for _, s := range a.subs {
		walkGAST(s, f)
	}
}

// cyclicRules finds the rules on a cycle of references (Tarjan's strongly
// connected components: a component of several rules, or a rule that
// refers to itself).
func cyclicRules(order []string, refs map[string][]string) map[string]bool {
	index := map[string]int{}
	low := map[string]int{}
	onStack := map[string]bool{}
	var stack []string
	out := map[string]bool{}
	var visit func(v string)
	visit = func(v string) {
		index[v] = len(index)
		low[v] = index[v]
		stack = append(stack, v)
		onStack[v] = true
		for _, w := range refs[v] {
			if _, seen := index[w]; !seen {
				visit(w)
				low[v] = min(low[v], low[w])
			} else if onStack[w] {
				low[v] = min(low[v], index[w])
			}
		}
		if low[v] == index[v] {
			var comp []string
			for {
				w := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[w] = false
				comp = append(comp, w)
				if w == v {
					break
				}
			}
			if len(comp) > 1 || slices.Contains(refs[v], v) {
				for _, w := range comp {
					out[w] = true
				}
			}
		}
	}
	for _, v := range order {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	return out
}

// normalizeRanges sorts and merges ranges, leaving out the UTF-16
// surrogates, which UTF-8 cannot encode.
func normalizeRanges(in []runeRange) []runeRange {
	rs := slices.Clone(in)
	slices.SortFunc(rs, func(a, b runeRange) int { return int(a.lo - b.lo) })
	var out []runeRange
	for _, r := range rs {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi+1 {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	var clean []runeRange
	for _, r := range out {
		if r.lo < 0xD800 && r.hi > 0xDFFF {
			clean = append(clean, runeRange{r.lo, 0xD7FF}, runeRange{0xE000, r.hi})
			continue
		}
		if r.lo >= 0xD800 && r.hi <= 0xDFFF {
			continue
		}
		if r.lo >= 0xD800 && r.lo <= 0xDFFF {
			r.lo = 0xE000
		}
		if r.hi >= 0xD800 && r.hi <= 0xDFFF {
			r.hi = 0xD7FF
		}
		clean = append(clean, r)
	}
	return clean
}

// complementRanges is every character (but the surrogates) not in rs,
// which is normalized.
func complementRanges(rs []runeRange) []runeRange {
	var out []runeRange
	next := rune(0)
	for _, r := range rs {
		if r.lo > next {
			out = append(out, runeRange{next, r.lo - 1})
		}
		next = r.hi + 1
	}
	if next <= utf8.MaxRune {
		out = append(out, runeRange{next, utf8.MaxRune})
	}
	return normalizeRanges(out)
}

// utf8Ranges matches one character in rs as its UTF-8 bytes: each range
// is split where its encodings change length, and then where their
// leading bytes differ, until each piece is a sequence of byte ranges.
func utf8Ranges(rs []runeRange) Expr {
	var alts []Expr
	for _, r := range rs {
		alts = append(alts, utf8Range(r.lo, r.hi)...)
	}
	if len(alts) == 0 {
		return Expr{&node{kind: kClass}} // refused by Compile: matches nothing
	}
	if len(alts) == 1 {
		return alts[0]
	}
	return Alt(alts...)
}

func utf8Range(lo, hi rune) []Expr {
	// Split at the boundaries of encoding lengths.
	for _, b := range []rune{0x7F, 0x7FF, 0xFFFF} {
		if lo <= b && hi > b {
			return append(utf8Range(lo, b), utf8Range(b+1, hi)...)
		}
	}
	if hi < 0x80 {
		return []Expr{Range(byte(lo), byte(hi))}
	}
	// Split until all bytes but a prefix range over whole continuation
	// ranges: for n continuation bytes, a range whose low end has all
	// trailing bits 0 and high end all 1 below some byte.
	n := utf8.RuneLen(lo)
	for i := 1; i < n; i++ {
		m := rune(1)<<(6*i) - 1
		if lo&^m != hi&^m {
			if lo&m != 0 {
				return append(utf8Range(lo, lo|m), utf8Range((lo|m)+1, hi)...)
			}
			if hi&m != m {
				return append(utf8Range(lo, (hi&^m)-1), utf8Range(hi&^m, hi)...)
			}
		}
	}
	var a, z [utf8.UTFMax]byte
	utf8.EncodeRune(a[:], lo)
	utf8.EncodeRune(z[:], hi)
	parts := make([]Expr, n)
	for i := range n {
		parts[i] = Range(a[i], z[i])
	}
	return []Expr{Seq(parts...)}
}
