package constrain

import (
	"encoding/json"
	"math/rand/v2"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/text/tokenizer"
)

// The grammars in testdata/gbnf/ambiguous are written for these tests
// from the GBNF notation in the way llama.cpp's example grammars are
// written (JSON, arithmetic, a list, chess moves): rules that recur end
// with blanks their callers may also read, rules that recur may match
// nothing, and a rule may call another that starts with the same byte as
// something else it reads. A byte can then be read in more than one way
// until a later byte decides, which the matcher follows by keeping every
// parse. Before it did, each of these grammars was refused.
func ambiguousGrammar(t testing.TB, name string) *Grammar {
	t.Helper()
	return gbnfFile(t, "ambiguous/"+name)
}

var ambiguousCases = []struct {
	grammar string
	texts   map[string][2]bool // text: prefix, complete
	check   func(string) bool  // an independent check of generated texts
	loose   bool               // the check passes some texts the grammar does not
}{
	{"json", map[string][2]bool{
		`{"a": [1, 2.5e-3, true, null, "x\n\u00e9"], "b": {}}`: {true, true},
		" [ 1 , [ ] , { } ]  \n":                               {true, true},
		"{ \"a\" : 1 \n }":                                     {true, true},
		`{"a": 1 `:                                             {true, false},
		`[1 2]`:                                                {false, false},
		`[1,]`:                                                 {false, false},
		`{"a" 1}`:                                              {false, false},
		`"héllo €𝄞"`:                                           {true, true},
		`01`:                                                   {false, false},
		"[[[[[ 1 ] ] ] ] ]":                                    {true, true},
		"[[[[[ 1 ] ] ] ] ] ]":                                  {false, false},
		`{"a": {"b": {"c": [] } }`:                             {true, false},
	}, func(s string) bool { return json.Valid([]byte(s)) }, false},
	{"arithmetic", map[string][2]bool{
		"1 + 2 = 3\n":                     {true, true},
		"1 + 2 = 3 \n\n":                  {true, true},
		"(a1 * -b) / 4.5 = 7\n2-1=1\n":    {true, true},
		"((1 + 2)\n * 3) = 9\n":           {true, true},
		"1 + = 3\n":                       {false, false},
		"1 + 2 = 3":                       {true, false},
		"1 + 2 = 3 ":                      {true, false},
		"(1 + 2 = 3\n":                    {false, false},
		"1 ++ 2 = 3\n":                    {false, false},
		"x_y - (z) - ((((((1)))))) = 0\n": {true, true},
		"1 = 2\n 3 = 3\n":                 {false, false},
	}, checkArithmetic, false},
	{"list", map[string][2]bool{
		"milk\n":                              {true, true},
		"milk, eggs (six, brown ), bread  \n": {true, true},
		"a (b (c (d), e) ), f\n":              {true, true},
		"milk,\n":                             {false, false},
		"milk (\n":                            {false, false},
		"milk ()\n":                           {false, false},
		"milk (eggs\n":                        {false, false},
		"milk (eggs (a, b), c":                {true, false},
		"milk  eggs\n":                        {false, false},
		"bread,    jam ,  tea  (green, black)  \n": {false, false}, // no blank before a comma... but a blank after an item is its own
	}, checkList, false},
	{"chess", map[string][2]bool{
		"1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 4. O-O":                    {true, true},
		"1. e4 e5 (1... c5 2. Nf3 d6 (2... Nc6) ) 2. Nf3 Nc6 1-0": {true, true},
		"1. e4 (1. d4) e5": {false, false}, // a variation ends the turn
		"1. d4 (1. e4 e5 (1... c5 ) ) 1... d5 2. c4 dxc4 3. e8=Q+": {true, true},
		"1. e4 1-0 ":   {true, true},
		"1. e4 ( )":    {false, false},
		"1. e4 (2. d4": {true, false},
		"1. e9":        {false, false},
		"1. Pe4":       {false, false},
		"0. e4":        {false, false},
		"1. e4 1-":     {true, false},
		"1. e4 1-0 2.": {false, false},
	}, checkChess, true},
}

