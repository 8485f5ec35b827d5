package constrain

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ErrSchema is wrapped by the errors of Schema for a schema it cannot
// compile: malformed, or using what the supported subset leaves out.
var ErrSchema = errors.New("unsupported JSON schema")

// Schema turns a JSON Schema into an Expr that matches the JSON texts of
// the values it accepts (without whitespace around the value).
//
// The subset is the one OpenAI's structured outputs take: type (a name or
// a list of names: string, number, integer, boolean, null, object, array),
// properties, required, additionalProperties, items, minItems, maxItems,
// enum, const, anyOf, and $ref to "#", "#/$defs/..." or
// "#/definitions/..." (not recursive). Annotations (title, description,
// default, examples, $schema, $id, $comment, ...) are ignored. Assertions
// outside the subset (pattern, format, minLength, minimum, oneOf, allOf,
// not, ...) are an error rather than silently unchecked.
//
// Objects are generated with their declared properties in the declared
// order, required ones always present, optional ones possibly left out.
// Where additionalProperties allows more, none are generated (a valid
// choice); an object schema without properties and without
// additionalProperties: false takes any members.
func Schema(schema []byte) (Expr, error) {
	var root json.RawMessage
	if err := json.Unmarshal(schema, &root); err != nil {
		return Expr{}, fmt.Errorf("%w: not JSON: %v", ErrSchema, err)
	}
	sc := &schemaCompiler{root: root, active: map[string]bool{}}
	return sc.expr(root, "#", 0)
}

type schemaCompiler struct {
	root   json.RawMessage
	active map[string]bool // $refs being expanded (recursion guard)
	nodes  int             // subschemas expanded so far
	refs   map[string]json.RawMessage
}

// maxSchemaNodes bounds the subschemas one schema expands to: $refs are
// inlined, so a small schema can name the same definition many times.
const maxSchemaNodes = 5000

// maxSchemaDepth bounds the nesting of schemas (and of $refs).
const maxSchemaDepth = 64

// Limits on repetition counts, each of which copies the item's automaton.
const maxItemsBound = 64

// supported are the keywords the subset takes; unsupported, the assertions
// it refuses. Other keywords (annotations such as title, description,
// default, examples, $schema, $defs) are ignored, as validators do.
var supported = map[string]bool{
	"type": true, "properties": true, "required": true, "additionalProperties": true,
	"items": true, "minItems": true, "maxItems": true, "enum": true, "const": true,
	"anyOf": true, "$ref": true,
}

var unsupported = map[string]string{
	"pattern": "", "format": "", "minLength": "", "maxLength": "",
	"minimum": "", "maximum": "", "exclusiveMinimum": "", "exclusiveMaximum": "", "multipleOf": "",
	"uniqueItems": "", "contains": "", "minContains": "", "maxContains": "", "prefixItems": "",
	"unevaluatedItems": "", "unevaluatedProperties": "", "patternProperties": "", "propertyNames": "",
	"minProperties": "", "maxProperties": "", "dependentRequired": "", "dependentSchemas": "",
	"dependencies": "", "oneOf": " (use anyOf)", "allOf": "", "not": "", "if": "", "then": "", "else": "",
	"$dynamicRef": "", "$recursiveRef": "",
}

func schemaErr(path, format string, args ...any) error {
	return fmt.Errorf("%w: at %s: %s", ErrSchema, path, fmt.Sprintf(format, args...))
}

// members reads an object keeping its keys' order.
func members(raw json.RawMessage) ([]string, map[string]json.RawMessage, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	t, err := dec.Token()
	if err != nil {
		return nil, nil, err
	}
	if d, ok := t.(json.Delim); !ok || d != '{' {
		return nil, nil, errors.New("not an object")
	}
	var keys []string
	m := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, nil, err
		}
		k, _ := t.(string)
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, nil, err
		}
		if _, dup := m[k]; !dup {
			keys = append(keys, k)
		}
		m[k] = v
	}
	return keys, m, nil
}

