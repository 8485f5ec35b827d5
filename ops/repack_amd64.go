//go:build !noasm

package ops

import "github.com/atsinfer/ats/gguf"

// The kernels over repacked weights (ops/_asm/packed.go): each computes
// groups of 16 rows for T tokens (1, 2, 4, and 8 and 16 with AVX-512) per
// call.
// AVX-VNNI runs AVX2's: its VEX dot would save little where the
// per-row scaling dominates, and the results are the same bits.
var packedIDs = map[Level]map[gguf.Type]asmID{
	LevelAVX2:       {gguf.TypeQ4_K: asmP4KAVX2, gguf.TypeQ6_K: asmP6KAVX2},
	LevelAVXVNNI:    {gguf.TypeQ4_K: asmP4KAVX2, gguf.TypeQ6_K: asmP6KAVX2},
	LevelAVX512:     {gguf.TypeQ4_K: asmP4KAVX512, gguf.TypeQ6_K: asmP6KAVX512},
	LevelAVX512VNNI: {gguf.TypeQ4_K: asmP4KVNNI, gguf.TypeQ6_K: asmP6KVNNI},
}

// packedBlockBytes is about the repacked weights a kernel call keeps in the
// L2 cache while every token group passes over them; the activations of
// the token group (at most 8 rows) come from L1 and L2.
const packedBlockBytes = 256 << 10

// archPacked returns level l's product over repacked weights of type t
// (nil: none).
func archPacked(l Level, t gguf.Type) packedMulFunc {
	return archPackedTiles(l, t, l == LevelAVX512VNNI && amxUsable())
}

// archPackedTiles is archPacked, with AMX tiles (amxKernels) for the
// token counts they take where amx is set and the level and type have
// them.
func archPackedTiles(l Level, t gguf.Type, amx bool) packedMulFunc {
	id, ok := packedIDs[l][t]
	if !ok {
		return nil
	}
	f := packFormats[t]
	tokens := asmTokens[id]
	amxK, tiles := amxKernels[t]
	tiles = tiles && amx && l == LevelAVX512VNNI
	return func(nb int, w []byte, groups int, x []byte, ab, nTok int, out []float32, ldOut int) {
		if groups <= 0 || nTok <= 0 {
			return
		}
		checkPacked(f, nb, w, groups, x, ab, nTok, out, ldOut)
		if tiles && nTok >= amxK.minTokens {
			mulPackedAMX(amxK.f, amxK.blockBytes, nb, w, groups, x, ab, nTok, out, ldOut)
			return
		}
		if nb == 0 {
			for t := range nTok {
				clear(out[t*ldOut : t*ldOut+groups*packRows])
			}
			return
		}
		gb := nb * f.blockBytes
		block := max(1, packedBlockBytes/gb)
		os := uintptr(4 * ldOut)
		for g0 := 0; g0 < groups; g0 += block {
			ng := min(block, groups-g0)
			wp := &w[g0*gb]
			for t := 0; t < nTok; {
				T := 1
				for _, c := range [...]int{16, 8, 4, 2} {
					if tokens&(1<<c) != 0 && t+c <= nTok {
						T = c
						break
					}
				}
				callMul(id, T, wp, ng, &x[t*ab], uintptr(ab), &out[t*ldOut+g0*packRows], os, nb)
				t += T
			}
		}
	}
}
