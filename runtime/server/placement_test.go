package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atsinfer/ats/plan"
	"github.com/atsinfer/ats/runtime/placement"
)

// modelShape is what testPlacementMap needs of a model's architecture.
type modelShape struct {
	name, arch                          string
	layers, hidden, ffn, heads, kvHeads int
	headDim, vocab, ctx                 int
}

// qwen3_14B is Qwen3-14B's shape.
var qwen3_14B = modelShape{name: "qwen3-14b-q4_k_m.gguf", arch: "qwen3", layers: 40, hidden: 5120, ffn: 17408,
	heads: 40, kvHeads: 8, headDim: 128, vocab: 151936, ctx: 4096}

// testPlacementMap stands in for the lead's producer in tests: a placement
// map in the contract's shape (helper-notes/placement-api.md) for a model of
// the given shape at Q4_K, with each unit's time modelled from the bytes
// it reads (CPU 60 GB/s, GPU 3 TB/s plus a launch) and the backends chosen
// by ats's planner (plan.Static) under the VRAM budget.
func testPlacementMap(t testing.TB, m modelShape, budget int64) []byte {
	t.Helper()
	q4k := func(rows, cols int) int64 { return int64(rows) * int64(cols) / 256 * 144 }
	q6k := func(rows, cols int) int64 { return int64(rows) * int64(cols) / 256 * 210 }
	var units []placement.UnitPlacement
	add := func(name string, layer int, role, op, typ string, bytes int64) {
		cpu := float64(bytes) / 60e9
		gpu := float64(bytes)/3e12 + 4e-6
		if op == "embed" { // a row lookup: nothing to gain on the GPU
			cpu, gpu = 2e-6, 4e-6
		}
		units = append(units, placement.UnitPlacement{Index: len(units), Name: name, Layer: layer, Role: role, Op: op, Type: typ,
			Bytes: bytes, CPU: cpu, GPU: gpu, Density: (cpu - gpu) / float64(bytes)})
	}
	q, kv := m.heads*m.headDim, m.kvHeads*m.headDim
	add("token_embd.weight", -1, "token_embd", "embed", "Q4_K", q4k(m.vocab, m.hidden))
	for l := range m.layers {
		blk := fmt.Sprintf("blk.%d.", l)
		add(blk+"attn_q.weight", l, "attn_q", "matmul", "Q4_K", q4k(q, m.hidden))
		add(blk+"attn_k.weight", l, "attn_k", "matmul", "Q4_K", q4k(kv, m.hidden))
		add(blk+"attn_v.weight", l, "attn_v", "matmul", "Q6_K", q6k(kv, m.hidden))
		add(blk+"attention", l, "attention", "attention", "kv_f16", int64(2*m.ctx*kv*2))
		add(blk+"attn_output.weight", l, "attn_output", "matmul", "Q4_K", q4k(m.hidden, q))
		add(blk+"ffn_gate.weight", l, "ffn_gate", "matmul", "Q4_K", q4k(m.ffn, m.hidden))
		add(blk+"ffn_up.weight", l, "ffn_up", "matmul", "Q4_K", q4k(m.ffn, m.hidden))
		add(blk+"ffn_down.weight", l, "ffn_down", "matmul", "Q6_K", q6k(m.hidden, m.ffn))
	}
	add("output.weight", -1, "output", "matmul", "Q6_K", q6k(m.vocab, m.hidden))

	fixed := budget / 12
	p := plan.Problem{Budget: budget - fixed, ToGPU: 20e-6, ToCPU: 20e-6, Start: plan.CPU, End: plan.CPU}
	for _, u := range units {
		p.Units = append(p.Units, plan.Unit{Name: u.Name, Bytes: u.Bytes, CPU: u.CPU, GPU: u.GPU})
	}
	sol, err := plan.Static(p)
	if err != nil {
		t.Fatal(err)
	}
	var gpuBytes, cpuBytes int64
	for i := range units {
		units[i].Backend = sol.On[i].String()
		if sol.On[i] == plan.GPU {
			gpuBytes += units[i].Bytes
		} else {
			cpuBytes += units[i].Bytes
		}
	}
	b, err := json.Marshal(&placement.Placement{Model: m.name, Arch: m.arch, Layers: m.layers, OptimizedFor: "decode",
		Budget: budget, FixedBytes: fixed, GPUBytes: gpuBytes, CPUBytes: cpuBytes,
		Predicted: &placement.Prediction{DecodeTokensPerS: 1 / sol.Time, PrefillTokensPerS: 1400, PrefillBatch: 512},
		Units:     units})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestPlacementEndpoint(t *testing.T) {
	tiny := modelShape{name: "tiny", arch: "qwen3", layers: 3, hidden: 256, ffn: 768, heads: 8, kvHeads: 2, headDim: 64, vocab: 512, ctx: 256}
	placement := testPlacementMap(t, tiny, 2<<20)
	var providerErr error
	var provided []byte
	ts := startServer(t, Config{APIKey: "k", PlacementMap: func() ([]byte, error) { return provided, providerErr }})
	get := func(key string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest("GET", ts.url+"/v1/ats/placement", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}

	provided = placement
	code, body := get("k")
	if code != 200 {
		t.Fatalf("status %d: %s", code, body)
	}
	var got, want any
	json.Unmarshal(body, &got)
	json.Unmarshal(placement, &want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("placement changed on the way (-want +got):\n%s", diff)
	}
	if code, _ := get(""); code != 401 {
		t.Errorf("without the key: status %d, want 401", code)
	}

	providerErr = errors.New("the plan is being recomputed")
	if code, body := get("k"); code != 500 || !containsAll(string(body), "placement map", "recomputed") {
		t.Errorf("provider error: %d %s", code, body)
	}
	providerErr, provided = nil, []byte("{not json")
	if code, body := get("k"); code != 500 || !containsAll(string(body), "not JSON") {
		t.Errorf("invalid JSON: %d %s", code, body)
	}

	// CPU only: no provider.
	cpu := startServer(t, Config{})
	resp, err := http.Get(cpu.url + "/v1/ats/placement")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var e struct {
		Error apiError `json:"error"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&e); err != nil || resp.StatusCode != 404 || e.Error.Code == nil || *e.Error.Code != "no_placement" {
		t.Errorf("CPU only: status %d, error %+v (%v)", resp.StatusCode, e.Error, err)
	}
}

func TestTestPlacementMapSplits(t *testing.T) {
	// 6 GiB for a 14B model at Q4_K (about 8.4 GiB of weights): the plan
	// must split, or the machine page's screenshot shows nothing useful.
	var p struct {
		Units []struct {
			Backend string `json:"backend"`
		} `json:"units"`
	}
	if err := json.Unmarshal(testPlacementMap(t, qwen3_14B, 6<<30), &p); err != nil {
		t.Fatal(err)
	}
	n := map[string]int{}
	for _, u := range p.Units {
		n[u.Backend]++
	}
	if n["gpu"] == 0 || n["cpu"] == 0 {
		t.Errorf("backends %v: want a split", n)
	}
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
