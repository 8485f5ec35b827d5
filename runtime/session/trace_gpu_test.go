package session

import (
	"bytes"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/executor"
	"github.com/atsinfer/ats/runtime/model"
)

// TestTraceShowsEveryStream: a hybrid context of the MoE oracle that
// streams and splits its prefill batch and promotes every CPU unit at
// decode writes a trace (--trace) that is valid JSON and holds, for the
// prefill batch and for the decode steps, CPU segments, GPU segments and
// weight uploads with their bytes, and for the prefill batch each split
// layer's wait for its routing and the CPU's share. Skips without a GPU.
func TestTraceShowsEveryStream(t *testing.T) {
	dev := needGPUDevice(t)
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	want := loadOracle(t, filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-qwen3moe-q4_k_m.logits.json"))
	const ctx = 128
	pl := splitPrefill(m, forcedPlacement(t, m, ctx, func(i int, _ model.Unit) bool { return i%2 == 1 }), 0.25)
	if pl == nil {
		t.Fatal("no MoE layer streams in the alternating placement")
	}
	var buf bytes.Buffer
	tr := executor.NewTrace(&buf)
	c, err := newCtx(m, Options{Backend: executor.BackendAuto, Device: dev, PromoteEverything: true, Placement: pl, CtxSize: ctx, Threads: 2, Trace: tr})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Eval(want.Prompt, false); err != nil {
		t.Fatal(err)
	}
	for _, tok := range want.Generated[:3] {
		if _, err := c.Eval([]int{tok}, false); err != nil {
			t.Fatal(err)
		}
	}
	c.Close()
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Cat  string         `json:"cat"`
			Ph   string         `json:"ph"`
			TS   float64        `json:"ts"`
			Dur  float64        `json:"dur"`
			TID  int            `json:"tid"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
		t.Fatalf("the trace is not JSON: %v", err)
	}
	type key struct {
		cat string
		tid int
	}
	count := map[key]int{}
	shares, waits := 0, 0
	var uploaded float64
	for _, e := range doc.TraceEvents {
		if e.Ph != "X" {
			continue
		}
		if e.Dur < 0 || e.TS < 0 {
			t.Errorf("%s (%s, thread %d): starts at %.1f µs for %.1f µs", e.Name, e.Cat, e.TID, e.TS, e.Dur)
		}
		count[key{e.Cat, e.TID}]++
		switch {
		case e.TID == 3:
			b, _ := e.Args["bytes"].(float64)
			if b <= 0 {
				t.Errorf("upload %s of %v bytes", e.Name, e.Args["bytes"])
			}
			uploaded += b
		case strings.Contains(e.Name, "the CPU's experts"):
			shares++
		case strings.Contains(e.Name, "waiting for the routing"):
			waits++
		}
	}
	for _, cat := range []string{"prefill", "decode"} {
		for tid, what := range map[int]string{1: "CPU segments", 2: "GPU segments", 3: "weight uploads"} {
			if count[key{cat, tid}] == 0 {
				t.Errorf("no %s in the %s batches", what, cat)
			}
		}
	}
	if shares == 0 || shares != waits {
		t.Errorf("%d shares of split layers and %d waits for their routing, want the same, at least one", shares, waits)
	}
	t.Logf("%d events: %v; %d split layers; %.0f bytes uploaded", len(doc.TraceEvents), count, shares, uploaded)
}
