package plan

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestProfileCache(t *testing.T) {
	dir := t.TempDir()
	hw := Hardware{CPU: "test cpu", Cores: 8, Threads: 16, GPU: "test gpu", Driver: "13.0", VRAM: 24 << 30}
	key := ProfileKey("model-a", hw, []int{1, 32})
	if key == ProfileKey("model-b", hw, []int{1, 32}) || key == ProfileKey("model-a", Hardware{CPU: "other"}, []int{1, 32}) {
		t.Fatal("profile keys do not tell models or machines apart")
	}
	if p, err := LoadProfile(dir, key); p != nil || err != nil {
		t.Fatalf("empty cache: %v, %v", p, err)
	}
	p := &Profile{Version: ProfileVersion, Key: key, Model: "a.gguf", Hardware: hw, Created: time.Unix(1700000000, 0).UTC(),
		Batches: []int{1, 32}, Units: []UnitTimes{{Name: "u", Sig: "matmul", CPU: []float64{1e-3, 2e-2}, GPU: []float64{1e-5, 1e-4},
			CPUAlone: []float64{1e-3, 2e-2}, GPUAlone: []float64{2e-5, 1e-4}}},
		Switch: []Link{{Latency: 1e-5, BytesPerSec: 1e10}, {Latency: 1e-5, BytesPerSec: 2e10}}, Stream: Link{BytesPerSec: 5e10}}
	if err := SaveProfile(dir, p); err != nil {
		t.Fatal(err)
	}
	got, err := LoadProfile(dir, key)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(p, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	// A profile of another version is measured again.
	p.Version = ProfileVersion + 1
	if err := SaveProfile(dir, p); err != nil {
		t.Fatal(err)
	}
	if got, _ := LoadProfile(dir, key); got != nil {
		t.Error("a profile of another version was reused")
	}
	if err := os.WriteFile(filepath.Join(dir, key+".json"), []byte("{"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadProfile(dir, key); err == nil {
		t.Error("a corrupt profile loaded without error")
	}
}

func TestBatchIndexAndLink(t *testing.T) {
	p := &Profile{Batches: []int{1, 32, 128, 512}}
	for n, want := range map[int]int{1: 0, 2: 0, 8: 1, 32: 1, 60: 1, 70: 2, 300: 3, 512: 3, 4096: 3} {
		if got := p.BatchIndex(n); got != want {
			t.Errorf("BatchIndex(%d) = %d, want %d", n, got, want)
		}
	}
	l := Link{Latency: 1e-5, BytesPerSec: 1e9}
	if got := l.Time(1e6); got < 1.0099e-3 || got > 1.0101e-3 {
		t.Errorf("1 MB at 1 GB/s plus 10 µs: %g s", got)
	}
}