func (sc *schemaCompiler) expr(raw json.RawMessage, path string, depth int) (Expr, error) {
	if depth > maxSchemaDepth {
		return Expr{}, schemaErr(path, "the schema nests deeper than %d levels", maxSchemaDepth)
	}
	if sc.nodes++; sc.nodes > maxSchemaNodes {
		return Expr{}, schemaErr(path, "the schema expands to more than %d subschemas ($refs count each time they are used)", maxSchemaNodes)
	}
	raw = bytes.TrimSpace(raw)
	switch string(raw) {
	case "true":
		return JSONValue(), nil
	case "false":
		return Expr{}, schemaErr(path, "the schema false accepts no value")
	}
	keys, s, err := members(raw)
	if err != nil {
		return Expr{}, schemaErr(path, "a schema must be an object or a boolean")
	}
	for _, k := range keys {
		if why, bad := unsupported[k]; bad {
			return Expr{}, schemaErr(path, "keyword %q is not supported%s; constrained decoding covers type, properties, required, additionalProperties, items, minItems, maxItems, enum, const, anyOf and $ref", k, why)
		}
	}
	if r, ok := s["$ref"]; ok {
		for _, k := range keys {
			if supported[k] && k != "$ref" {
				return Expr{}, schemaErr(path, "$ref beside %q is not supported", k)
			}
		}
		return sc.ref(r, path, depth)
	}
	if a, ok := s["anyOf"]; ok {
		for _, k := range keys {
			if supported[k] && k != "anyOf" {
				return Expr{}, schemaErr(path, "anyOf beside %q is not supported; move %q into each choice", k, k)
			}
		}
		var choices []json.RawMessage
		if err := json.Unmarshal(a, &choices); err != nil || len(choices) == 0 {
			return Expr{}, schemaErr(path+"/anyOf", "anyOf must be a non-empty array of schemas")
		}
		var alts []Expr
		for i, c := range choices {
			e, err := sc.expr(c, fmt.Sprintf("%s/anyOf/%d", path, i), depth+1)
			if err != nil {
				return Expr{}, err
			}
			alts = append(alts, e)
		}
		return Alt(alts...), nil
	}

	types, err := schemaTypes(s, path)
	if err != nil {
		return Expr{}, err
	}
	if c, ok := s["const"]; ok {
		return sc.literals([]json.RawMessage{c}, types, path+"/const")
	}
	if e, ok := s["enum"]; ok {
		var vals []json.RawMessage
		if err := json.Unmarshal(e, &vals); err != nil || len(vals) == 0 {
			return Expr{}, schemaErr(path+"/enum", "enum must be a non-empty array")
		}
		return sc.literals(vals, types, path+"/enum")
	}
	if types == nil {
		// No type: infer it from the keywords, or take any value.
		_, hasProps := s["properties"]
		_, hasAdd := s["additionalProperties"]
		_, hasReq := s["required"]
		_, hasItems := s["items"]
		_, hasMin := s["minItems"]
		_, hasMax := s["maxItems"]
		switch {
		case hasProps || hasAdd || hasReq:
			types = []string{"object"}
		case hasItems || hasMin || hasMax:
			types = []string{"array"}
		default:
			return JSONValue(), nil
		}
	}
	var alts []Expr
	for _, t := range types {
		var e Expr
		switch t {
		case "string":
			e = jsonString()
		case "number":
			e = jsonNumber()
		case "integer":
			e = jsonInteger()
		case "boolean":
			e = Alt(Lit("true"), Lit("false"))
		case "null":
			e = Lit("null")
		case "object":
			if e, err = sc.object(s, path, depth); err != nil {
				return Expr{}, err
			}
		case "array":
			if e, err = sc.array(s, path, depth); err != nil {
				return Expr{}, err
			}
		}
		alts = append(alts, e)
	}
	if len(alts) == 1 {
		return alts[0], nil
	}
	return Alt(alts...), nil
}

