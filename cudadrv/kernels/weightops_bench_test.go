package kernels

import (
	"fmt"
	"testing"
	"time"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
)

// Benchmarks of the weight kernels, timed with CUDA events around b.N
// launches on one stream (after a warm-up), on valid quantized weights
// (ops.Quantize of normal values; a pool of rows repeated to full size).
// Each launch reads the next of several copies of the weights, together
// well over the L2 cache, so the figures are DRAM figures. Metrics:
//
//	GB/s     weight bytes read per second (matvec; the activations are
//	         a few KiB from L2)
//	TFLOP/s  2*rows*cols*tokens per second (matmul)
//	us/op    device time per launch sequence
//
// The matvec and MoE figures are graph replays (woTimeGraph): queued one
// by one, the small matrices would measure the CPU's launch rate (about
// 3.5 us a launch through purego), not the kernel.
// BenchmarkWeightCopy gives the ceiling: a device-to-device copy, counting
// bytes read plus bytes written. Shapes are Qwen3-14B's (hidden 5120, FFN
// 17408, K/V 1024) and Qwen3-30B-A3B's experts (128 of 768x2048, 8 used).

// woBenchWeights returns copies of an m-shaped matrix of type t, enough of
// them to be read from DRAM; Data of each is set.
func woBenchWeights(b *testing.B, ctx *cudadrv.Context, t gguf.Type, rows, cols, experts int) []Matrix {
	m := Matrix{Type: t, Rows: rows, Cols: cols}
	rb := m.RowBytes()
	const pool = 256
	src := woGauss(woRand(fmt.Sprint("bench", t, cols)), pool*cols, cols)
	raw := make([]byte, pool*rb)
	woParallel(pool, func(r int) {
		if err := ops.Quantize(t, raw[r*rb:(r+1)*rb], src[r*cols:(r+1)*cols]); err != nil {
			panic(err)
		}
	})
	total := rows * experts
	full := make([]byte, total*rb)
	for r := 0; r < total; r++ {
		copy(full[r*rb:], raw[(r%pool)*rb:][:rb])
	}
	copies := min(64, max(2, (512<<20)/len(full)+1))
	ms := make([]Matrix, copies)
	for i := range ms {
		d := woAlloc(b, ctx, len(full))
		if err := ctx.CopyHtoD(d.p, full); err != nil {
			b.Fatal(err)
		}
		ms[i] = m
		ms[i].Data = d.p
	}
	return ms
}

// woTime runs fn(i) b.N times after a warm-up and returns the device time
// per call.
func woTime(b *testing.B, ctx *cudadrv.Context, s *cudadrv.Stream, fn func(i int) error) time.Duration {
	for i := range 3 {
		if err := fn(i); err != nil {
			b.Fatal(err)
		}
	}
	e0, err := ctx.NewEvent(cudadrv.EventDefault)
	if err != nil {
		b.Fatal(err)
	}
	defer e0.Destroy()
	e1, err := ctx.NewEvent(cudadrv.EventDefault)
	if err != nil {
		b.Fatal(err)
	}
	defer e1.Destroy()
	if err := s.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	if err := e0.Record(s); err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		if err := fn(i); err != nil {
			b.Fatal(err)
		}
	}
	if err := e1.Record(s); err != nil {
		b.Fatal(err)
	}
	if err := e1.Synchronize(); err != nil {
		b.Fatal(err)
	}
	b.StopTimer()
	d, err := cudadrv.Elapsed(e0, e1)
	if err != nil {
		b.Fatal(err)
	}
	return d / time.Duration(b.N)
}

