package session

import (
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/executor"
)

// The host profile (ATS_CPU_OPS_PROFILE) times the CPU backend's ops per batch size, the
// MoE op's parts listed apart, and leaves the results as they are.
func TestCPUOpsProfile(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	run := func(profile bool) ([]float32, string) {
		var buf strings.Builder
		c, err := newCtx(m, Options{Backend: executor.BackendCPU, CtxSize: 64, Threads: 2, HostProfile: profile,
			Notes: func(s string) { buf.WriteString(s + "\n") }})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Eval([]int{1, 2, 3, 4, 5}, false); err != nil {
			t.Fatal(err)
		}
		var last []float32
		for _, tok := range []int{6, 7} {
			l, err := c.Eval([]int{tok}, false)
			if err != nil {
				t.Fatal(err)
			}
			last = append(last[:0], l...)
		}
		c.Close() // the report comes at Close
		return last, buf.String()
	}
	plain, report := run(false)
	if report != "" {
		t.Fatalf("a report with the profile off:\n%s", report)
	}
	profiled, report := run(true)
	if !slices.Equal(plain, profiled) {
		t.Fatal("the profiled run computed other logits")
	}
	for _, want := range []string{"batches of 1 tokens: 2 batches", "batches of 5 tokens: 1 batches", "moe > router", "moe > down", "matmul attn_q"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
}
