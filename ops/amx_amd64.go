//go:build !noasm

package ops

import (
	"os"
	"sync"

	"github.com/klauspost/cpuid/v2"
)

// AMX tiles for the products over repacked Q4_K weights of many tokens
// (amxQ4K, ops/_asm/amx.go). The kernel computes the VNNI kernel's
// integers and float steps, so a token's result is the same bits whichever
// of the two computes it: the choice by token count (amxMinTokens) keeps
// the promise of the packed kernels that results do not depend on it.
//
// On a core of a Xeon with AMX (the development machine) the tile products
// run ten times VPDPBUSD's rate; the kernel, whose weights must be
// expanded into tiles block by block and whose tiles' sums are scaled on
// the vector units, runs a 768×2048 Q4_K product of 32-256 tokens 1.7-2.1
// times as fast as the VNNI kernel there, 1.6-1.9 times on the GPU
// machine, a 4096×2048 one 1.2-1.6 times (BenchmarkPackedQ4KAMX), and an
// MoE layer's experts about 1.2 times (their down products are Q6_K,
// still VNNI's).
//
// The system must grant the process the tiles' register state
// (amxPermission); without the grant, or the CPU features, or with
// ATS_CPU_AMX=0, the VNNI kernel computes every token count.

// EnvCPUAMX set to "0" keeps the AMX tiles unused.
const EnvCPUAMX = "ATS_CPU_AMX"

// amxMinTokens is the fewest tokens a call hands to the tiles: a tile
// holds 16, and the kernel places its tiles within the tokens.
const amxMinTokens = 16

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

// mulPackedQ4KAMX is a packedMulFunc over repacked Q4_K weights of at
// least 16 tokens: for each run of tokens (amxTokenBytes, a multiple of
// 32, the last one taking a remainder under 16), amxQ4K for each group of
// 16 rows, with the passes' table (see ops/_asm/amx.go): whole passes of
// 32 tokens, and a last one whose tiles end at the run's last token. The
// kernel's first block stores the rows of out, so they need no clearing
// first (clearing them took a sixth of the kernel's time in the GPU
// machine's hybrid prefill: each store's line is missing from the cache).
func mulPackedQ4KAMX(nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
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
	gb := nb * packQ4KBytes
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
			amxQ4K(amxConfig, &w[g*gb], nb, &x[t0*ab], ab, &table[0], passes, &out[t0*ldOut+g*packRows], 4*ldOut)
		}
		t0 += n
	}
}
