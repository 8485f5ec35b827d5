package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"slices"
	"strings"

	"github.com/atsinfer/ats/internal/jinja"
)

// toValue converts a Go value (tool definitions, Vars) into a template
// value. Maps get sorted keys (Go maps have no order to keep);
// json.RawMessage keeps the order of its text; other types (structs) go
// through encoding/json, which keeps struct field order.
func toValue(v any) (jinja.Value, error) {
	switch x := v.(type) {
	case nil:
		return jinja.None(), nil
	case jinja.Value:
		return x, nil
	case bool:
		return jinja.NewBool(x), nil
	case string:
		return jinja.NewString(x), nil
	case int:
		return jinja.NewInt(int64(x)), nil
	case int8:
		return jinja.NewInt(int64(x)), nil
	case int16:
		return jinja.NewInt(int64(x)), nil
	case int32:
		return jinja.NewInt(int64(x)), nil
	case int64:
		return jinja.NewInt(x), nil
	case uint8:
		return jinja.NewInt(int64(x)), nil
	case uint16:
		return jinja.NewInt(int64(x)), nil
	case uint32:
		return jinja.NewInt(int64(x)), nil
	case float32:
		return floatValue(float64(x)), nil
	case float64:
		return floatValue(x), nil
	case json.Number:
		return numberValue(x), nil
	case json.RawMessage:
		return parseJSON(x)
	case []any:
		return listValue(len(x), func(i int) any { return x[i] })
	case []string:
		return listValue(len(x), func(i int) any { return x[i] })
	case []map[string]any:
		return listValue(len(x), func(i int) any { return x[i] })
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		d := jinja.NewDict()
		for _, k := range keys {
			e, err := toValue(x[k])
			if err != nil {
				return jinja.Undefined(), fmt.Errorf("key %q: %w", k, err)
			}
			d.AsDict().Set(k, e)
		}
		return d, nil
	}
	// Anything else (structs, typed maps and slices, uint64): through its
	// JSON form, as a server would receive it.
	b, err := json.Marshal(v)
	if err != nil {
		return jinja.Undefined(), fmt.Errorf("cannot pass %s to a template: %w", reflect.TypeOf(v), err)
	}
	return parseJSON(b)
}

func listValue(n int, at func(int) any) (jinja.Value, error) {
	items := make([]jinja.Value, n)
	for i := range items {
		v, err := toValue(at(i))
		if err != nil {
			return jinja.Undefined(), fmt.Errorf("index %d: %w", i, err)
		}
		items[i] = v
	}
	return jinja.NewList(items), nil
}

// floatValue turns integral floats into ints: encoding/json decodes every
// JSON number to float64, so an integral one almost always was an integer
// in the JSON, and Python would have it as an int (1, not 1.0).
func floatValue(f float64) jinja.Value {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return jinja.NewInt(int64(f))
	}
	return jinja.NewFloat(f)
}

// numberValue follows Python's json.loads: no '.', 'e' or 'E' is an int.
func numberValue(n json.Number) jinja.Value {
	s := string(n)
	if !strings.ContainsAny(s, ".eE") {
		if i, err := n.Int64(); err == nil {
			return jinja.NewInt(i)
		}
	}
	f, _ := n.Float64() // json.Decoder only yields valid numbers
	return jinja.NewFloat(f)
}

// parseJSON decodes JSON text into a template value, keeping object keys
// in their order, as Python's json.loads does.
func parseJSON(b []byte) (jinja.Value, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := decodeJSON(dec)
	if err != nil {
		return jinja.Undefined(), err
	}
	if _, err := dec.Token(); err != io.EOF {
		return jinja.Undefined(), errors.New("trailing data after JSON value")
	}
	return v, nil
}

func decodeJSON(dec *json.Decoder) (jinja.Value, error) {
	tok, err := dec.Token()
	if err != nil {
		return jinja.Undefined(), err
	}
	switch t := tok.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(t), nil
	case json.Delim:
		if t == '[' {
			var items []jinja.Value
			for dec.More() {
				v, err := decodeJSON(dec)
				if err != nil {
					return jinja.Undefined(), err
				}
				items = append(items, v)
			}
			_, err := dec.Token() // ']'
			return jinja.NewList(items), err
		}
		d := jinja.NewDict() // t == '{'
		for dec.More() {
			k, err := dec.Token()
			if err != nil {
				return jinja.Undefined(), err
			}
			v, err := decodeJSON(dec)
			if err != nil {
				return jinja.Undefined(), err
			}
			d.AsDict().Set(k.(string), v) // the decoder guarantees a string key
		}
		_, err := dec.Token() // '}'
		return d, err
	}
	return jinja.Undefined(), fmt.Errorf("unexpected JSON token %v", tok)
}