func TestGBNFAmbiguousExamples(t *testing.T) {
	for _, tc := range ambiguousCases {
		t.Run(tc.grammar, func(t *testing.T) {
			g := ambiguousGrammar(t, tc.grammar)
			if len(g.multi) == 0 {
				t.Errorf("the grammar compiled without a place read in two ways: it tests nothing new")
			}
			for text, want := range tc.texts {
				if (want[1] || !tc.loose) && want[1] != tc.check(text) {
					t.Errorf("%q: the independent check says %v, the case %v", text, !want[1], want[1])
				}
				p, c := match(t, g, text)
				if p != want[0] || c != want[1] {
					t.Errorf("%q: prefix %v complete %v, want %v %v", text, p, c, want[0], want[1])
				}
			}
			rng := rand.New(rand.NewPCG(11, 12))
			most := 0
			for i := range 200 {
				text := randomText(t, g, rng, rng.IntN(80))
				if !tc.check(text) {
					t.Fatalf("generated text %d fails the independent check: %q", i, text)
				}
				// How many parses the text keeps at once, at most.
				m := New(g, byteVocab(t)).NewMatcher()
				for j := range len(text) {
					if err := m.AcceptString(text[j : j+1]); err != nil {
						t.Fatal(err)
					}
					most = max(most, len(m.cur))
				}
			}
			t.Logf("at most %d parses at once", most)
		})
	}
}

// The deterministic grammars (testdata/gbnf, the JSON rules, schemas)
// compile to the table they had before the matcher kept several parses:
// no place is read in two ways, so their masks and speed are unchanged.
func TestDeterministicGrammarsHaveNoBranches(t *testing.T) {
	for _, name := range []string{"json", "arithmetic", "list", "chess"} {
		if g := gbnfFile(t, name); len(g.multi) != 0 {
			t.Errorf("testdata/gbnf/%s.gbnf: %d places read in two ways", name, len(g.multi))
		}
	}
	if g := mustCompile(t, JSONValue()); len(g.multi) != 0 {
		t.Errorf("JSON value: %d places read in two ways", len(g.multi))
	}
	for _, tc := range schemaCases {
		e, err := Schema([]byte(tc.schema))
		if err != nil {
			t.Fatal(err)
		}
		if g := mustCompile(t, e); len(g.multi) != 0 {
			t.Errorf("schema %s: %d places read in two ways", tc.name, len(g.multi))
		}
	}
}

// Per-token masks of the ambiguous grammars equal trying each token on its
// own, with tokens that span the places where a byte is read in two ways.
func TestAmbiguousMaskAgreesWithStepping(t *testing.T) {
	pieces := []string{"", " (", ") ", "\n\n", "  ", " \n", "1.", "1...", "e4", " e5", "Nf3 ", "O-O", "O-O-O", "1-0", "1/2", ") )",
		`{"`, `": `, ", ", "] ", "}\n", "true ", "12", "= ", " + ", "x_1", "milk", "eggs, ", ", (", "( ", "3\n", " =", "é", "\xc3", "\xa9"}
	for b := 0; b < 128; b++ {
		pieces = append(pieces, string([]byte{byte(b)}))
	}
	eog := len(pieces)
	v := pieceVocab(t, pieces)
	for _, tc := range ambiguousCases {
		c := New(ambiguousGrammar(t, tc.grammar), v)
		ends := minEnd(c.g)
		rng := rand.New(rand.NewPCG(13, 14))
		for run := range 40 {
			m := c.NewMatcher()
			text := ""
			for step := 0; step < 60; step++ {
				mask, err := m.Allowed()
				if err != nil {
					t.Fatal(err)
				}
				var allowed, closer []int
				best := 1 << 30
				for id := 0; id <= eog; id++ {
					got := maskAllows(mask, id)
					want := id == eog && m.Complete() || id != eog && m.tokenDistance(id, nil) >= 0
					if got != want {
						t.Fatalf("%s run %d after %q: token %d (%q) allowed %v, want %v", tc.grammar, run, text, id, pieces[id%len(pieces)], got, want)
					}
					if !got {
						continue
					}
					allowed = append(allowed, id)
					// Past half the steps, head for the end.
					if d := m.tokenDistance(id, ends); d < best {
						best, closer = d, []int{id}
					} else if d == best {
						closer = append(closer, id)
					}
				}
				tok := allowed[rng.IntN(len(allowed))]
				if step > 30 {
					tok = closer[rng.IntN(len(closer))]
				}
				if err := m.Accept(tok); err != nil {
					t.Fatal(err)
				}
				if tok == eog {
					if !tc.check(text) {
						t.Fatalf("%s: %q fails the independent check", tc.grammar, text)
					}
					break
				}
				text += pieces[tok]
			}
		}
	}
}

