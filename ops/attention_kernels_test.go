package ops

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// The attention's tile kernels of every level against the twins: shapes
// with every row and vector remainder, strided and misaligned operands,
// guards around the outputs.

// levelAttn is level l's tile kernels (the generic ones where it has none).
func levelAttn(l Level) attnKernels {
	if k := archAttn(l); k != nil {
		return *k
	}
	return attnKernelsGeneric
}

// misalignedF32 returns a copy of x starting off floats into a larger
// slice whose other elements are guards.
func misalignedF32(x []float32, off int) []float32 {
	buf := make([]float32, len(x)+off+16)
	for i := range buf {
		buf[i] = guard
	}
	copy(buf[off:], x)
	return buf[off : off+len(x)]
}

func TestAttnGemmKernels(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		k := levelAttn(l)
		rng := rand.New(rand.NewPCG(uint64(l), 101))
		for _, c := range []struct{ m, n, k int }{
			{1, 8, 1}, {6, 16, 128}, {7, 64, 64}, {13, 72, 33}, {64, 128, 128}, {5, 128, 64}, {3, 24, 5}, {2, 7, 3}, {11, 136, 64}, {1, 200, 9},
		} {
			for _, trans := range []bool{false, true} {
				for _, scale := range []bool{false, true} {
					// A as rows (sai = lda, sap = 1) or as columns (sai = 1, sap = lda).
					lda := c.k + 3
					sai, sap := lda, 1
					alen := (c.m-1)*lda + c.k
					if trans {
						lda = c.m + 5
						sai, sap = 1, lda
						alen = (c.k-1)*lda + c.m
					}
					a := misalignedF32(randVec(rng, alen, 1), rng.IntN(8))
					ldb := c.n + rng.IntN(9)
					b := misalignedF32(randVec(rng, (c.k-1)*ldb+c.n, 1), rng.IntN(8))
					ldc := c.n + 1 + rng.IntN(9)
					c0 := randVec(rng, (c.m-1)*ldc+c.n, 1)
					var rs []float32
					if scale {
						rs = randVec(rng, c.m, 1)
					}
					got := misalignedF32(c0, rng.IntN(8))
					full := got[:len(got)+8]
					want := append([]float32(nil), c0...)
					k.gemm(c.m, c.n, c.k, a, sai, sap, b, ldb, got, ldc, rs)
					gemmGeneric(c.m, c.n, c.k, a, sai, sap, b, ldb, want, ldc, rs)
					for i := len(got); i < len(full); i++ {
						if !isGuard(full[i]) {
							t.Fatalf("%+v: wrote past C", c)
						}
					}
					for i := range c.m {
						for j := range ldc {
							e := i*ldc + j
							if e >= len(want) {
								break
							}
							if j >= c.n {
								if got[e] != c0[e] {
									t.Fatalf("%+v: C[%d][%d] between rows changed", c, i, j)
								}
								continue
							}
							var mag float64
							if rs != nil {
								mag = math.Abs(float64(c0[e] * rs[i]))
							} else {
								mag = math.Abs(float64(c0[e]))
							}
							for p := range c.k {
								mag += math.Abs(float64(a[i*sai+p*sap]) * float64(b[p*ldb+j]))
							}
							if d := math.Abs(float64(got[e] - want[e])); d > 1e-6*mag {
								t.Fatalf("%+v trans=%v scale=%v: C[%d][%d] = %g, twin %g", c, trans, scale, i, j, got[e], want[e])
							}
						}
					}
				}
			}
		}
	})
}

