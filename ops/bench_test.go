package ops

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/atsinfer/ats/gguf"
)

// Kernel benchmarks, one thread, every level this machine runs. SetBytes is
// the weight bytes read per operation, so -bench reports weight GB/s (MB/s
// in Go's units); the extra metric tok/s... is not needed: GB/s × tokens is
// the work. Two working sets: "cache" (256 KiB of weights, compute-bound)
// and "ram" (64 MiB, beyond the caches, the decode situation).
//
//	go test -run NONE -bench Mul ./ops

var benchTypes = []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeQ8_0, gguf.TypeQ4_0, gguf.TypeF16, gguf.TypeF32}

func BenchmarkMul(b *testing.B) {
	const n = 4096
	for _, typ := range benchTypes {
		k, _ := KernelFor(typ)
		rb := k.RowBytes(n)
		for _, size := range []struct {
			name  string
			bytes int
		}{{"cache", 256 << 10}, {"ram", 64 << 20}} {
			rows := max(1, size.bytes/rb)
			rng := rand.New(rand.NewPCG(1, 2))
			row := randomRow(typ, n, rng)
			w := make([]byte, rows*rb)
			for r := range rows {
				copy(w[r*rb:], row)
			}
			for _, nTok := range []int{1, 4, 16} {
				ab := k.ActRowBytes(n)
				xq := make([]byte, nTok*ab)
				for t := range nTok {
					genericImpl(typ).quantAct(xq[t*ab:(t+1)*ab], gaussRow(n, rng))
				}
				out := make([]float32, nTok*rows)
				for _, l := range SupportedLevels() {
					mul := implFor(l, typ).mul
					b.Run(fmt.Sprintf("%s/%s/tok%d/%s", typ, size.name, nTok, l), func(b *testing.B) {
						b.SetBytes(int64(rows * rb))
						for b.Loop() {
							mul(n, w, rb, rows, xq, ab, nTok, out, rows)
						}
						// Multiply-adds per second: the compute view of the same run.
						b.ReportMetric(float64(2*n*rows*nTok)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
					})
				}
			}
		}
	}
}

func BenchmarkQuantizeActLevels(b *testing.B) {
	const n = 4096
	x := gaussRow(n, rand.New(rand.NewPCG(2, 2)))
	for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ4_K, gguf.TypeF16} {
		k, _ := KernelFor(typ)
		dst := make([]byte, k.ActRowBytes(n))
		for _, l := range SupportedLevels() {
			q := implFor(l, typ).quantAct
			b.Run(fmt.Sprintf("%s/%s", k.ActType, l), func(b *testing.B) {
				b.SetBytes(4 * n)
				for b.Loop() {
					q(dst, x)
				}
			})
		}
	}
}

// BenchmarkAttention is one layer's attention of a Qwen3-0.6B-shaped model
// (16 query heads, 8 KV heads of 128) with an f16 cache: a decode step at
// context 64, and a prefill of 128 tokens.
func BenchmarkAttention(b *testing.B) {
	a := &Attention{NHeads: 16, NKVHeads: 8, HeadSize: 128, Scale: DefaultScale(128)}
	rng := rand.New(rand.NewPCG(3, 4))
	kv, err := NewKVLayer(256, 8, 128, KVF16)
	if err != nil {
		b.Fatal(err)
	}
	for pos := 0; pos < 256; pos++ {
		if err := kv.Store(pos, gaussRow(1024, rng), gaussRow(1024, rng)); err != nil {
			b.Fatal(err)
		}
	}
	for _, c := range []struct {
		name       string
		nTok, pos0 int
	}{{"decode64", 1, 63}, {"prefill128", 128, 0}} {
		q := gaussRow(c.nTok*16*128, rng)
		out := make([]float32, len(q))
		for _, l := range SupportedLevels() {
			b.Run(fmt.Sprintf("%s/%s", c.name, l), func(b *testing.B) {
				if err := SetCPULevel(l); err != nil {
					b.Fatal(err)
				}
				defer SetCPULevel(SupportedLevels()[len(SupportedLevels())-1])
				for b.Loop() {
					a.RunContiguous(nil, kv, q, out, c.nTok, c.pos0)
				}
			})
		}
	}
}

