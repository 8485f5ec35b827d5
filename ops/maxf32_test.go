package ops

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestMaxF32 checks each level's kernel against its twin: lengths around
// the four-vector chunks (tails), starts off the vector alignment, NaN
// anywhere (never the answer), infinities, all-NaN and empty input.
func TestMaxF32(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		k := archMaxF32(l)
		if k == nil {
			t.Skip("no MaxF32 kernel at this level")
		}
		rng := rand.New(rand.NewPCG(uint64(l), 91))
		nan := float32(math.NaN())
		for _, n := range []int{0, 1, 7, 31, 32, 33, 63, 64, 65, 127, 128, 200, 1000, 151936} {
			for _, off := range []int{0, 1, 3} {
				buf := make([]float32, n+off)
				x := buf[off:]
				for i := range x {
					x[i] = float32(rng.NormFloat64() * 10)
				}
				cases := map[string][]float32{"random": x}
				if n > 0 {
					withNaN := append([]float32(nil), x...)
					for i := 0; i < n; i += 1 + rng.IntN(5) {
						withNaN[i] = nan
					}
					withNaN[rng.IntN(n)] = 1e30 // a finite winner among NaNs
					cases["nan"] = withNaN
					allNaN := make([]float32, n)
					for i := range allNaN {
						allNaN[i] = nan
					}
					cases["all-nan"] = allNaN
					inf := append([]float32(nil), x...)
					inf[n-1] = float32(math.Inf(1))
					cases["+inf last"] = inf
					ninf := make([]float32, n)
					for i := range ninf {
						ninf[i] = float32(math.Inf(-1))
					}
					cases["all -inf"] = ninf
				}
				for name, c := range cases {
					got, want := k(c), maxF32Generic(c)
					if math.Float32bits(got) != math.Float32bits(want) && !(got == 0 && want == 0) {
						t.Fatalf("n=%d off=%d %s: %v, want %v", n, off, name, got, want)
					}
				}
			}
		}
	})
}

func BenchmarkMaxF32(b *testing.B) {
	x := make([]float32, 151936)
	for i := range x {
		x[i] = float32(i%977) * 0.001
	}
	b.SetBytes(int64(4 * len(x)))
	for b.Loop() {
		MaxF32(x)
	}
}

// TestLogitsKernels checks each level's sanitizing copy and first-above
// scan against their twins: tails, starts off the alignment, NaN, ±Inf,
// the largest float, and a threshold at, below and above the data.
func TestLogitsKernels(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		sa, fa := archLogits(l)
		if sa == nil {
			t.Skip("no logits kernels at this level")
		}
		rng := rand.New(rand.NewPCG(uint64(l), 92))
		specials := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)), math.MaxFloat32, -math.MaxFloat32, 0}
		for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 100, 1001} {
			for _, off := range []int{0, 1, 5} {
				buf := make([]float32, n+off)
				x := buf[off:]
				for i := range x {
					x[i] = float32(rng.NormFloat64())
					if rng.IntN(6) == 0 {
						x[i] = specials[rng.IntN(len(specials))]
					}
				}
				got, want := make([]float32, n+2), make([]float32, n)
				got[n], got[n+1] = 7, 7
				sa(got[:n], x)
				sanitizeGeneric(want, x)
				if got[n] != 7 || got[n+1] != 7 {
					t.Fatalf("n=%d off=%d: wrote past the end", n, off)
				}
				for i := range want {
					if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
						t.Fatalf("n=%d off=%d: sanitize[%d] of %v = %v, want %v", n, off, i, x[i], got[i], want[i])
					}
				}
				for _, th := range []float32{-10, 0, 0.5, 2, 3.5, float32(math.Inf(-1)), math.MaxFloat32} {
					if g, w := fa(x, th), firstAboveGeneric(x, th); g != w {
						t.Fatalf("n=%d off=%d: first above %v = %d, want %d", n, off, th, g, w)
					}
				}
			}
		}
	})
}