// schemaTypes reads "type": nil when absent.
func schemaTypes(s map[string]json.RawMessage, path string) ([]string, error) {
	raw, ok := s["type"]
	if !ok {
		return nil, nil
	}
	var types []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		types = []string{one}
	} else if err := json.Unmarshal(raw, &types); err != nil || len(types) == 0 {
		return nil, schemaErr(path+"/type", "type must be a type name or a non-empty array of them")
	}
	seen := map[string]bool{}
	var out []string
	for _, t := range types {
		switch t {
		case "string", "number", "integer", "boolean", "null", "object", "array":
		default:
			return nil, schemaErr(path+"/type", "unknown type %q (use string, number, integer, boolean, null, object or array)", t)
		}
		if !seen[t] {
			seen[t] = true
			out = append(out, t)
		}
	}
	if seen["number"] && seen["integer"] {
		// Every integer is a number: the number grammar covers both.
		out = slicesDelete(out, "integer")
	}
	return out, nil
}

func slicesDelete(s []string, v string) []string {
	out := s[:0]
	for _, x := range s {
		if x != v {
			out = append(out, x)
		}
	}
	return out
}

func (sc *schemaCompiler) ref(raw json.RawMessage, path string, depth int) (Expr, error) {
	var r string
	if err := json.Unmarshal(raw, &r); err != nil {
		return Expr{}, schemaErr(path+"/$ref", "$ref must be a string")
	}
	if sc.active[r] {
		return Expr{}, schemaErr(path, "$ref %q is recursive; recursive schemas are not supported", r)
	}
	target, known := sc.refs[r]
	if !known {
		var err error
		if target, err = sc.resolve(r, path); err != nil {
			return Expr{}, err
		}
		if sc.refs == nil {
			sc.refs = map[string]json.RawMessage{}
		}
		sc.refs[r] = target
	}
	sc.active[r] = true
	defer delete(sc.active, r)
	return sc.expr(target, r, depth+1)
}

// resolve finds the subschema a $ref points at.
func (sc *schemaCompiler) resolve(r, path string) (json.RawMessage, error) {
	target := sc.root
	if r != "#" {
		rest, ok := strings.CutPrefix(r, "#/")
		if !ok {
			return nil, schemaErr(path, "$ref %q: only references into this schema (#, #/$defs/NAME) are supported", r)
		}
		for _, part := range strings.Split(rest, "/") {
			part = strings.ReplaceAll(strings.ReplaceAll(part, "~1", "/"), "~0", "~")
			_, m, err := members(target)
			if err != nil {
				return nil, schemaErr(path, "$ref %q does not resolve", r)
			}
			next, ok := m[part]
			if !ok {
				return nil, schemaErr(path, "$ref %q does not resolve: no %q", r, part)
			}
			target = next
		}
	}
	return target, nil
}

func (sc *schemaCompiler) object(s map[string]json.RawMessage, path string, depth int) (Expr, error) {
	var names []string
	props := map[string]json.RawMessage{}
	if p, ok := s["properties"]; ok {
		var err error
		if names, props, err = members(p); err != nil {
			return Expr{}, schemaErr(path+"/properties", "properties must be an object of schemas")
		}
	}
	var required []string
	if r, ok := s["required"]; ok {
		if err := json.Unmarshal(r, &required); err != nil {
			return Expr{}, schemaErr(path+"/required", "required must be an array of property names")
		}
	}
	addAllowed, addSchema := true, json.RawMessage(nil)
	if a, ok := s["additionalProperties"]; ok {
		switch strings.TrimSpace(string(a)) {
		case "false":
			addAllowed = false
		case "true":
		default:
			addSchema = a
		}
	}
	req := map[string]bool{}
	for _, r := range required {
		req[r] = true
		if _, ok := props[r]; !ok {
			if !addAllowed {
				return Expr{}, schemaErr(path+"/required", "%q is required but not among the properties, and additionalProperties is false", r)
			}
			// A required property the schema says nothing else about.
			names = append(names, r)
			props[r] = addSchema
			if props[r] == nil {
				props[r] = json.RawMessage("true")
			}
		}
	}
	if len(names) == 0 {
		switch {
		case !addAllowed:
			return Seq(Lit("{"), ws(), Lit("}")), nil
		case addSchema != nil:
			// Free keys, values of one schema.
			v, err := sc.expr(addSchema, path+"/additionalProperties", depth+1)
			if err != nil {
				return Expr{}, err
			}
			member := Seq(jsonString(), ws(), Lit(":"), ws(), v)
			sep := Seq(ws(), Lit(","), ws())
			return Seq(Lit("{"), ws(), Opt(Seq(member, Star(Seq(sep, member)))), ws(), Lit("}")), nil
		}
		return JSONObject(), nil
	}
	items := make([]Expr, len(names))
	reqFlags := make([]bool, len(names))
	for i, n := range names {
		v, err := sc.expr(props[n], path+"/properties/"+n, depth+1)
		if err != nil {
			return Expr{}, err
		}
		items[i] = Seq(Lit(jsonText(n)), ws(), Lit(":"), ws(), v)
		reqFlags[i] = req[n]
	}
	return Seq(Lit("{"), ws(), List(items, reqFlags, Seq(ws(), Lit(","), ws())), ws(), Lit("}")), nil
}

