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

// TestPackedQ4KAMXMatchesVNNI: the AMX product over repacked Q4_K weights
// gives the VNNI kernel's bits for every token, whatever the token count,
// the blocks, the groups, misaligned buffers and outputs wider than the
// groups (the VNNI kernel computing each token alone is the reference,
// as a decode step would). Skips where the CPU or the system has no AMX.
func TestPackedQ4KAMXMatchesVNNI(t *testing.T) {
	if !levelSupported(LevelAVX512VNNI) || !amxUsable() {
		t.Skip("skipping: no AVX-512 VNNI and AMX tiles here (or ATS_CPU_AMX=0)")
	}
	packed := archPacked(LevelAVX512VNNI, gguf.TypeQ4_K)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, nb := range []int{1, 3, 8} {
		for _, nTok := range []int{amxMinTokens, 17, 31, 32, 33, 64, 70, 100, 250, 333} {
			for _, realistic := range []bool{false, true} {
				groups := 1 + rng.IntN(3)
				c := newPackCase(gguf.TypeQ4_K, nb*qkK, groups*packRows, nTok, realistic, rng.IntN(64), rng)
				got := c.runPacked(t, packed) // the tiles: nTok >= amxMinTokens
				want := c.runPacked(t, func(nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
					for t := range nTok {
						packed(nb, w, groups, x[t*ab:], ab, 1, out[t*ldOut:], ldOut)
					}
				})
				for i := range want {
					if got[i] != want[i] {
						t.Fatalf("%d blocks, %d tokens, %d groups (realistic %v): token %d row %d: %v, the VNNI kernel %v",
							nb, nTok, groups, realistic, i/(groups*packRows), i%(groups*packRows), got[i], want[i])
					}
				}
			}
		}
	}
}

// BenchmarkPackedQ4KAMX times the repacked Q4_K product of an MoE expert's
// gate (768×2048) and a dense layer's (4096×2048) for several token counts,
// on the tiles and on the VNNI kernel (tokens one by one up to 16 at a time).
func BenchmarkPackedQ4KAMX(b *testing.B) {
	if !levelSupported(LevelAVX512VNNI) || !amxUsable() {
		b.Skip("skipping: no AVX-512 VNNI and AMX tiles here")
	}
	const n = 2048
	packed := archPacked(LevelAVX512VNNI, gguf.TypeQ4_K)
	vnni := func(nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
		for t := 0; t < nTok; t += amxMinTokens - 1 {
			packed(nb, w, groups, x[t*ab:], ab, min(amxMinTokens-1, nTok-t), out[t*ldOut:], ldOut)
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for _, rows := range []int{768, 4096} {
		for _, nTok := range []int{16, 32, 64, 256} {
			c := newPackCase(gguf.TypeQ4_K, n, rows, nTok, true, 0, rng)
			out := make([]float32, nTok*rows)
			for _, k := range []struct {
				name string
				f    packedMulFunc
			}{{"vnni", vnni}, {"amx", packed}} {
				b.Run(fmt.Sprintf("rows%d/tok%d/%s", rows, nTok, k.name), func(b *testing.B) {
					for b.Loop() {
						k.f(c.nb, c.packed, c.groups, c.xq, c.ab, nTok, out, rows)
					}
					b.ReportMetric(float64(2*n*rows*nTok)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
				})
			}
		}
	}
}

// TestPackedQ4KAMXStaysInBounds: with the activations ending right before
// a page that may not be read, no token count makes the tiles read past
// the last token's row (the last pass moves its tiles back).
func TestPackedQ4KAMXStaysInBounds(t *testing.T) {
	if !levelSupported(LevelAVX512VNNI) || !amxUsable() {
		t.Skip("skipping: no AVX-512 VNNI and AMX tiles here (or ATS_CPU_AMX=0)")
	}
	packed := archPacked(LevelAVX512VNNI, gguf.TypeQ4_K)
	rng := rand.New(rand.NewPCG(13, 14))
	page := syscall.Getpagesize()
	for _, nTok := range []int{16, 20, 32, 33, 47, 64, 70, 250} {
		c := newPackCase(gguf.TypeQ4_K, 2*qkK, packRows, nTok, true, 0, rng)
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
			t.Errorf("%d tokens: the activations at a page's end give other results", nTok)
		}
		if err := syscall.Munmap(mem); err != nil {
			t.Fatal(err)
		}
	}
}
