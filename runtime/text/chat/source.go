package chat

import "strings"

// prepareSource rewrites a template so that the engine renders it the way
// Jinja2 configured as in HF transformers does. Each step works around a
// difference between the two, found by comparing renderings:
//
//  1. Jinja2 turns every \r\n and \r into \n, and with
//     keep_trailing_newline=False drops one final newline.
//  2. HF replaces Jinja's tojson with json.dumps(ensure_ascii=False, ...).
//     The engine's own tojson cannot be replaced (built-in filters win over
//     template variables), so `| tojson` is renamed to a filter of ours.
//  3. The engine applies a whitespace rule ({%- -%} markers, trim_blocks,
//     lstrip_blocks) to the nearest text segment, even past a tag in
//     between: in `{%- if x -%}a: {{ y }}{%- endif %}` it strips the space
//     after "a:". Jinja2 only trims text that touches the tag. So wherever
//     two tags touch, a space is put between them and the first tag given a
//     '-' on its right, which strips exactly that space: every tag then
//     has a text neighbour (possibly empty) and the output is unchanged
//     under Jinja2's rules. Likewise a template that starts with a tag gets
//     a leading space eaten by that tag, so the engine's "first text
//     segment starts a line" rule lands on the right text.
func prepareSource(src string) string {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")

	segs := splitSource(src)
	out := make([]segment, 0, 2*len(segs))
	for i, s := range segs {
		if s.kind != textSeg && !s.raw {
			if s.kind != commentSeg {
				s.code = renameInCode(s.code, "tojson", tojsonFilter)
			}
			switch {
			case i == 0:
				s.trimLeft = true
				out = append(out, segment{kind: textSeg, code: " "})
			case out[len(out)-1].kind != textSeg && !out[len(out)-1].raw:
				out[len(out)-1].trimRight = true
				out = append(out, segment{kind: textSeg, code: " "})
			}
		}
		out = append(out, s)
	}
	return joinSource(out)
}

type segKind int

const (
	textSeg    segKind = iota
	exprSeg            // {{ }}
	stmtSeg            // {% %}
	commentSeg         // {# #}
)

// segment is a piece of template source: text, or a tag with its code
// (between the delimiters and trim markers).
type segment struct {
	kind                segKind
	code                string
	trimLeft, trimRight bool
	// raw marks {% raw %} … {% endraw %} and what lies between: text to
	// the engine, so it is passed through untouched.
	raw bool
	// unclosed marks a tag that runs to the end of the source; it is kept
	// that way so the parser still reports it.
	unclosed bool
}

var delims = map[segKind][2]string{
	exprSeg:    {"{{", "}}"},
	stmtSeg:    {"{%", "%}"},
	commentSeg: {"{#", "#}"},
}

// splitSource cuts src into text and tags as the engine's scanner does
// (string literals may contain closers; comments may not). An unclosed tag
// runs to the end, for the parser to report.
func splitSource(src string) []segment {
	var segs []segment
	inRaw := false
	for i := 0; i < len(src); {
		j := nextTag(src, i)
		if j > i {
			segs = append(segs, segment{kind: textSeg, code: src[i:j], raw: inRaw})
		}
		if j == len(src) {
			break
		}
		kind := exprSeg
		switch src[j+1] {
		case '%':
			kind = stmtSeg
		case '#':
			kind = commentSeg
		}
		closer := delims[kind][1]
		k := j + 2
		s := segment{kind: kind}
		if k < len(src) && src[k] == '-' {
			s.trimLeft = true
			k++
		}
		end := tagEnd(src, k, closer, kind != commentSeg)
		s.code = src[k:end]
		s.unclosed = end == len(src)
		if strings.HasSuffix(s.code, "-") && !s.unclosed {
			s.code, s.trimRight = s.code[:len(s.code)-1], true
		}
		word := strings.Fields(s.code)
		switch {
		case kind == stmtSeg && len(word) > 0 && word[0] == "raw":
			inRaw = true
			s.raw = true
		case kind == stmtSeg && len(word) > 0 && word[0] == "endraw":
			inRaw = false
			s.raw = true
		default:
			s.raw = inRaw
		}
		segs = append(segs, s)
		i = min(end+len(closer), len(src))
	}
	return segs
}

// nextTag returns the index of the next "{{", "{%" or "{#" at or after i,
// or len(src).
func nextTag(src string, i int) int {
	for ; i+1 < len(src); i++ {
		if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
			return i
		}
	}
	return len(src)
}

// tagEnd returns the index of closer ending the tag whose code starts at i,
// skipping string literals when quotes is set; len(src) if it never closes.
func tagEnd(src string, i int, closer string, quotes bool) int {
	var quote byte
	for ; i < len(src); i++ {
		c := src[i]
		switch {
		case quote != 0:
			if c == '\\' {
				i++
			} else if c == quote {
				quote = 0
			}
		case quotes && (c == '\'' || c == '"'):
			quote = c
		case strings.HasPrefix(src[i:], closer):
			return i
		}
	}
	return len(src)
}

func joinSource(segs []segment) string {
	var b strings.Builder
	for _, s := range segs {
		if s.kind == textSeg {
			b.WriteString(s.code)
			continue
		}
		d := delims[s.kind]
		b.WriteString(d[0])
		if s.trimLeft {
			b.WriteByte('-')
		}
		b.WriteString(s.code)
		if s.trimRight {
			b.WriteByte('-')
		}
		if !s.unclosed {
			b.WriteString(d[1])
		}
	}
	return b.String()
}

// renameInCode rewrites the filter name after '|' outside string literals.
func renameInCode(code, from, to string) string {
	var out strings.Builder
	var quote byte
	for i := 0; i < len(code); i++ {
		c := code[i]
		out.WriteByte(c)
		switch {
		case quote != 0:
			if c == '\\' && i+1 < len(code) {
				i++
				out.WriteByte(code[i])
			} else if c == quote {
				quote = 0
			}
		case c == '\'' || c == '"':
			quote = c
		case c == '|':
			k := i + 1
			for k < len(code) && (code[k] == ' ' || code[k] == '\t' || code[k] == '\n') {
				k++
			}
			if strings.HasPrefix(code[k:], from) && !isIdent(code, k+len(from)) {
				out.WriteString(code[i+1 : k])
				out.WriteString(to)
				i = k + len(from) - 1
			}
		}
	}
	return out.String()
}

// isIdent reports whether code[i] continues an identifier.
func isIdent(code string, i int) bool {
	if i >= len(code) {
		return false
	}
	c := code[i]
	return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}
