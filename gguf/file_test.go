package gguf

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// TestSharedRoundTrip: every shared file re-encodes byte for byte, so the
// reader loses nothing and the writer lays files out as llama.cpp does.
func TestSharedRoundTrip(t *testing.T) {
	for _, p := range sharedFiles(t) {
		t.Run(filepath.Base(p), func(t *testing.T) {
			f, err := Open(p)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			want, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			n, err := f.WriteTo(&out)
			if err != nil {
				t.Fatal(err)
			}
			if n != int64(len(want)) || !bytes.Equal(out.Bytes(), want) {
				i := 0
				for i < min(out.Len(), len(want)) && out.Bytes()[i] == want[i] {
					i++
				}
				t.Fatalf("WriteTo gives %d bytes (reported %d), the file has %d; first difference at %d", out.Len(), n, len(want), i)
			}
			if f.Size() != int64(len(want)) {
				t.Errorf("Size() = %d, want %d", f.Size(), len(want))
			}
			// Tensors are views into the mapping, in bounds, in header order.
			for i, tn := range f.Tensors {
				if tn.TensorInfo.Name != f.Parts[0].Tensors[i].Name || uint64(len(tn.Data)) != tn.Size {
					t.Fatalf("tensor %d: %s with %d bytes", i, tn.Name, len(tn.Data))
				}
			}
		})
	}
}

// TestOpenSparse9GiB: opening a model maps it; nothing proportional to the
// tensor data is read or allocated.
func TestOpenSparse9GiB(t *testing.T) {
	if runtime.GOARCH == "386" || runtime.GOARCH == "arm" {
		t.Skip("a 9 GiB mapping needs a 64-bit address space")
	}
	const size = 9 << 30
	path := filepath.Join(t.TempDir(), "big.gguf")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	// One F16 tensor of almost 4.5G elements fills the file; its data is
	// a hole.
	w := NewWriter(out)
	w.Set("general.architecture", String("big"))
	dims := []uint64{1 << 16, 9<<30>>17 - 1}
	must(t, w.AddTensor("huge", TypeF16, dims))
	must(t, w.WriteHeader())
	must(t, w.out.Flush())
	end := w.dataStart + int64(w.tensors[0].Size)
	if end > size {
		t.Fatalf("layout: data ends at %d", end)
	}
	if err := out.Truncate(size); err != nil {
		out.Close()
		t.Skipf("the file system refuses a sparse 9 GiB file: %v", err)
	}
	must(t, out.Close())

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	start := time.Now()
	f, err := Open(path)
	took := time.Since(start)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runtime.ReadMemStats(&after)
	growth := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("Open of a %d GiB file: %v, heap grew %d bytes, mapped=%v", size>>30, took, growth, f.Mapped)
	if !f.Mapped {
		t.Skip("mmap unavailable here: the file was read into memory")
	}
	if growth > 16<<20 {
		t.Errorf("heap grew by %d bytes", growth)
	}
	h, ok := f.Tensor("huge")
	if !ok || h.Size != 2*dims[0]*dims[1] || uint64(len(h.Data)) != h.Size {
		t.Fatalf("tensor: %+v", h.TensorInfo)
	}
	if h.Data[len(h.Data)-1] != 0 {
		t.Fatal("the hole does not read as zeros")
	}
}

// TestParseAliases: Parse keeps tensor data in the caller's buffer.
func TestParseAliases(t *testing.T) {
	b := small()
	f, err := Parse("mem.gguf", b)
	if err != nil {
		t.Fatal(err)
	}
	w, _ := f.Tensor("w")
	b[128] ^= 0xff
	if w.Data[0] != b[128] {
		t.Error("tensor data is a copy, not a view")
	}
	if f.Mapped || f.Parts[0].Mapped {
		t.Error("an in-memory file reports Mapped")
	}
}

// BenchmarkOpen opens the largest shared vocabulary: 128k-token string
// arrays dominate, as in every real model's header.
func BenchmarkOpen(b *testing.B) {
	var path string
	var best int64
	for _, p := range sharedFiles(b) {
		if st, err := os.Stat(p); err == nil && filepath.Base(filepath.Dir(p)) == "vocab" && st.Size() > best {
			path, best = p, st.Size()
		}
	}
	if path == "" {
		b.Fatal("no vocabulary file in the test data")
	}
	b.Logf("%s (%d bytes)", filepath.Base(path), best)
	b.SetBytes(best)
	b.ReportAllocs()
	for b.Loop() {
		f, err := Open(path)
		if err != nil {
			b.Fatal(err)
		}
		f.Close()
	}
}
