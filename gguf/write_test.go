package gguf

import (
	"bytes"
	"encoding/binary"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

// allValues is one metadata entry of every value type: scalars at their
// extremes, empty strings, arrays of every element type, empty arrays and
// arrays of arrays.
func allValues() []KV {
	return []KV{
		{"u8", Uint8(math.MaxUint8)},
		{"i8", Int8(math.MinInt8)},
		{"u16", Uint16(math.MaxUint16)},
		{"i16", Int16(math.MinInt16)},
		{"u32", Uint32(math.MaxUint32)},
		{"i32", Int32(math.MinInt32)},
		{"f32", Float32(-1.5e-38)},
		{"f32.nan", Float32(float32(math.NaN()))},
		{"true", Bool(true)},
		{"false", Bool(false)},
		{"str", String("héllo, 世界\x00\n")},
		{"str.empty", String("")},
		{"", String("empty key")},
		{"u64", Uint64(math.MaxUint64)},
		{"i64", Int64(math.MinInt64)},
		{"f64", Float64(math.Inf(-1))},
		{"a.u8", MustArray([]uint8{0, 1, 255})},
		{"a.i8", MustArray([]int8{-128, 0, 127})},
		{"a.u16", MustArray([]uint16{0, 65535})},
		{"a.i16", MustArray([]int16{-32768, 32767})},
		{"a.u32", MustArray([]uint32{1, 2, 3})},
		{"a.i32", MustArray([]int32{-1, 0, 1})},
		{"a.f32", MustArray([]float32{0.5, float32(math.Inf(1)), -0})},
		{"a.bool", MustArray([]bool{true, false, true})},
		{"a.str", MustArray([]string{"a", "", "ccc"})},
		{"a.u64", MustArray([]uint64{math.MaxUint64})},
		{"a.i64", MustArray([]int64{math.MinInt64, math.MaxInt64})},
		{"a.f64", MustArray([]float64{math.Pi, math.SmallestNonzeroFloat64})},
		{"a.empty.u8", MustArray([]uint8{})},
		{"a.empty.i16", MustArray([]int16{})},
		{"a.empty.f64", MustArray([]float64{})},
		{"a.empty.str", MustArray([]string{})},
		{"a.empty.arr", MustArray([]Value{})},
		{"a.nested", MustArray([]Value{
			MustArray([]string{"x", "yy"}),
			MustArray([]string{}),
			MustArray([]string{""}),
		})},
		{"a.nested.mixed", MustArray([]Value{
			MustArray([]int32{1, 2}),
			MustArray([]float32{3}),
			MustArray([]Value{MustArray([]uint8{7}), MustArray([]Value{})}),
		})},
	}
}

func fillAllValues(w *Writer) {
	for _, kv := range allValues() {
		w.Set(kv.Key, kv.Value)
	}
}

// testTensors are tensors of several types and 1 to 4 dimensions,
// including an empty one.
var testTensors = []struct {
	name string
	typ  Type
	dims []uint64
}{
	{"f32.vec", TypeF32, []uint64{7}},
	{"f16.mat", TypeF16, []uint64{3, 5}},
	{"bf16.one", TypeBF16, []uint64{1}},
	{"q4_0.mat", TypeQ4_0, []uint64{64, 3}},
	{"q8_0.3d", TypeQ8_0, []uint64{32, 2, 2}},
	{"q4_k.mat", TypeQ4_K, []uint64{256, 2}},
	{"q6_k.4d", TypeQ6_K, []uint64{256, 1, 1, 2}},
	{"iq4_xs", TypeIQ4_XS, []uint64{256}},
	{"i32.vec", TypeI32, []uint64{5}},
	{"empty", TypeF32, []uint64{4, 0}},
	{"mxfp4", TypeMXFP4, []uint64{32, 3}},
}

// fillTensors sets an alignment (when not the default) and adds testTensors.
func fillTensors(align uint32) func(w *Writer) {
	return func(w *Writer) {
		w.Set("general.architecture", String("test"))
		if align != DefaultAlignment {
			w.Set("general.alignment", Uint32(align))
		}
		for _, tt := range testTensors {
			if err := w.AddTensor(tt.name, tt.typ, tt.dims); err != nil {
				panic(err)
			}
		}
	}
}

func TestWriterValuesRoundTrip(t *testing.T) {
	for _, v := range []uint32{2, 3} {
		b := build(t, v, fillAllValues, nil)
		f, err := Parse("values.gguf", b)
		if err != nil {
			t.Fatalf("v%d: %v", v, err)
		}
		if f.Version() != v {
			t.Errorf("version %d, want %d", f.Version(), v)
		}
		want := allValues()
		if len(f.KVs) != len(want) {
			t.Fatalf("v%d: %d entries, want %d", v, len(f.KVs), len(want))
		}
		for i, kv := range want {
			got := f.KVs[i]
			if got.Key != kv.Key || !valueEqual(got.Value, kv.Value) {
				t.Errorf("v%d: entry %d = %q %#v, want %q %#v", v, i, got.Key, got.Value, kv.Key, kv.Value)
			}
		}
		// Re-encoding what was read gives the same bytes.
		var out bytes.Buffer
		if _, err := f.WriteTo(&out); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(out.Bytes(), b) {
			t.Errorf("v%d: WriteTo gives %d bytes that differ from the %d written", v, out.Len(), len(b))
		}
	}
}

func TestWriterTensorsRoundTrip(t *testing.T) {
	for _, align := range []uint32{8, 32, 64, 4096} {
		for _, v := range []uint32{2, 3} {
			b := build(t, v, fillTensors(align), nil)
			// Through the file system too, so the mmap path is covered.
			path := filepath.Join(t.TempDir(), "t.gguf")
			if err := os.WriteFile(path, b, 0o644); err != nil {
				t.Fatal(err)
			}
			f, err := Open(path)
			if err != nil {
				t.Fatalf("align %d v%d: %v", align, v, err)
			}
			if f.Alignment() != uint64(align) {
				t.Errorf("align %d: Alignment() = %d", align, f.Alignment())
			}
			p := f.Parts[0]
			if p.DataOffset%int64(align) != 0 {
				t.Errorf("align %d: data section at %d", align, p.DataOffset)
			}
			if len(b)%int(align) != 0 {
				t.Errorf("align %d: file size %d is not padded to the alignment", align, len(b))
			}
			if len(f.Tensors) != len(testTensors) {
				t.Fatalf("%d tensors, want %d", len(f.Tensors), len(testTensors))
			}
			for i, tt := range testTensors {
				got := f.Tensors[i]
				size, _ := tensorSize(tt.typ, tt.dims)
				if got.Name != tt.name || got.Type != tt.typ || !reflect.DeepEqual(got.Dims, tt.dims) || got.Size != size {
					t.Errorf("align %d: tensor %d = %s %s %v %d bytes, want %s %s %v %d", align, i, got.Name, got.Type, got.Dims, got.Size, tt.name, tt.typ, tt.dims, size)
				}
				if got.Offset%uint64(align) != 0 {
					t.Errorf("align %d: tensor %s at data offset %d", align, got.Name, got.Offset)
				}
				if !bytes.Equal(got.Data, pattern(tt.name, size)) {
					t.Errorf("align %d: tensor %s data differs", align, got.Name)
				}
				if byName, ok := f.Tensor(tt.name); !ok || byName != got {
					t.Errorf("Tensor(%q) = %v, %v", tt.name, byName, ok)
				}
			}
			if e, _ := f.Tensor("empty"); e.Rows() != 0 || e.Elements() != 0 || len(e.Data) != 0 {
				t.Errorf("empty tensor: %d rows, %d elements, %d bytes", e.Rows(), e.Elements(), len(e.Data))
			}
			if m, _ := f.Tensor("q6_k.4d"); m.Rows() != 2 || m.Elements() != 512 {
				t.Errorf("q6_k.4d: %d rows, %d elements", m.Rows(), m.Elements())
			}
			var out bytes.Buffer
			if _, err := f.WriteTo(&out); err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(out.Bytes(), b) {
				t.Errorf("align %d v%d: WriteTo differs from the written file", align, v)
			}
			if err := f.Close(); err != nil {
				t.Error(err)
			}
		}
	}
}

func TestWriterLayout(t *testing.T) {
	// Tensors written at explicit offsets, out of header order, with a gap.
	b := build(t, 3, func(w *Writer) {
		must(t, w.AddTensorAt(TensorInfo{Name: "late", Type: TypeF32, Dims: []uint64{8}, Offset: 128}))
		must(t, w.AddTensorAt(TensorInfo{Name: "early", Type: TypeF32, Dims: []uint64{4}, Offset: 0}))
	}, nil)
	f, err := Parse("layout.gguf", b)
	if err != nil {
		t.Fatal(err)
	}
	late, _ := f.Tensor("late")
	early, _ := f.Tensor("early")
	if late.Offset != 128 || early.Offset != 0 || f.Tensors[0] != late {
		t.Fatalf("offsets %d %d, order %s", late.Offset, early.Offset, f.Tensors[0].Name)
	}
	if !bytes.Equal(late.Data, pattern("late", 32)) || !bytes.Equal(early.Data, pattern("early", 16)) {
		t.Fatal("data differs")
	}
	if got := int64(len(b)) - f.Parts[0].DataOffset; got != 160 {
		t.Errorf("data section %d bytes, want 160 (end of late, padded to 32)", got)
	}
}

func TestWriterErrors(t *testing.T) {
	cases := []struct {
		name string
		fill func(w *Writer) error
		want string
	}{
		{"duplicate tensor", func(w *Writer) error {
			w.AddTensor("a", TypeF32, []uint64{1})
			return w.AddTensor("a", TypeF32, []uint64{1})
		}, `duplicate tensor "a"`},
		{"unknown type", func(w *Writer) error { return w.AddTensor("a", Type(4), []uint64{1}) }, "unknown ggml type id 4"},
		{"five dims", func(w *Writer) error { return w.AddTensor("a", TypeF32, []uint64{1, 1, 1, 1, 1}) }, "5 dimensions"},
		{"no dims", func(w *Writer) error { return w.AddTensor("a", TypeF32, nil) }, "0 dimensions"},
		{"partial block", func(w *Writer) error { return w.AddTensor("a", TypeQ4_K, []uint64{255}) }, "not a multiple"},
		{"alignment type", func(w *Writer) error {
			w.Set("general.alignment", Uint64(64))
			return w.WriteHeader()
		}, "general.alignment must be a uint32"},
		{"alignment value", func(w *Writer) error {
			w.Set("general.alignment", Uint32(48))
			return w.WriteHeader()
		}, "power of two"},
		{"misaligned offset", func(w *Writer) error {
			w.AddTensorAt(TensorInfo{Name: "a", Type: TypeF32, Dims: []uint64{1}, Offset: 4})
			return w.WriteHeader()
		}, "not a multiple of the alignment 32"},
		{"overlap", func(w *Writer) error {
			w.AddTensorAt(TensorInfo{Name: "a", Type: TypeF32, Dims: []uint64{16}, Offset: 0})
			w.AddTensorAt(TensorInfo{Name: "b", Type: TypeF32, Dims: []uint64{16}, Offset: 32})
			return w.WriteHeader()
		}, `"b" at offset 32 overlaps tensor "a"`},
		{"version", func(w *Writer) error { w.Version = 1; return w.WriteHeader() }, "cannot write version 1"},
		{"wrong order", func(w *Writer) error {
			w.AddTensor("a", TypeF32, []uint64{1})
			w.AddTensor("b", TypeF32, []uint64{1})
			w.WriteHeader()
			return w.WriteTensor("b", make([]byte, 4))
		}, `"a" is next`},
		{"wrong size", func(w *Writer) error {
			w.AddTensor("a", TypeF32, []uint64{2})
			w.WriteHeader()
			return w.WriteTensor("a", make([]byte, 4))
		}, "4 bytes of data, want 8"},
		{"missing data", func(w *Writer) error {
			w.AddTensor("a", TypeF32, []uint64{2})
			return w.Close()
		}, `before tensor "a" was written`},
		{"late tensor", func(w *Writer) error {
			w.WriteHeader()
			return w.AddTensor("a", TypeF32, []uint64{2})
		}, "after the header"},
		{"zero value", func(w *Writer) error {
			w.Set("k", Value{})
			return w.WriteHeader()
		}, `metadata "k"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			w := NewWriter(&bytes.Buffer{})
			err := c.fill(w)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one containing %q", err, c.want)
			}
		})
	}
}

func TestArrayConstructor(t *testing.T) {
	if _, err := Array([]int{1}); err == nil {
		t.Error("Array([]int) accepted")
	}
	if _, err := Array([]Value{Uint8(1)}); err == nil || !strings.Contains(err.Error(), "element 0 is a uint8") {
		t.Errorf("Array of a scalar Value: %v", err)
	}
	v := MustArray([]string{"a", "b"})
	if v.Type != ValArray || v.Elem != ValString || v.Len() != 2 || v.String() != "[string × 2]" {
		t.Errorf("MustArray: %+v %q", v, v.String())
	}
	if Uint8(3).Len() != 0 || Uint8(3).String() != "3" {
		t.Error("scalar Len/String")
	}
}

// v1File is a hand-encoded GGUF v1 file: 32-bit counts, string lengths and
// dimensions. The Writer does not write v1, so it is assembled here.
func v1File() []byte {
	le := binary.LittleEndian
	var b []byte
	str := func(s string) { b = le.AppendUint32(b, uint32(len(s))); b = append(b, s...) }
	b = le.AppendUint32(b, Magic)
	b = le.AppendUint32(b, 1)
	b = le.AppendUint32(b, 1) // tensors
	b = le.AppendUint32(b, 2) // metadata
	str("general.name")
	b = le.AppendUint32(b, uint32(ValString))
	str("old")
	str("v1.arr")
	b = le.AppendUint32(b, uint32(ValArray))
	b = le.AppendUint32(b, uint32(ValString))
	b = le.AppendUint32(b, 2)
	str("x")
	str("yz")
	str("w")
	b = le.AppendUint32(b, 2) // dims
	b = le.AppendUint32(b, 2)
	b = le.AppendUint32(b, 3)
	b = le.AppendUint32(b, uint32(TypeF32))
	b = le.AppendUint64(b, 0)
	for len(b)%DefaultAlignment != 0 {
		b = append(b, 0)
	}
	for i := range 6 {
		b = le.AppendUint32(b, math.Float32bits(float32(i)))
	}
	return b
}

func TestReadV1(t *testing.T) {
	b := v1File()
	f, err := Parse("v1.gguf", b)
	if err != nil {
		t.Fatal(err)
	}
	if f.Version() != 1 {
		t.Errorf("version %d", f.Version())
	}
	if s, _ := f.String("general.name"); s != "old" {
		t.Errorf("general.name = %q", s)
	}
	if a, _ := f.Strings("v1.arr"); !reflect.DeepEqual(a, []string{"x", "yz"}) {
		t.Errorf("v1.arr = %q", a)
	}
	w, _ := f.Tensor("w")
	if w == nil || !reflect.DeepEqual(w.Dims, []uint64{2, 3}) || len(w.Data) != 24 || w.Data[4] != 0 || w.Data[7] != 0x3f {
		t.Fatalf("tensor w: %+v", w)
	}
	// v1 re-encodes as v3 with the same content.
	var out bytes.Buffer
	if _, err := f.WriteTo(&out); err != nil {
		t.Fatal(err)
	}
	f3, err := Parse("v3.gguf", out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if f3.Version() != 3 {
		t.Errorf("re-encoded version %d", f3.Version())
	}
	if err := headerDiff(f, f3, false); err != nil {
		t.Error(err)
	}
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
