package gguf

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// enc assembles GGUF bytes by hand, so tests can write what the Writer
// refuses to.
type enc struct{ b []byte }

func (e *enc) u32(x uint32) *enc { e.b = binary.LittleEndian.AppendUint32(e.b, x); return e }
func (e *enc) u64(x uint64) *enc { e.b = binary.LittleEndian.AppendUint64(e.b, x); return e }
func (e *enc) str(s string) *enc { e.u64(uint64(len(s))); e.b = append(e.b, s...); return e }
func (e *enc) raw(b ...byte) *enc {
	e.b = append(e.b, b...)
	return e
}
func (e *enc) pad(a int) *enc {
	for len(e.b)%a != 0 {
		e.b = append(e.b, 0)
	}
	return e
}
func (e *enc) head(nTensors, nKV uint64) *enc {
	return e.u32(Magic).u32(3).u64(nTensors).u64(nKV)
}

// tensor appends a tensor info.
func (e *enc) tensor(name string, typ Type, off uint64, dims ...uint64) *enc {
	e.str(name).u32(uint32(len(dims)))
	for _, d := range dims {
		e.u64(d)
	}
	return e.u32(uint32(typ)).u64(off)
}

// small is the file the offsets below refer to:
//
//	 0 magic            4 version       8 tensor count   16 metadata count
//	24 key length      32 key "general.architecture"     52 value type
//	56 string length   64 "x"
//	65 name length     73 "w"           74 dimension count 78 dim 0
//	86 type            90 offset        98 padding      128 data (16 bytes)
//	144 padding to 160
func small() []byte {
	e := (&enc{}).head(1, 1).str("general.architecture").u32(uint32(ValString)).str("x")
	e.tensor("w", TypeF32, 0, 4).pad(32)
	e.raw(pattern("w", 16)...).pad(32)
	return e.b
}

func TestSmallMatchesWriter(t *testing.T) {
	b := build(t, 3, func(w *Writer) {
		w.Set("general.architecture", String("x"))
		w.AddTensor("w", TypeF32, []uint64{4})
	}, nil)
	if !bytes.Equal(b, small()) {
		t.Fatalf("the Writer's encoding differs from the hand-made one:\n%x\n%x", b, small())
	}
	if len(b) != 160 {
		t.Fatalf("small file is %d bytes, want 160", len(b))
	}
}

// patch returns a copy of b with x written little-endian at off.
func patch(b []byte, off int, x any) []byte {
	c := append([]byte(nil), b...)
	switch v := x.(type) {
	case uint32:
		binary.LittleEndian.PutUint32(c[off:], v)
	case uint64:
		binary.LittleEndian.PutUint64(c[off:], v)
	case byte:
		c[off] = v
	}
	return c
}

