package main

import (
	"encoding/json"
	"encoding/xml"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/placement"
	"github.com/atsinfer/ats/runtime/session"
)

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"4.5GiB": 4831838208, "800MiB": 800 << 20, "4.5G": 4831838208, "1GB": 1e9, "0": 0, "123": 123,
		"2 GiB": 2 << 30, "512kib": 512 << 10, "1.5TB": 1.5e12,
	} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "4.5 furlongs", "-1GiB", "1e400", "99999999999TiB"} {
		if _, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) accepted", in)
		}
	}
}

func TestPlacementFlags(t *testing.T) {
	var o session.Options
	pf := placementFlags{backend: "auto", budget: "0", planFor: "decode"}
	if err := pf.apply(&o, nil); err != nil || o.Backend != executor.BackendCPU {
		t.Errorf("--vram-budget 0: backend %q, %v; want the CPU", o.Backend, err)
	}
	for _, bad := range []placementFlags{
		{backend: "tpu", planFor: "decode"},
		{backend: "auto", planFor: "training"},
		{backend: "gpu", budget: "0", planFor: "decode"},
		{backend: "auto", budget: "lots", planFor: "decode"},
		{backend: "auto", placement: "/nonexistent/placement.json", planFor: "decode"},
	} {
		if err := bad.apply(&session.Options{}, nil); err == nil {
			t.Errorf("%+v accepted", bad)
		}
	}
}

// TestPlacementSVG draws a made-up placement and checks the SVG parses and
// shows both backends.
func TestPlacementSVG(t *testing.T) {
	pl := &placement.Placement{Model: "m.gguf", Arch: "qwen3", Layers: 2, Budget: 300 << 20, FixedBytes: 100 << 20, Note: "test"}
	for l := 0; l < 2; l++ {
		for j, role := range []string{"attn_q", "attention", "ffn_down"} {
			b := "cpu"
			if (l+j)%2 == 0 {
				b = "gpu"
			}
			pl.Units = append(pl.Units, placement.UnitPlacement{Name: role, Layer: l, Role: role, Bytes: 100 << 20, Backend: b, Density: float64(j+1) * 1e-12})
		}
	}
	pl.Units = append(pl.Units, placement.UnitPlacement{Name: "output.weight", Layer: -1, Role: "output", Bytes: 50 << 20, Backend: "gpu"})
	svg := placementSVG(pl)
	d := xml.NewDecoder(strings.NewReader(svg))
	for {
		if _, err := d.Token(); err == io.EOF {
			break
		} else if err != nil {
			t.Fatalf("SVG does not parse: %v", err)
		}
	}
	for _, want := range []string{"#2e8b57", "#c8c8c8", "budget for units", "output.weight", "attn_q"} {
		if !strings.Contains(svg, want) {
			t.Errorf("SVG lacks %q", want)
		}
	}
	roles, byLayer, other := placementGrid(pl)
	if len(roles) != 3 || len(byLayer) != 2 || len(other) != 1 {
		t.Errorf("grid: %v roles, %d layers, %d others", roles, len(byLayer), len(other))
	}
}

// profile --cpu-only measures the CPU's side without a GPU, in both
// layouts where the CPU has repacked kernels, and caches nothing.
func TestProfileCPUOnly(t *testing.T) {
	t.Setenv("ATS_CACHE_DIR", t.TempDir())
	out, stderr, err := runATS(t, "profile", "-m", oracleModel(t, "tiny-qwen3-q4_k_m"), "-t", "2", "--cpu-only")
	if err != nil {
		t.Fatalf("%v\n%s", err, stderr)
	}
	for _, want := range []string{"no GPU (the CPU's side only)", "blk.0.attn_q.weight", "output.weight"} {
		if !strings.Contains(out, want) {
			t.Errorf("the output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "switch") || strings.Contains(out, "streaming") {
		t.Errorf("a CPU-only profile shows the GPU's link:\n%s", out)
	}
	if !strings.Contains(stderr, "not cached") {
		t.Errorf("stderr does not say the profile is not cached:\n%s", stderr)
	}
	js, _, err := runATS(t, "profile", "-m", oracleModel(t, "tiny-qwen3-q4_k_m"), "-t", "2", "--cpu-only", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var p plan.Profile
	if err := json.Unmarshal([]byte(js), &p); err != nil {
		t.Fatal(err)
	}
	if p.Version != plan.ProfileVersion || len(p.Units) == 0 || p.Hardware.CPULevel == "" {
		t.Errorf("version %d, %d units, CPU level %q", p.Version, len(p.Units), p.Hardware.CPULevel)
	}
	if slices.ContainsFunc(p.Units, func(u plan.UnitTimes) bool { return len(u.CPUPacked) > 0 }) && !regexp.MustCompile(`\d \(\d+\.\d\)  `).MatchString(out) {
		t.Errorf("the table does not show the repacked times:\n%s", out)
	}
	if strings.Contains(out, "/ 0.0") || strings.Contains(out, "gpu µs") {
		t.Errorf("a CPU-only table with GPU columns:\n%s", out)
	}
	if entries, _ := os.ReadDir(filepath.Join(os.Getenv("ATS_CACHE_DIR"), "profiles")); len(entries) > 0 {
		t.Errorf("a CPU-only profile was cached: %v", entries)
	}
}

// plan --gpu NAME plans for a card that is not here, by an estimate that
// every line says is one; a card ats does not know is an error naming
// those it does.
func TestPlanForCard(t *testing.T) {
	m := oracleModel(t, "tiny-qwen3-q4_k_m")
	out, _, err := runATS(t, "plan", m, "--gpu", "rtx 3060 laptop", "--gpu-vram", "520MiB", "-c", "256", "-b", "32")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, "estimate: ") {
			t.Errorf("a line that does not say it is an estimate: %q", l)
		}
	}
	for _, want := range []string{"RTX 3060 Laptop", "units on the GPU", "layer 0: attn_q:"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, _, err := runATS(t, "plan", m, "--gpu", "voodoo5"); err == nil || !strings.Contains(err.Error(), "RTX 4090") {
		t.Errorf("an unknown card: %v", err)
	}
	if _, _, err := runATS(t, "plan", m, "--gpu-vram", "8GiB"); err == nil || !strings.Contains(err.Error(), "--gpu-bandwidth") {
		t.Errorf("a card of its own without its bandwidth: %v", err)
	}
}
