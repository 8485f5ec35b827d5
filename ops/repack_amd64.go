//go:build !noasm

package ops

import (
	"sync"

	"github.com/atsinfer/ats/gguf"
)

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
		// Tokens [0, padAt) in calls of the sizes the level has; the
		// tail from padAt, if any, in one padded call (paddedTail).
		padAt, padT := nTok, 0
		for t := 0; t < nTok; t += tokenStep(tokens, nTok-t) {
			if T := paddedTail(tokens, nTok-t); T > 0 {
				padAt, padT = t, T
				break
			}
		}
		var pad *padBuf
		if padT > 0 {
			pad = newPadBuf(padT, x[padAt*ab:], ab, nTok-padAt, nb, block*packRows)
			defer padBufs.Put(pad)
		}
		for g0 := 0; g0 < groups; g0 += block {
			ng := min(block, groups-g0)
			wp := &w[g0*gb]
			for t := 0; t < padAt; {
				T := tokenStep(tokens, padAt-t)
				callMul(id, T, wp, ng, &x[t*ab], uintptr(ab), &out[t*ldOut+g0*packRows], os, nb)
				t += T
			}
			if pad != nil {
				ld := block * packRows
				callMul(id, padT, wp, ng, &pad.x[0], uintptr(ab), &pad.out[0], uintptr(4*ld), nb)
				for t := padAt; t < nTok; t++ {
					copy(out[t*ldOut+g0*packRows:][:ng*packRows], pad.out[(t-padAt)*ld:])
				}
			}
		}
	}
}

// tokenStep is the largest token count of a kernel call (tokens: the
// counts the level has, bit T for T) that r tokens fill.
func tokenStep(tokens uint32, r int) int {
	for _, c := range [...]int{16, 8, 4, 2} {
		if tokens&(1<<c) != 0 && c <= r {
			return c
		}
	}
	return 1
}

// paddedTail is the token count of the one call that computes a tail of
// r tokens, a zero row added (0: none). A tail of 3, 7 or 15 tokens would
// take three or four calls (2+1, 4+2+1, 8+4+2+1), each unpacking the
// weights again; the next size up with one row of padding costs less
// (VNNI, 768×2048 Q4_K on the development machine: 27 µs for four tokens
// against 33 for three, 49 for eight against 60 for seven; Q6_K 2048×768
// 43 against 49 and 74 against 92). Two rows of padding do not pay (six
// tokens: 45 µs as 4+2, 49 as eight), nor does padding the file-layout
// kernels (asmMul), whose calls unpack little: 21.9 µs for three tokens
// against 20.8 for four (BenchmarkMulPacked's orig).
func paddedTail(tokens uint32, r int) int {
	if (r == 3 || r == 7 || r == 15) && tokens&(1<<(r+1)) != 0 {
		return r + 1
	}
	return 0
}

// padBuf is the scratch of a padded call: T activation rows, the tail's
// then zero ones, and T output rows of a block of groups.
type padBuf struct {
	x   []byte
	out []float32
}

var padBufs = sync.Pool{New: func() any { return new(padBuf) }}

// newPadBuf is a padBuf for a call of T tokens over the r tail rows of x
// (ab bytes apart, nb blocks each; the last may end there) and outputs
// ld floats a token.
func newPadBuf(T int, x []byte, ab, r, nb, ld int) *padBuf {
	b := padBufs.Get().(*padBuf)
	if cap(b.x) < T*ab {
		b.x = make([]byte, T*ab)
	}
	if cap(b.out) < T*ld {
		b.out = make([]float32, T*ld)
	}
	b.x, b.out = b.x[:T*ab], b.out[:T*ld]
	rb := nb * blockQ8_K
	for t := range T {
		if t < r {
			copy(b.x[t*ab:t*ab+rb], x[t*ab:t*ab+rb])
		} else {
			clear(b.x[t*ab : t*ab+rb]) // the kernel reads rb bytes a row
		}
	}
	return b
}