func (sc *schemaCompiler) array(s map[string]json.RawMessage, path string, depth int) (Expr, error) {
	item := JSONValue()
	if it, ok := s["items"]; ok {
		var err error
		if item, err = sc.expr(it, path+"/items", depth+1); err != nil {
			return Expr{}, err
		}
	}
	count := func(k string) (int, bool, error) {
		raw, ok := s[k]
		if !ok {
			return 0, false, nil
		}
		var n float64
		if err := json.Unmarshal(raw, &n); err != nil || n < 0 || n != math.Trunc(n) {
			return 0, false, schemaErr(path+"/"+k, "%s must be a non-negative integer", k)
		}
		if n > maxItemsBound {
			return 0, false, schemaErr(path+"/"+k, "%s is %v; constrained decoding supports at most %d", k, n, maxItemsBound)
		}
		return int(n), true, nil
	}
	lo, _, err := count("minItems")
	if err != nil {
		return Expr{}, err
	}
	hi, hasMax, err := count("maxItems")
	if err != nil {
		return Expr{}, err
	}
	if !hasMax {
		hi = -1
	} else if hi < lo {
		return Expr{}, schemaErr(path, "maxItems %d is below minItems %d", hi, lo)
	}
	sep := Seq(ws(), Lit(","), ws())
	var body Expr
	switch {
	case hi == 0:
		return Seq(Lit("["), ws(), Lit("]")), nil
	case hi < 0:
		body = Seq(item, Repeat(Seq(sep, item), max(lo-1, 0), -1))
	default:
		body = Seq(item, Repeat(Seq(sep, item), max(lo-1, 0), hi-1))
	}
	if lo == 0 {
		body = Opt(body)
	}
	return Seq(Lit("["), ws(), body, ws(), Lit("]")), nil
}

// literals matches the JSON values vals (enum, const), written compactly,
// keeping those of the allowed types.
func (sc *schemaCompiler) literals(vals []json.RawMessage, types []string, path string) (Expr, error) {
	var alts []Expr
	seen := map[string]bool{}
	for _, v := range vals {
		var b bytes.Buffer
		if err := json.Compact(&b, v); err != nil {
			return Expr{}, schemaErr(path, "a value is not valid JSON")
		}
		text := b.String()
		if types != nil && !hasType(text, types) {
			continue // the validator would reject it: never generate it
		}
		if !seen[text] {
			seen[text] = true
			alts = append(alts, Lit(text))
		}
	}
	if len(alts) == 0 {
		return Expr{}, schemaErr(path, "no value has one of the types %v", types)
	}
	return Alt(alts...), nil
}

func hasType(text string, types []string) bool {
	kind := ""
	switch text[0] {
	case '"':
		kind = "string"
	case '{':
		kind = "object"
	case '[':
		kind = "array"
	case 't', 'f':
		kind = "boolean"
	case 'n':
		kind = "null"
	default:
		kind = "number"
	}
	for _, t := range types {
		if t == kind {
			return true
		}
		if t == "integer" && kind == "number" {
			if f, err := strconv.ParseFloat(text, 64); err == nil && f == math.Trunc(f) && !math.IsInf(f, 0) {
				return true
			}
		}
	}
	return false
}

// jsonText is s as a JSON string, written as encoding/json would but
// without escaping <, > and &.
func jsonText(s string) string {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.Encode(s)
	return strings.TrimSuffix(b.String(), "\n")
}
