package gguf

import "fmt"

// Get returns a metadata value by key.
func (f *File) Get(key string) (Value, bool) {
	i, ok := f.kv[key]
	if !ok {
		return Value{}, false
	}
	return f.KVs[i].Value, true
}

// Has reports whether key is present.
func (f *File) Has(key string) bool { _, ok := f.kv[key]; return ok }

// MissingKeyError names a metadata key the caller needed.
type MissingKeyError struct {
	File, Key string
}

func (e *MissingKeyError) Error() string {
	return fmt.Sprintf("gguf: %s: missing metadata key %q", e.File, e.Key)
}

func (f *File) lookup(key string) (Value, error) {
	v, ok := f.Get(key)
	if !ok {
		return Value{}, &MissingKeyError{File: f.Path, Key: key}
	}
	return v, nil
}

// WrongTypeError reports a metadata value whose type (or, for integers, sign
// or range) is not what the caller asked for.
type WrongTypeError struct {
	File, Key string
	Got       Value
	Want      string // "string", "a non-negative integer", "array of float32", ...
}

func (e *WrongTypeError) Error() string {
	got := e.Got.Type.String()
	if e.Got.Type == ValArray {
		got = "array of " + e.Got.Elem.String()
	}
	val := e.Got.String()
	if len(val) > 40 {
		val = val[:40] + "…"
	}
	return fmt.Sprintf("gguf: %s: metadata key %q is %s %s, want %s", e.File, e.Key, got, val, e.Want)
}

func (f *File) wrongType(key string, v Value, want string) error {
	return &WrongTypeError{File: f.Path, Key: key, Got: v, Want: want}
}

// String reads a string value.
func (f *File) String(key string) (string, error) {
	v, err := f.lookup(key)
	if err != nil {
		return "", err
	}
	s, ok := v.v.(string)
	if !ok {
		return "", f.wrongType(key, v, "string")
	}
	return s, nil
}

// Uint reads any non-negative integer value.
func (f *File) Uint(key string) (uint64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	x, ok := v.asUint()
	if !ok {
		return 0, f.wrongType(key, v, "a non-negative integer")
	}
	return x, nil
}

// Int reads any integer value.
func (f *File) Int(key string) (int64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	x, ok := v.asInt()
	if !ok {
		return 0, f.wrongType(key, v, "an integer")
	}
	return x, nil
}

// Float reads a float value (integers are accepted too).
func (f *File) Float(key string) (float64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return 0, err
	}
	x, ok := v.asFloat()
	if !ok {
		return 0, f.wrongType(key, v, "a number")
	}
	return x, nil
}

// Bool reads a bool value.
func (f *File) Bool(key string) (bool, error) {
	v, err := f.lookup(key)
	if err != nil {
		return false, err
	}
	x, ok := v.v.(bool)
	if !ok {
		return false, f.wrongType(key, v, "bool")
	}
	return x, nil
}

// Strings reads an array of strings.
func (f *File) Strings(key string) ([]string, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	x, ok := v.v.([]string)
	if !ok {
		return nil, f.wrongType(key, v, "array of string")
	}
	return x, nil
}

// Float32s reads an array of float32.
func (f *File) Float32s(key string) ([]float32, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	x, ok := v.v.([]float32)
	if !ok {
		return nil, f.wrongType(key, v, "array of float32")
	}
	return x, nil
}

// Ints reads an array of any integer type as int64s.
func (f *File) Ints(key string) ([]int64, error) {
	v, err := f.lookup(key)
	if err != nil {
		return nil, err
	}
	if v.Type != ValArray {
		return nil, f.wrongType(key, v, "array of integers")
	}
	out := make([]int64, 0, v.Len())
	switch a := v.v.(type) {
	case []int32:
		for _, x := range a {
			out = append(out, int64(x))
		}
	case []uint32:
		for _, x := range a {
			out = append(out, int64(x))
		}
	case []int64:
		out = append(out, a...)
	case []uint64:
		for _, x := range a {
			out = append(out, int64(x))
		}
	case []int16:
		for _, x := range a {
			out = append(out, int64(x))
		}
	case []uint16:
		for _, x := range a {
			out = append(out, int64(x))
		}
	case []int8:
		for _, x := range a {
			out = append(out, int64(x))
		}
	case []uint8:
		for _, x := range a {
			out = append(out, int64(x))
		}
	default:
		return nil, f.wrongType(key, v, "array of integers")
	}
	return out, nil
}

// Arch is general.architecture.
func (f *File) Arch() (string, error) { return f.String("general.architecture") }

// ArchKey is the key "<arch>.<suffix>", e.g. ArchKey("block_count").
func (f *File) ArchKey(suffix string) string {
	a, _ := f.Arch()
	return a + "." + suffix
}

// ArchUint reads "<arch>.<suffix>" as an unsigned integer.
func (f *File) ArchUint(suffix string) (uint64, error) { return f.Uint(f.ArchKey(suffix)) }

// ArchFloat reads "<arch>.<suffix>" as a number.
func (f *File) ArchFloat(suffix string) (float64, error) { return f.Float(f.ArchKey(suffix)) }
