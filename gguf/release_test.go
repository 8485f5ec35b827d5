package gguf

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// A tensor's released pages read back unchanged, and only whole pages
// inside a mapped part are released.
func TestReleasePages(t *testing.T) {
	const n = 1 << 16 // floats: 256 KiB, many pages
	path := filepath.Join(t.TempDir(), "r.gguf")
	fd, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	w := NewWriter(fd)
	w.Set("general.architecture", String("test"))
	if err := w.AddTensor("big", TypeF32, []uint64{n}); err != nil {
		t.Fatal(err)
	}
	if err := w.WriteHeader(); err != nil {
		t.Fatal(err)
	}
	want := make([]byte, 4*n)
	for i := range want {
		want[i] = byte(i*7 + i>>9)
	}
	if err := w.WriteTensor("big", want); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if err := fd.Close(); err != nil {
		t.Fatal(err)
	}
	f, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tb, ok := f.Tensor("big")
	if !ok {
		t.Fatal("tensor big not found")
	}
	data := tb.Data
	if !bytes.Equal(data, want) {
		t.Fatal("tensor data differs from what was written")
	}
	got := f.ReleasePages(data)
	page := int64(os.Getpagesize())
	switch {
	case !f.Mapped || runtime.GOOS == "windows":
		if got != 0 {
			t.Fatalf("released %d bytes of unmapped data", got)
		}
	case got < int64(len(data))-2*page || got%page != 0:
		t.Fatalf("released %d bytes of a %d-byte tensor", got, len(data))
	}
	if !bytes.Equal(data, want) {
		t.Fatal("tensor data changed after its pages were released")
	}
	if got := f.ReleasePages(make([]byte, 1<<20)); got != 0 {
		t.Fatalf("released %d bytes of heap memory", got)
	}
	if got := f.ReleasePages(data[:10]); got != 0 {
		t.Fatalf("released %d bytes of a slice inside one page", got)
	}
}
