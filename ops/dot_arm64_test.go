//go:build !noasm

package ops

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/atsinfer/ats/gguf"
)

// TestNEONDotVariants checks both arm64 code paths (SMULL/SADALP, and SDOT
// where the CPU has the dot-product extension) against the generic dots,
// bit for bit: random bytes (extreme quants such as -128 included), block
// counts across the assembly chunk size, misaligned slices.
func TestNEONDotVariants(t *testing.T) {
	type variant struct {
		name string
		typ  gguf.Type
		dot  func(n int, w, x []byte) float32
		sdot bool
	}
	vs := []variant{
		{"Q8_0/smull", gguf.TypeQ8_0, dotQ8_0NEON, false},
		{"Q8_0/sdot", gguf.TypeQ8_0, dotQ8_0SDOT, true},
		{"Q4_0/smull", gguf.TypeQ4_0, dotQ4_0NEON, false},
		{"Q4_0/sdot", gguf.TypeQ4_0, dotQ4_0SDOT, true},
		{"Q4_K", gguf.TypeQ4_K, dotQ4_KNEON, false},
		{"Q6_K", gguf.TypeQ6_K, dotQ6_KNEON, false},
	}
	t.Logf("dot-product extension: %v", hasSDOT)
	rng := rand.New(rand.NewPCG(11, 12))
	for _, v := range vs {
		t.Run(v.name, func(t *testing.T) {
			if v.sdot && !hasSDOT {
				t.Skip("CPU lacks the dot-product extension")
			}
			k, _ := KernelFor(v.typ)
			ref := genericImpl(v.typ).dot
			for _, nb := range []int{0, 1, 2, 3, 63, 64, 65, 129, 200} {
				n := nb * k.BlockSize
				if k.BlockSize > 32 && nb > 9 {
					continue
				}
				for rep := range 4 {
					w := make([]byte, k.RowBytes(n))
					x := make([]byte, k.ActRowBytes(n))
					switch rep {
					case 0, 1: // random bytes: any quant, any scale bits
						for i := range w {
							w[i] = byte(rng.Uint32())
						}
						for i := range x {
							x[i] = byte(rng.Uint32())
						}
					case 2: // extremes: -128·-128 everywhere, finite scales
						for i := range w {
							w[i] = 0x80
						}
						for i := range x {
							x[i] = 0x80
						}
						for b := 0; b < nb; b++ {
							if v.typ == gguf.TypeQ6_K {
								putF16(w[b*k.BlockBytes+208:], 0.5)
								putF32(x[b*blockQ8_K:], 0.25)
								continue
							}
							putF16(w[b*k.BlockBytes:], 0.5)
							if v.typ == gguf.TypeQ4_K {
								putF16(w[b*k.BlockBytes+2:], 0.125)
								putF32(x[b*blockQ8_K:], 0.25)
							} else {
								putF16(x[b*blockQ8_0:], 0.25)
							}
						}
					case 3: // realistic rows
						if n > 0 {
							if err := Quantize(v.typ, w, gaussRow(n, rng)); err != nil {
								t.Fatal(err)
							}
							k.QuantizeAct(x, gaussRow(n, rng))
						}
					}
					wm, xm := misaligned(w, rng.IntN(16)), misaligned(x, rng.IntN(16))
					got, want := v.dot(n, wm, xm), ref(n, w, x)
					if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
						t.Fatalf("nb=%d rep=%d: %g, generic %g", nb, rep, got, want)
					}
				}
			}
		})
	}
}

// TestNEONLevel: arm64 builds offer the NEON level, and it uses the NEON
// kernels for the types it accelerates.
func TestNEONLevel(t *testing.T) {
	if !levelSupported(LevelNEON) {
		t.Fatalf("levels %v lack neon", SupportedLevels())
	}
	for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ4_0, gguf.TypeQ4_K, gguf.TypeQ6_K} {
		if archImpl(LevelNEON, typ).dot == nil {
			t.Errorf("%s: no NEON dot", typ)
		}
	}
	t.Logf("active level %s (note %q)", CPULevel(), CPUNote())
}
