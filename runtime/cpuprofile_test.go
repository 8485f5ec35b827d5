package runtime

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	"github.com/atsinfer/ats/runtime/cpu"
)

// ATS_CPU_OPS_PROFILE times the CPU backend's ops per batch size, the
// MoE op's parts listed apart, and leaves the results as they are.
func TestCPUOpsProfile(t *testing.T) {
	m := openOracle(t, "tiny-qwen3moe-q4_k_m")
	run := func() ([]float32, string) {
		c, err := m.NewContext(ContextOptions{Backend: BackendCPU, CtxSize: 64, Threads: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
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
		var buf bytes.Buffer
		c.cpu.Report(&buf)
		return last, buf.String()
	}
	plain, report := run()
	if report != "" {
		t.Fatalf("a report with %s unset:\n%s", cpu.EnvCPUProfile, report)
	}
	t.Setenv(cpu.EnvCPUProfile, "1")
	profiled, report := run()
	if !slices.Equal(plain, profiled) {
		t.Fatal("the profiled run computed other logits")
	}
	for _, want := range []string{"batches of 1 tokens: 2 batches", "batches of 5 tokens: 1 batches", "moe > router", "moe > down", "matmul attn_q"} {
		if !strings.Contains(report, want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
}
