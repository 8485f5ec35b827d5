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
		{"Q5_K", gguf.TypeQ5_K, dotQ5_KNEON, false},
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
							if v.typ == gguf.TypeQ4_K || v.typ == gguf.TypeQ5_K {
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
	for _, typ := range []gguf.Type{gguf.TypeQ8_0, gguf.TypeQ4_0, gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeF32, gguf.TypeF16} {
		if archImpl(LevelNEON, typ).dot == nil {
			t.Errorf("%s: no NEON dot", typ)
		}
	}
	t.Logf("active level %s (note %q)", CPULevel(), CPUNote())
}

// TestNEONFloatDots checks the F32 and F16 dots against the generic ones:
// the products are the same float32 products, summed in float64 in another
// order, so the results agree to float64 rounding of the sum (far inside
// the float kernels' 2e-5 relative tolerance); lengths around the 8-element
// step, misaligned slices.
func TestNEONFloatDots(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	for _, c := range []struct {
		typ gguf.Type
		dot func(n int, w, x []byte) float32
	}{{gguf.TypeF32, dotF32NEON}, {gguf.TypeF16, dotF16NEON}} {
		t.Run(c.typ.String(), func(t *testing.T) {
			k, _ := KernelFor(c.typ)
			ref := genericImpl(c.typ).dot
			for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 64, 255, 256, 1000, 4096} {
				for rep := range 3 {
					w := make([]byte, k.RowBytes(n))
					x := make([]byte, k.ActRowBytes(n))
					xs, ws := gaussRow(n, rng), gaussRow(n, rng)
					if rep == 2 { // exactly representable small integers: exact sums
						for i := range xs {
							xs[i], ws[i] = float32(rng.IntN(9)-4), float32(rng.IntN(9)-4)
						}
					}
					if err := Quantize(c.typ, w, ws); err != nil {
						t.Fatal(err)
					}
					k.QuantizeAct(x, xs)
					var mag float64
					for i := range n {
						mag += math.Abs(float64(xs[i]) * float64(ws[i]))
					}
					wm, xm := misaligned(w, rng.IntN(16)), misaligned(x, rng.IntN(16))
					got, want := c.dot(n, wm, xm), ref(n, w, x)
					if d := math.Abs(float64(got) - float64(want)); d > 1e-6*mag+1e-30 || rep == 2 && got != want {
						t.Fatalf("n=%d rep=%d: %g, generic %g", n, rep, got, want)
					}
				}
			}
		})
	}
}

// TestNEONMulQ8_0 checks the two-token Q8_0 product (both code paths)
// against the generic dot of every row and token, bit for bit: token counts
// odd and even, block counts across the chunk size, padded row and token
// strides, misaligned slices.
func TestNEONMulQ8_0(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	for _, sdot := range []bool{false, true} {
		if sdot && !hasSDOT {
			continue
		}
		mul := mulQ8_0With(sdot)
		for _, nb := range []int{0, 1, 3, 64, 65, 130} {
			n := nb * qk
			for _, nTok := range []int{1, 2, 3, 4, 5} {
				rows := 3
				rb, ab := nb*blockQ8_0+rng.IntN(3), nb*blockQ8_0+rng.IntN(3)
				w := make([]byte, rows*rb)
				x := make([]byte, nTok*ab)
				for i := range w {
					w[i] = byte(rng.Uint32())
				}
				for i := range x {
					x[i] = byte(rng.Uint32())
				}
				if nb > 0 && nTok > 1 {
					k, _ := KernelFor(gguf.TypeQ8_0)
					if err := Quantize(gguf.TypeQ8_0, w[rb:rb+nb*blockQ8_0], gaussRow(n, rng)); err != nil {
						t.Fatal(err)
					}
					k.QuantizeAct(x[ab:ab+nb*blockQ8_0], gaussRow(n, rng))
				}
				ld := rows + 1
				out := make([]float32, nTok*ld)
				wm, xm := misaligned(w, rng.IntN(16)), misaligned(x, rng.IntN(16))
				mul(n, wm, rb, rows, xm, ab, nTok, out, ld)
				for tk := range nTok {
					for r := range rows {
						want := dotQ8_0(n, w[r*rb:(r+1)*rb], x[tk*ab:(tk+1)*ab])
						got := out[tk*ld+r]
						if math.Float32bits(got) != math.Float32bits(want) && !(got != got && want != want) {
							t.Fatalf("sdot=%v nb=%d nTok=%d tok=%d row=%d: %g, generic %g", sdot, nb, nTok, tk, r, got, want)
						}
					}
					if out[tk*ld+rows] != 0 {
						t.Fatalf("sdot=%v nb=%d nTok=%d: wrote past the rows", sdot, nb, nTok)
					}
				}
			}
		}
	}
}
