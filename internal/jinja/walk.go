package jinja

// ats: this file is not part of upstream. Printing, comparing and encoding
// walk values recursively, and values can nest without end (a list that
// contains itself) or share parts (x = [y, y], y = [z, z], ...: printed
// size doubling with each level while memory grows by one list). These
// versions of the walks count their work against the budget and stop at
// maxNesting levels even without one.

import (
	"math/bits"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// builder is a strings.Builder whose growth counts against a budget.
type builder struct {
	sb   strings.Builder
	b    *Budget
	what string
	err  error
}

func (w *builder) WriteString(s string) {
	if w.err != nil {
		return
	}
	if w.err = w.b.Grow(int64(w.sb.Len()), int64(len(s)), w.what); w.err == nil {
		w.sb.WriteString(s)
	}
}

func (w *builder) WriteByte(c byte) error {
	if w.err != nil {
		return w.err
	}
	if w.err = w.b.Grow(int64(w.sb.Len()), 1, w.what); w.err == nil {
		w.sb.WriteByte(c)
	}
	return w.err
}

func (w *builder) String() (string, error) { return w.sb.String(), w.err }

// Repr returns the Python-style representation of v (Value.String)
// within the budget b.
func Repr(b *Budget, v Value) (string, error) {
	w := &builder{b: b, what: "a printed value"}
	depth := 0
	reprTo(w, v, &depth)
	return w.String()
}

func reprTo(w *builder, v Value, depth *int) {
	if w.err != nil {
		return
	}
	switch v.kind {
	case KindList, KindDict:
		*depth++
		defer func() { *depth-- }()
		if *depth > maxNesting {
			w.err = w.b.fail(&LimitError{Limit: "nesting", Max: maxNesting, What: "printing a list or dict nested too deeply (does it contain itself?)"})
			return
		}
		if w.err = w.b.Step(1); w.err != nil {
			return
		}
	}
	switch v.kind {
	case KindList:
		w.WriteByte('[')
		for i, item := range v.v.(*List).Items {
			if i > 0 {
				w.WriteString(", ")
			}
			reprTo(w, item, depth)
		}
		w.WriteByte(']')
	case KindDict:
		d := v.v.(*Dict)
		w.WriteByte('{')
		for i, key := range d.Keys {
			if i > 0 {
				w.WriteString(", ")
			}
			w.WriteByte('\'')
			w.WriteString(key)
			w.WriteString("': ")
			reprTo(w, d.Data[key], depth)
		}
		w.WriteByte('}')
	case KindString:
		w.WriteByte('\'')
		w.WriteString(v.v.(string))
		w.WriteByte('\'')
	default:
		w.WriteString(v.String())
	}
}

// Print returns v as a template prints it (printValue) within the budget
// b: strings as they are, lists and dicts as their representation.
func Print(b *Budget, v Value) (string, error) {
	switch v.kind {
	case KindList, KindDict:
		return Repr(b, v)
	case KindInt:
		return strconv.FormatInt(v.AsInt(), 10), nil
	}
	return printValue(v), nil
}

// equalsB is Value.Equals within the budget b.
func equalsB(b *Budget, x, y Value, depth int) (bool, error) {
	if x.kind != y.kind {
		return false, nil
	}
	switch x.kind {
	case KindList, KindDict:
		if depth > maxNesting {
			return false, b.fail(&LimitError{Limit: "nesting", Max: maxNesting, What: "comparing lists or dicts nested too deeply (does one contain itself?)"})
		}
		if err := b.Step(1); err != nil {
			return false, err
		}
	}
	switch x.kind {
	case KindList:
		l, r := x.v.(*List), y.v.(*List)
		if l == r {
			return true, nil
		}
		if l.Len() != r.Len() {
			return false, nil
		}
		for i := range l.Items {
			if eq, err := equalsB(b, l.Items[i], r.Items[i], depth+1); err != nil || !eq {
				return false, err
			}
		}
		return true, nil
	case KindDict:
		l, r := x.v.(*Dict), y.v.(*Dict)
		if l == r {
			return true, nil
		}
		if l.Len() != r.Len() {
			return false, nil
		}
		for _, key := range l.Keys {
			rv, ok := r.Get(key)
			if !ok {
				return false, nil
			}
			if eq, err := equalsB(b, l.Data[key], rv, depth+1); err != nil || !eq {
				return false, err
			}
		}
		return true, nil
	}
	return x.Equals(y), nil
}

// printB is printValue within the budget b.
func printB(b *Budget, v Value) (string, error) { return Print(b, v) }

// mustPrint is printB for callers that cannot return an error: a broken
// limit sticks to the budget, and the rendering fails at its end.
func mustPrint(b *Budget, v Value) string {
	s, err := printB(b, v)
	if err != nil {
		return ""
	}
	return s
}

// add is the + operator within the budget.
func (e *evaluator) add(l, r Value) (Value, error) {
	switch {
	case l.IsString() || r.IsString():
		return e.concat(l, r)
	case l.IsList() && r.IsList():
		n := int64(l.AsList().Len() + r.AsList().Len())
		if err := e.b.Alloc(n*ValueBytes, "a list"); err != nil {
			return Undefined(), err
		}
	}
	return addValues(l, r), nil
}

// concat is the ~ operator (and + on strings) within the budget.
func (e *evaluator) concat(l, r Value) (Value, error) {
	ls, err := e.print(l)
	if err != nil {
		return Undefined(), err
	}
	rs, err := e.print(r)
	if err != nil {
		return Undefined(), err
	}
	if err := e.b.Alloc(int64(len(ls))+int64(len(rs)), "a string"); err != nil {
		return Undefined(), err
	}
	return NewString(ls + rs), nil
}

// mul is the * operator within the budget: 'x' * n builds n copies.
func (e *evaluator) mul(l, r Value) (Value, error) {
	if l.IsString() && r.IsInt() && r.AsInt() > 0 {
		if err := e.b.Alloc(satMul(int64(len(l.AsString())), r.AsInt()), "a repeated string"); err != nil {
			return Undefined(), err
		}
	}
	return mulValues(l, r), nil
}

// equal is == within the budget.
func (e *evaluator) equal(l, r Value) (bool, error) {
	if l.IsNumber() && r.IsNumber() || l.IsNone() && r.IsNone() {
		return valuesEqual(l, r), nil
	}
	return equalsB(e.b, l, r, 0)
}

// containsB is containsValue within the budget.
func containsB(b *Budget, container, item Value) (bool, error) {
	if container.IsList() {
		items := container.AsList().Items
		if err := b.Step(int64(len(items))); err != nil {
			return false, err
		}
		for _, v := range items {
			if eq, err := equalsB(b, v, item, 0); err != nil || eq {
				return eq, err
			}
		}
		return false, nil
	}
	if container.IsString() && item.IsString() {
		if err := b.Step(int64(len(container.AsString()) / 256)); err != nil {
			return false, err
		}
	}
	return containsValue(container, item), nil
}

// countParts is how many parts strings.Split(s, sep) returns (strings.Fields
// for " ", which returns no more).
func countParts(s, sep string) int64 {
	if sep == "" {
		return int64(utf8.RuneCountInString(s))
	}
	return int64(strings.Count(s, sep)) + 1
}

// replacedSize is the length of strings.Replace(s, old, new, n).
func replacedSize(s, old, new string, n int) int64 {
	m := strings.Count(s, old) // for "", one more than the runes
	if n >= 0 && n < m {
		m = n
	}
	return satAdd(int64(len(s)), satMul(int64(m), int64(len(new)))) - int64(m)*int64(len(old))
}

// countFields is len(strings.Fields(s)) without building them.
func countFields(s string) int64 {
	var n int64
	in := false
	for _, r := range s {
		space := unicode.IsSpace(r)
		if !space && !in {
			n++
		}
		in = !space
	}
	return n
}

// allocText charges a string built from v's text, factor bytes per byte.
func allocText(b *Budget, v Value, factor int64) error {
	s, err := printB(b, v)
	if err != nil {
		return err
	}
	return b.Alloc(factor*int64(len(s)), "a converted string")
}

// allocSort charges a copy of n items and the comparisons to sort them.
func allocSort(b *Budget, n int) error {
	if err := b.Alloc(ValueBytes*int64(n), "a sorted list"); err != nil {
		return err
	}
	return b.Step(int64(n) * int64(bits.Len(uint(n))+1))
}

// rangeLen is the length of range(start, stop, step) (step != 0).
func rangeLen(start, stop, step int64) int64 {
	// Differences and quotients in uint64 cannot overflow where int64 may.
	if step > 0 && start < stop {
		return int64(min((uint64(stop-start)-1)/uint64(step)+1, 1<<62))
	}
	if step < 0 && start > stop {
		return int64(min((uint64(start-stop)-1)/uint64(-step)+1, 1<<62))
	}
	return 0
}

// jsonBound walks v within the budget and returns an upper bound of its
// compact JSON size, and its number of items (the lines of the indented
// form).
func jsonBound(b *Budget, v Value) (size, items int64, err error) {
	var walk func(v Value, depth int) error
	walk = func(v Value, depth int) error {
		if depth > maxNesting {
			return b.fail(&LimitError{Limit: "nesting", Max: maxNesting, What: "tojson of a value nested too deeply (does it contain itself?)"})
		}
		if err := b.Step(1); err != nil {
			return err
		}
		items++
		switch v.kind {
		case KindString:
			size += 6*int64(len(v.AsString())) + 2
		case KindList:
			size += 2
			for _, it := range v.AsList().Items {
				size += 2
				if err := walk(it, depth+1); err != nil {
					return err
				}
			}
		case KindDict:
			size += 2
			d := v.AsDict()
			for _, k := range d.Keys {
				size += 6*int64(len(k)) + 6
				if err := walk(d.Data[k], depth+1); err != nil {
					return err
				}
			}
		default:
			size += 32
		}
		return nil
	}
	err = walk(v, 0)
	return size, items + 1, err
}

// maxNestingJSON bounds the indentation levels of a line of indented JSON
// with n items (it cannot nest deeper than it has items).
func maxNestingJSON(n int64) int64 { return min(n, maxNesting) }
