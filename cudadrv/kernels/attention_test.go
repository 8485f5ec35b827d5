package kernels

import "testing"

// TestPlanAttentionMMA checks which launches the tensor-core prefill
// kernel takes and with how many heads a block (no GPU needed).
func TestPlanAttentionMMA(t *testing.T) {
	const h200 = 232448 // opt-in shared memory a block on an H200
	const turing = 65536
	prefill := func(nTok, heads, kv, hs int) AttnArgs {
		return AttnArgs{Out: 1 << 20, Q: 2 << 20, K: 3 << 20, V: 4 << 20, NTok: nTok, NHeads: heads, NKV: kv, HeadSize: hs}
	}
	for _, c := range []struct {
		name  string
		a     AttnArgs
		optin int
		hb    int // 0: the CUDA-core kernel
	}{
		{"qwen3-30b-a3b", prefill(512, 32, 4, 128), h200, 8},
		{"qwen3-14b", prefill(512, 40, 8, 128), h200, 1},
		{"tiny-qwen3", prefill(16, 8, 2, 64), h200, 4},
		{"group 6", prefill(100, 12, 2, 64), h200, 2},
		{"MHA 33 tokens", prefill(33, 8, 8, 64), h200, 1},
		{"MHA 31 tokens", prefill(31, 8, 8, 64), h200, 0},
		{"group 4, 8 tokens", prefill(8, 8, 2, 64), h200, 4},
		{"group 4, 7 tokens", prefill(7, 8, 2, 64), h200, 0},
		{"decode", prefill(1, 64, 1, 128), h200, 0},
		{"head size 80", prefill(512, 12, 12, 80), h200, 0},
		{"head size 256", prefill(512, 16, 1, 256), h200, 0},
		{"CC 7.5, head size 128", prefill(512, 32, 4, 128), turing, 0},
		{"CC 7.5, head size 64", prefill(512, 8, 2, 64), turing, 4},
		{"split-K", func() AttnArgs { a := prefill(512, 32, 4, 128); a.Splits = 4; return a }(), h200, 0},
		{"asked for SIMT", func() AttnArgs { a := prefill(512, 32, 4, 128); a.SIMT = true; return a }(), h200, 0},
		{"unaligned Q", func() AttnArgs { a := prefill(512, 32, 4, 128); a.Q += 8; return a }(), h200, 0},
	} {
		p, why := planAttentionMMA(&c.a, c.optin)
		got := 0
		if why == "" {
			got = p.hb
			if p.shared != attnMMAShared(c.a.HeadSize) || p.shared > c.optin {
				t.Errorf("%s: shared memory %d (limit %d)", c.name, p.shared, c.optin)
			}
		}
		if got != c.hb {
			t.Errorf("%s: heads a block %d (%q), want %d", c.name, got, why, c.hb)
		}
	}
	if got := attnMMAShared(128); got != 69632 {
		t.Errorf("shared memory at head size 128: %d, want 4 x 64 x 136 x 2 = 69632 (attention.cu)", got)
	}
}
