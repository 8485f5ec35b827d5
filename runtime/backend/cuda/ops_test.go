package cuda

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"testing"
	"unsafe"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend/cpu"
)

// The GPU op table, after llama.cpp's test-backend-ops: every non-weight
// kernel of the GPU backend against its CPU twin, op × shapes (odd sizes
// included), fresh random inputs per case, outputs poisoned with NaN
// before the launch, NaN/Inf checked, normalised error under a bound per
// op. Subtests are named op/shape, so `-run 'TestGPUOps/rope'` filters by
// op. Without a GPU every test here skips and says why.

// needGPUDevice returns the shared device or skips the test.
func needGPUDevice(t testing.TB) *Device {
	t.Helper()
	if ok, reason := cudadrv.Available(); !ok {
		t.Skip("skipping GPU test: " + reason)
	}
	dev, err := Open(0)
	if errors.Is(err, cudadrv.ErrUnavailable) {
		t.Skip("skipping GPU test: " + err.Error())
	}
	if err != nil {
		t.Fatal(err)
	}
	return dev
}

// gpuT bundles a device, a stream and the allocations of one test case.
type gpuT struct {
	t   *testing.T
	dev *Device
	s   *cudadrv.Stream
	rng *rand.Rand
}

func newGPUT(t *testing.T, dev *Device, seed uint64) *gpuT {
	s, err := dev.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Destroy() })
	return &gpuT{t: t, dev: dev, s: s, rng: rand.New(rand.NewPCG(seed, 0xa7a7))}
}

// randn returns n values, normal with the given scale.
func (g *gpuT) randn(n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(g.rng.NormFloat64() * scale)
	}
	return v
}

func (g *gpuT) alloc(bytes int) cudadrv.DevicePtr {
	p, err := g.dev.ctx.Alloc(max(bytes, 4))
	if err != nil {
		g.t.Fatal(err)
	}
	g.t.Cleanup(func() { g.dev.ctx.Free(p) })
	return p
}

func bytesOf[T any](v []T) []byte {
	if len(v) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&v[0])), len(v)*int(unsafe.Sizeof(v[0])))
}

// up copies v to a new device buffer, in the order of the case's stream:
// a synchronous copy from pageable memory may return before its DMA lands,
// and the legacy stream it runs on does not order the case's non-blocking
// stream (the copy stages v before it returns).
func up[T any](g *gpuT, v []T) cudadrv.DevicePtr {
	b := bytesOf(v)
	p := g.alloc(len(b))
	if err := g.s.CopyHtoD(p, b); err != nil {
		g.t.Fatal(err)
	}
	return p
}

// poison allocates n float32 (or int32) slots filled with a NaN pattern,
// in the case's stream's order (a memset on the legacy stream could land
// after a kernel of the case's stream wrote the buffer).
func (g *gpuT) poison(n int) cudadrv.DevicePtr {
	p := g.alloc(4 * n)
	if err := g.s.MemsetD32(p, 0x7fc00bad, n); err != nil {
		g.t.Fatal(err)
	}
	return p
}

// down waits for the stream and copies n values back.
func down[T any](g *gpuT, p cudadrv.DevicePtr, n int) []T {
	if err := g.s.Synchronize(); err != nil {
		g.t.Fatal(err)
	}
	v := make([]T, n)
	if err := g.dev.ctx.CopyDtoH(bytesOf(v), p); err != nil {
		g.t.Fatal(err)
	}
	return v
}

func (g *gpuT) check(err error) {
	g.t.Helper()
	if err != nil {
		g.t.Fatal(err)
	}
}

// expectClose checks got against want: finite, NMSE under bound.
func expectClose(t *testing.T, what string, got, want []float32, bound float64) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d values, want %d", what, len(got), len(want))
	}
	for i, v := range got {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			t.Fatalf("%s: value %d is %v (want %v): unwritten or overflowed", what, i, v, want[i])
		}
	}
	e := nmse(got, want)
	if e > bound || math.IsNaN(e) {
		worst := 0
		for i := range got {
			if math.Abs(float64(got[i]-want[i])) > math.Abs(float64(got[worst]-want[worst])) {
				worst = i
			}
		}
		t.Fatalf("%s: NMSE %.3g over the bound %.0e (worst at %d: %v, want %v)", what, e, bound, worst, got[worst], want[worst])
	}
	t.Logf("%s: NMSE %.3g (bound %.0e)", what, e, bound)
}