// woTimeGraph captures per calls fn(0..per-1) into a CUDA graph and times
// b.N replays: the device time per call without the CPU's launch cost
// (the executor replays graphs too).
func woTimeGraph(b *testing.B, ctx *cudadrv.Context, s *cudadrv.Stream, per int, fn func(i int) error) time.Duration {
	g, err := s.Capture(cudadrv.CaptureRelaxed, func() error {
		for i := 0; i < per; i++ {
			if err := fn(i); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Destroy()
	ge, err := g.Instantiate(0)
	if err != nil {
		b.Fatal(err)
	}
	defer ge.Destroy()
	return woTime(b, ctx, s, func(int) error { return ge.Launch(s) }) / time.Duration(per)
}

func woBenchStream(b *testing.B, ctx *cudadrv.Context) *cudadrv.Stream {
	s, err := ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Destroy() })
	return s
}

func BenchmarkWeightCopy(b *testing.B) {
	ctx, _ := woSetup(b)
	s := woBenchStream(b, ctx)
	const n = 1 << 30
	src, dst := woAlloc(b, ctx, n), woAlloc(b, ctx, n)
	if err := ctx.MemsetD8(src.p, 0x3c, n); err != nil {
		b.Fatal(err)
	}
	d := woTime(b, ctx, s, func(int) error { return s.CopyDtoD(dst.p, src.p, n) })
	b.ReportMetric(2*n/d.Seconds()/1e9, "GB/s")
}

type woShape struct {
	name       string
	rows, cols int
}

var woBenchShapes = []woShape{
	{"ffn_up_17408x5120", 17408, 5120},
	{"ffn_down_5120x17408", 5120, 17408},
	{"attn_q_5120x5120", 5120, 5120},
	{"attn_k_1024x5120", 1024, 5120},
}

// woBenchInput makes nTok random f32 activation rows for m (x), their
// Q8_1 rows for a quantized m (xq), and room for the products (out).
func woBenchInput(b *testing.B, ctx *cudadrv.Context, w *WeightOps, s *cudadrv.Stream, m Matrix, nTok int) (x, xq, out woBuf) {
	x = woAlloc(b, ctx, 4*nTok*m.Cols)
	if err := ctx.CopyHtoD(x.p, woF32s(woGauss(woRand("x"), nTok*m.Cols, m.Cols))); err != nil {
		b.Fatal(err)
	}
	out = woAlloc(b, ctx, 4*nTok*m.Rows)
	xq = woAlloc(b, ctx, Q8_1Bytes(nTok, m.Cols))
	if !isFloat(m.Type) {
		if err := w.QuantizeQ8_1(s, x.p, m.Cols, nTok, m.Cols, xq.p); err != nil {
			b.Fatal(err)
		}
	}
	return x, xq, out
}

func BenchmarkWeightMatVec(b *testing.B) {
	ctx, w := woSetup(b)
	s := woBenchStream(b, ctx)
	for _, t := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeQ8_0, gguf.TypeQ5_K, gguf.TypeQ4_0, gguf.TypeF16} {
		for _, sh := range woBenchShapes {
			ms := woBenchWeights(b, ctx, t, sh.rows, sh.cols, 1)
			m := ms[0]
			x, xq, out := woBenchInput(b, ctx, w, s, m, 8)
			for _, n := range []int{1, 2, 4, 8} {
				type variant struct{ rows, ks int }
				variants := []variant{{0, 0}}
				if n == 1 && w.types[t].mvR1 != nil {
					variants = append(variants, variant{1, 0}, variant{4, 0}, variant{0, 1}, variant{0, 2}, variant{0, 4})
				}
				for _, v := range variants {
					name := fmt.Sprintf("type=%s/%s/ntok=%d", t, sh.name, n)
					if v.rows != 0 {
						name += fmt.Sprintf("/r=%d", v.rows)
					}
					if v.ks != 0 {
						name += fmt.Sprintf("/ks=%d", v.ks)
					}
					b.Run(name, func(b *testing.B) {
						w.mvRows, w.mvKS = v.rows, v.ks
						defer func() { w.mvRows, w.mvKS = 0, 0 }()
						d := woTimeGraph(b, ctx, s, 2*len(ms), func(i int) error {
							m := ms[i%len(ms)]
							if isFloat(t) {
								return w.MatVecF32(s, m, x.p, m.Cols, n, out.p, m.Rows)
							}
							return w.MatVecQ8_1(s, m, xq.p, n, out.p, m.Rows)
						})
						b.ReportMetric(float64(m.Bytes())/d.Seconds()/1e9, "GB/s")
						b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
					})
				}
			}
		}
	}
}

