package constrain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// schemaCases are schemas of the supported subset, with texts the
// constraint must allow (the validator accepts them too) and texts it must
// refuse (the validator refuses them, or they are outside what ats
// generates).
var schemaCases = []struct {
	name, schema string
	good, bad    []string
}{
	{
		name: "person (strict, OpenAI style)",
		schema: `{"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},
			"email":{"type":["string","null"]},"tags":{"type":"array","items":{"type":"string"}}},
			"required":["name","age","email","tags"],"additionalProperties":false}`,
		good: []string{`{"name":"Ada","age":36,"email":null,"tags":[]}`,
			"{\n  \"name\": \"Ada\",\n  \"age\": -3,\n  \"email\": \"a@b.c\",\n  \"tags\": [\"x\", \"y\"]\n}"},
		bad: []string{`{"name":"Ada"}`, `{"age":36,"name":"Ada","email":null,"tags":[]}`,
			`{"name":"Ada","age":3.5,"email":null,"tags":[]}`, `{"name":1,"age":36,"email":null,"tags":[]}`},
	},
	{
		name:   "optional properties",
		schema: `{"type":"object","properties":{"a":{"type":"number"},"b":{"type":"boolean"},"c":{"type":"null"}},"required":["b"]}`,
		good:   []string{`{"b":true}`, `{"a":1.5,"b":false}`, `{"b":true,"c":null}`, `{"a":-2e10,"b":true,"c":null}`},
		bad:    []string{`{}`, `{"a":1}`, `{"b":true,}`, `{"c":null,"b":true}`},
	},
	{
		name: "nested objects and enums",
		schema: `{"type":"object","properties":{"order":{"type":"object","properties":{
			"size":{"enum":["small","medium","large"]},"qty":{"type":"integer"},
			"extras":{"type":"array","items":{"type":"object","properties":{"name":{"const":"cheese"},"n":{"type":"integer"}},"required":["name","n"],"additionalProperties":false}}},
			"required":["size","qty","extras"],"additionalProperties":false},
			"status":{"enum":["ok",1,null,true,{"x":[1]}]}},"required":["order","status"],"additionalProperties":false}`,
		good: []string{`{"order":{"size":"small","qty":2,"extras":[{"name":"cheese","n":1}]},"status":{"x":[1]}}`,
			`{"order":{"size":"large","qty":0,"extras":[]},"status":1}`},
		bad: []string{`{"order":{"size":"huge","qty":2,"extras":[]},"status":"ok"}`,
			`{"order":{"size":"small","qty":2,"extras":[{"name":"ham","n":1}]},"status":"ok"}`,
			`{"order":{"size":"small","qty":2,"extras":[]},"status":"bad"}`},
	},
	{
		name:   "free-form values",
		schema: `{"type":"object","properties":{"meta":{"type":"object"},"any":{},"list":{"type":"array"}},"required":["meta","any","list"],"additionalProperties":false}`,
		good:   []string{`{"meta":{"k":[1,{"z":null}]},"any":"s","list":[1,"a",[]]}`, `{"meta":{},"any":{"a":1},"list":[]}`},
		bad:    []string{`{"meta":[],"any":1,"list":[]}`, `{"meta":{},"any":1,"list":{}}`},
	},
	{
		name:   "anyOf, $defs and $ref",
		schema: `{"$defs":{"pt":{"type":"object","properties":{"x":{"type":"number"},"y":{"type":"number"}},"required":["x","y"],"additionalProperties":false}},"type":"object","properties":{"shape":{"anyOf":[{"$ref":"#/$defs/pt"},{"type":"array","items":{"$ref":"#/$defs/pt"}},{"type":"string"}]}},"required":["shape"],"additionalProperties":false}`,
		good:   []string{`{"shape":{"x":1,"y":2}}`, `{"shape":[{"x":1,"y":2},{"x":0,"y":0}]}`, `{"shape":"circle"}`},
		bad:    []string{`{"shape":{"x":1}}`, `{"shape":[1]}`, `{"shape":1}`},
	},
	{
		name:   "array bounds",
		schema: `{"type":"array","items":{"type":"integer"},"minItems":2,"maxItems":3}`,
		good:   []string{`[1,2]`, `[1, 2, 3]`},
		bad:    []string{`[]`, `[1]`, `[1,2,3,4]`},
	},
	{
		name:   "additionalProperties schema",
		schema: `{"type":"object","additionalProperties":{"type":"integer"}}`,
		good:   []string{`{}`, `{"a":1,"b":2}`},
		bad:    []string{`{"a":"x"}`},
	},
	{
		name:   "top-level scalars",
		schema: `{"type":["number","boolean"]}`,
		good:   []string{`3.25`, `false`},
		bad:    []string{`"3"`, `null`},
	},
	{
		name:   "keys that need escaping",
		schema: `{"type":"object","properties":{"a\"b":{"type":"string"},"<tag>":{"type":"integer"},"é":{"type":"boolean"}},"required":["a\"b","<tag>","é"],"additionalProperties":false}`,
		good:   []string{`{"a\"b":"","<tag>":1,"é":true}`},
		bad:    []string{`{"a\"b":"","\u003ctag\u003e":1,"é":true}`},
	},
}

func TestSchemaTexts(t *testing.T) {
	for _, tc := range schemaCases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Schema([]byte(tc.schema))
			if err != nil {
				t.Fatal(err)
			}
			g := mustCompile(t, e)
			val := validator(t, tc.schema)
			for _, s := range tc.good {
				if err := validate(val, s); err != nil {
					t.Fatalf("test case broken: %s is invalid: %v", s, err)
				}
				if _, c := match(t, g, s); !c {
					t.Errorf("refused valid %s", s)
				}
			}
			for _, s := range tc.bad {
				if _, c := match(t, g, s); c {
					t.Errorf("allowed %s", s)
				}
			}
		})
	}
}

