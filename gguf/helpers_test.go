package gguf

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
)

// sharedFiles lists every shared .gguf file (oracle models and tokenizer
// vocabularies), skipping the test when the shared folder is absent.
func sharedFiles(t testing.TB) []string {
	t.Helper()
	d := testenv.SharedDir(t)
	var files []string
	for _, sub := range []string{"oracle", "vocab"} {
		m, _ := filepath.Glob(filepath.Join(d, "testdata", sub, "*.gguf"))
		files = append(files, m...)
	}
	if len(files) == 0 {
		t.Fatalf("no .gguf files under %s/testdata", d)
	}
	return files
}

// build writes a file with a Writer that fill prepares, then writes each
// tensor's data from data (or a deterministic pattern when absent).
func build(t testing.TB, version uint32, fill func(w *Writer), data map[string][]byte) []byte {
	t.Helper()
	b, err := buildErr(version, fill, data)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func buildErr(version uint32, fill func(w *Writer), data map[string][]byte) ([]byte, error) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	w.Version = version
	fill(w)
	if err := w.WriteHeader(); err != nil {
		return nil, err
	}
	for {
		name, ok := w.Next()
		if !ok {
			break
		}
		d, ok := data[name]
		if !ok {
			d = pattern(name, w.tensors[w.byName[name]].Size)
		}
		if err := w.WriteTensor(name, d); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// pattern is n bytes derived from name, so each tensor's data differs.
func pattern(name string, n uint64) []byte {
	b := make([]byte, n)
	h := uint32(2166136261)
	for i := range len(name) {
		h = (h ^ uint32(name[i])) * 16777619
	}
	for i := range b {
		h = h*1664525 + 1013904223
		b[i] = byte(h >> 24)
	}
	return b
}

// valueEqual compares two values exactly, floats by bit pattern so that NaNs
// from fuzzed input compare equal to themselves.
func valueEqual(a, b Value) bool {
	if a.Type != b.Type || a.Elem != b.Elem {
		return false
	}
	switch x := a.v.(type) {
	case float32:
		y, ok := b.v.(float32)
		return ok && math.Float32bits(x) == math.Float32bits(y)
	case float64:
		y, ok := b.v.(float64)
		return ok && math.Float64bits(x) == math.Float64bits(y)
	case []float32:
		y, ok := b.v.([]float32)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(y[i]) {
				return false
			}
		}
		return true
	case []float64:
		y, ok := b.v.([]float64)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if math.Float64bits(x[i]) != math.Float64bits(y[i]) {
				return false
			}
		}
		return true
	case []Value:
		y, ok := b.v.([]Value)
		if !ok || len(x) != len(y) {
			return false
		}
		for i := range x {
			if !valueEqual(x[i], y[i]) {
				return false
			}
		}
		return true
	}
	// Empty slices may be nil on one side and empty on the other.
	if a.Len() == 0 && b.Len() == 0 && a.Type == ValArray {
		return reflect.TypeOf(a.v) == reflect.TypeOf(b.v)
	}
	return reflect.DeepEqual(a.v, b.v)
}

// headerDiff describes the first difference between the headers and tensor
// data of two files, or returns nil when they hold the same model.
// Versions are compared only when sameVersion is set (v1 re-encodes as v3).
func headerDiff(a, b *File, sameVersion bool) error {
	if sameVersion && a.Version() != b.Version() {
		return fmt.Errorf("version %d != %d", a.Version(), b.Version())
	}
	if a.Alignment() != b.Alignment() {
		return fmt.Errorf("alignment %d != %d", a.Alignment(), b.Alignment())
	}
	if len(a.KVs) != len(b.KVs) {
		return fmt.Errorf("%d metadata entries != %d", len(a.KVs), len(b.KVs))
	}
	for i := range a.KVs {
		if a.KVs[i].Key != b.KVs[i].Key {
			return fmt.Errorf("metadata[%d] key %q != %q", i, a.KVs[i].Key, b.KVs[i].Key)
		}
		if !valueEqual(a.KVs[i].Value, b.KVs[i].Value) {
			return fmt.Errorf("metadata %q: %v != %v", a.KVs[i].Key, a.KVs[i].Value, b.KVs[i].Value)
		}
	}
	if len(a.Tensors) != len(b.Tensors) {
		return fmt.Errorf("%d tensors != %d", len(a.Tensors), len(b.Tensors))
	}
	for i := range a.Tensors {
		x, y := a.Tensors[i], b.Tensors[i]
		if x.Name != y.Name || x.Type != y.Type || x.Offset != y.Offset || x.Size != y.Size || !reflect.DeepEqual(x.Dims, y.Dims) {
			return fmt.Errorf("tensor %d: %+v != %+v", i, x.TensorInfo, y.TensorInfo)
		}
		if !bytes.Equal(x.Data, y.Data) {
			return fmt.Errorf("tensor %q: data differs", x.Name)
		}
	}
	return nil
}

// parseErr asserts err is a *ParseError and returns it.
func parseErr(t testing.TB, err error) *ParseError {
	t.Helper()
	if err == nil {
		t.Fatal("no error")
	}
	var pe *ParseError
	if !errors.As(err, &pe) {
		t.Fatalf("error %v (%T) is not a *ParseError", err, err)
	}
	return pe
}
