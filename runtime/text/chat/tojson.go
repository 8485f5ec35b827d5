package chat

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/atsinfer/ats/internal/jinja"
)

// tojsonFilter is the name template code calls for `tojson` after
// prepareSource renamed it.
const tojsonFilter = "__ats_tojson"

// tojson is HF's tojson filter: Python's json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False), byte for byte. The
// engine's own tojson differs with indent= (Go's encoding/json: sorted
// keys, <>& escaped) and in float formatting (1e6 vs 1000000.0), and
// models see tool schemas and call arguments through this filter.
//
// prot, which may be nil, knows the placeholders of the rendering
// (prompt.go).
func tojson(b *jinja.Budget, args []jinja.Value, kwargs map[string]jinja.Value, prot *protector) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), fmt.Errorf("tojson: no value")
	}
	o := jsonOptions{b: b, prot: prot}
	// HF's signature, in order: tojson(x, ensure_ascii, indent, separators, sort_keys).
	names := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	opts := map[string]jinja.Value{}
	for i, a := range args[1:] {
		if i >= len(names) {
			return jinja.Undefined(), fmt.Errorf("tojson: too many arguments")
		}
		opts[names[i]] = a
	}
	for k, v := range kwargs {
		if !slices.Contains(names, k) {
			return jinja.Undefined(), fmt.Errorf("tojson: unexpected argument %q", k)
		}
		opts[k] = v
	}
	o.ensureASCII = opts["ensure_ascii"].IsTruthy()
	o.sortKeys = opts["sort_keys"].IsTruthy()
	o.itemSep, o.keySep = ", ", ": "
	if ind, ok := opts["indent"]; ok && !ind.IsNone() && !ind.IsUndefined() {
		o.indented = true
		o.itemSep = "," // Python drops the space when it adds newlines
		switch {
		case ind.IsString():
			o.indent = ind.AsString()
		case ind.IsInt():
			n := max(ind.AsInt(), 0)
			if err := b.Alloc(n, "tojson's indent"); err != nil {
				return jinja.Undefined(), err
			}
			o.indent = strings.Repeat(" ", int(n))
		default:
			return jinja.Undefined(), fmt.Errorf("tojson: indent must be an int or a string, not %s", ind.Kind())
		}
	}
	if sep, ok := opts["separators"]; ok && !sep.IsNone() && !sep.IsUndefined() {
		if !sep.IsList() || sep.AsList().Len() != 2 || !sep.AsList().Get(0).IsString() || !sep.AsList().Get(1).IsString() {
			return jinja.Undefined(), fmt.Errorf("tojson: separators must be two strings, not %s", sep.Kind())
		}
		o.itemSep, o.keySep = sep.AsList().Get(0).AsString(), sep.AsList().Get(1).AsString()
	}
	var sb strings.Builder
	if err := o.encode(&sb, args[0], 0); err != nil {
		var le *jinja.LimitError
		if errors.As(err, &le) {
			return jinja.Undefined(), err
		}
		return jinja.Undefined(), fmt.Errorf("tojson: %w", err)
	}
	return jinja.NewString(sb.String()), nil
}

type jsonOptions struct {
	b                     *jinja.Budget // the rendering's limits
	ensureASCII, sortKeys bool
	indented              bool
	prot                  *protector // nil: no placeholders
	indent                string
	itemSep, keySep       string
}

func (o *jsonOptions) newline(sb *strings.Builder, depth int) error {
	if o.indented {
		if err := o.grow(sb, 1+int64(depth)*int64(len(o.indent))); err != nil {
			return err
		}
		sb.WriteByte('\n')
		for range depth {
			sb.WriteString(o.indent)
		}
	}
	return nil
}

// grow checks n more bytes of output against the budget.
func (o *jsonOptions) grow(sb *strings.Builder, n int64) error {
	return o.b.Grow(int64(sb.Len()), n, "tojson output")
}

// maxJSONDepth bounds the nesting tojson follows: a list that contains
// itself would otherwise recurse until the stack overflows.
const maxJSONDepth = 1000

