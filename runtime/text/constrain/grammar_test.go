package constrain

import (
	"encoding/json"
	"errors"
	"math/rand/v2"
	"testing"
)

func TestJSONValueGrammar(t *testing.T) {
	g := mustCompile(t, JSONValue())
	for _, tc := range []struct {
		text             string
		prefix, complete bool
	}{
		{`{"a": [1, 2.5e-3, true, null, "x\n\u00e9"], "b": {}}`, true, true},
		{"{\n  \"a\": [\n    1\n  ]\n}", true, true},
		{`"héllo €𝄞"`, true, true},
		{`-0`, true, true},
		{`123`, true, true},
		{`[[[[[]]]]]`, true, true},
		{`{"a"`, true, false},
		{`[1,`, true, false},
		{`tr`, true, false},
		{`01`, false, false},
		{`{a: 1}`, false, false},
		{`[1,]`, false, false},
		{`{"a":1,}`, false, false},
		{`"\x"`, false, false},
		{"\"a\x01\"", false, false},
		{"\"\xff\"", false, false},         // not UTF-8
		{"\"\xed\xa0\x80\"", false, false}, // a UTF-16 surrogate in UTF-8
		{`1.`, true, false},
		{`1.e3`, false, false},
		{` 1`, false, false}, // no whitespace around the value
		{`[1]]`, false, false},
		{`12345678901234567`, false, false},                    // more digits than maxIntDigits
		{"[" + "\n" + "                     1]", false, false}, // indent past maxIndent
	} {
		p, c := match(t, g, tc.text)
		if p != tc.prefix || c != tc.complete {
			t.Errorf("%q: prefix %v complete %v, want %v %v", tc.text, p, c, tc.prefix, tc.complete)
		}
	}
}

func TestRandomJSONIsValid(t *testing.T) {
	g := mustCompile(t, JSONValue())
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		text := randomText(t, g, rng, rng.IntN(60))
		if !json.Valid([]byte(text)) {
			t.Fatalf("text %d is not JSON: %q", i, text)
		}
	}
}

func TestUntilAndList(t *testing.T) {
	g := mustCompile(t, Seq(Opt(Seq(Lit("<think>"), Until("</think>"))), Lit("X")))
	for _, tc := range []struct {
		text             string
		prefix, complete bool
	}{
		{"X", true, true},
		{"<think>a</thin</think>X", true, true},
		{"<think></think>X", true, true},
		{"<think>a </think", true, false},
		{"<think>a</think></think>X", false, false}, // the block ends at the first marker
		{"<thinkX", false, false},
	} {
		p, c := match(t, g, tc.text)
		if p != tc.prefix || c != tc.complete {
			t.Errorf("%q: prefix %v complete %v, want %v %v", tc.text, p, c, tc.prefix, tc.complete)
		}
	}

	l := mustCompile(t, Seq(Lit("("), List([]Expr{Lit("a"), Lit("b"), Lit("c")}, []bool{false, true, false}, Lit(",")), Lit(")")))
	for text, want := range map[string]bool{
		"(b)": true, "(a,b)": true, "(b,c)": true, "(a,b,c)": true,
		"()": false, "(a)": false, "(a,c)": false, "(b,a)": false, "(,b)": false, "(a,,b)": false, "(ab)": false,
	} {
		if _, c := match(t, l, text); c != want {
			t.Errorf("list %q: complete %v, want %v", text, c, want)
		}
	}
}

func TestInvalidGrammarsAreRejected(t *testing.T) {
	for name, e := range map[string]Expr{
		"no choices":  Alt(),
		"empty class": AnyOf(""),
	} {
		if _, err := Compile(e); !errors.Is(err, ErrGrammar) {
			t.Errorf("%s: err %v, want ErrGrammar", name, err)
		}
	}
}

// Choices that start alike through calls (two free-form JSON values, one
// beside a literal that is also a JSON value) are read side by side until
// a byte tells them apart, so they match what either matches.
func TestAlternativesThatStartAlike(t *testing.T) {
	for name, e := range map[string]Expr{
		"two free values":       Alt(JSONValue(), JSONObject()),
		"free value and string": Alt(JSONValue(), Lit(`"x"`)),
		"value or value list":   Seq(Alt(JSONValue(), Seq(JSONValue(), Lit(";"), JSONValue())), Lit("!")),
	} {
		g := mustCompile(t, e)
		for text, want := range map[string]bool{`{"a":1}`: true, `"x"`: true, `[1]`: true, `{`: false, `"x`: false, `{}{}`: false} {
			if name == "value or value list" {
				text += "!"
			}
			if _, c := match(t, g, text); c != want {
				t.Errorf("%s: %q complete %v, want %v", name, text, c, want)
			}
		}
	}
	g := mustCompile(t, Seq(Alt(JSONValue(), Seq(JSONValue(), Lit(";"), JSONValue())), Lit("!")))
	for text, want := range map[string]bool{`{"a":[1]};"b"!`: true, `1;2;3!`: false, `[];{}!`: true} {
		if _, c := match(t, g, text); c != want {
			t.Errorf("value or value list: %q complete %v, want %v", text, c, want)
		}
	}
}

func TestMatcherMaskAgreesWithStepping(t *testing.T) {
	// A vocabulary of multi-byte tokens: the mask from the tree walk must
	// equal trying every token on its own.
	pieces := []string{"", "{", "}", `"`, `"a`, `":`, `": `, "a", "ab", `a"`, "1", "12", "1.", ".5", ",", ", ", ` "`, "\n", "\n ", "tr", "true", "ue", "null", "[", "]", "[]", "{}", `{"`, "é", "\xc3", "\xa9"}
	for b := byte(' '); b <= '~'; b++ {
		if b != 'a' && b != '"' && b != '1' { // those have their own tokens already
			pieces = append(pieces, string([]byte{b}))
		}
	}
	eog := len(pieces)
	v := pieceVocab(t, pieces)
	g := mustCompile(t, JSONValue())
	c := New(g, v)
	rng := rand.New(rand.NewPCG(3, 4))
	for run := range 50 {
		m := c.NewMatcher()
		for step := 0; step < 40; step++ {
			mask, err := m.Allowed()
			if err != nil {
				t.Fatal(err)
			}
			var allowed []int
			for id := 0; id <= eog; id++ {
				got := maskAllows(mask, id)
				want := false
				if id == eog {
					want = m.Complete()
				} else if pieces[id] != "" {
					want = m.tokenDistance(id, nil) >= 0
				}
				if got != want {
					t.Fatalf("run %d step %d after %q: token %d (%q) allowed %v, want %v", run, step, m.text, id, pieces[id%len(pieces)], got, want)
				}
				if got {
					allowed = append(allowed, id)
				}
			}
			tok := allowed[rng.IntN(len(allowed))]
			if err := m.Accept(tok); err != nil {
				t.Fatal(err)
			}
			if tok == eog {
				break
			}
		}
	}
}