// BenchmarkMulPacked compares, one thread, the row kernels (orig) with the
// kernels over repacked weights (packed) on multi-token products (prefill)
// of Q4_K and Q6_K rows of 4096, for weights that stay in the caches and
// weights that stream from memory:
//
//	go test -run NONE -bench MulPacked ./ops
func BenchmarkMulPacked(b *testing.B) {
	const n = 4096
	for _, typ := range packTypes {
		k, _ := KernelFor(typ)
		rb := k.RowBytes(n)
		for _, size := range []struct {
			name  string
			bytes int
		}{{"cache", 256 << 10}, {"ram", 64 << 20}} {
			rows := max(packRows, size.bytes/rb/packRows*packRows)
			rng := rand.New(rand.NewPCG(1, 2))
			data := make([]byte, 0, rows*rb)
			for range packRows {
				data = append(data, randomRow(typ, n, rng)...)
			}
			for len(data) < rows*rb {
				data = append(data, data[:packRows*rb]...)
			}
			m, err := NewMatrix(k, rows, n, data)
			if err != nil {
				b.Fatal(err)
			}
			f := packFormats[typ]
			nb := n / qkK
			packed := make([]byte, rows/packRows*nb*f.blockBytes)
			for g := range rows / packRows {
				f.pack(packed[g*nb*f.blockBytes:], m.Data[g*packRows*rb:], rb, nb)
			}
			for _, nTok := range []int{1, 2, 3, 4, 7, 16, 64} {
				ab := k.ActRowBytes(n)
				xq := make([]byte, nTok*ab)
				for t := range nTok {
					genericImpl(typ).quantAct(xq[t*ab:(t+1)*ab], gaussRow(n, rng))
				}
				out := make([]float32, nTok*rows)
				for _, l := range SupportedLevels() {
					mul, pmul := implFor(l, typ).mul, archPacked(l, typ)
					if l == LevelGeneric || pmul == nil {
						continue
					}
					// GFLOP/s from wall time, and cpu-GFLOP/s from the thread's
					// CPU time (the kernel's own speed on a shared machine).
					run := func(b *testing.B, f func()) {
						runtime.LockOSThread()
						defer runtime.UnlockOSThread()
						b.SetBytes(int64(rows * rb))
						c0 := threadCPUTime()
						for b.Loop() {
							f()
						}
						flop := float64(2*n*rows*nTok) * float64(b.N)
						b.ReportMetric(flop/b.Elapsed().Seconds()/1e9, "GFLOP/s")
						if c := threadCPUTime() - c0; c > 0 {
							b.ReportMetric(flop/c.Seconds()/1e9, "cpu-GFLOP/s")
						}
					}
					b.Run(fmt.Sprintf("%s/%s/tok%d/%s/orig", typ, size.name, nTok, l), func(b *testing.B) {
						run(b, func() { mul(n, m.Data, rb, rows, xq, ab, nTok, out, rows) })
					})
					b.Run(fmt.Sprintf("%s/%s/tok%d/%s/packed", typ, size.name, nTok, l), func(b *testing.B) {
						run(b, func() { pmul(nb, packed, rows/packRows, xq, ab, nTok, out, rows) })
					})
				}
			}
		}
	}
}

// BenchmarkRepack is the load-time cost of Matrix.Repack: bytes of
// original weights repacked per second, one thread.
func BenchmarkRepack(b *testing.B) {
	const n, rows = 4096, 1024
	for _, typ := range packTypes {
		k, _ := KernelFor(typ)
		rng := rand.New(rand.NewPCG(1, 3))
		data := make([]byte, 0, rows*k.RowBytes(n))
		for range rows {
			data = append(data, randomRow(typ, n, rng)...)
		}
		m, _ := NewMatrix(k, rows, n, data)
		b.Run(typ.String(), func(b *testing.B) {
			withPackedKernels(b, packedKernelsOrTwins(), func() {
				runtime.LockOSThread()
				defer runtime.UnlockOSThread()
				b.SetBytes(int64(len(data)))
				c0 := threadCPUTime()
				for b.Loop() {
					m.Repack()
				}
				if c := threadCPUTime() - c0; c > 0 {
					b.ReportMetric(float64(len(data))*float64(b.N)/c.Seconds()/1e9, "cpu-GB/s")
				}
			})
		})
	}
}