// TestRandomTextsValidate generates texts at random under each schema and
// checks each with an independent validator.
func TestRandomTextsValidate(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, tc := range schemaCases {
		t.Run(tc.name, func(t *testing.T) {
			e, err := Schema([]byte(tc.schema))
			if err != nil {
				t.Fatal(err)
			}
			g := mustCompile(t, e)
			val := validator(t, tc.schema)
			for i := range 100 {
				text := randomText(t, g, rng, rng.IntN(80))
				if !json.Valid([]byte(text)) {
					t.Fatalf("text %d is not JSON: %q", i, text)
				}
				if err := validate(val, text); err != nil {
					t.Fatalf("text %d does not validate: %q: %v", i, text, err)
				}
			}
		})
	}
}

// explodingSchema has n definitions, each using the next one twice: 2^n
// subschemas once the $refs are inlined.
func explodingSchema(n int) string {
	var b strings.Builder
	b.WriteString(`{"$defs":{`)
	for i := range n {
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `"d%d":{"type":"object","properties":{"a":{"$ref":"#/$defs/d%d"},"b":{"$ref":"#/$defs/d%d"}}}`, i, i+1, i+1)
	}
	fmt.Fprintf(&b, `,"d%d":{"type":"integer"}},"$ref":"#/$defs/d0"}`, n)
	return b.String()
}

func TestUnsupportedSchemas(t *testing.T) {
	for _, tc := range []struct{ schema, want string }{
		{`{"type":"string","pattern":"^a"}`, `"pattern" is not supported`},
		{`{"type":"string","format":"date-time"}`, `"format" is not supported`},
		{`{"oneOf":[{"type":"string"}]}`, `use anyOf`},
		{`{"type":"object","properties":{"a":{"type":"integer","minimum":0}}}`, `at #/properties/a: keyword "minimum"`},
		{`{"type":"date"}`, `unknown type "date"`},
		{`{"$defs":{"n":{"type":"object","properties":{"next":{"$ref":"#/$defs/n"}}}},"$ref":"#/$defs/n"}`, `recursive`},
		{`{"$ref":"https://example.com/s.json"}`, `only references into this schema`},
		{`false`, `accepts no value`},
		{`[1]`, `must be an object or a boolean`},
		{`{"enum":[]}`, `non-empty`},
		{`{"type":"string","enum":[1,2]}`, `no value has one of the types`},
		{`{"type":"object","properties":{},"required":["x"],"additionalProperties":false}`, `"x" is required but not among the properties`},
		{`{"type":"array","maxItems":1000}`, `at most 64`},
		{`{`, `not JSON`},
		{explodingSchema(24), `expands to more than`},
	} {
		_, err := Schema([]byte(tc.schema))
		if !errors.Is(err, ErrSchema) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one with %q", tc.schema, err, tc.want)
		}
	}
}

// FuzzSchema feeds arbitrary schemas through the compiler: it must never
// panic, must fail only with ErrSchema or ErrGrammar, and every text it
// generates for a schema it accepts must validate (where the independent
// validator accepts the schema too).
func FuzzSchema(f *testing.F) {
	for _, tc := range schemaCases {
		f.Add([]byte(tc.schema), uint64(1))
	}
	f.Add([]byte(`{"anyOf":[{"type":"string"},{"type":"object"}]}`), uint64(2))
	f.Add([]byte(`{"type":"array","items":{"enum":[[1,2],{"a":null}]},"minItems":1}`), uint64(3))
	f.Fuzz(func(t *testing.T, schema []byte, seed uint64) {
		if len(schema) > 4096 {
			return
		}
		e, err := Schema(schema)
		if err != nil {
			if !errors.Is(err, ErrSchema) {
				t.Fatalf("error without ErrSchema: %v", err)
			}
			return
		}
		g, err := Compile(e)
		if err != nil {
			if !errors.Is(err, ErrGrammar) {
				t.Fatalf("error without ErrGrammar: %v", err)
			}
			return
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
		if err != nil {
			return
		}
		c := jsonschema.NewCompiler()
		if c.AddResource("schema.json", doc) != nil {
			return
		}
		val, err := c.Compile("schema.json")
		if err != nil {
			return // a schema the validator does not take (e.g. an invalid keyword value)
		}
		rng := rand.New(rand.NewPCG(seed, 7))
		for range 3 {
			text := randomText(t, g, rng, rng.IntN(40))
			if err := validate(val, text); err != nil {
				t.Fatalf("schema %s: %q does not validate: %v", schema, text, err)
			}
		}
	})
}

// TestOversizedSchemas: repetition counts multiply, so nested bounds can
// ask for an automaton far too large; Compile refuses it from an estimate,
// before building anything.
func TestOversizedSchemas(t *testing.T) {
	for _, s := range []string{
		`{"type":"array","items":{"type":"array","items":{"type":"array","items":{"type":"integer"},"minItems":64},"minItems":64},"minItems":64}`,
		`{"type":"array","items":{"type":"array","items":{"type":"string"},"minItems":64,"maxItems":64},"minItems":64,"maxItems":64}`,
	} {
		e, err := Schema([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Compile(e); !errors.Is(err, ErrGrammar) || !strings.Contains(err.Error(), "too large") {
			t.Errorf("%s: %v, want a too-large grammar error", s, err)
		}
	}
}