// With a real vocabulary (Qwen3's), the masks of the ambiguous JSON
// grammar at places where a blank is read in two ways equal trying each
// token, and generation on random logits writes valid JSON.
func TestAmbiguousRealVocabulary(t *testing.T) {
	v := realVocab(t, "qwen3")
	c := New(ambiguousGrammar(t, "json"), v)
	for _, prefix := range []string{"", "{", `{"a": 1 `, "[1, [2 ", "[1, [2 \n ", `{"a": {"b": true `, `{"a": "x`, `{"a": [] `} {
		m := c.NewMatcher()
		if err := m.AcceptString(prefix); err != nil {
			t.Fatal(err)
		}
		mask, err := m.Allowed()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for id := range v.size {
			got := maskAllows(mask, id)
			want := v.isEOG[id] && m.Complete() || !v.isEOG[id] && m.tokenDistance(id, nil) >= 0
			if got != want {
				t.Fatalf("after %q: token %d (%q) allowed %v, want %v", prefix, id, v.piece(id), got, want)
			}
			if got {
				n++
			}
		}
		t.Logf("after %q: %d parses, %d tokens allowed", prefix, len(m.cur), n)
	}
	rng := rand.New(rand.NewPCG(15, 16))
	for _, tc := range ambiguousCases {
		c := New(ambiguousGrammar(t, tc.grammar), v)
		for i := range 3 {
			text := generate(t, c, rng, rng.IntN(40))
			if !tc.check(text) {
				t.Fatalf("%s, run %d: %q fails the independent check", tc.grammar, i, text)
			}
		}
	}
}

// checkArithmetic parses a tape of the arithmetic grammar by recursive
// descent: terms take the blanks after them, and a line's result must be
// followed by blanks that end in a line break.
func checkArithmetic(s string) bool {
	p := 0
	blanks := func() {
		for p < len(s) && strings.IndexByte(" \t\n", s[p]) >= 0 {
			p++
		}
	}
	digits := func() bool {
		q := p
		for p < len(s) && s[p] >= '0' && s[p] <= '9' {
			p++
		}
		return p > q
	}
	var expr, term func() bool
	term = func() bool {
		switch {
		case p >= len(s):
			return false
		case s[p] == '-':
			p++
			if !term() {
				return false
			}
		case s[p] == '(':
			p++
			blanks()
			if !expr() || p >= len(s) || s[p] != ')' {
				return false
			}
			p++
		case s[p] >= 'a' && s[p] <= 'z':
			for p++; p < len(s) && (s[p] >= 'a' && s[p] <= 'z' || s[p] >= '0' && s[p] <= '9' || s[p] == '_'); p++ {
			}
		case s[p] >= '0' && s[p] <= '9':
			if s[p] == '0' {
				p++
			} else {
				digits()
			}
			if p < len(s) && s[p] == '.' {
				p++
				if !digits() {
					return false
				}
			}
		default:
			return false
		}
		blanks()
		return true
	}
	expr = func() bool {
		if !term() {
			return false
		}
		for p < len(s) && strings.IndexByte("+-*/", s[p]) >= 0 {
			p++
			blanks()
			if !term() {
				return false
			}
		}
		return true
	}
	for lines := 0; ; lines++ {
		if p == len(s) {
			return lines > 0
		}
		if !expr() || p >= len(s) || s[p] != '=' {
			return false
		}
		p++
		blanks()
		if !term() || s[p-1] != '\n' {
			return false
		}
	}
}

// checkList parses the list grammar: greedy blanks, one character of
// look-ahead after a space.
func checkList(s string) bool {
	p := 0
	blank := func() {
		for p < len(s) && (s[p] == ' ' || s[p] == '\t') {
			p++
		}
	}
	isWord := func(c byte) bool {
		return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '\''
	}
	word := func() bool {
		q := p
		for p < len(s) && isWord(s[p]) {
			p++
		}
		return p > q
	}
	var list func() bool
	item := func() bool {
		if !word() {
			return false
		}
		for p+1 < len(s) && s[p] == ' ' && isWord(s[p+1]) {
			p++
			word()
		}
		if p+1 < len(s) && s[p] == ' ' && s[p+1] == '(' {
			p += 2
			if !list() {
				return false
			}
			blank()
			if p >= len(s) || s[p] != ')' {
				return false
			}
			p++
		}
		blank()
		return true
	}
	list = func() bool {
		if !item() {
			return false
		}
		for p < len(s) && s[p] == ',' {
			p++
			blank()
			if !item() {
				return false
			}
		}
		return true
	}
	return list() && p == len(s)-1 && s[p] == '\n'
}

var (
	chessMove  = `(O-O(-O)?|[KQRBN][a-h]?[1-8]?x?[a-h][1-8]|([a-h]x)?[a-h][1-8](=[QRBN])?)[+#]?`
	chessTurn  = `[1-9][0-9]?(\.[ \n]*` + chessMove + `[ \n]*(` + chessMove + `[ \n]*)?|\.\.\.[ \n]*` + chessMove + `[ \n]*)`
	chessLine  = regexp.MustCompile(`^(` + chessTurn + `)+((1-0|0-1|1/2-1/2)[ \n]*)?$`)
	innerGroup = regexp.MustCompile(`\(([^()]*)\)[ \n]*`)
)

