//go:build !noasm

package ops

import (
	"os"
	"sync"

	"github.com/atsinfer/ats/gguf"
	"github.com/klauspost/cpuid/v2"
)

// AMX tiles for the products over repacked Q4_K and Q6_K weights of many
// tokens (amxQ4K, ops/_asm/amx.go; amxQ6K, amx6.go). The kernels compute
// the VNNI kernels' integers and float steps, so a token's result is the
// same bits whichever computes it: the choice by token count (minTokens)
// keeps the promise of the packed kernels that results do not depend on
// it.
//
// On a core of a Xeon with AMX the tile products run ten times
// VPDPBUSD's rate; the kernels, whose weights must be expanded into tiles
// block by block and whose tiles' sums are scaled on the vector units,
// run an expert's Q4_K gate (768×2048) 1.1 times as fast as the VNNI
// kernels at 16 tokens and 1.8 times at 32-256, its Q6_K down (2048×768)
// 1.0 times at 16-20 tokens, 1.1 at 24, 1.35-1.5 at 32-256 (on the
// development machine, BenchmarkPackedAMX).
//
// The system must grant the process the tiles' register state
// (amxPermission); without the grant, or the CPU features, or with
// ATS_CPU_AMX=0, the VNNI kernels compute every token count.

// EnvCPUAMX set to "0" keeps the AMX tiles unused.
const EnvCPUAMX = "ATS_CPU_AMX"

// amxMinTokens is the fewest tokens a call hands to the tiles: a tile
// holds 16, and the kernel places its tiles within the tokens.
const amxMinTokens = 16

// amxQ6KMin is the fewest tokens the Q6_K tiles take: expanding a block's
// four tiles costs about what the VNNI kernel spends on 16 tokens (the
// same speed at 16 and 20 tokens; in an MoE layer's experts, 24 was
// faster than 16 and 32).
const amxQ6KMin = 24

var amx struct {
	once sync.Once
	ok   bool
}

// amxUsable says whether this process may use AMX tiles, asking the kernel
// for them the first time.
func amxUsable() bool {
	amx.once.Do(func() {
		amx.ok = os.Getenv(EnvCPUAMX) != "0" && cpuid.CPU.Supports(cpuid.AMXINT8, cpuid.AMXTILE) && amxPermission()
	})
	return amx.ok
}

// amxTiles says whether the products may use AMX tiles (CPUKernels).
func amxTiles() bool { return amxUsable() }

// amxConfig is the tile configuration of amxQ4K: palette 1, tiles 0-6 of
// 16 rows of 64 bytes.
var amxConfig = func() *[64]byte {
	var c [64]byte
	c[0] = 1
	for t := 0; t <= 6; t++ {
		c[16+2*t] = 64 // bytes a row (little-endian uint16)
		c[48+t] = 16   // rows
	}
	return &c
}()

// amxTokenBytes is about the activations (Q8_K rows) a run of amxQ4K
// calls reads for every group of rows: a few tokens' worth that stays in
// the L2 cache while the groups pass, as the VNNI kernels' token groups do
// (archPacked). All of a 512-token batch would not (2.4 MB at 4096
// columns), and then every group read it from memory again.
const amxTokenBytes = 256 << 10

// amxKernel is amxQ4K's or amxQ6K's signature: one group of 16 rows for
// the tokens of a run, in the passes of table.
type amxKernel func(cfg *[64]byte, w *byte, nb int, x *byte, ab int, table *[4]int, passes int, out *float32, ldo int)

// amxKernels are the AMX products by weight type, with the bytes of a
// repacked group-block.
var amxKernels = map[gguf.Type]struct {
	f          amxKernel
	blockBytes int
	minTokens  int // the fewest tokens for which the tiles are faster (at least amxMinTokens)
}{
	gguf.TypeQ4_K: {amxQ4K, packQ4KBytes, amxMinTokens},
	gguf.TypeQ6_K: {amxQ6K, packQ6KBytes, amxQ6KMin},
}

// mulPackedAMX is a packedMulFunc over repacked weights of at least 16
// tokens: for each run of tokens (amxTokenBytes, a multiple of 32, the
// last one taking a remainder under 16), the kernel for each group of 16
// rows, with the passes' table (see ops/_asm/amx.go): whole passes of 32
// tokens, and a last one whose tiles end at the run's last token. The
// kernels' first block stores the rows of out, so they need no clearing
// first (clearing them took a sixth of the Q4_K kernel's time in the GPU
// machine's hybrid prefill: each store's line is missing from the cache).
func mulPackedAMX(kernel amxKernel, blockBytes, nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
	if nTok < amxMinTokens {
		panic("ops: the AMX kernel takes 16 tokens or more")
	}
	if nb == 0 || groups == 0 {
		for g := range groups {
			for t := range nTok {
				clear(out[t*ldOut+g*packRows:][:packRows])
			}
		}
		return
	}
	run := max(32, amxTokenBytes/(nb*blockQ8_K)/32*32)
	var buf [32][4]int
	gb := nb * blockBytes
	for t0 := 0; t0 < nTok; {
		n := min(run, nTok-t0)
		if rest := nTok - t0 - n; rest > 0 && rest < amxMinTokens {
			n += rest
		}
		passes := (n + 31) / 32
		table := buf[:]
		if passes > len(buf) {
			table = make([][4]int, passes)
		}
		table = table[:passes]
		for p := range passes - 1 {
			table[p] = [4]int{32 * p, 32*p + 16, 32 * p, 32*p + 32}
		}
		table[passes-1] = [4]int{max(0, n-32), n - 16, 32 * (passes - 1), n}
		for g := range groups {
			kernel(amxConfig, &w[g*gb], nb, &x[t0*ab], ab, &table[0], passes, &out[t0*ldOut+g*packRows], 4*ldOut)
		}
		t0 += n
	}
}