func TestGPUOps(t *testing.T) {
	dev := needGPUDevice(t)
	seed := uint64(1)
	run := func(name string, f func(g *gpuT)) {
		seed++
		s := seed
		t.Run(name, func(t *testing.T) { f(newGPUT(t, dev, s)) })
	}

	// Programmatic dependent launch (cudadrv Stream.SetProgrammatic, the
	// compute stream's mode on CC 9.0+): a chain of 128 kernels, each
	// reading what the one before wrote, launched eagerly and replayed from
	// a graph. A kernel whose griddepcontrol.wait came too late would read
	// x before the previous kernel's write and lose a term: exact sums.
	run("programmatic/chain", func(g *gpuT) {
		if !g.s.SetProgrammatic(true) {
			g.t.Skip("no programmatic dependent launch on this device or driver")
		}
		const n, steps = 300007, 64
		x, y := g.randn(n, 1), g.randn(n, 1)
		dx, dy := up(g, x), up(g, y)
		chain := func() error {
			for range steps {
				if err := errors.Join(dev.elem.AddF32(g.s, dx, dx, dy, n), dev.elem.ScaleF32(g.s, dx, dx, 1, n)); err != nil {
					return err
				}
			}
			return nil
		}
		want := append([]float32(nil), x...)
		sums := func() {
			for range steps {
				for i := range want {
					want[i] += y[i]
				}
			}
		}
		g.check(chain())
		sums()
		expectClose(g.t, "eager chain", down[float32](g, dx, n), want, 0)
		graph, err := g.s.Capture(cudadrv.CaptureRelaxed, chain)
		g.check(err)
		defer graph.Destroy()
		ge, err := graph.Instantiate(0)
		g.check(err)
		defer ge.Destroy()
		for range 3 {
			g.check(ge.Launch(g.s))
			sums()
		}
		expectClose(g.t, "replayed chain", down[float32](g, dx, n), want, 0)
	})

	// rms_norm: rows × cols, with and without a weight, in place.
	for _, c := range []struct {
		rows, cols      int
		weight, inPlace bool
	}{{1, 5120, true, false}, {7, 257, true, false}, {3, 1, false, false}, {513, 64, true, true}, {2, 8193, false, true}} {
		run(fmt.Sprintf("rms_norm/rows=%d,cols=%d,w=%v,inplace=%v", c.rows, c.cols, c.weight, c.inPlace), func(g *gpuT) {
			x := g.randn(c.rows*c.cols, 3)
			var w []float32
			var dw cudadrv.DevicePtr
			if c.weight {
				w = g.randn(c.cols, 1)
				dw = up(g, w)
			}
			dx := up(g, x)
			dst := dx
			if !c.inPlace {
				dst = g.poison(len(x))
			}
			g.check(dev.norm.RMSNorm(g.s, dst, dx, dw, c.cols, 1e-6, c.rows))
			want := make([]float32, len(x))
			for r := 0; r < c.rows; r++ {
				ops.RMSNorm(want[r*c.cols:(r+1)*c.cols], x[r*c.cols:(r+1)*c.cols], w, 1e-6)
			}
			expectClose(g.t, "rms_norm", down[float32](g, dst, len(x)), want, 1e-10)
		})
	}

	// add_rms_norm: sum = a + b in place of a, then the norm.
	for _, c := range []struct{ rows, cols int }{{1, 5120}, {5, 4097}, {64, 96}} {
		run(fmt.Sprintf("add_rms_norm/rows=%d,cols=%d", c.rows, c.cols), func(g *gpuT) {
			n := c.rows * c.cols
			a, b, w := g.randn(n, 2), g.randn(n, 2), g.randn(c.cols, 1)
			da, db, dw, dst := up(g, a), up(g, b), up(g, w), g.poison(n)
			g.check(dev.norm.AddRMSNorm(g.s, da, da, db, dst, dw, c.cols, 1e-5, c.rows))
			sum, want := make([]float32, n), make([]float32, n)
			ops.Add(sum, a, b)
			for r := 0; r < c.rows; r++ {
				ops.RMSNorm(want[r*c.cols:(r+1)*c.cols], sum[r*c.cols:(r+1)*c.cols], w, 1e-5)
			}
			expectClose(g.t, "sum", down[float32](g, da, n), sum, 0)
			expectClose(g.t, "norm", down[float32](g, dst, n), want, 1e-10)
		})
	}

	// rms_norm_ex: the norm with the residual add, the MoE weighted sum
	// and the Q8_1 output of the next product fused in, each optional.
	for _, c := range []struct {
		rows, cols, k    int
		add, norm, q8    bool
		weight, storeSum bool
	}{
		{1, 5120, 0, false, true, true, true, false},  // norm → Q8_1 (decode)
		{3, 2048, 0, true, true, true, true, true},    // add + norm → Q8_1
		{1, 2048, 8, true, true, true, true, true},    // moe sum + add + norm → Q8_1
		{5, 256, 2, true, false, false, false, true},  // moe sum + add alone
		{7, 96, 0, true, true, false, false, true},    // add + norm, no weight
		{2, 4096, 4, true, true, false, true, false},  // moe sum + add + norm, sum not stored
		{2, 4096, 8, true, true, true, true, true},    // moe sum wider than the register path: the loop
		{3, 992, 10, true, true, true, true, true},    // more slots than the register path holds
		{1, 2048, 3, true, false, false, false, true}, // moe sum + add alone, register path
	} {
		run(fmt.Sprintf("rms_norm_ex/rows=%d,cols=%d,k=%d,add=%v,norm=%v,q8=%v,w=%v,sum=%v", c.rows, c.cols, c.k, c.add, c.norm, c.q8, c.weight, c.storeSum), func(g *gpuT) {
			n := c.rows * c.cols
			a := g.randn(n, 2)
			var term []float32
			args := kernels.NormEx{A: up(g, a), Cols: c.cols, Rows: c.rows, Eps: 1e-6}
			if c.add {
				if c.k > 0 {
					y, yw := g.randn(n*c.k, 1), g.randn(c.rows*c.k, 0.3)
					args.Y, args.YW, args.K = up(g, y), up(g, yw), c.k
					term = make([]float32, n)
					for r := 0; r < c.rows; r++ {
						for d := 0; d < c.cols; d++ {
							var t float32
							for j := 0; j < c.k; j++ {
								p := y[(r*c.k+j)*c.cols+d] * yw[r*c.k+j]
								if j == 0 {
									t = p
								} else {
									t += p
								}
							}
							term[r*c.cols+d] = t
						}
					}
				} else {
					term = g.randn(n, 2)
					args.B = up(g, term)
				}
				args.BOut = g.poison(n)
			}
			x := append([]float32(nil), a...)
			if term != nil {
				ops.Add(x, a, term)
			}
			if c.storeSum {
				args.Sum = g.poison(n)
			}
			var w []float32
			if c.weight {
				w = g.randn(c.cols, 1)
				args.W = up(g, w)
			}
			if c.norm {
				args.Dst = g.poison(n)
			}
			if c.q8 {
				args.Q8Planes = 1
				args.Q8 = g.alloc(kernels.Q8_1PlanesBytes(2, c.rows, c.cols))
			}
			g.check(dev.norm.RMSNormEx(g.s, &args))
			if c.add {
				expectClose(g.t, "term", down[float32](g, args.BOut, n), term, 0)
			}
			if c.storeSum {
				expectClose(g.t, "sum", down[float32](g, args.Sum, n), x, 0)
			}
			if !c.norm {
				return
			}
			want := make([]float32, n)
			for r := 0; r < c.rows; r++ {
				ops.RMSNorm(want[r*c.cols:(r+1)*c.cols], x[r*c.cols:(r+1)*c.cols], w, 1e-6)
			}
			got := down[float32](g, args.Dst, n)
			expectClose(g.t, "norm", got, want, 1e-10)
			if c.q8 {
				checkQ8(g, args.Q8, got, c.rows, c.cols, 1)
				// Again in two planes: the same outputs, and both planes.
				args.Q8Planes = 2
				g.check(dev.norm.RMSNormEx(g.s, &args))
				expectClose(g.t, "norm (two planes)", down[float32](g, args.Dst, n), want, 1e-10)
				checkQ8(g, args.Q8, got, c.rows, c.cols, 2)
			}
		})
	}

	// swiglu_q8_1: SwiGLU with the Q8_1 form of its output.
	for _, c := range []struct{ rows, width, planes int }{{1, 17408, 1}, {3, 768, 1}, {1, 17408, 2}, {3, 768, 2}} {
		run(fmt.Sprintf("swiglu_q8_1/rows=%d,width=%d,planes=%d", c.rows, c.width, c.planes), func(g *gpuT) {
			n := c.rows * c.width
			gate, upv := g.randn(n, 3), g.randn(n, 3)
			want := make([]float32, n)
			ops.SwiGLU(want, gate, upv)
			dg, q8 := up(g, gate), g.alloc(kernels.Q8_1PlanesBytes(c.planes, c.rows, c.width))
			g.check(dev.glu.SwiGLUQ8(g.s, dg, dg, up(g, upv), c.width, c.width, c.rows, q8, c.planes))
			got := down[float32](g, dg, n)
			expectClose(g.t, "swiglu", got, want, 1e-12)
			checkQ8(g, q8, got, c.rows, c.width, c.planes)
		})
	}

	// rope (and head norms before it): layouts, partial rotary, factors,
	// scaling, one or two tensors, positions from device memory.
	type ropeCase struct {
		nTok, pos0, heads0, heads1, hs, dims int
		neox, norm, factors                  bool
		freqScale                            float32
	}
	for _, c := range []ropeCase{
		{1, 0, 8, 2, 64, 64, true, true, false, 1},          // qwen3 decode at 0
		{7, 123, 8, 2, 64, 64, true, true, false, 1},        // qwen3 prefill
		{1, 4000, 40, 8, 128, 128, true, true, false, 1},    // qwen3-14b decode, far position
		{33, 5, 8, 4, 32, 32, false, false, true, 1},        // llama with rope factors
		{5, 17, 8, 2, 64, 32, false, false, false, 1},       // glm4: half the head rotated
		{3, 1000, 12, 0, 80, 80, false, false, false, 0.25}, // one tensor, linear scaling
		{4, 9, 6, 3, 96, 0, false, true, false, 1},          // head norms alone
	} {
		run(fmt.Sprintf("rope/tok=%d,pos=%d,heads=%d+%d,hs=%d,dims=%d,neox=%v,norm=%v,factors=%v,fs=%g",
			c.nTok, c.pos0, c.heads0, c.heads1, c.hs, c.dims, c.neox, c.norm, c.factors, c.freqScale), func(g *gpuT) {
			r := &ops.Rope{Dims: c.dims, Base: 1e6, FreqScale: c.freqScale, NeoX: c.neox}
			if c.factors {
				r.Factors = ops.Llama3Factors(c.dims, r.Base, 8, 1, 4, 8192)
			}
			a := kernels.RopeArgs{HeadSize: c.hs, Dims: c.dims, NeoX: c.neox, Base: r.Base, FreqScale: r.FreqScale, Eps: 1e-6, NTok: c.nTok}
			a.Pos0 = up(g, []int32{int32(c.pos0)})
			if r.Factors != nil {
				a.Factors = up(g, r.Factors)
			}
			heads := []int{c.heads0, c.heads1}
			var xs, wants [][]float32
			for j, h := range heads {
				if h == 0 {
					continue
				}
				x := g.randn(c.nTok*h*c.hs, 2)
				var w []float32
				if c.norm {
					w = g.randn(c.hs, 1)
				}
				want := append([]float32(nil), x...)
				cos, sin := make([]float32, c.dims/2), make([]float32, c.dims/2)
				for t := 0; t < c.nTok; t++ {
					row := want[t*h*c.hs : (t+1)*h*c.hs]
					if w != nil {
						for hd := 0; hd < h; hd++ {
							v := row[hd*c.hs : (hd+1)*c.hs]
							ops.RMSNorm(v, v, w, 1e-6)
						}
					}
					if c.dims > 0 {
						r.Table(c.pos0+t, cos, sin)
						r.Apply(row, h, c.hs, cos, sin)
					}
				}
				a.T[j] = kernels.RopeTensor{X: up(g, x), Heads: h}
				if w != nil {
					a.T[j].NormW = up(g, w)
				}
				a.NTensors++
				xs, wants = append(xs, x), append(wants, want)
			}
			// Where there are keys, store them and values in a cache too.
			var vals []float32
			var kc, vc cudadrv.DevicePtr
			kw := c.heads1 * c.hs
			if c.heads1 > 0 && c.dims > 0 {
				vals = g.randn(c.nTok*kw, 1)
				ctx := c.pos0 + c.nTok
				kc, vc = g.alloc(2*ctx*kw), g.alloc(2*ctx*kw)
				a.KV = &kernels.RopeKV{T: 1, V: up(g, vals), KC: kc, VC: vc}
			}
			g.check(dev.rope.Run(g.s, &a))
			for j := range xs {
				expectClose(g.t, fmt.Sprintf("tensor %d", j), down[float32](g, a.T[j].X, len(xs[j])), wants[j], 1e-11)
			}
			if a.KV != nil {
				gotK := down[float32](g, a.T[1].X, len(xs[1]))
				ck := down[uint16](g, kc.Add(2*c.pos0*kw), c.nTok*kw)
				cv := down[uint16](g, vc.Add(2*c.pos0*kw), c.nTok*kw)
				for i := range ck {
					if ck[i] != ops.F32ToF16(gotK[i]) || cv[i] != ops.F32ToF16(vals[i]) {
						g.t.Fatalf("cache element %d: k %#04x v %#04x, want %#04x %#04x", i, ck[i], cv[i], ops.F32ToF16(gotK[i]), ops.F32ToF16(vals[i]))
					}
				}
			}
		})
	}

	// fwht: the rotation of a quantized cache's keys, values and queries,
	// bit for bit the CPU's (the same operations in the same order).
	for _, n := range []int{64, 128, 256} {
		run(fmt.Sprintf("fwht/n=%d,chunks=37", n), func(g *gpuT) {
			x := g.randn(37*n, 3)
			d := up(g, x)
			g.check(dev.elem.FWHT(g.s, d, 37, n))
			got := down[float32](g, d, len(x))
			ops.FWHT(x, n)
			for i := range x {
				if math.Float32bits(got[i]) != math.Float32bits(x[i]) {
					g.t.Fatalf("element %d: %g, the CPU's %g", i, got[i], x[i])
				}
			}
		})
	}

	// kv_store: f32 rows to f16 cache rows at pos0.., bit-exact.
	run("kv_store/width=1024,tok=5,pos=77", func(g *gpuT) {
		const width, nTok, pos0, ctx = 1024, 5, 77, 100
		k, v := g.randn(nTok*width, 1), g.randn(nTok*width, 100)
		kc, vc := g.alloc(2*ctx*width), g.alloc(2*ctx*width)
		g.check(dev.attn.Store(g.s, kc, vc, up(g, k), up(g, v), width, up(g, []int32{pos0}), nTok))
		gk := down[uint16](g, kc.Add(2*pos0*width), nTok*width)
		gv := down[uint16](g, vc.Add(2*pos0*width), nTok*width)
		for i := range k {
			if gk[i] != ops.F32ToF16(k[i]) || gv[i] != ops.F32ToF16(v[i]) {
				g.t.Fatalf("element %d: k %#04x v %#04x, want %#04x %#04x", i, gk[i], gv[i], ops.F32ToF16(k[i]), ops.F32ToF16(v[i]))
			}
		}
	})

	// attention: prefill and decode, GQA groups, head sizes 32..256, a
	// split-K decode over a long cache, a chunk of a prompt after a cache.
	// The cases marked mma take the tensor-core prefill kernel (head sizes
	// 64 and 128, at least 32 query rows a block): odd token counts, first
	// positions off the kernel's 64-position tiles, GQA groups 1, 3, 4, 5
	// and 8, prompts continued from a cache (pos0 > 0). Wherever the
	// tensor-core kernel runs, the CUDA-core kernel runs the case too
	// (AttnArgs.SIMT), both against the CPU op. Likewise decode: where the
	// decode kernel (attn_dec, head sizes 32, 64, 128, 256) runs, the tiled
	// kernel (AttnArgs.Tiled) runs the case too. Decode cases: first
	// position, a warp's run of 8 cut short, more positions than one pass
	// of the block's 64, splits with empty ones, each head size.
	//
	// Bound, NMSE 1e-6 for both kernels: Q is rounded to f16 on both sides
	// alike and K, V are the same f16 cache, so none of those differ; scores
	// and sums are f32 against the CPU's f32/f64 (relative ~1e-7, through
	// exp about the same in the weights). What differs is the f16 rounding
	// of the probabilities: the CPU rounds the normalised weights, the
	// tensor-core kernel the unnormalised ones (relative to its running
	// max), the CUDA-core kernel none. A rounding is a relative error of at
	// most 2^-11, of mean square about 2^-20/24 ≈ 4e-8 over mantissas,
	// independent from weight to weight and side to side; with random V the
	// NMSE of Σ w·v is then about 2 × 4e-8 ≈ 1e-7: 1e-6 leaves ten times.
	type attnCase struct {
		nTok, pos0, heads, kv, hs, splitCtx int
		mma                                 bool // meant for the tensor-core kernel
	}
	for _, c := range []attnCase{
		{1, 0, 8, 2, 64, 0, false},
		{9, 0, 8, 2, 64, 0, true}, // group 4: 9 tokens x 4 heads fill 36 rows
		{7, 0, 8, 4, 32, 0, false},
		{5, 37, 40, 8, 128, 0, false},
		{1, 1000, 40, 8, 128, 4096, false}, // split-K decode
		{1, 70, 32, 4, 128, 4096, false},   // split-K, most splits empty
		{33, 100, 12, 12, 80, 0, false},    // MHA, head size 80
		{3, 5, 16, 1, 256, 0, false},       // MQA, head size 256
		{130, 0, 6, 2, 64, 0, true},        // many tiles; group 3: 1 head a block
		{1, 513, 6, 3, 96, 1024, false},    // split-K, head size 96
		{2, 10, 8, 2, 64, 0, false},        // 8 rows a block: 16 threads a row
		{1, 300, 16, 1, 256, 0, false},     // decode, 16 heads a block, big tile
		{1, 63, 40, 8, 128, 0, false},      // decode without splits (tg64's cache)
		{1, 0, 32, 4, 128, 0, false},       // decode: Qwen3-30B-A3B's heads, first position
		{1, 12, 32, 4, 128, 0, false},      // 13 positions: warp 1's run cut short
		{1, 64, 32, 4, 128, 0, false},      // 65 positions: a second pass of the block
		{1, 100, 32, 4, 128, 128, false},   // two splits of 64 and the combine
		{1, 5000, 32, 4, 128, 8192, false}, // many splits, the last ones empty
		{1, 333, 40, 8, 128, 0, false},     // Qwen3-14B's heads, one long pass
		{1, 90, 8, 8, 32, 0, false},        // head size 32 (MHA)
		{1, 517, 12, 3, 64, 2048, false},   // head size 64, split
		{1, 70, 8, 2, 256, 0, false},       // head size 256
		{1, 41, 6, 6, 96, 0, false},        // head size 96: the tiled kernel
		// Tensor-core prefill.
		{5, 37, 32, 4, 128, 0, true},    // group 8: 5 tokens x 8 heads fill 40 rows
		{33, 0, 8, 8, 64, 0, true},      // MHA, odd count, a second tile of 1 row
		{100, 37, 32, 4, 128, 0, true},  // Qwen3-30B-A3B's heads, pos0 off the tile
		{77, 0, 40, 8, 128, 0, true},    // Qwen3-14B's heads (group 5: 1 head a block)
		{130, 200, 16, 4, 64, 0, true},  // group 4, continued from a cache
		{200, 0, 8, 1, 64, 0, true},     // MQA-like group 8
		{64, 64, 4, 4, 128, 0, true},    // exactly one tile, pos0 on a tile edge
		{16, 1000, 32, 4, 128, 0, true}, // a short chunk after a long cache
		{300, 509, 4, 1, 64, 0, true},   // group 4, tiles straddled by the chunk
		{513, 0, 8, 2, 128, 0, true},    // one past a multiple of the tile
	} {
		run(fmt.Sprintf("attention/tok=%d,pos=%d,heads=%d/%d,hs=%d,split_ctx=%d", c.nTok, c.pos0, c.heads, c.kv, c.hs, c.splitCtx), func(g *gpuT) {
			a := &ops.Attention{NHeads: c.heads, NKVHeads: c.kv, HeadSize: c.hs, Scale: ops.DefaultScale(c.hs)}
			total := c.pos0 + c.nTok
			width := c.kv * c.hs
			k, v := g.randn(total*width, 1), g.randn(total*width, 1)
			q := g.randn(c.nTok*c.heads*c.hs, 1)
			kv, err := ops.NewKVLayer(total, c.kv, c.hs, ops.KVF16)
			g.check(err)
			for p := 0; p < total; p++ {
				g.check(kv.Store(p, k[p*width:(p+1)*width], v[p*width:(p+1)*width]))
			}
			want := make([]float32, len(q))
			pool := ops.NewPool(2)
			defer pool.Close()
			g.check(a.RunContiguous(pool, kv, q, want, c.nTok, c.pos0))

			ctx := max(total, c.splitCtx)
			kc, vc := g.alloc(2*ctx*width), g.alloc(2*ctx*width)
			g.check(dev.attn.Store(g.s, kc, vc, up(g, k), up(g, v), width, up(g, []int32{0}), total))
			dq, dpos := up(g, q), up(g, []int32{int32(c.pos0)})
			args := kernels.AttnArgs{Q: dq, K: kc, V: vc, Pos0: dpos,
				NTok: c.nTok, NHeads: c.heads, NKV: c.kv, HeadSize: c.hs, Scale: a.Scale}
			if c.splitCtx > 0 {
				args.Splits, args.Chunk = kernels.DecodeSplits(c.splitCtx, c.kv, 4, dev.info.Multiprocessors)
				pb, mb := kernels.AttnScratch(c.nTok, c.heads, c.hs, args.Splits)
				args.Part, args.ML = g.poison(pb/4), g.poison(mb/4)
				g.t.Logf("%d splits of %d positions", args.Splits, args.Chunk)
			}
			mma, why := dev.attn.TensorCores(&args)
			if c.mma != mma && dev.attn.TensorCoreHeadSize(c.hs) {
				g.t.Fatalf("tensor-core kernel taken: %v, want %v (%s)", mma, c.mma, why)
			}
			dec, whyDec := dev.attn.Decode(&args)
			if wantDec := c.nTok == 1 && c.hs%32 == 0 && c.hs != 96 && c.hs <= 256; dec != wantDec && os.Getenv(kernels.EnvAttention) != "tile" {
				g.t.Fatalf("decode kernel taken: %v, want %v (%s)", dec, wantDec, whyDec)
			}
			type kind struct{ simt, tiled bool }
			kinds := []kind{{}}
			if mma {
				kinds = append(kinds, kind{simt: true})
			} else if why != "" {
				g.t.Logf("CUDA-core kernel: %s", why)
			}
			if dec {
				kinds = append(kinds, kind{tiled: true})
			}
			for _, kd := range kinds {
				name := "attention (tensor cores)"
				switch {
				case kd.simt:
					name = "attention (forced CUDA cores)"
				case kd.tiled:
					name = "attention (tiled, forced)"
				case dec:
					name = "attention (decode kernel)"
				case !mma:
					name = "attention (CUDA cores)"
				}
				args := args
				args.SIMT, args.Tiled = kd.simt, kd.tiled
				args.Out = g.poison(len(q))
				if c.hs%32 == 0 {
					args.Q8Planes = 1
					args.Q8 = g.alloc(kernels.Q8_1PlanesBytes(2, c.nTok, c.heads*c.hs))
				}
				g.check(dev.attn.Run(g.s, &args))
				got := down[float32](g, args.Out, len(q))
				expectClose(g.t, name, got, want, 1e-6)
				if args.Q8 != 0 {
					checkQ8(g, args.Q8, got, c.nTok, c.heads*c.hs, 1)
					// Again in two planes (the second from q8_1_plane2).
					args.Q8Planes = 2
					g.check(dev.attn.Run(g.s, &args))
					expectClose(g.t, name+" (two planes)", down[float32](g, args.Out, len(q)), want, 1e-6)
					checkQ8(g, args.Q8, got, c.nTok, c.heads*c.hs, 2)
				}
			}
		})
	}

	// swiglu: separate buffers (in place, as the programs use it) and the
	// two halves of one row.
	for _, c := range []struct {
		rows, width int
		fused       bool
	}{{1, 17408, false}, {7, 1000, false}, {1, 512, true}, {9, 4099, true}} {
		run(fmt.Sprintf("swiglu/rows=%d,width=%d,fused=%v", c.rows, c.width, c.fused), func(g *gpuT) {
			n := c.rows * c.width
			want := make([]float32, n)
			if c.fused {
				in := g.randn(2*n, 3)
				for r := 0; r < c.rows; r++ {
					row := in[2*r*c.width : 2*(r+1)*c.width]
					ops.SwiGLU(want[r*c.width:(r+1)*c.width], row[:c.width], row[c.width:])
				}
				din, out := up(g, in), g.poison(n)
				g.check(dev.glu.SwiGLU(g.s, out, din, din.Add(4*c.width), c.width, 2*c.width, c.rows))
				expectClose(g.t, "swiglu", down[float32](g, out, n), want, 1e-12)
				return
			}
			gate, upv := g.randn(n, 3), g.randn(n, 3)
			ops.SwiGLU(want, gate, upv)
			dg := up(g, gate)
			g.check(dev.glu.SwiGLU(g.s, dg, dg, up(g, upv), c.width, c.width, c.rows))
			expectClose(g.t, "swiglu", down[float32](g, dg, n), want, 1e-12)
		})
	}

	run("add_bias/rows=5,width=1023", func(g *gpuT) {
		const rows, width = 5, 1023
		x, b := g.randn(rows*width, 1), g.randn(width, 1)
		dx := up(g, x)
		g.check(dev.glu.AddBias(g.s, dx, up(g, b), width, rows))
		for r := 0; r < rows; r++ {
			ops.AddTo(x[r*width:(r+1)*width], b)
		}
		expectClose(g.t, "add_bias", down[float32](g, dx, len(x)), x, 0)
	})

	// The MoE router's float32 product at prefill (dense_matmul_f32_t8)
	// against a float64 product; then its routing against the CPU's
	// routing of the CPU's float32 router product (ops' F32 matrix),
	// which must choose the same experts wherever the CPU's choice is not
	// a tie to the last bits.
	for _, c := range []struct{ nTok, ne, cols, k int }{{37, 128, 2048, 8}, {9, 60, 257, 4}, {512, 8, 256, 2}, {8, 8, 256, 2}} {
		run(fmt.Sprintf("router_f32/tok=%d,experts=%d,cols=%d", c.nTok, c.ne, c.cols), func(g *gpuT) {
			w, x := g.randn(c.ne*c.cols, 0.05), g.randn(c.nTok*c.cols, 1)
			out := g.poison(c.nTok * c.ne)
			g.check(dev.dense.MatMulTiled(g.s, out, up(g, w), up(g, x), c.ne, c.cols, c.nTok, c.ne))
			got := down[float32](g, out, c.nTok*c.ne)
			want := make([]float32, c.nTok*c.ne)
			for t := 0; t < c.nTok; t++ {
				for e := 0; e < c.ne; e++ {
					var d float64
					for i := 0; i < c.cols; i++ {
						d += float64(w[e*c.cols+i]) * float64(x[t*c.cols+i])
					}
					want[t*c.ne+e] = float32(d)
				}
			}
			expectClose(g.t, "router logits", got, want, 1e-10)
			kf, err := ops.KernelFor(gguf.TypeF32)
			if err != nil {
				g.t.Fatal(err)
			}
			m, err := ops.NewMatrix(kf, c.ne, c.cols, bytesOf(w))
			if err != nil {
				g.t.Fatal(err)
			}
			pool := ops.NewPool(2)
			defer pool.Close()
			cpuLogits := make([]float32, c.nTok*c.ne)
			m.Mul(pool, x, c.nTok, cpuLogits, c.ne, make([]byte, m.ActBytes(c.nTok)))
			ids, wts := g.poison(c.nTok*c.k), g.poison(c.nTok*c.k)
			g.check(dev.moe.Route(g.s, out, c.ne, c.k, true, ids, wts, c.nTok))
			gotIDs := down[int32](g, ids, c.nTok*c.k)
			choice, weight, idx := make([]int, c.k), make([]float32, c.k), make([]int, c.ne)
			for t := 0; t < c.nTok; t++ {
				p := append([]float32(nil), cpuLogits[t*c.ne:(t+1)*c.ne]...)
				cpu.Route(p, c.k, true, choice, weight, idx)
				sorted := append([]float32(nil), p...)
				slices.SortFunc(sorted, func(a, b float32) int { return cmp.Compare(b, a) })
				if c.k < c.ne && sorted[c.k-1]-sorted[c.k] < 1e-6 {
					continue // a tie to the last bits: either choice is right
				}
				for j, e := range choice {
					if int(gotIDs[t*c.k+j]) != e {
						g.t.Fatalf("token %d slot %d: expert %d, want %d (margin %.3g)", t, j, gotIDs[t*c.k+j], e, sorted[c.k-1]-sorted[c.k])
					}
				}
			}
		})
	}

	// moe_route against runtime's routing: ids exact, weights close.
	for _, c := range []struct {
		nTok, ne, k int
		norm        bool
	}{{1, 8, 2, true}, {17, 128, 8, true}, {5, 60, 4, false}, {3, 256, 8, true}, {9, 33, 1, true}} {
		run(fmt.Sprintf("moe_route/tok=%d,experts=%d,k=%d,norm=%v", c.nTok, c.ne, c.k, c.norm), func(g *gpuT) {
			logits := g.randn(c.nTok*c.ne, 2)
			ids, w := g.poison(c.nTok*c.k), g.poison(c.nTok*c.k)
			g.check(dev.moe.Route(g.s, up(g, logits), c.ne, c.k, c.norm, ids, w, c.nTok))
			gotIDs, gotW := down[int32](g, ids, c.nTok*c.k), down[float32](g, w, c.nTok*c.k)
			wantW := make([]float32, c.nTok*c.k)
			choice, idx := make([]int, c.k), make([]int, c.ne)
			for t := 0; t < c.nTok; t++ {
				p := append([]float32(nil), logits[t*c.ne:(t+1)*c.ne]...)
				cpu.Route(p, c.k, c.norm, choice, wantW[t*c.k:(t+1)*c.k], idx)
				for j, e := range choice {
					if int(gotIDs[t*c.k+j]) != e {
						g.t.Fatalf("token %d slot %d: expert %d, want %d (all %v)", t, j, gotIDs[t*c.k+j], e, gotIDs[t*c.k:(t+1)*c.k])
					}
				}
			}
			expectClose(g.t, "weights", gotW, wantW, 1e-12)
		})
	}

	run("moe_weighted_sum/tok=7,k=8,width=2048", func(g *gpuT) {
		const nTok, k, width = 7, 8, 2048
		y, w := g.randn(nTok*k*width, 1), g.randn(nTok*k, 0.3)
		out := g.poison(nTok * width)
		g.check(dev.moe.WeightedSum(g.s, out, up(g, y), up(g, w), width, k, nTok))
		want := make([]float32, nTok*width)
		for t := 0; t < nTok; t++ {
			o := want[t*width : (t+1)*width]
			for j := 0; j < k; j++ {
				for d := range o {
					r := y[(t*k+j)*width+d] * w[t*k+j]
					if j == 0 {
						o[d] = r
					} else {
						o[d] += r
					}
				}
			}
		}
		expectClose(g.t, "weighted sum", down[float32](g, out, len(want)), want, 0)
	})

	// moe_split and moe_weighted_sum_host: the slots of experts below ks
	// handed to mapped host memory, the rest summed on the device onto the
	// host's partial sum, exactly as the CPU adds them.
	for _, c := range []struct{ nTok, ne, k, ks, width int }{{7, 16, 4, 5, 64}, {33, 128, 8, 26, 2048}, {3, 8, 2, 0, 33}, {5, 8, 2, 8, 17}} {
		run(fmt.Sprintf("moe_split/tok=%d,experts=%d,k=%d,split=%d,width=%d", c.nTok, c.ne, c.k, c.ks, c.width), func(g *gpuT) {
			ns := c.nTok * c.k
			ids := make([]int32, ns)
			for i := range ids {
				ids[i] = int32(g.rng.IntN(c.ne))
			}
			w, y, host := g.randn(ns, 0.3), g.randn(ns*c.width, 1), g.randn(c.nTok*c.width, 1)
			mapped := func(n int) *cudadrv.HostMem {
				h, err := dev.ctx.HostAlloc(4*n, cudadrv.HostAllocPortable|cudadrv.HostAllocDeviceMap)
				if err != nil {
					g.t.Fatal(err)
				}
				g.t.Cleanup(func() { h.Free() })
				return h
			}
			hIDs, hW, hY := mapped(ns), mapped(ns), mapped(c.nTok*c.width)
			copy(unsafe.Slice((*float32)(hY.Pointer()), c.nTok*c.width), host)
			dIDs, dW := up(g, ids), up(g, w)
			g.check(dev.moe.Split(g.s, dIDs, dW, c.ks, ns, hIDs.DevicePtr(), hW.DevicePtr()))
			out := g.poison(c.nTok * c.width)
			g.check(dev.moe.WeightedSumHost(g.s, out, up(g, y), dW, dIDs, hY.DevicePtr(), c.width, c.k, c.nTok))
			got := down[float32](g, out, c.nTok*c.width)
			gotIDs := down[int32](g, dIDs, ns)
			if !slices.Equal(unsafe.Slice((*int32)(hIDs.Pointer()), ns), ids) || !slices.Equal(unsafe.Slice((*float32)(hW.Pointer()), ns), w) {
				g.t.Fatal("the host's copy of the ids or weights differs from the device's")
			}
			want := append([]float32(nil), host...)
			for i, e := range ids {
				wantID := e
				if int(e) < c.ks {
					wantID = -1
				}
				if gotIDs[i] != wantID {
					g.t.Fatalf("slot %d (expert %d, split %d): device id %d, want %d", i, e, c.ks, gotIDs[i], wantID)
				}
				if wantID < 0 {
					continue
				}
				t := i / c.k
				for d := 0; d < c.width; d++ {
					want[t*c.width+d] += float32(y[i*c.width+d] * w[i]) // rounded before the add, as the kernel
				}
			}
			expectClose(g.t, "weighted sum onto the host's", got, want, 0)
		})
	}
}