func BenchmarkWeightMatMul(b *testing.B) {
	ctx, w := woSetup(b)
	s := woBenchStream(b, ctx)
	const n = 512
	for _, t := range WeightTypes {
		shapes := woBenchShapes[:1]
		if t == gguf.TypeQ4_K || t == gguf.TypeQ6_K || t == gguf.TypeQ8_0 || t == gguf.TypeF16 {
			shapes = woBenchShapes[:3]
		}
		for _, sh := range shapes {
			ms := woBenchWeights(b, ctx, t, sh.rows, sh.cols, 1)
			m := ms[0]
			x := woAlloc(b, ctx, 4*n*m.Cols)
			if err := ctx.CopyHtoD(x.p, woF32s(woGauss(woRand("x"), n*m.Cols, m.Cols))); err != nil {
				b.Fatal(err)
			}
			out := woAlloc(b, ctx, 4*n*m.Rows)
			scratch := woAlloc(b, ctx, MatMulScratchBytes(m, n))
			if err := w.ConvertF16(s, x.p, m.Cols, n, m.Cols, scratch.p); err != nil {
				b.Fatal(err)
			}
			flop := 2 * float64(m.Rows) * float64(m.Cols) * n
			for _, bn := range mmTiles {
				b.Run(fmt.Sprintf("type=%s/%s/ntok=%d/mma/bn=%d", t, sh.name, n, bn), func(b *testing.B) {
					w.mmBN = bn
					defer func() { w.mmBN = 0 }()
					d := woTime(b, ctx, s, func(i int) error {
						return w.MatMulF16(s, ms[i%len(ms)], scratch.p, n, out.p, m.Rows)
					})
					b.ReportMetric(flop/d.Seconds()/1e12, "TFLOP/s")
					b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
				})
			}
			b.Run(fmt.Sprintf("type=%s/%s/ntok=%d/with-convert", t, sh.name, n), func(b *testing.B) {
				d := woTime(b, ctx, s, func(i int) error {
					return w.MatMul(s, ms[i%len(ms)], x.p, m.Cols, n, out.p, m.Rows, scratch.p)
				})
				b.ReportMetric(flop/d.Seconds()/1e12, "TFLOP/s")
				b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
			})
		}
	}
}

// BenchmarkWeightMoE: Qwen3-30B-A3B's expert FFN (128 experts of 768x2048
// for gate/up, 2048x768 for down, 8 per token), decode and prefill.
func BenchmarkWeightMoE(b *testing.B) {
	ctx, w := woSetup(b)
	s := woBenchStream(b, ctx)
	const nExp, k = 128, 8
	for _, t := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K} {
		for _, sh := range []woShape{{"gate_768x2048", 768, 2048}, {"down_2048x768", 2048, 768}} {
			ms := woBenchWeights(b, ctx, t, sh.rows, sh.cols, nExp)
			for _, n := range []int{1, 4, 64, 512} {
				perSlot := sh.rows == 2048
				e := MoE{Matrix: ms[0], NExpert: nExp, K: k, PerSlot: perSlot}
				ids := woUpload(b, ctx, woI32s(woMoEIDs(woRand("ids"), n, k, nExp)))
				in := e.inputRows(n)
				x := woAlloc(b, ctx, 4*in*sh.cols)
				if err := ctx.CopyHtoD(x.p, woF32s(woGauss(woRand("x"), in*sh.cols, sh.cols))); err != nil {
					b.Fatal(err)
				}
				out := woAlloc(b, ctx, 4*n*k*sh.rows)
				scratch := woAlloc(b, ctx, MoEScratchBytes(e, n))
				bns := []int{0} // automatic
				if n > MoEMatVecMaxTokens {
					bns = append(bns, mmTiles[:]...)
				}
				for _, bn := range bns {
					name := fmt.Sprintf("type=%s/%s/experts=%d/k=%d/ntok=%d", t, sh.name, nExp, k, n)
					if bn != 0 {
						name += fmt.Sprintf("/bn=%d", bn)
					}
					b.Run(name, func(b *testing.B) {
						w.moeBN = bn
						defer func() { w.moeBN = 0 }()
						d := woTimeGraph(b, ctx, s, 2*len(ms), func(i int) error {
							e.Matrix = ms[i%len(ms)]
							return w.MoEMatMul(s, e, ids.p, x.p, sh.cols, n, out.p, sh.rows, scratch.p)
						})
						b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
						if n <= MoEMatVecMaxTokens {
							b.ReportMetric(float64(n*k*e.Bytes())/d.Seconds()/1e9, "GB/s")
						} else {
							b.ReportMetric(2*float64(sh.rows*sh.cols*n*k)/d.Seconds()/1e12, "TFLOP/s")
						}
					})
				}
			}
		}
	}
}

