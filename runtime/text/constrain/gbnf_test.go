package constrain

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// The grammars in testdata/gbnf are written for these tests from the GBNF
// notation (JSON, arithmetic, lists, chess moves: the kinds of grammar
// llama.cpp ships as examples).
func gbnfFile(t testing.TB, name string) *Grammar {
	t.Helper()
	b, err := os.ReadFile("testdata/gbnf/" + name + ".gbnf")
	if err != nil {
		t.Fatal(err)
	}
	e, err := ParseGBNF(string(b))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return mustCompile(t, e)
}

func TestGBNFExamples(t *testing.T) {
	for _, tc := range []struct {
		grammar string
		texts   map[string][2]bool // text: prefix, complete
		check   func(string) bool  // an independent check of generated texts
	}{
		{"json", map[string][2]bool{
			`{"a": [1, 2.5e-3, true, null, "x\n\u00e9"], "b": {}}`: {true, true},
			`"héllo €𝄞"`: {true, true},
			`[1,]`:       {false, false},
			`{"a"`:       {true, false},
			`01`:         {false, false},
		}, func(s string) bool { return json.Valid([]byte(s)) }},
		{"arithmetic", map[string][2]bool{
			"1 + 2 = 3\n":                     {true, true},
			"(a1 * -b) / 4.5 = 7\n2-1=1\n":    {true, true},
			"((1 + 2) * 3) = 9\n":             {true, true},
			"1 + = 3\n":                       {false, false},
			"1 + 2 = 3":                       {true, false},
			"(1 + 2 = 3\n":                    {false, false},
			"1 ++ 2 = 3\n":                    {false, false},
			"x_y - (z) - ((((((1)))))) = 0\n": {true, true},
		}, regexp.MustCompile(`^([-+*/()a-z0-9_. \t]+=[ \t]*[0-9.]+\n)+$`).MatchString},
		{"list", map[string][2]bool{
			"- milk\n- eggs\n  - six\n": {true, true},
			"- milk\n":                  {true, true},
			"- \n":                      {false, false},
			"* milk\n":                  {false, false},
			"- milk":                    {true, false},
			"- a\n- b\n- c\n- d\n- e\n": {true, true},
		}, regexp.MustCompile(`^(- [^\n]+\n(  - [^\n]+\n)*)+$`).MatchString},
		{"chess", map[string][2]bool{
			"1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 4. O-O":       {true, true},
			"1. d4 d5 2. c4 dxc4 3. e8=Q+ Kxe8 4. Rad1#": {true, true},
			"1. O-O-O":  {true, true},
			"1. e9":     {false, false},
			"1. Pe4":    {false, false},
			"0. e4":     {false, false},
			"1. Nbd2 f": {true, false},
		}, regexp.MustCompile(`^[1-9][0-9]{0,2}\. \S+( \S+)?( [1-9][0-9]{0,2}\. \S+( \S+)?)*$`).MatchString},
	} {
		t.Run(tc.grammar, func(t *testing.T) {
			g := gbnfFile(t, tc.grammar)
			for text, want := range tc.texts {
				p, c := match(t, g, text)
				if p != want[0] || c != want[1] {
					t.Errorf("%q: prefix %v complete %v, want %v %v", text, p, c, want[0], want[1])
				}
			}
			rng := rand.New(rand.NewPCG(3, 4))
			for i := range 200 {
				text := randomText(t, g, rng, rng.IntN(80))
				if !tc.check(text) {
					t.Fatalf("generated text %d fails the independent check: %q", i, text)
				}
			}
		})
	}
}

