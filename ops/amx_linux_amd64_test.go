//go:build !noasm

package ops

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"syscall"
	"testing"

	"github.com/atsinfer/ats/gguf"
)

// TestPackedAMXMatchesVNNI: the AMX products over repacked Q4_K and Q6_K
// weights give the VNNI kernels' bits for every token, whatever the token
// count, the blocks, the groups, misaligned buffers and outputs wider than
// the groups (the VNNI kernel computing each token alone is the reference,
// as a decode step would). Skips where the CPU or the system has no AMX.
func TestPackedAMXMatchesVNNI(t *testing.T) {
	if !levelSupported(LevelAVX512VNNI) || !amxUsable() {
		t.Skip("skipping: no AVX-512 VNNI and AMX tiles here (or ATS_CPU_AMX=0)")
	}
	rng := rand.New(rand.NewPCG(11, 12))
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K} {
		packed := archPacked(LevelAVX512VNNI, typ)
		for _, nb := range []int{1, 3, 8} {
			for _, nTok := range []int{amxMinTokens, 17, 31, 32, 33, 64, 70, 100, 250, 333} {
				for _, realistic := range []bool{false, true} {
					groups := 1 + rng.IntN(3)
					c := newPackCase(typ, nb*qkK, groups*packRows, nTok, realistic, rng.IntN(64), rng)
					got := c.runPacked(t, packed) // the tiles, where the type takes nTok tokens (amxKernels)
					want := c.runPacked(t, func(nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
						for t := range nTok {
							packed(nb, w, groups, x[t*ab:], ab, 1, out[t*ldOut:], ldOut)
						}
					})
					for i := range want {
						if got[i] != want[i] {
							t.Fatalf("%v: %d blocks, %d tokens, %d groups (realistic %v): token %d row %d: %v, the VNNI kernel %v",
								typ, nb, nTok, groups, realistic, i/(groups*packRows), i%(groups*packRows), got[i], want[i])
						}
					}
				}
			}
		}
	}
}

// BenchmarkPackedAMX times the repacked products of an MoE expert's gate
// (Q4_K 768×2048) and down (Q6_K 2048×768), and of a dense layer's Q4_K
// 4096×2048, for several token counts, on the tiles and on the VNNI
// kernels (16 tokens at a time, then 8, 4, 2, 1).
func BenchmarkPackedAMX(b *testing.B) {
	if !levelSupported(LevelAVX512VNNI) || !amxUsable() {
		b.Skip("skipping: no AVX-512 VNNI and AMX tiles here")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, m := range []struct {
		typ        gguf.Type
		rows, cols int
	}{{gguf.TypeQ4_K, 768, 2048}, {gguf.TypeQ6_K, 2048, 768}, {gguf.TypeQ4_K, 4096, 2048}} {
		packed, vnni := archPacked(LevelAVX512VNNI, m.typ), archPackedTiles(LevelAVX512VNNI, m.typ, false)
		for _, nTok := range []int{16, 20, 24, 32, 64, 256} {
			c := newPackCase(m.typ, m.cols, m.rows, nTok, true, 0, rng)
			out := make([]float32, nTok*m.rows)
			for _, k := range []struct {
				name string
				f    packedMulFunc
			}{{"vnni", vnni}, {"amx", packed}} {
				b.Run(fmt.Sprintf("%v/%dx%d/tok%d/%s", m.typ, m.rows, m.cols, nTok, k.name), func(b *testing.B) {
					for b.Loop() {
						k.f(c.nb, c.packed, c.groups, c.xq, c.ab, nTok, out, m.rows)
					}
					b.ReportMetric(float64(2*m.cols*m.rows*nTok)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// TestPackedAMXStaysInBounds: with the activations ending right before
// a page that may not be read, no token count makes the tiles read past
// the last token's row (the last pass moves its tiles back).
func TestPackedAMXStaysInBounds(t *testing.T) {
	if !levelSupported(LevelAVX512VNNI) || !amxUsable() {
		t.Skip("skipping: no AVX-512 VNNI and AMX tiles here (or ATS_CPU_AMX=0)")
	}
	rng := rand.New(rand.NewPCG(13, 14))
	page := syscall.Getpagesize()
	for i := range 16 {
		typ, nTok := gguf.TypeQ4_K, []int{16, 20, 32, 33, 47, 64, 70, 250}[i%8]
		if i >= 8 {
			typ = gguf.TypeQ6_K
		}
		packed := archPacked(LevelAVX512VNNI, typ)
		c := newPackCase(typ, 2*qkK, packRows, nTok, true, 0, rng)
		size := nTok * c.ab
		n := (size+page-1)/page*page + page
		mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			t.Fatal(err)
		}
		if err := syscall.Mprotect(mem[n-page:], syscall.PROT_NONE); err != nil {
			t.Fatal(err)
		}
		x := mem[n-page-size : n-page]
		copy(x, c.xq[:size])
		want := c.runPacked(t, packed)
		c.xq = x
		if got := c.runPacked(t, packed); !slices.Equal(got, want) {
			t.Errorf("%v, %d tokens: the activations at a page's end give other results", typ, nTok)
		}
		if err := syscall.Munmap(mem); err != nil {
			t.Fatal(err)
		}
	}
}