func TestBadInput(t *testing.T) {
	ok := small()
	deep := (&enc{}).head(0, 1).str("deep").u32(uint32(ValArray))
	for range 9 {
		deep.u32(uint32(ValArray)).u64(1)
	}
	deep.u32(uint32(ValUint8)).u64(0)

	cases := []struct {
		name   string
		b      []byte
		offset int64
		field  string
		msg    string
	}{
		{"empty", nil, 0, "magic", "needs 4 bytes, 0 left"},
		{"magic", patch(ok, 0, byte('X')), 0, "magic", `got "XGUF"`},
		{"version 0", patch(ok, 4, uint32(0)), 4, "version", "unsupported GGUF version 0"},
		{"version 4", patch(ok, 4, uint32(4)), 4, "version", "unsupported GGUF version 4"},
		{"big-endian version", patch(ok, 4, uint32(3<<24)), 4, "version", "unsupported GGUF version 50331648"},
		{"huge tensor count", patch(ok, 8, uint64(1)<<62), 8, "tensor count", "cannot fit"},
		{"huge metadata count", patch(ok, 16, uint64(math.MaxUint64)), 16, "metadata count", "cannot fit"},
		{"huge key length", patch(ok, 24, uint64(1)<<60), 24, "metadata[0] key length", "cannot fit"},
		{"huge string length", patch(ok, 56, uint64(200)), 56, "general.architecture length", "count 200 cannot fit in the 96 bytes left"},
		{"unknown value type", patch(ok, 52, uint32(13)), 52, "general.architecture value type", "unknown value type 13"},
		{"unknown tensor type", patch(ok, 86, uint32(4)), 86, `tensor "w" type`, "unknown ggml type id 4"},
		{"tensor type 40", patch(ok, 86, uint32(40)), 86, `tensor "w" type`, "unknown ggml type id 40"},
		{"five dims", patch(ok, 74, uint32(5)), 74, `tensor "w" dimension count`, "5 dimensions"},
		{"no dims", patch(ok, 74, uint32(0)), 74, `tensor "w" dimension count`, "0 dimensions"},
		{"misaligned", patch(ok, 90, uint64(16)), 90, `tensor "w" offset`, "offset 16 is not a multiple of the alignment 32"},
		{"outside data", patch(ok, 90, uint64(32)), 128 + 32, `tensor "w" data`, "16 bytes at data offset 32 run past the end of the data section (32 bytes"},
		{"far outside data", patch(ok, 90, uint64(1)<<40), 160, `tensor "w" data`, "run past the end"},
		{"offset wraps", patch(ok, 90, uint64(math.MaxUint64)&^31), 160, `tensor "w" data`, "run past the end"},
		{"too big", patch(ok, 78, uint64(100)), 128, `tensor "w" data`, "400 bytes at data offset 0"},
		{"shape overflow", (&enc{}).head(1, 0).tensor("w", TypeF32, 0, 1<<32, 1<<32).pad(32).b, 24, `tensor "w" shape`, "overflows"},
		{"partial block", (&enc{}).head(1, 0).tensor("w", TypeQ4_K, 0, 100).pad(32).b, 24, `tensor "w" shape`, "row length 100 is not a multiple of the Q4_K block size 256"},
		{"truncated dim", (&enc{}).head(1, 0).str("w").u32(4).u64(32).u64(1).u64(1).raw(1, 2).b, 61, `tensor "w" dim 3`, "needs 8 bytes, 2 left"},
		{"truncated type", (&enc{}).head(1, 0).str("w").u32(2).u64(32).u64(1).raw(1, 2, 3).b, 53, `tensor "w" type`, "needs 4 bytes, 3 left"},
		{"tensor name", (&enc{}).head(1, 0).u64(40).raw(make([]byte, 30)...).b, 24, "tensor[0] name length", "cannot fit"},
		{"header past end", (&enc{}).head(1, 0).tensor("w", TypeF32, 0, 0).b, 57, "data section", "starts at 64, past the end of the file (57 bytes"},
		{"bool", (&enc{}).head(0, 1).str("b").u32(uint32(ValBool)).raw(2).b, 37, "b", "bool byte is 2"},
		{"bool array", (&enc{}).head(0, 1).str("b").u32(uint32(ValArray)).u32(uint32(ValBool)).u64(3).raw(1, 0, 7).b, 51, "b", "bool element 2 is 7"},
		{"array element type", (&enc{}).head(0, 1).str("a").u32(uint32(ValArray)).u32(99).u64(0).b, 37, "a element type", "unknown value type 99"},
		{"huge array", (&enc{}).head(0, 1).str("a").u32(uint32(ValArray)).u32(uint32(ValUint32)).u64(1 << 61).b, 41, "a element count", "count 2305843009213693952 cannot fit in the 0 bytes left"},
		{"huge string array", (&enc{}).head(0, 1).str("a").u32(uint32(ValArray)).u32(uint32(ValString)).u64(1 << 62).u64(0).u64(0).u64(9).b, 41, "a element count", "count 4611686018427387904 cannot fit in the 24 bytes left (each item takes at least 8)"},
		{"string array last", (&enc{}).head(0, 1).str("a").u32(uint32(ValArray)).u32(uint32(ValString)).u64(3).u64(0).u64(0).u64(9).b, 65, "a[2] length", "count 9 cannot fit in the 0 bytes left"},
		{"string array element", (&enc{}).head(0, 1).str("a").u32(uint32(ValArray)).u32(uint32(ValString)).u64(2).u64(0).u64(9).raw(0, 0, 0, 0, 0, 0, 0, 0).b, 57, "a[1] length", "count 9 cannot fit in the 8 bytes left"},
		{"nested element", (&enc{}).head(0, 1).str("a").u32(uint32(ValArray)).u32(uint32(ValArray)).u64(2).u32(uint32(ValUint8)).u64(0).u32(uint32(ValUint8)).u64(5).b, 65, "a[1] element count", "cannot fit"},
		{"deep", deep.b, 40 + 8*12, "deep" + strings.Repeat("[0]", 8), "arrays nested deeper than 8"},
		{"alignment 48", (&enc{}).head(0, 1).str("general.alignment").u32(uint32(ValUint32)).u32(48).b, 49, "general.alignment", "power of two, got uint32 48"},
		{"alignment 0", (&enc{}).head(0, 1).str("general.alignment").u32(uint32(ValUint32)).u32(0).b, 49, "general.alignment", "got uint32 0"},
		{"alignment uint64", (&enc{}).head(0, 1).str("general.alignment").u32(uint32(ValUint64)).u64(64).b, 49, "general.alignment", "got uint64 64"},
		{"alignment string", (&enc{}).head(0, 1).str("general.alignment").u32(uint32(ValString)).str("64").b, 49, "general.alignment", "got string 64"},
		{"duplicate key", (&enc{}).head(0, 2).str("k").u32(uint32(ValUint8)).raw(1).str("k").u32(uint32(ValUint8)).raw(2).b, 38, "metadata[1] key", `duplicate key "k"`},
		{"duplicate tensor", (&enc{}).head(2, 0).tensor("w", TypeF32, 0, 8).tensor("w", TypeF32, 32, 8).pad(32).raw(make([]byte, 64)...).b, 57, "tensor[1] name", `duplicate tensor name "w"`},
		{"overlap", (&enc{}).head(2, 0).tensor("a", TypeF32, 0, 16).tensor("b", TypeF32, 32, 16).pad(32).raw(make([]byte, 96)...).b, 96 + 32, `tensor "b" data`, `overlaps tensor "a", which ends at data offset 64`},
		{"same offset", (&enc{}).head(2, 0).tensor("a", TypeF32, 64, 8).tensor("b", TypeF32, 64, 8).pad(32).raw(make([]byte, 96)...).b, 96 + 64, `tensor "b" data`, `overlaps tensor "a", which ends at data offset 96`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("bad.gguf", c.b)
			pe := parseErr(t, err)
			if pe.Offset != c.offset || pe.Field != c.field || pe.File != "bad.gguf" || !strings.Contains(pe.Msg, c.msg) {
				t.Errorf("got  offset %d field %q msg %q\nwant offset %d field %q msg containing %q", pe.Offset, pe.Field, pe.Msg, c.offset, c.field, c.msg)
			}
			if !strings.Contains(err.Error(), "bad.gguf") {
				t.Errorf("%q does not name the file", err)
			}
		})
	}
}

