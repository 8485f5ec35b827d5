package plan

import (
	"fmt"
	"strings"
	"testing"
)

// qwen3Shapes are the decode units of a Qwen3 dense model at Q4_K_M
// (4.5 bits a weight; ffn_down and attn_v at Q6_K, 6.56 bits), with a
// F16 KV cache of ctx tokens read at position pos: the shapes of
// `ats synth --preset qwen3-14b`, without its 8.4 GiB of weights.
func qwen3Shapes(layers, hidden, ffn, heads, kvHeads, headDim, vocab, ctx, pos int) []Shape {
	q4 := func(n int) int64 { return int64(float64(n) * 4.5 / 8) }
	q6 := func(n int) int64 { return int64(float64(n) * 6.5625 / 8) }
	mat := func(name string, in, out int, bytes func(int) int64) Shape {
		b := bytes(in * out)
		return Shape{Name: name, Bytes: b, ReadBytes: b, FLOPsPerToken: 2 * float64(in*out), InBytes: int64(4 * in)}
	}
	var s []Shape
	s = append(s, Shape{Name: "token_embd", Bytes: q4(hidden * vocab), ReadBytes: int64(hidden) / 2})
	kvRow := int64(2 * 2 * kvHeads * headDim) // K and V, F16
	for l := range layers {
		p := fmt.Sprintf("blk.%d.", l)
		s = append(s, mat(p+"attn_q", hidden, heads*headDim, q4), mat(p+"attn_k", hidden, kvHeads*headDim, q4),
			mat(p+"attn_v", hidden, kvHeads*headDim, q6),
			Shape{Name: p + "attention", Bytes: kvRow * int64(ctx), ReadBytes: kvRow * int64(pos),
				FLOPsPerToken: float64(4 * heads * headDim * pos), InBytes: int64(4 * (heads + 2*kvHeads) * headDim), Attention: true},
			mat(p+"attn_output", heads*headDim, hidden, q4),
			mat(p+"ffn_gate", hidden, ffn, q4), mat(p+"ffn_up", hidden, ffn, q4), mat(p+"ffn_down", ffn, hidden, q6))
	}
	return append(s, mat("output", hidden, vocab, q6))
}

// CI plans the paper's laptop (RTX 3060 Laptop, 6 GB; an 8-core CPU) for
// Qwen3-14B and checks the map is sane: every attention on the GPU (its
// KV cache is small and its time per byte large), the largest FFN
// matrices on the CPU, and the budget kept.
func TestEstimateQwen3_14BOnLaptop(t *testing.T) {
	card, err := FindCard("rtx3060-laptop")
	if err != nil {
		t.Fatal(err)
	}
	if card.VRAM != 6*gib {
		t.Fatalf("card %+v", card)
	}
	shapes := qwen3Shapes(40, 5120, 17408, 40, 8, 128, 151936, 4096, 1024)
	const fixed = 600 << 20 // the context's buffers, staging ring and vectors
	pl, units, err := EstimateStatic(shapes, LaptopCPU, card, fixed)
	if err != nil {
		t.Fatal(err)
	}
	if pl.GPUBytes > card.VRAM-fixed {
		t.Errorf("%d bytes placed, budget %d", pl.GPUBytes, card.VRAM-fixed)
	}
	var attnGPU, attn int
	var cpuBytes, cpuFFN int64
	for i, u := range units {
		if strings.HasSuffix(u.Name, "attention") {
			attn++
			if pl.On[i] == GPU {
				attnGPU++
			}
		}
		if pl.On[i] == CPU {
			cpuBytes += u.Bytes
			if strings.Contains(u.Name, "ffn_") {
				cpuFFN += u.Bytes
			}
		}
	}
	// Most attentions on the GPU (the estimate leaves a few at the CPU
	// where a switch would cost more than the attention saves).
	if attnGPU < attn*3/4 {
		t.Errorf("%d of %d attentions on the GPU, want most", attnGPU, attn)
	}
	// What stays on the CPU is the largest matrices: the FFNs (and the
	// embedding table, which a step reads one row of); in a roofline every
	// memory-bound matrix saves the same time per byte, so the switches
	// decide among them.
	if float64(cpuFFN) < 0.6*float64(cpuBytes-units[0].Bytes) {
		t.Errorf("of %d MiB on the CPU, %d MiB are FFN matrices; want most", cpuBytes>>20, cpuFFN>>20)
	}
	est := pl.Time
	if est <= 0 || 1/est > 30 {
		t.Errorf("estimated decode %.1f tokens/s: not plausible for 14B on this laptop", 1/est)
	}
	t.Logf("estimate: %.1f tokens/s, %d MiB on the GPU, %d switches", 1/est, pl.GPUBytes>>20, pl.Switches)
}

func TestFindCard(t *testing.T) {
	for _, n := range []string{"RTX 3060 Laptop", "rtx3060laptop", "3060-laptop", "H200", "a100 80gb", "l4"} {
		if _, err := FindCard(n); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
	if _, err := FindCard("Voodoo 3"); err == nil {
		t.Error("an unknown card was found")
	}
	for _, c := range Cards {
		if c.VRAM <= 0 || c.MemBW <= 0 || c.FLOPs <= 0 || c.LinkBW <= 0 {
			t.Errorf("%s: %+v", c.Name, c)
		}
	}
}
