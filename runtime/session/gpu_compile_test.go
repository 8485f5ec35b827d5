package session

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/runtime/backend/cuda"
	"github.com/atsinfer/ats/runtime/model"
)

// TestGPUCompileFusions checks the step list the GPU executor makes of
// each architecture's block: which ops fuse, and which steps feed a group
// of products its Q8_1 input.
func TestGPUCompileFusions(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	for name, want := range map[string]string{
		"tiny-qwen3-q4_k_m":    "norm | matmul attn_q.weight,attn_k.weight,attn_v.weight | head_norm+head_norm+rope+kv_store ×2 | attention | matmul attn_output.weight | add+norm | matmul ffn_gate.weight,ffn_up.weight | swiglu | matmul ffn_down.weight | add+norm",
		"tiny-qwen3moe-q4_k_m": "norm | matmul attn_q.weight,attn_k.weight,attn_v.weight | head_norm+head_norm+rope+kv_store ×2 | attention | matmul attn_output.weight | add+norm | moe | moe_sum+add+norm",
		"tiny-llama-q4_0":      "norm | matmul attn_q.weight,attn_k.weight,attn_v.weight | rope+kv_store ×2 | attention | matmul attn_output.weight | add+norm | matmul ffn_gate.weight,ffn_up.weight | swiglu | matmul ffn_down.weight | add+norm",
		"tiny-glm4-q4_k_m":     "norm | matmul attn_q.weight+bias,attn_k.weight+bias,attn_v.weight+bias | rope+kv_store ×2 | attention | matmul attn_output.weight | norm | add+norm | matmul ffn_up.weight | swiglu | matmul ffn_down.weight | norm | add+norm",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".gguf")
			if _, err := os.Stat(path); err != nil {
				t.Fatal(err)
			}
			m, err := model.Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			all, first, err := cuda.StepNames(m.Prog, 0, len(m.Prog.Ops))
			if err != nil {
				t.Fatal(err)
			}
			// Layer 0's steps: from the first norm after the embedding up to
			// the first step of layer 1.
			var names []string
			fed := 0
			for i, name := range all {
				if m.Prog.Ops[first[i]].Layer == 0 {
					names = append(names, strings.TrimSuffix(name, " (Q8_1 fed)"))
				}
				if strings.HasSuffix(name, " (Q8_1 fed)") {
					fed++
				}
			}
			if got := strings.Join(names, " | "); got != want {
				t.Errorf("layer 0 steps:\n got %s\nwant %s", got, want)
			}
			if fed == 0 {
				t.Errorf("no group is fed its Q8_1 input by the step before")
			}
			t.Logf("%d ops -> %d steps, %d groups fed Q8_1 by the step before", len(m.Prog.Ops), len(all), fed)
		})
	}
}