func TestEmptyTensorsMayShareOffsets(t *testing.T) {
	// Zero-size tensors take no bytes, so they overlap nothing.
	b := (&enc{}).head(3, 0).tensor("a", TypeF32, 0, 8).tensor("e", TypeF32, 0, 0).tensor("f", TypeF32, 32, 8, 0).pad(32).raw(make([]byte, 32)...).b
	f, err := Parse("empty.gguf", b)
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := f.Tensor("e"); e.Size != 0 || len(e.Data) != 0 {
		t.Errorf("e: %+v", e)
	}
	// The Writer accepts the same layout (the fuzzer found it refusing an
	// empty tensor placed inside another one).
	var out bytes.Buffer
	if _, err := f.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(out.Bytes(), b) {
		t.Error("WriteTo differs")
	}
}

func TestTruncatedEverywhere(t *testing.T) {
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"small", small()},
		{"values", build(t, 3, fillAllValues, nil)},
		{"values v2", build(t, 2, fillAllValues, nil)},
		{"tensors", build(t, 3, fillTensors(64), nil)},
		{"v1", v1File()},
	} {
		full, err := Parse("full.gguf", tc.b)
		if err != nil {
			t.Fatal(err)
		}
		// The data of the last tensor ends before the final padding; a file
		// cut inside that padding still holds every byte of every tensor,
		// and llama.cpp's loader accepts it too.
		end := len(tc.b) - len(full.Parts[0].Tail)
		for n := range len(tc.b) {
			f, err := Parse("cut.gguf", tc.b[:n])
			if n >= end {
				if err != nil {
					t.Errorf("%s cut at %d (data ends at %d): %v", tc.name, n, end, err)
				} else if err := headerDiff(full, f, true); err != nil {
					t.Errorf("%s cut at %d: %v", tc.name, n, err)
				}
				continue
			}
			if err == nil {
				t.Fatalf("%s cut at %d of %d bytes: no error", tc.name, n, len(tc.b))
			}
			var pe *ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("%s cut at %d: %T %v", tc.name, n, err, err)
			}
			if pe.Offset < 0 || pe.Offset > int64(n) {
				t.Errorf("%s cut at %d: error offset %d is past the end: %v", tc.name, n, pe.Offset, err)
			}
		}
	}
}

func TestOpenErrors(t *testing.T) {
	dir := t.TempDir()
	_, err := Open(filepath.Join(dir, "missing.gguf"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "missing.gguf") {
		t.Errorf("missing file: %v", err)
	}
	_, err = Open(dir)
	if err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Errorf("directory: %v", err)
	}
	empty := filepath.Join(dir, "empty.gguf")
	os.WriteFile(empty, nil, 0o644)
	if pe := parseErr(t, func() error { _, err := Open(empty); return err }()); pe.Field != "magic" || pe.File != empty {
		t.Errorf("empty file: %+v", pe)
	}
	cut := filepath.Join(dir, "cut.gguf")
	os.WriteFile(cut, small()[:100], 0o644)
	if pe := parseErr(t, func() error { _, err := Open(cut); return err }()); pe.Field != "data section" || pe.File != cut {
		t.Errorf("truncated file: %+v", pe)
	}
}
