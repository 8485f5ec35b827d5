package plan

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestProfileCache(t *testing.T) {
	dir := t.TempDir()
	hw := Hardware{CPU: "test cpu", Cores: 8, Threads: 16, CPULevel: "avx512vnni", GPU: "test gpu", Driver: "13.0", VRAM: 24 << 30}
	key := ProfileKey("model-a", hw, []int{1, 32})
	if key == ProfileKey("model-b", hw, []int{1, 32}) || key == ProfileKey("model-a", Hardware{CPU: "other"}, []int{1, 32}) {
		t.Fatal("profile keys do not tell models or machines apart")
	}
	generic := hw
	generic.CPULevel = "generic"
	if key == ProfileKey("model-a", generic, []int{1, 32}) {
		t.Fatal("profile keys do not tell the CPU's kernel levels apart")
	}
	if p, err := LoadProfile(dir, key); p != nil || err != nil {
		t.Fatalf("empty cache: %v, %v", p, err)
	}
	p := &Profile{Version: ProfileVersion, Key: key, Model: "a.gguf", Hardware: hw, Created: time.Unix(1700000000, 0).UTC(),
		Batches: []int{1, 32}, Units: []UnitTimes{{Name: "u", Sig: "matmul", CPU: []float64{1e-3, 2e-2}, GPU: []float64{1e-5, 1e-4},
			CPUAlone: []float64{1e-3, 2e-2}, GPUAlone: []float64{2e-5, 1e-4}, CPUPacked: []float64{7e-4, 1e-2}, CPUPackedAlone: []float64{8e-4, 1.1e-2}}},
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

// Packed takes each unit's CPU times between the file's layout and the
// repacked one by the fraction repacked, leaves units without repacked
// times and the GPU's times alone, and does not change the profile.
func TestProfilePacked(t *testing.T) {
	p := &Profile{Batches: []int{1, 32}, Units: []UnitTimes{
		{Name: "a", CPU: []float64{4, 40}, CPUAlone: []float64{5, 50}, GPU: []float64{1, 2}, GPUAlone: []float64{1, 3},
			CPUPacked: []float64{2, 10}, CPUPackedAlone: []float64{3, 20}},
		{Name: "b", CPU: []float64{4, 40}, CPUAlone: []float64{5, 50}, GPU: []float64{1, 2}, GPUAlone: []float64{1, 3},
			CPUPacked: []float64{2, 10}, CPUPackedAlone: []float64{3, 20}},
		{Name: "attention", CPU: []float64{7, 70}, CPUAlone: []float64{8, 80}, GPU: []float64{1, 2}, GPUAlone: []float64{1, 3}},
		{Name: "c", CPU: []float64{4, 40}, CPUAlone: []float64{5, 50}, GPU: []float64{1, 2}, GPUAlone: []float64{1, 3},
			CPUPacked: []float64{2, 10}, CPUPackedAlone: []float64{3, 20}},
	}}
	before := *p
	before.Units = append([]UnitTimes(nil), p.Units...)
	for i := range before.Units {
		u := &before.Units[i]
		u.CPU, u.CPUAlone = append([]float64(nil), u.CPU...), append([]float64(nil), u.CPUAlone...)
	}
	q := p.Packed([]float64{1, 0.5, 1, 0})
	want := [][2][]float64{
		{{2, 10}, {3, 20}},
		{{3, 25}, {4, 35}},
		{{7, 70}, {8, 80}},
		{{4, 40}, {5, 50}},
	}
	for i, w := range want {
		u := q.Units[i]
		if diff := cmp.Diff(w, [2][]float64{u.CPU, u.CPUAlone}); diff != "" {
			t.Errorf("%s: CPU, CPUAlone (-want +got):\n%s", u.Name, diff)
		}
		if diff := cmp.Diff(p.Units[i].GPU, u.GPU); diff != "" {
			t.Errorf("%s: GPU changed: %s", u.Name, diff)
		}
	}
	if diff := cmp.Diff(&before, p); diff != "" {
		t.Errorf("Packed changed its receiver (-before +after):\n%s", diff)
	}
	if short := p.Packed([]float64{1}); short.Units[1].CPU[0] != 4 {
		t.Errorf("a unit beyond frac took %g, want its own 4", short.Units[1].CPU[0])
	}
}

// Shaped interpolates between the profiled batches, extrapolates past the
// largest, and adds the per-position seconds of the context, no lower
// than half a unit's time.
func TestProfileShaped(t *testing.T) {
	p := &Profile{Batches: []int{1, 32, 128}, DecodePos: 256, DepthPos: 2048,
		Switch: []Link{{Latency: 1}, {Latency: 2}, {Latency: 3}},
		Units: []UnitTimes{
			{Name: "w", CPU: []float64{1, 32, 128}, GPU: []float64{2, 3, 4}, CPUAlone: []float64{1, 32, 128}, GPUAlone: []float64{2, 3, 4}},
			{Name: "attn", CPU: []float64{1, 2, 3}, GPU: []float64{1, 1, 1}, CPUAlone: []float64{1, 2, 3}, GPUAlone: []float64{1, 1, 1},
				CPUPerPos: []float64{0.01, 0.01, 0.01}, GPUPerPos: []float64{0.001, 0.001, 0.001}},
		}}
	for _, c := range []struct {
		rows, depth      int
		wCPU, aCPU, aGPU float64
		sw               float64
	}{
		{1, 0, 1, 1, 1, 1},
		{4, 0, 4, 1 + 3.0/31, 1, 1},
		{32, 100, 32, 2 + 32*100*0.01, 1 + 32*100*0.001, 2},
		{256, 0, 256, 3 + 128.0/96, 1, 3},
		{1, -10000, 1, 0.5, 0.5, 1},
	} {
		q := p.Shaped(c.rows, c.depth)
		if len(q.Batches) != 1 || q.Batches[0] != c.rows || q.BatchIndex(c.rows) != 0 {
			t.Fatalf("rows %d: batches %v", c.rows, q.Batches)
		}
		near := func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }
		if w, a := q.Units[0], q.Units[1]; !near(w.CPU[0], c.wCPU) || !near(a.CPU[0], c.aCPU) || !near(a.GPU[0], c.aGPU) || !near(a.CPUAlone[0], c.aCPU) || q.Switch[0].Latency != c.sw {
			t.Errorf("rows %d depth %d: w CPU %v, attention CPU %v GPU %v alone %v, switch %v; want %v %v %v, %v", c.rows, c.depth, w.CPU, a.CPU, a.GPU, a.CPUAlone, q.Switch, c.wCPU, c.aCPU, c.aGPU, c.sw)
		}
	}
	if p.Units[1].CPU[0] != 1 || len(p.Batches) != 3 {
		t.Error("Shaped changed its profile")
	}
}

// AtDepth moves every batch of a profile to a depth: the decode batch
// from the profile's decode position, the others from none.
func TestProfileAtDepth(t *testing.T) {
	p := &Profile{Batches: []int{1, 32}, DecodePos: 256, DepthPos: 2048,
		Units: []UnitTimes{{Name: "attn", CPU: []float64{1, 2}, GPU: []float64{1, 1}, CPUAlone: []float64{1, 2}, GPUAlone: []float64{1, 1},
			CPUPerPos: []float64{0.001, 0.0001}, GPUPerPos: []float64{0, 0}}}}
	q := p.AtDepth(1256)
	if got, want := q.Units[0].CPU, []float64{1 + 1000*0.001, 2 + 32*1256*0.0001}; math.Abs(got[0]-want[0]) > 1e-9 || math.Abs(got[1]-want[1]) > 1e-9 {
		t.Errorf("CPU %v, want %v", got, want)
	}
	if p.Units[0].CPU[0] != 1 || p.AtDepth(0) != p {
		t.Error("AtDepth changed its profile, or made a copy for no depth")
	}
}
