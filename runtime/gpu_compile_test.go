package runtime

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/ops"
)

// compileOnly compiles m's program for the GPU with made-up device
// pointers: the step list, without a device (runs everywhere).
func compileOnly(t *testing.T, m *Model) *gpuExec {
	t.Helper()
	p := m.Prog
	g := &gpuExec{prog: p, m: m, place: make([]device, len(p.Ops))}
	fake := cudadrv.DevicePtr(1 << 20)
	next := func() cudadrv.DevicePtr { fake += 1 << 12; return fake }
	g.bufs = make([]cudadrv.DevicePtr, len(p.Bufs))
	for i := range g.bufs {
		g.bufs[i] = next()
	}
	g.kvK, g.kvV = make([]cudadrv.DevicePtr, p.Hyper.NLayer), make([]cudadrv.DevicePtr, p.Hyper.NLayer)
	for l := range g.kvK {
		g.kvK[l], g.kvV[l] = next(), next()
	}
	g.dIn = next()
	g.gm = &gpuModel{mats: map[*Weight]*gpuMat{}, vecs: map[*Weight]cudadrv.DevicePtr{}, ropes: map[*ops.Rope]cudadrv.DevicePtr{}}
	for _, w := range programWeights(p) {
		if len(w.Dims) == 1 {
			g.gm.vecs[w] = next()
		} else {
			m := matOf(w, next())
			g.gm.mats[w] = &m
		}
	}
	if err := g.compile(); err != nil {
		t.Fatal(err)
	}
	return g
}

// TestGPUCompileFusions checks the step list the GPU executor makes of
// each architecture's block: which ops fuse, and which steps feed a group
// of products its Q8_1 input.
func TestGPUCompileFusions(t *testing.T) {
	dir := filepath.Join(testenv.SharedDir(t), "testdata", "oracle")
	for name, want := range map[string]string{
		"tiny-qwen3-q4_k_m":    "norm | matmul attn_q.weight,attn_k.weight,attn_v.weight | head_norm+head_norm+rope+kv_store ×2 | attention | matmul attn_output.weight | add+norm | matmul ffn_gate.weight,ffn_up.weight | swiglu | matmul ffn_down.weight | add+norm",
		"tiny-qwen3moe-q4_k_m": "norm | matmul attn_q.weight,attn_k.weight,attn_v.weight | head_norm+head_norm+rope+kv_store ×2 | attention | matmul attn_output.weight | add+norm | moe | moe_sum+add+norm",
		"tiny-llama-q4_0":      "norm | matmul attn_q.weight,attn_k.weight,attn_v.weight | rope+kv_store ×2 | attention | matmul attn_output.weight | add+norm | matmul ffn_gate.weight,ffn_up.weight | swiglu | matmul ffn_down.weight | add+norm",
		"tiny-glm4-q8_0":       "norm | matmul attn_q.weight+bias,attn_k.weight+bias,attn_v.weight+bias | rope+kv_store ×2 | attention | matmul attn_output.weight | norm | add+norm | matmul ffn_up.weight | swiglu | matmul ffn_down.weight | norm | add+norm",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, name+".gguf")
			if _, err := os.Stat(path); err != nil {
				t.Skip(err)
			}
			m, err := Open(path)
			if err != nil {
				t.Fatal(err)
			}
			defer m.Close()
			g := compileOnly(t, m)
			// Layer 0's steps: from the first norm after the embedding up to
			// the first step of layer 1.
			var names []string
			fed := 0
			for i, st := range g.steps {
				op := &g.prog.Ops[st.op]
				if op.Layer == 0 {
					names = append(names, st.name)
				}
				if st.group != nil && st.group.fedQ8 {
					fed++
					if p := g.steps[i-1]; p.link == nil || p.link.group != st.group {
						t.Errorf("step %d (%s) is fed Q8_1 but step %d (%s) does not link to it", i, st.name, i-1, p.name)
					}
				}
			}
			if got := strings.Join(names, " | "); got != want {
				t.Errorf("layer 0 steps:\n got %s\nwant %s", got, want)
			}
			t.Logf("%d ops -> %d steps, %d groups fed Q8_1 by the step before", len(g.prog.Ops), len(g.steps), fed)
		})
	}
}