// BenchmarkWeightMatMulMulti: Qwen3-14B's products on one input (attn
// q/k/v, ffn gate/up; Q4_K, 512 tokens) one launch each against one
// MatMulF16Multi launch.
func BenchmarkWeightMatMulMulti(b *testing.B) {
	ctx, w := woSetup(b)
	s := woBenchStream(b, ctx)
	const n = 512
	for _, g := range []struct {
		name string
		rows []int
	}{{"qkv_5120+1024+1024x5120", []int{5120, 1024, 1024}}, {"gate_up_2x17408x5120", []int{17408, 17408}}} {
		const cols = 5120
		var sets [][]Matrix
		var outs []woBuf
		flop := 0.0
		for _, r := range g.rows {
			sets = append(sets, woBenchWeights(b, ctx, gguf.TypeQ4_K, r, cols, 1))
			outs = append(outs, woAlloc(b, ctx, 4*n*r))
			flop += 2 * float64(r) * cols * n
		}
		xh := woAlloc(b, ctx, F16Bytes(n, cols))
		x := woAlloc(b, ctx, 4*n*cols)
		if err := ctx.CopyHtoD(x.p, woF32s(woGauss(woRand("x"), n*cols, cols))); err != nil {
			b.Fatal(err)
		}
		if err := w.ConvertF16(s, x.p, cols, n, cols, xh.p); err != nil {
			b.Fatal(err)
		}
		products := func(i int) []F16Product {
			var ps []F16Product
			for j, set := range sets {
				ps = append(ps, F16Product{M: set[i%len(set)], Out: outs[j].p, LdOut: g.rows[j]})
			}
			return ps
		}
		for _, fused := range []bool{false, true} {
			b.Run(fmt.Sprintf("%s/ntok=%d/fused=%v", g.name, n, fused), func(b *testing.B) {
				d := woTime(b, ctx, s, func(i int) error {
					ps := products(i)
					if fused {
						return w.MatMulF16Multi(s, ps, xh.p, n)
					}
					for _, p := range ps {
						if err := w.MatMulF16(s, p.M, xh.p, n, p.Out, p.LdOut); err != nil {
							return err
						}
					}
					return nil
				})
				b.ReportMetric(flop/d.Seconds()/1e12, "TFLOP/s")
				b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
			})
		}
	}
}

// BenchmarkDecodeBatch: a decode step's product for n tokens (decode rows
// of n sequences), through MatVecQ8_1 as the engine calls it: the matvec
// in runs of 8 (mvt=off) against the tensor-core kernels (mvt), with the
// one-token matvec as the yardstick ("x1" is the time over one token's).
func BenchmarkDecodeBatch(b *testing.B) {
	ctx, w := woSetup(b)
	s := woBenchStream(b, ctx)
	defer func() { w.SetDecodeMMA(-1) }()
	const maxTok = MatVecQ8_1MaxTokens
	for _, t := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K} {
		for _, sh := range woBenchShapes {
			ms := woBenchWeights(b, ctx, t, sh.rows, sh.cols, 1)
			m := ms[0]
			_, xq, out := woBenchInput(b, ctx, w, s, m, maxTok)
			var one time.Duration
			for _, n := range []int{1, 4, 8, 16, 32} {
				for _, path := range []string{"mvt=off", "mvt", "mvt/ks=2", "mvt/ks=4"} {
					if n == 1 && path != "mvt=off" {
						continue
					}
					b.Run(fmt.Sprintf("type=%s/%s/ntok=%d/%s", t, sh.name, n, path), func(b *testing.B) {
						w.SetDecodeMMA(0)
						w.mvKS = woVariantInt(path, "ks")
						defer func() { w.mvKS = 0 }()
						if path != "mvt=off" {
							w.SetDecodeMMA(1)
						}
						d := woTimeGraph(b, ctx, s, 2*len(ms), func(i int) error {
							m := ms[i%len(ms)]
							return w.MatVecQ8_1(s, m, xq.p, n, out.p, m.Rows)
						})
						if n == 1 {
							one = d
						}
						b.ReportMetric(float64(m.Bytes())/d.Seconds()/1e9, "GB/s")
						b.ReportMetric(float64(d.Nanoseconds())/1e3, "us/op")
						if one > 0 {
							b.ReportMetric(float64(d)/float64(one), "x1")
						}
					})
				}
			}
		}
	}
}
