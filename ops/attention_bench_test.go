package ops

import (
	"fmt"
	"math/rand/v2"
	"os"
	"testing"
)

// BenchmarkAttentionDepth is one layer's attention at depth, the tiled
// kernel (new) against the one before the paged cache (old, f16 only):
// a 512-token prompt chunk after depth tokens, and a decode step of one
// and of eight sequences each at that depth, for layers shaped like
// Qwen3-14B's (40 heads, 8 KV heads of 128) and Qwen3-30B-A3B's (32 heads,
// 4 KV heads of 128), with f16 and q8_0 caches:
//
//	go test -run NONE -bench AttentionDepth ./ops
//
// The old kernel takes one sequence at a time, so its eight-sequence
// decode is eight calls. ATS_BENCH_OLD=0 leaves the old kernel out (its
// deep prompt chunks take seconds each).
func BenchmarkAttentionDepth(b *testing.B) {
	pool := NewPool(0)
	defer pool.Close()
	type shape struct {
		name        string
		nh, nkv, hs int
	}
	shapes := []shape{{"qwen3-14b", 40, 8, 128}, {"qwen3-30b-a3b", 32, 4, 128}}
	type load struct {
		name         string
		seqs, tokens int // tokens per sequence
		depths       []int
	}
	loads := []load{
		{"prefill512", 1, 512, []int{0, 4096, 16384}},
		{"decode1", 1, 1, []int{4096, 16384}},
		{"decode8", 8, 1, []int{4096, 16384}},
	}
	for _, sh := range shapes {
		a := &Attention{NHeads: sh.nh, NKVHeads: sh.nkv, HeadSize: sh.hs, Scale: DefaultScale(sh.hs)}
		width := sh.nkv * sh.hs
		rng := rand.New(rand.NewPCG(1, 2))
		rows := make([][]float32, 64) // cycled through the cells: random data is slow to make
		for i := range rows {
			rows[i] = gaussRow(width, rng)
		}
		for _, typ := range []KVType{KVF16, KVQ8_0} {
			for _, ld := range loads {
				for _, depth := range ld.depths {
					b.Run(fmt.Sprintf("%s/%s/%s-d%d", sh.name, typ, ld.name, depth), func(b *testing.B) {
						benchAttention(b, pool, a, typ, rows, ld.seqs, ld.tokens, depth)
					})
				}
			}
		}
	}
}

// benchAttention runs one case of BenchmarkAttentionDepth: seqs sequences
// of tokens query tokens after depth cached ones. Besides the time it
// reports the process's CPU time per step (cpu-ms/op): the machine may be
// shared, and the CPU time is the kernel's own work.
func benchAttention(b *testing.B, pool *Pool, a *Attention, typ KVType, rows [][]float32, seqs, tokens, depth int) {
	const block = 256
	width := a.NKVHeads * a.HeadSize
	per := roundUp(depth+tokens, block) // cells of a sequence
	kv, err := NewKVLayer(seqs*per, a.NKVHeads, a.HeadSize, typ)
	if err != nil {
		b.Fatal(err)
	}
	for c := range kv.Rows {
		if err := kv.Store(c, rows[c%len(rows)], rows[(c+7)%len(rows)]); err != nil {
			b.Fatal(err)
		}
	}
	bt := &AttnBatch{Block: block}
	for s := range seqs {
		table := make([]int32, per/block)
		for i := range table {
			table[i] = int32(s*per/block + i)
		}
		bt.Tables = append(bt.Tables, table)
		for t := range tokens {
			bt.Pos = append(bt.Pos, int32(depth+t))
			bt.Seq = append(bt.Seq, int32(s))
		}
	}
	n := len(bt.Pos)
	rng := rand.New(rand.NewPCG(uint64(depth), uint64(n)))
	q := gaussRow(n*a.NHeads*a.HeadSize, rng)
	out := make([]float32, len(q))
	// The bytes of the cache the step must read at least once.
	bytes := 2 * int64(seqs) * int64(depth+tokens) * int64(typ.RowBytes(width))
	timed := func(b *testing.B, step func()) {
		b.SetBytes(bytes)
		cpu0 := processCPUTime()
		for b.Loop() {
			step()
		}
		if cpu := processCPUTime() - cpu0; cpu > 0 {
			b.ReportMetric(float64(cpu.Microseconds())/1e3/float64(b.N), "cpu-ms/op")
		}
	}
	b.Run("new", func(b *testing.B) {
		timed(b, func() {
			if err := a.Run(pool, kv, q, out, bt); err != nil {
				b.Fatal(err)
			}
		})
	})
	if typ != KVF16 || envOff("ATS_BENCH_OLD") {
		return
	}
	b.Run("old", func(b *testing.B) {
		// Each sequence's cells are consecutive: the old kernel reads
		// them as a cache of its own.
		views := make([]*KVLayer, seqs)
		rb := kv.RowBytes()
		for s := range views {
			views[s] = &KVLayer{Type: typ, Rows: per, Width: width, HeadSize: a.HeadSize, K: kv.K[s*per*rb : (s+1)*per*rb], V: kv.V[s*per*rb : (s+1)*per*rb]}
		}
		qs := tokens * a.NHeads * a.HeadSize
		timed(b, func() {
			for s, v := range views {
				if err := a.RunContiguous(pool, v, q[s*qs:(s+1)*qs], out[s*qs:(s+1)*qs], tokens, depth); err != nil {
					b.Fatal(err)
				}
			}
		})
	})
}

// envOff reports whether the environment variable is set to 0.
func envOff(name string) bool { return os.Getenv(name) == "0" }