// checkQ8 checks the Q8_1 activations at p (rows of cols values in planes
// planes) against the host twin of the kernels' rounding of x, bit for bit.
func checkQ8(g *gpuT, p cudadrv.DevicePtr, x []float32, rows, cols, planes int) {
	g.t.Helper()
	want, err := kernels.Q8_1Host(x, rows, cols, planes)
	if err != nil {
		g.t.Fatal(err)
	}
	if msg := kernels.Q8_1Compare(down[byte](g, p, kernels.Q8_1PlanesBytes(planes, rows, cols)), want, rows, cols, planes); msg != "" {
		g.t.Fatalf("Q8_1 in %d planes: %s", planes, msg)
	}
	g.t.Logf("Q8_1: %d blocks in %d planes exact", rows*cols/32, planes)
}

// nmse is sum((a-b)²) / sum(b²).
func nmse(a, b []float32) float64 {
	var num, den float64
	for i := range b {
		d := float64(a[i]) - float64(b[i])
		num += d * d
		den += float64(b[i]) * float64(b[i])
	}
	return num / den
}

// BenchmarkMoERouter times the MoE router's product at a prefill batch
// (512 tokens, Qwen3-30B-A3B's router: 128 experts of 2048) two ways: the
// float32 product moeStep uses (dense_matmul_f32_t8), and the weight
// kernels' tensor-core path it replaced for float32 routers (f16
// conversion of the activations, f16 weights in the MMA). Device time from
// events around b.N launches; us/op per product.
func BenchmarkMoERouter(b *testing.B) {
	dev := needGPUDevice(b)
	q, ok := dev.w.(*quantOps)
	if !ok {
		b.Skip("the quantized weight kernels are not in use")
	}
	const nTok, ne, cols = 512, 128, 2048
	rng := rand.New(rand.NewPCG(7, 7))
	randBuf := func(n int, scale float64) cudadrv.DevicePtr {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64() * scale)
		}
		p, err := dev.ctx.Alloc(4 * n)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dev.ctx.Free(p) })
		if err := dev.ctx.CopyHtoD(p, bytesOf(v)); err != nil {
			b.Fatal(err)
		}
		return p
	}
	w, x, out := randBuf(ne*cols, 0.05), randBuf(nTok*cols, 1), randBuf(nTok*ne, 1)
	m := kernels.Matrix{Type: gguf.TypeF32, Data: w, Rows: ne, Cols: cols}
	scratch := randBuf(kernels.MatMulScratchBytes(m, nTok)/4+4, 1)
	s, err := dev.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	for _, v := range []struct {
		name string
		f    func() error
	}{
		{"f32_tiled", func() error { return dev.dense.MatMulTiled(s, out, w, x, ne, cols, nTok, ne) }},
		{"tensor_cores_f16", func() error { return q.k.MatMul(s, m, x, cols, nTok, out, ne, scratch) }},
	} {
		b.Run(v.name, func(b *testing.B) {
			b.ReportMetric(benchDeviceTime(b, dev, s, v.f)*1e6, "us/op")
		})
	}
}

