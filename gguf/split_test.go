package gguf

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// splitModel writes a small model with the Writer, then splits it into 3
// parts with WriteSplit. It returns the single file and the part paths.
func splitModel(t *testing.T, dir string) (*File, []string) {
	t.Helper()
	b := build(t, 3, func(w *Writer) {
		w.Set("general.architecture", String("llama"))
		w.Set("general.name", String("split test"))
		w.Set("llama.block_count", Uint32(2))
		w.Set("tokenizer.ggml.tokens", MustArray([]string{"<s>", "a", "b"}))
		for _, tt := range testTensors {
			must(t, w.AddTensor(tt.name, tt.typ, tt.dims))
		}
	}, nil)
	whole, err := Parse("whole.gguf", b)
	if err != nil {
		t.Fatal(err)
	}
	paths, err := whole.WriteSplit(filepath.Join(dir, "model"), 3)
	if err != nil {
		t.Fatal(err)
	}
	return whole, paths
}

func TestSplitOpen(t *testing.T) {
	dir := t.TempDir()
	whole, paths := splitModel(t, dir)
	for i, want := range []string{"model-00001-of-00003.gguf", "model-00002-of-00003.gguf", "model-00003-of-00003.gguf"} {
		if filepath.Base(paths[i]) != want {
			t.Fatalf("part %d is %s, want %s", i+1, paths[i], want)
		}
	}
	f, err := Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Parts) != 3 {
		t.Fatalf("%d parts", len(f.Parts))
	}
	// Every tensor, in order, with its data, whichever part holds it.
	if len(f.Tensors) != len(whole.Tensors) {
		t.Fatalf("%d tensors, want %d", len(f.Tensors), len(whole.Tensors))
	}
	seenParts := map[int]int{}
	for i, w := range whole.Tensors {
		g := f.Tensors[i]
		if g.Name != w.Name || g.Type != w.Type || !bytes.Equal(g.Data, w.Data) || g.Size != w.Size {
			t.Errorf("tensor %d: %s %s %d bytes, want %s %s %d", i, g.Name, g.Type, len(g.Data), w.Name, w.Type, len(w.Data))
		}
		if byName, _ := f.Tensor(w.Name); byName != g {
			t.Errorf("Tensor(%q) is not the listed tensor", w.Name)
		}
		seenParts[g.Part]++
	}
	if len(seenParts) != 3 {
		t.Errorf("tensors per part: %v", seenParts)
	}
	// The model's metadata comes from the first part; the split keys are
	// typed as llama.cpp writes them.
	for _, kv := range whole.KVs {
		v, ok := f.Get(kv.Key)
		if !ok || !valueEqual(v, kv.Value) {
			t.Errorf("%s = %v, want %v", kv.Key, v, kv.Value)
		}
	}
	for i, p := range f.Parts {
		keys := map[string]Value{}
		for _, kv := range p.KVs {
			keys[kv.Key] = kv.Value
		}
		if v := keys[KeySplitNo]; v.Type != ValUint16 || v.Data() != uint16(i) {
			t.Errorf("part %d: split.no = %s %v", i+1, v.Type, v)
		}
		if v := keys[KeySplitCount]; v.Type != ValUint16 || v.Data() != uint16(3) {
			t.Errorf("part %d: split.count = %s %v", i+1, v.Type, v)
		}
		if v := keys[KeySplitTensorsCount]; v.Type != ValInt32 || v.Data() != int32(len(testTensors)) {
			t.Errorf("part %d: split.tensors.count = %s %v", i+1, v.Type, v)
		}
		if i > 0 && len(keys) != 3 {
			t.Errorf("part %d has %d keys, want only the 3 split keys", i+1, len(keys))
		}
	}
	if _, err := f.WriteTo(&bytes.Buffer{}); err == nil {
		t.Error("WriteTo of a split model did not fail")
	}
}

func TestSplitOpenLaterPart(t *testing.T) {
	_, paths := splitModel(t, t.TempDir())
	_, err := Open(paths[1])
	if err == nil || !strings.Contains(err.Error(), "part 2 of 3") || !strings.Contains(err.Error(), "model-00001-of-00003.gguf") {
		t.Fatalf("opening part 2: %v", err)
	}
}

func TestSplitMissingPart(t *testing.T) {
	_, paths := splitModel(t, t.TempDir())
	os.Remove(paths[2])
	_, err := Open(paths[0])
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "part 3 of 3") || !strings.Contains(err.Error(), "model-00003-of-00003.gguf") {
		t.Fatalf("missing part: %v", err)
	}
}

func TestSplitForeignPart(t *testing.T) {
	dir := t.TempDir()
	_, paths := splitModel(t, dir)
	// Part 3 replaced by part 2: its split.no is wrong.
	b, _ := os.ReadFile(paths[1])
	os.WriteFile(paths[2], b, 0o644)
	_, err := Open(paths[0])
	if err == nil || !strings.Contains(err.Error(), "split.no is 1, want 2") {
		t.Errorf("foreign part: %v", err)
	}
	// Part 3 replaced by a file that is not split at all.
	os.WriteFile(paths[2], small(), 0o644)
	_, err = Open(paths[0])
	if err == nil || !strings.Contains(err.Error(), "not part of a split model") {
		t.Errorf("unsplit part: %v", err)
	}
}