func (o *jsonOptions) encode(sb *strings.Builder, v jinja.Value, depth int) error {
	if depth > maxJSONDepth {
		return &jinja.LimitError{Limit: "nesting", Max: maxJSONDepth, What: "tojson of a value nested too deeply (does it contain itself?)"}
	}
	if err := o.b.Step(1); err != nil {
		return err
	}
	if err := o.grow(sb, 32+int64(len(o.itemSep)+len(o.keySep))); err != nil { // any scalar, brackets, separators
		return err
	}
	switch {
	case v.IsNone(), v.IsUndefined():
		// Python would refuse Undefined; null is kinder to a template that
		// dumps an optional field.
		sb.WriteString("null")
	case v.IsBool():
		sb.WriteString(strconv.FormatBool(v.AsBool()))
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(pyFloat(v.AsFloat()))
	case v.IsString():
		if err := o.grow(sb, 6*int64(len(v.AsString()))); err != nil {
			return err
		}
		if err := o.encodeString(sb, v.AsString()); err != nil {
			return err
		}
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			if err := o.newline(sb, depth+1); err != nil {
				return err
			}
			if err := o.encode(sb, it, depth+1); err != nil {
				return err
			}
		}
		if err := o.newline(sb, depth); err != nil {
			return err
		}
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			sb.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = slices.Sorted(slices.Values(d.Keys))
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			if err := o.newline(sb, depth+1); err != nil {
				return err
			}
			if err := o.grow(sb, 6*int64(len(k)+len(o.keySep)+len(o.itemSep))); err != nil {
				return err
			}
			if err := o.encodeString(sb, k); err != nil {
				return err
			}
			sb.WriteString(o.keySep)
			if err := o.encode(sb, d.Data[k], depth+1); err != nil {
				return err
			}
		}
		if err := o.newline(sb, depth); err != nil {
			return err
		}
		sb.WriteByte('}')
	default:
		return fmt.Errorf("cannot encode %s as JSON", v.Kind())
	}
	return nil
}

// encodeString escapes like Python's json module: with ensure_ascii off
// only '"', '\\' and control characters; with it on, also everything
// outside printable ASCII, as \uXXXX (surrogate pairs above U+FFFF).
func (o *jsonOptions) encodeString(sb *strings.Builder, s string) error {
	sb.WriteByte('"')
	if err := o.escape(sb, s, true); err != nil {
		return err
	}
	sb.WriteByte('"')
	return nil
}

// escape writes s escaped. With placeholders, a placeholder (prompt.go)
// is written as it is when its text needs no escaping, so that the text
// put back for it is what the escaping would have written; otherwise the
// escaped text itself is written, protected in its turn.
func (o *jsonOptions) escape(sb *strings.Builder, s string, placeholders bool) error {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if placeholders && isPlaceholder(r) {
			if text, ok := o.prot.text(r); ok {
				var esc strings.Builder
				if err := o.escape(&esc, text, false); err != nil {
					return err
				}
				out := s[i : i+size]
				if esc.String() != text {
					var err error
					if out, err = o.prot.protect(esc.String()); err != nil {
						return err
					}
					if err := o.grow(sb, int64(len(out))); err != nil {
						return err
					}
				}
				sb.WriteString(out)
				i += size
				continue
			}
		}
		switch {
		case r == '"':
			sb.WriteString(`\"`)
		case r == '\\':
			sb.WriteString(`\\`)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == '\b':
			sb.WriteString(`\b`)
		case r == '\f':
			sb.WriteString(`\f`)
		case r < 0x20 || (o.ensureASCII && r == 0x7f):
			fmt.Fprintf(sb, `\u%04x`, r)
		case o.ensureASCII && r >= 0x80:
			if r > 0xffff {
				r1, r2 := utf16Pair(r)
				fmt.Fprintf(sb, `\u%04x\u%04x`, r1, r2)
			} else {
				fmt.Fprintf(sb, `\u%04x`, r) // invalid UTF-8 arrives as U+FFFD
			}
		default:
			sb.WriteString(s[i : i+size]) // raw bytes, invalid UTF-8 included
		}
		i += size
	}
	return nil
}

func utf16Pair(r rune) (rune, rune) {
	r -= 0x10000
	return 0xd800 + (r>>10)&0x3ff, 0xdc00 + r&0x3ff
}

// pyFloat formats like Python's repr(float), which json.dumps uses: the
// shortest digits that round-trip, positional between 1e-4 and 1e16 with
// at least one decimal ("1.0"), scientific outside ("1e+16", "1.5e-05").
func pyFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	if f == 0 {
		if math.Signbit(f) {
			return "-0.0"
		}
		return "0.0"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64) // shortest round-trip digits
	exp, _ := strconv.Atoi(e[strings.IndexByte(e, 'e')+1:])
	if exp < -4 || exp >= 16 {
		return e // Go's 'e' already writes a signed, two-digit-minimum exponent
	}
	s := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.ContainsAny(s, ".") {
		s += ".0"
	}
	return s
}