// benchDeviceTime runs f b.N times on s after 10 warm-up runs and returns
// the device time of one, in seconds, from events around the b.N runs.
func benchDeviceTime(b *testing.B, dev *Device, s *cudadrv.Stream, f func() error) float64 {
	start, err := dev.ctx.NewEvent(cudadrv.EventDefault)
	if err != nil {
		b.Fatal(err)
	}
	defer start.Destroy()
	end, err := dev.ctx.NewEvent(cudadrv.EventDefault)
	if err != nil {
		b.Fatal(err)
	}
	defer end.Destroy()
	for i := 0; i < 10; i++ {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	if err := start.Record(s); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if err := f(); err != nil {
			b.Fatal(err)
		}
	}
	if err := end.Record(s); err != nil {
		b.Fatal(err)
	}
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	d, err := cudadrv.Elapsed(start, end)
	if err != nil {
		b.Fatal(err)
	}
	return d.Seconds() / float64(b.N)
}

// BenchmarkAttentionPrefill times the prefill attention of one layer at
// Qwen3-30B-A3B's heads (32 over 4 KV heads of 128) and Qwen3-14B's (40
// over 8 of 128): batches of 512 and 2048 tokens from position 0, and the
// last 512-token batch of a 2048-token prompt (pos0 1536, how pp2048 at
// -b 512 ends), on the tensor cores (kernel=mma) and on the CUDA cores
// (kernel=simt). Device time from events around b.N launches; us/op a
// launch, TFLOP/s of the causal products (4·hs·heads per attended
// position), with the Q8_1 output the executor asks for.
func BenchmarkAttentionPrefill(b *testing.B) {
	dev := needGPUDevice(b)
	const hs, ctxLen = 128, 2048
	rng := rand.New(rand.NewPCG(11, 11))
	upload := func(raw []byte) cudadrv.DevicePtr {
		p, err := dev.ctx.Alloc(len(raw))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { dev.ctx.Free(p) })
		if err := dev.ctx.CopyHtoD(p, raw); err != nil {
			b.Fatal(err)
		}
		return p
	}
	randF32 := func(n int) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(rng.NormFloat64())
		}
		return v
	}
	randF16 := func(n int) []uint16 {
		v := make([]uint16, n)
		for i := range v {
			v[i] = ops.F32ToF16(float32(rng.NormFloat64()))
		}
		return v
	}
	s, err := dev.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	for _, m := range []struct {
		name      string
		heads, kv int
	}{{"qwen3-30b-a3b", 32, 4}, {"qwen3-14b", 40, 8}} {
		width := m.kv * hs
		kc, vc := upload(bytesOf(randF16(ctxLen*width))), upload(bytesOf(randF16(ctxLen*width)))
		for _, sh := range []struct{ tok, pos0 int }{{512, 0}, {2048, 0}, {512, 1536}} {
			q := upload(bytesOf(randF32(sh.tok * m.heads * hs)))
			out := upload(make([]byte, 4*sh.tok*m.heads*hs))
			q8 := upload(make([]byte, kernels.Q8_1Bytes(sh.tok, m.heads*hs)))
			pos0 := upload(bytesOf([]int32{int32(sh.pos0)}))
			attended := 0 // positions attended, summed over the tokens
			for t := 0; t < sh.tok; t++ {
				attended += sh.pos0 + t + 1
			}
			flops := 4 * float64(hs) * float64(m.heads) * float64(attended)
			for _, kernel := range []string{"mma", "simt"} {
				b.Run(fmt.Sprintf("%s/tok=%d,pos=%d/kernel=%s", m.name, sh.tok, sh.pos0, kernel), func(b *testing.B) {
					args := kernels.AttnArgs{Out: out, Q: q, K: kc, V: vc, Pos0: pos0, Q8: q8,
						NTok: sh.tok, NHeads: m.heads, NKV: m.kv, HeadSize: hs, Scale: ops.DefaultScale(hs),
						SIMT: kernel == "simt"}
					if ok, why := dev.attn.TensorCores(&args); kernel == "mma" && !ok {
						b.Skip("the tensor-core kernel does not run here: " + why)
					}
					sec := benchDeviceTime(b, dev, s, func() error { return dev.attn.Run(s, &args) })
					b.ReportMetric(sec*1e6, "us/op")
					b.ReportMetric(flops/sec/1e12, "TFLOP/s")
				})
			}
		}
	}
}
