package session

import (
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/atsinfer/ats/runtime/model"
	"github.com/atsinfer/ats/tools/synth"
)

// Engine benchmarks on a model in the shape of a real one: decode (one token
// at a time) and prefill (a batch of 128 tokens from an empty cache), with
// the thread counts of the pool. The model is $ATS_BENCH_MODEL, or a
// synthetic Qwen3-0.6B-shaped Q4_K_M file written once into the temporary
// directory (about 0.4 GB, 3 s). Profile with
//
//	go test -run NONE -bench Engine -cpuprofile cpu.out ./runtime
func benchModel(b *testing.B) *model.Model {
	b.Helper()
	path := os.Getenv("ATS_BENCH_MODEL")
	if path == "" {
		path = filepath.Join(os.TempDir(), "ats-bench-qwen3-0.6b-q4_k_m.gguf")
		if _, err := os.Stat(path); err != nil {
			tmp := path + fmt.Sprintf(".%d.tmp", os.Getpid())
			if _, err := synth.Write(tmp, synth.Options{Preset: "qwen3-0.6b", Layout: "q4_k_m", Seed: 1}); err != nil {
				b.Skip("cannot write the benchmark model:", err)
			}
			if err := os.Rename(tmp, path); err != nil {
				b.Fatal(err)
			}
		}
	}
	m, err := model.Open(path)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

func BenchmarkEngine(b *testing.B) {
	m := benchModel(b)
	nv := m.Hyper().NVocab
	for _, threads := range []int{1, 2, 4} {
		b.Run(fmt.Sprintf("decode/t%d", threads), func(b *testing.B) {
			c, err := newCtx(m, Options{Threads: threads, CtxSize: 256})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			b.SetBytes(m.WeightBytes())
			for b.Loop() {
				if c.Pos() == c.CtxSize() {
					c.Truncate(0)
				}
				if _, err := c.EvalView([]int{rng.IntN(nv)}, false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
		b.Run(fmt.Sprintf("prefill128/t%d", threads), func(b *testing.B) {
			c, err := newCtx(m, Options{Threads: threads, CtxSize: 128})
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			rng := rand.New(rand.NewPCG(3, 4))
			toks := make([]int, 128)
			for b.Loop() {
				for i := range toks {
					toks[i] = rng.IntN(nv)
				}
				c.Truncate(0)
				if _, err := c.EvalView(toks, false); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(128*b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}
