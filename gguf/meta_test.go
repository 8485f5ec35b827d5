package gguf

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func metaFile(t *testing.T) *File {
	t.Helper()
	b := build(t, 3, func(w *Writer) {
		w.Set("general.architecture", String("llama"))
		w.Set("llama.block_count", Uint32(32))
		w.Set("llama.rope.freq_base", Float32(500000))
		w.Set("llama.neg", Int32(-3))
		w.Set("big", Uint64(1<<63))
		w.Set("flag", Bool(true))
		w.Set("f64", Float64(0.25))
		w.Set("tokens", MustArray([]string{"a", "b"}))
		w.Set("scores", MustArray([]float32{1, 2}))
		w.Set("types", MustArray([]int32{1, -1}))
		w.Set("u8s", MustArray([]uint8{9}))
		w.Set("nested", MustArray([]Value{MustArray([]int32{1})}))
		w.Set("long", String(strings.Repeat("x", 500)))
	}, nil)
	f, err := Parse("meta.gguf", b)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestAccessors(t *testing.T) {
	f := metaFile(t)
	check := func(what string, got, want any, err error) {
		t.Helper()
		if err != nil {
			t.Errorf("%s: %v", what, err)
		} else if !reflect.DeepEqual(got, want) {
			t.Errorf("%s = %#v, want %#v", what, got, want)
		}
	}
	a, err := f.Arch()
	check("Arch", a, "llama", err)
	check("ArchKey", f.ArchKey("block_count"), "llama.block_count", nil)
	u, err := f.ArchUint("block_count")
	check("ArchUint", u, uint64(32), err)
	fl, err := f.ArchFloat("rope.freq_base")
	check("ArchFloat", fl, 500000.0, err)
	fl, err = f.Float("llama.block_count") // integers read as floats too
	check("Float(int)", fl, 32.0, err)
	fl, err = f.Float("f64")
	check("Float(f64)", fl, 0.25, err)
	i, err := f.Int("llama.neg")
	check("Int", i, int64(-3), err)
	i, err = f.Int("llama.block_count")
	check("Int(uint32)", i, int64(32), err)
	u, err = f.Uint("big")
	check("Uint(uint64)", u, uint64(1<<63), err)
	b, err := f.Bool("flag")
	check("Bool", b, true, err)
	ss, err := f.Strings("tokens")
	check("Strings", ss, []string{"a", "b"}, err)
	fs, err := f.Float32s("scores")
	check("Float32s", fs, []float32{1, 2}, err)
	is, err := f.Ints("types")
	check("Ints(int32)", is, []int64{1, -1}, err)
	is, err = f.Ints("u8s")
	check("Ints(uint8)", is, []int64{9}, err)
	if !f.Has("flag") || f.Has("nope") {
		t.Error("Has")
	}
	if v, ok := f.Get("tokens"); !ok || v.Len() != 2 || v.Elem != ValString {
		t.Errorf("Get(tokens) = %v, %v", v, ok)
	}
}

func TestAccessorMissingKey(t *testing.T) {
	f := metaFile(t)
	calls := map[string]func() error{
		"String":   func() error { _, err := f.String("no.such"); return err },
		"Uint":     func() error { _, err := f.Uint("no.such"); return err },
		"Int":      func() error { _, err := f.Int("no.such"); return err },
		"Float":    func() error { _, err := f.Float("no.such"); return err },
		"Bool":     func() error { _, err := f.Bool("no.such"); return err },
		"Strings":  func() error { _, err := f.Strings("no.such"); return err },
		"Float32s": func() error { _, err := f.Float32s("no.such"); return err },
		"Ints":     func() error { _, err := f.Ints("no.such"); return err },
	}
	for name, call := range calls {
		err := call()
		var mk *MissingKeyError
		if !errors.As(err, &mk) {
			t.Errorf("%s: error %v is not a *MissingKeyError", name, err)
			continue
		}
		if mk.Key != "no.such" || mk.File != "meta.gguf" {
			t.Errorf("%s: MissingKeyError %+v", name, mk)
		}
		if !strings.Contains(err.Error(), `"no.such"`) || !strings.Contains(err.Error(), "meta.gguf") {
			t.Errorf("%s: %q does not name the key and file", name, err)
		}
	}
	_, err := f.ArchUint("context_length")
	var mk *MissingKeyError
	if !errors.As(err, &mk) || mk.Key != "llama.context_length" {
		t.Errorf("ArchUint: %v", err)
	}
}

func TestAccessorWrongType(t *testing.T) {
	f := metaFile(t)
	cases := []struct {
		call      func() error
		key, want string // substrings of the message
	}{
		{func() error { _, err := f.String("flag"); return err }, "flag", "is bool true, want string"},
		{func() error { _, err := f.Uint("llama.neg"); return err }, "llama.neg", "is int32 -3, want a non-negative integer"},
		{func() error { _, err := f.Int("big"); return err }, "big", "is uint64 9223372036854775808, want an integer"},
		{func() error { _, err := f.Int("f64"); return err }, "f64", "is float64 0.25, want an integer"},
		{func() error { _, err := f.Float("tokens"); return err }, "tokens", "is array of string [string × 2], want a number"},
		{func() error { _, err := f.Bool("llama.block_count"); return err }, "llama.block_count", "is uint32 32, want bool"},
		{func() error { _, err := f.Strings("scores"); return err }, "scores", "is array of float32 [float32 × 2], want array of string"},
		{func() error { _, err := f.Float32s("tokens"); return err }, "tokens", "want array of float32"},
		{func() error { _, err := f.Ints("scores"); return err }, "scores", "want array of integers"},
		{func() error { _, err := f.Ints("flag"); return err }, "flag", "want array of integers"},
		{func() error { _, err := f.Ints("nested"); return err }, "nested", "is array of array"},
		{func() error { _, err := f.Uint("long"); return err }, "long", "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…, want"},
	}
	for _, c := range cases {
		err := c.call()
		var wt *WrongTypeError
		if !errors.As(err, &wt) || wt.Key != c.key {
			t.Errorf("%s: error %v is not a *WrongTypeError for the key", c.key, err)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, `"`+c.key+`"`) || !strings.Contains(msg, c.want) {
			t.Errorf("error %q, want it to name %q and contain %q", msg, c.key, c.want)
		}
	}
}