func TestSplitBadFirstPart(t *testing.T) {
	dir := t.TempDir()
	kvs := []KV{{"general.architecture", String("x")}}
	parts := [][]TensorData{{{"a", TypeF32, []uint64{4}, make([]byte, 16)}}, {{"b", TypeF32, []uint64{4}, make([]byte, 16)}}}
	paths, err := WriteSplit(filepath.Join(dir, "m"), kvs, parts)
	if err != nil {
		t.Fatal(err)
	}
	// A first part renamed so that its name no longer says which parts follow.
	renamed := filepath.Join(dir, "m.gguf")
	os.Rename(paths[0], renamed)
	if _, err := Open(renamed); err == nil || !strings.Contains(err.Error(), "does not follow NAME-00001-of-00002.gguf") {
		t.Errorf("renamed first part: %v", err)
	}
	// A name that disagrees with split.count.
	wrong := filepath.Join(dir, "m-00001-of-00003.gguf")
	os.Rename(renamed, wrong)
	if _, err := Open(wrong); err == nil || !strings.Contains(err.Error(), "the name says 3 parts, split.count says 2") {
		t.Errorf("wrong count in name: %v", err)
	}
	// split.tensors.count disagreeing with the parts.
	b := build(t, 3, func(w *Writer) {
		w.Set(KeySplitNo, Uint16(0))
		w.Set(KeySplitCount, Uint16(2))
		w.Set(KeySplitTensorsCount, Int32(5))
		w.AddTensor("a", TypeF32, []uint64{4})
	}, nil)
	os.WriteFile(paths[0], b, 0o644)
	if _, err := Open(paths[0]); err == nil || !strings.Contains(err.Error(), "split.tensors.count says 5 tensors, the 2 parts hold 2") {
		t.Errorf("tensor count: %v", err)
	}
	// The same tensor in two parts.
	if _, err := WriteSplit(filepath.Join(dir, "d"), kvs, [][]TensorData{parts[0], parts[0]}); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(filepath.Join(dir, "d-00001-of-00002.gguf")); err == nil || !strings.Contains(err.Error(), `tensor "a" appears in more than one part`) {
		t.Errorf("duplicate across parts: %v", err)
	}
}

func TestWriteSplitEmptyPartAndAlignment(t *testing.T) {
	dir := t.TempDir()
	kvs := []KV{{"general.alignment", Uint32(64)}, {"split.count", Uint16(9)}, {"general.name", String("n")}}
	parts := [][]TensorData{
		{{"a", TypeF32, []uint64{3}, pattern("a", 12)}, {"b", TypeF32, []uint64{5}, pattern("b", 20)}},
		{},
		{{"c", TypeF16, []uint64{2}, pattern("c", 4)}},
	}
	paths, err := WriteSplit(filepath.Join(dir, "e"), kvs, parts)
	if err != nil {
		t.Fatal(err)
	}
	f, err := Open(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if len(f.Tensors) != 3 || f.Alignment() != 64 || f.Parts[2].Alignment != 64 {
		t.Fatalf("%d tensors, alignment %d", len(f.Tensors), f.Alignment())
	}
	if n, _ := f.Uint(KeySplitCount); n != 3 {
		t.Errorf("split.count %d: the caller's split keys were not replaced", n)
	}
	for _, p := range parts {
		for _, td := range p {
			if g, _ := f.Tensor(td.Name); g == nil || !bytes.Equal(g.Data, td.Data) {
				t.Errorf("tensor %s", td.Name)
			}
		}
	}
	// Bad tensors fail the whole split and leave no files behind.
	bad := [][]TensorData{{{"x", TypeF32, []uint64{3}, make([]byte, 5)}}}
	if _, err := WriteSplit(filepath.Join(dir, "bad"), nil, bad); err == nil || !strings.Contains(err.Error(), "bad-00001-of-00001.gguf") {
		t.Errorf("bad data: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(dir, "bad*")); len(m) != 0 {
		t.Errorf("left behind: %v", m)
	}
	if _, err := WriteSplit(filepath.Join(dir, "none"), nil, nil); err == nil {
		t.Error("a split into 0 parts succeeded")
	}
}

func TestSplitEvenly(t *testing.T) {
	td := func(n int) TensorData { return TensorData{Data: make([]byte, n)} }
	sizes := func(parts [][]TensorData) []int {
		var out []int
		for _, p := range parts {
			s := 0
			for _, t := range p {
				s += len(t.Data)
			}
			out = append(out, s)
		}
		return out
	}
	cases := []struct {
		in   []int
		n    int
		want []int
	}{
		{[]int{10, 10, 10, 10, 10, 10}, 3, []int{20, 20, 20}},
		{[]int{100, 1, 1}, 3, []int{100, 1, 1}},
		{[]int{1, 1, 100}, 3, []int{1, 1, 100}},
		{[]int{5, 5}, 1, []int{10}},
		{[]int{1, 2, 3, 4, 5, 6, 7, 8}, 2, []int{21, 15}},
	}
	for _, c := range cases {
		var in []TensorData
		for _, s := range c.in {
			in = append(in, td(s))
		}
		got := sizes(SplitEvenly(in, c.n))
		if len(got) != len(c.want) {
			t.Errorf("SplitEvenly(%v, %d) = %v, want %v", c.in, c.n, got, c.want)
			continue
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Errorf("SplitEvenly(%v, %d) = %v, want %v", c.in, c.n, got, c.want)
				break
			}
		}
	}
}