func TestAttnSoftmaxKernels(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		k := levelAttn(l)
		rng := rand.New(rand.NewPCG(uint64(l), 102))
		for _, c := range []struct{ kt, n int }{{1, 8}, {64, 16}, {64, 128}, {13, 24}, {64, 40}, {3, 5}, {64, 136}} {
			for _, round := range []bool{false, true} {
				ld := c.n + rng.IntN(5)
				k0 := int32(rng.IntN(500))
				s0 := randVec(rng, (c.kt-1)*ld+c.n, 30)
				lim := make([]int32, c.n)
				mx0 := make([]float32, c.n)
				l0 := make([]float32, c.n)
				for i := range lim {
					// Positions before, inside and after the tile, and padding.
					lim[i] = k0 + int32(rng.IntN(c.kt+10)) - 5
					if i%7 == 6 {
						lim[i] = -1
					}
					mx0[i], l0[i] = noMax, 0
					if i%3 == 1 { // a running softmax from earlier tiles
						mx0[i], l0[i] = float32(rng.NormFloat64()*5), 1+rng.Float32()*10
					}
				}
				type state struct{ s, mx, l, ms []float32 }
				run := func(f func(s []float32, kt, n, ld int, lim []int32, k0 int32, scale float32, mx, l, ms []float32, round bool)) state {
					st := state{misalignedF32(s0, rng.IntN(8)), append([]float32(nil), mx0...), append([]float32(nil), l0...), make([]float32, c.n)}
					f(st.s, c.kt, c.n, ld, lim, k0, 0.09, st.mx, st.l, st.ms, round)
					return st
				}
				got, want := run(k.softmax), run(softmaxColsGeneric)
				near := func(what string, i int, g, w float32) {
					if d := math.Abs(float64(g - w)); d > 4e-7*math.Abs(float64(w))+1e-37 {
						// f16 rounding of a value near a tie may go either way.
						if !(round && what == "weight" && d <= math.Abs(float64(w))/1024) {
							t.Fatalf("kt=%d n=%d round=%v: %s %d = %g, twin %g", c.kt, c.n, round, what, i, g, w)
						}
					}
				}
				for i := range c.n {
					near("max", i, got.mx[i], want.mx[i])
					near("sum", i, got.l[i], want.l[i])
					near("rescale", i, got.ms[i], want.ms[i])
				}
				for j := range c.kt {
					for i := range c.n {
						e := j*ld + i
						if k0+int32(j) > lim[i] && got.s[e] != 0 {
							t.Fatalf("kt=%d n=%d: masked weight [%d][%d] = %g", c.kt, c.n, j, i, got.s[e])
						}
						near("weight", e, got.s[e], want.s[e])
					}
				}
			}
		}
	})
}

func TestAttnLoadKernels(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		k := levelAttn(l)
		rng := rand.New(rand.NewPCG(uint64(l), 103))
		for _, typ := range []KVType{KVF16, KVQ8_0, KVQ4_0, KVF32} {
			for _, cols := range []int{32, 64, 128, 96, 40, 8} {
				if typ.quantized() && cols%qk != 0 {
					continue
				}
				for _, rows := range []int{1, 3, 64} {
					width := 3*cols + 64 // a head of a row of several
					layer, err := NewKVLayer(rows, 1, width, typ)
					if err != nil {
						t.Fatal(err)
					}
					for r := range rows {
						x := randVec(rng, width, 1)
						x[0] = 0 // a zero block scale in q4_0/q8_0 stays exact
						if err := layer.Store(r, x, x); err != nil {
							t.Fatal(err)
						}
					}
					rb := layer.RowBytes()
					src := misaligned(layer.K, rng.IntN(64))[typ.RowBytes(cols):]
					got := misalignedF32(make([]float32, rows*cols), rng.IntN(8))
					full := got[:len(got)+8]
					want := make([]float32, rows*cols)
					k.load(typ, got, src, rb, rows, cols)
					loadTileGeneric(typ, want, src, rb, rows, cols)
					for i := range want {
						if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
							t.Fatalf("%s cols=%d rows=%d: value %d = %g, twin %g", typ, cols, rows, i, got[i], want[i])
						}
					}
					for _, g := range full[len(got):] {
						if !isGuard(g) {
							t.Fatalf("%s cols=%d rows=%d: wrote past the tile", typ, cols, rows)
						}
					}
				}
			}
		}
	})
}

// BenchmarkAttnGemm is the tile product of a prompt unit (256 query rows
// of head size 128, a tile of 64 keys) on one thread: the scores (keys ×
// rows) and the output update (rows × head), in GFLOP/s of wall time and
// of the thread's CPU time (the machine may be shared):
//
//	go test -run NONE -bench AttnGemm -cpu 1 ./ops
func BenchmarkAttnGemm(b *testing.B) {
	rng := rand.New(rand.NewPCG(1, 1))
	const rows, hs, keys = 256, 128, attnTileKeys
	kf, qt := gaussRow(keys*hs, rng), gaussRow(hs*rows, rng)
	st, o, ms := make([]float32, keys*rows), make([]float32, rows*hs), make([]float32, rows)
	for i := range ms {
		ms[i] = 1
	}
	for _, l := range SupportedLevels() {
		k := levelAttn(l)
		b.Run(l.String(), func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			cpu0 := threadCPUTime()
			for b.Loop() {
				clear(st)
				k.gemm(keys, rows, hs, kf, hs, 1, qt, rows, st, rows, nil)
				k.gemm(rows, hs, keys, st, 1, rows, kf, hs, o, hs, ms)
			}
			flops := float64(4*rows*hs*keys) * float64(b.N)
			b.ReportMetric(flops/b.Elapsed().Seconds()/1e9, "GFLOP/s")
			if cpu := threadCPUTime() - cpu0; cpu > 0 {
				b.ReportMetric(flops/cpu.Seconds()/1e9, "GFLOP/cpu-s")
			}
		})
	}
}