// The GBNF JSON grammar describes the language of the built-in JSON rules,
// so at every step of any text the two allow the same tokens: the same
// masks from the same kind of automaton.
func TestGBNFJSONSameMasks(t *testing.T) {
	gb := gbnfFile(t, "json")
	builtin := mustCompile(t, JSONValue())
	// A vocabulary of single bytes and some multi-byte pieces.
	pieces := []string{}
	for b := 0; b < 256; b++ {
		pieces = append(pieces, string([]byte{byte(b)}))
	}
	pieces = append(pieces, `{"`, `":`, `",`, `"}`, "true", "null", "12", ".5", "e-", " [", "]}", "\n  ", `\u00`, "é", "€")
	v := pieceVocab(t, pieces)
	ca, cb := New(gb, v), New(builtin, v)
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range 100 {
		text := randomText(t, builtin, rng, rng.IntN(60))
		ma, mb := ca.NewMatcher(), cb.NewMatcher()
		for j := 0; j <= len(text); j++ {
			a, err := ma.Allowed()
			if err != nil {
				t.Fatal(err)
			}
			b, err := mb.Allowed()
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(a, b) {
				t.Fatalf("text %d %q: the masks differ after %q", i, text, text[:j])
			}
			if j < len(text) {
				if err := ma.AcceptString(text[j : j+1]); err != nil {
					t.Fatal(err)
				}
				if err := mb.AcceptString(text[j : j+1]); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

func TestGBNFSyntax(t *testing.T) {
	for _, tc := range []struct {
		grammar string
		yes, no []string
	}{
		{`root ::= "a" | "b"  # a comment`, []string{"a", "b"}, []string{"c", "ab"}},
		{"root ::=\n  ( \"a\"\n  | \"b\" )", []string{"a", "b"}, []string{""}},
		{`root ::= ( "x" ( "y" | "z" ) )+`, []string{"xy", "xzxy"}, []string{"x", "xyy"}},
		{`root ::= [a-c]{2} "!"{1,} "?"{0,2} "#"?`, []string{"ab!", "cc!!??#"}, []string{"a!", "ab???"}},
		{`root ::= [^a-z] .`, []string{"Aé", "1\n", "€x"}, []string{"aA"}},
		{`root ::= "\x41\u00e9\U0001F600\t\"\\" [\[\]\-]`, []string{"Aé😀\t\"\\[", "Aé😀\t\"\\-"}, []string{"Aé😀\t\"\\a"}},
		{`root ::= [α-ω]+ ws
ws ::= | " "`, []string{"αβ", "ω "}, []string{"a", "αβ  "}},
		{`root ::= item ( "," item )*
item ::= "[" ( item ( "," item )* )? "]"`, []string{"[]", "[[],[[]]],[]"}, []string{"[],", "[[]"}},
		// What a matcher that kept one parse refused: a recurring rule
		// that matches nothing, one that ends with blanks its caller
		// reads too, and a rule that matches nothing called in a loop.
		{"root ::= list\nlist ::= \"a\" list | \"\"", []string{"", "a", "aaa"}, []string{"b"}},
		{"root ::= expr \" =\"\nexpr ::= \"1\" ws | \"(\" expr \")\" ws\nws ::= \" \"*", []string{"1 =", "(1 ) =", "((1))   ="}, []string{"1", "( 1) ="}},
		{"root ::= item* \"b\"\nitem ::= \"(\" item* \")\" | \"\"", []string{"b", "()b", "(())()b"}, []string{"(b", "()"}},
	} {
		e, err := ParseGBNF(tc.grammar)
		if err != nil {
			t.Errorf("%q: %v", tc.grammar, err)
			continue
		}
		g, err := Compile(e)
		if err != nil {
			t.Errorf("%q: %v", tc.grammar, err)
			continue
		}
		for _, s := range tc.yes {
			if _, c := match(t, g, s); !c {
				t.Errorf("%q does not match %q", tc.grammar, s)
			}
		}
		for _, s := range tc.no {
			if _, c := match(t, g, s); c {
				t.Errorf("%q matches %q", tc.grammar, s)
			}
		}
	}
}

// A grammar that reads a text in ever more ways (here twice as many at
// each byte: every "a" may open an x or a y, which end differently) fails
// the generation with ErrAmbiguous once the parses pass maxParses, instead
// of growing without bound.
func TestTooManyParses(t *testing.T) {
	e, err := ParseGBNF("root ::= x\nx ::= \"a\" x | \"a\" y | \"\"\ny ::= \"a\" x \"b\" | \"a\" y \"c\" | \"\"")
	if err != nil {
		t.Fatal(err)
	}
	g := mustCompile(t, e)
	if _, c := match(t, g, "aaaacb"); !c {
		t.Fatal(`"aaaacb" does not match`)
	}
	m := New(g, byteVocab(t)).NewMatcher()
	err = m.AcceptString(strings.Repeat("a", 20))
	if !errors.Is(err, ErrAmbiguous) {
		t.Fatalf("20 a's: %v, want ErrAmbiguous", err)
	}
	if !m.Complete() || len(m.cur) > maxParses {
		t.Errorf("the refused text changed the matcher: %d parses", len(m.cur))
	}
}

// Every error names what is wrong, and where.
func TestGBNFErrors(t *testing.T) {
	for _, tc := range []struct{ grammar, want string }{
		{`start ::= "a"`, "no rule called root"},
		{`root ::= thing`, `line 1: rule "thing" is used but not defined`},
		{"root ::= \"a\"\nroot ::= \"b\"", `line 2: rule "root" is defined twice`},
		{`root ::= "a`, "ends inside a literal"},
		{`root ::= [a-`, "ends inside a literal or class"},
		{`root ::= "\q"`, `unknown escape \q`},
		{`root ::= ( "a"`, "not closed with )"},
		{`root ::= "a"{3,1}`, "m <= n"},
		{`root ::= "a"{5000}`, "at most 1000"},
		{`root ::= <think> "a"`, "token references"},
		{`root ::= [z-a]`, "is empty"},
		{`root ::= "a" ) "b"`, `unexpected ")`},
		{"root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"", `rule "expr" is left-recursive`},
		// Left recursion past a rule that may match nothing.
		{"root ::= a\na ::= b a \"x\" | \"y\"\nb ::= \"z\" b | \"\"", `rule "a" is left-recursive`},
		{"root ::= a\na ::= b \"x\" | \"y\"\nb ::= a? \"z\"", `is left-recursive`},
	} {
		e, err := ParseGBNF(tc.grammar)
		if err == nil {
			_, err = Compile(e)
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) || !errors.Is(err, ErrGrammar) {
			t.Errorf("%q: %v, want ErrGrammar mentioning %q", tc.grammar, err, tc.want)
		}
	}
}

// A class is its characters' UTF-8 encodings, exactly.
func TestUTF8Ranges(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	bounds := []rune{0, 0x7F, 0x80, 0x7FF, 0x800, 0xD7FF, 0xE000, 0xFFFF, 0x10000, 0x10FFFF}
	for i := range 40 {
		var rs []runeRange
		for range 1 + rng.IntN(3) {
			a := bounds[rng.IntN(len(bounds))] + rune(rng.IntN(300)) - 150
			b := a + rune(rng.IntN(100000))
			a, b = max(a, 0), min(b, utf8.MaxRune)
			if a <= b {
				rs = append(rs, runeRange{a, b})
			}
		}
		norm := normalizeRanges(rs)
		for _, neg := range []bool{false, true} {
			set := norm
			if neg {
				set = complementRanges(norm)
			}
			if len(set) == 0 {
				continue
			}
			g := mustCompile(t, utf8Ranges(set))
			in := func(r rune) bool {
				for _, x := range set {
					if r >= x.lo && r <= x.hi {
						return true
					}
				}
				return false
			}
			probe := []rune{}
			for _, x := range rs {
				probe = append(probe, x.lo-1, x.lo, x.hi, x.hi+1)
			}
			for range 300 {
				probe = append(probe, rune(rng.IntN(utf8.MaxRune+1)))
			}
			probe = append(probe, bounds...)
			for _, r := range probe {
				if r < 0 || r > utf8.MaxRune || r >= 0xD800 && r <= 0xDFFF {
					continue
				}
				_, c := match(t, g, string(r))
				if c != in(r) {
					t.Fatalf("case %d (negated %v) %v: %U matched %v", i, neg, set, r, c)
				}
			}
		}
	}
}

func BenchmarkGBNFCompile(b *testing.B) {
	src, err := os.ReadFile("testdata/gbnf/json.gbnf")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		e, err := ParseGBNF(string(src))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := Compile(e); err != nil {
			b.Fatal(err)
		}
	}
}