// checkChess checks the innermost variations against the notation of a
// line and takes them out, until only the main line is left. (It lets a
// variation come between a turn's two moves, which the grammar does not:
// it is a check of what the grammar writes, not its equal.)
func checkChess(s string) bool {
	for {
		ok := true
		t := innerGroup.ReplaceAllStringFunc(s, func(g string) string {
			inner := innerGroup.FindStringSubmatch(g)[1]
			if !chessLine.MatchString(strings.TrimLeft(inner, " \n")) {
				ok = false
			}
			return ""
		})
		if !ok {
			return false
		}
		if t == s {
			return !strings.ContainsAny(s, "()") && chessLine.MatchString(s)
		}
		s = t
	}
}

// stepsCost replays token sequences, each through a fresh constraint of g
// (an empty mask cache, as a new request's grammar has), and returns the
// time per token of Allowed and Accept.
func stepsCost(t testing.TB, g *Grammar, v *Vocab, runs [][]int) time.Duration {
	t.Helper()
	n := 0
	start := time.Now()
	for _, toks := range runs {
		m := New(g, v).NewMatcher()
		for _, tok := range toks {
			if _, err := m.Allowed(); err != nil {
				t.Fatal(err)
			}
			if err := m.Accept(tok); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	return time.Since(start) / time.Duration(n)
}

// jsonRuns are JSON documents as a model writes them (indented, nested
// objects and arrays, numbers, strings), spelled with Qwen3's tokenizer
// and ended with its end of generation: texts of the deterministic JSON
// grammar, whose language the ambiguous one contains.
func jsonRuns(t testing.TB) [][]int {
	t.Helper()
	f, err := gguf.Open(filepath.Join(testenv.SharedDir(t), "testdata", "vocab", "vocab-qwen3.gguf"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tok, err := tokenizer.FromGGUF(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	docs := []any{
		map[string]any{"name": "Ada Lovelace", "born": 1815, "tags": []any{"math", "poetry", nil, true}, "notes": map[string]any{"a": 1.5, "b": []any{}}},
		[]any{1, -2.25e-3, "x\ny", []any{[]any{[]any{0}}}, map[string]any{}},
		map[string]any{"order": map[string]any{"id": 42, "items": []any{map[string]any{"sku": "A-1", "qty": 3}, map[string]any{"sku": "B-22", "qty": 1, "gift": false}}, "total": 99.5}},
	}
	var runs [][]int
	for _, d := range docs {
		for _, indent := range []string{"", "  "} {
			b, err := json.MarshalIndent(d, "", indent)
			if err != nil {
				t.Fatal(err)
			}
			if indent == "" {
				b, _ = json.Marshal(d)
			}
			ids := tok.Encode(string(b), false, false)
			eog := -1
			for id := range tok.VocabSize() {
				if tok.IsEOG(id) {
					eog = id
					break
				}
			}
			runs = append(runs, append(ids, eog))
		}
	}
	return runs
}

// The speed bound: on the same JSON documents (Qwen3's vocabulary, an
// empty mask cache), the ambiguous JSON grammar, which keeps two parses
// after every blank that follows a value, costs at most 4 times what the
// deterministic one does per token.
func TestAmbiguousGrammarSpeed(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping a timing test in -short mode")
	}
	v := realVocab(t, "qwen3")
	runs := jsonRuns(t)
	det, amb := gbnfFile(t, "json"), ambiguousGrammar(t, "json")
	best := func(g *Grammar) time.Duration {
		d := time.Duration(1 << 62)
		for range 3 {
			d = min(d, stepsCost(t, g, v, runs))
		}
		return d
	}
	dd, da := best(det), best(amb)
	t.Logf("per token: deterministic JSON %v, ambiguous JSON %v (%.2fx)", dd, da, float64(da)/float64(dd))
	if da > 4*dd {
		t.Errorf("the ambiguous JSON grammar costs %v a token, more than 4x the deterministic one's %v", da, dd)
	}
}

func BenchmarkAmbiguousSteps(b *testing.B) {
	v := realVocab(b, "qwen3")
	runs := jsonRuns(b)
	for _, bc := range []struct {
		name string
		g    *Grammar
	}{{"deterministic", gbnfFile(b, "json")}, {"ambiguous", ambiguousGrammar(b, "json")}} {
		b.Run(bc.name, func(b *testing.B) {
			var d time.Duration
			for b.Loop() {
				d = stepsCost(b, bc.g, v, runs)
			}
			b.ReportMetric(float64(d.Nanoseconds())/1e3, "µs/token")
		})
	}
}
