package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
)

// The weight kernels against the CPU, like llama.cpp's test-backend-ops: a
// table of op x weight type x shape, each run on fresh random inputs into
// NaN-poisoned outputs (with a poisoned pad after every output row, which
// must survive) and compared by normalised mean squared error
// (sum (gpu-ref)^2 / sum ref^2; see woCheck for few outputs) with a bound
// per op. Subtests are named
// op=<op>/type=<type>/rows=<r>/cols=<c>/ntok=<n>[/<variant>], so -run
// selects any slice of the table, e.g.
//
//	go test ./cudadrv/kernels -run 'TestWeightOps/op=matvec/type=Q4_K'
//
// Ops and their references (float64 sums over ops' dequantized weights):
//
//	quantize  GPU Q8_1 vs ops.Quantize(Q8_1): quants and scales equal
//	matvec    MatMul with ntok <= 8: quantized types against the GPU's own
//	          Q8_1 activations (the integer path is exact up to float32
//	          sums: bound 1e-8) and, loosely, against the f32 activations
//	          (activation quantization noise: 5e-4); float types against
//	          the f32 activations (1e-9)
//	matmul    MatMul with ntok > 8 (f16 tensor cores) against the f32
//	          activations: 1e-4
//	getrows   GetRows against ops.DequantizeRow: bit-identical
//	moe       MoEMatMul, decode (ntok <= 8, matvec) and grouped (tensor
//	          cores), shared and per-slot inputs, same bounds
//	graph     MatMul and MoEMatMul captured into a CUDA graph and replayed:
//	          identical to direct launches
//
// The seed is random per run and logged; WEIGHTOPS_SEED=<n> repeats a run.
// Without a CUDA driver and device the tests skip and say why.

const (
	woBoundQuant = 1e-8 // integer matvec vs its own Q8_1 activations
	woBoundAct   = 5e-4 // integer matvec vs unquantized activations
	woBoundAct2  = 1e-8 // the same, activations in two Q8_1 planes
	woBoundFloat = 1e-9 // float matvec (float32 FMA over float32 inputs)
	woBoundF16   = 1e-4 // tensor-core path (f16 weights and activations)
	woPoison     = 0x7fc00bad
)

var woFix struct {
	once sync.Once
	ctx  *cudadrv.Context
	info cudadrv.DeviceInfo
	w    *WeightOps
	jit  time.Duration
	err  error
	seed uint64
}

// woSetup returns the shared context and loaded kernels, or skips.
func woSetup(tb testing.TB) (*cudadrv.Context, *WeightOps) {
	tb.Helper()
	if ok, reason := cudadrv.Available(); !ok {
		tb.Skip("skipping GPU weight-kernel test: " + reason)
	}
	woFix.once.Do(func() {
		d, err := cudadrv.GetDevice(0)
		if err != nil {
			woFix.err = err
			return
		}
		if woFix.info, err = d.Info(); err != nil {
			woFix.err = err
			return
		}
		if woFix.ctx, err = d.RetainPrimaryContext(); err != nil {
			woFix.err = err
			return
		}
		t0 := time.Now()
		woFix.w, woFix.err = LoadWeightOps(woFix.ctx)
		if woFix.w != nil {
			woFix.w.SetBatchPlanes(true) // the batched two-plane kernels too
		}
		woFix.jit = time.Since(t0)
		woFix.seed = rand.Uint64()
		if s := os.Getenv("WEIGHTOPS_SEED"); s != "" {
			woFix.seed, _ = strconv.ParseUint(s, 10, 64)
		}
	})
	if woFix.err != nil {
		tb.Fatalf("loading the weight kernels: %v", woFix.err)
	}
	return woFix.ctx, woFix.w
}

func woRand(salt string) *rand.Rand {
	var h uint64 = 14695981039346656037
	for i := 0; i < len(salt); i++ {
		h = (h ^ uint64(salt[i])) * 1099511628211
	}
	return rand.New(rand.NewPCG(woFix.seed, h))
}

// ---- device buffers

type woBuf struct {
	p cudadrv.DevicePtr
	n int
}

func woAlloc(tb testing.TB, ctx *cudadrv.Context, n int) woBuf {
	tb.Helper()
	p, err := ctx.Alloc(max(n, 16))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ctx.Free(p) })
	return woBuf{p, n}
}

func woUpload(tb testing.TB, ctx *cudadrv.Context, b []byte) woBuf {
	tb.Helper()
	d := woAlloc(tb, ctx, len(b))
	if err := ctx.CopyHtoD(d.p, b); err != nil {
		tb.Fatal(err)
	}
	return d
}

func woDownload(tb testing.TB, ctx *cudadrv.Context, d woBuf) []byte {
	tb.Helper()
	if err := ctx.Synchronize(); err != nil {
		tb.Fatal(err)
	}
	b := make([]byte, d.n)
	if err := ctx.CopyDtoH(b, d.p); err != nil {
		tb.Fatal(err)
	}
	return b
}

// woPoisoned allocates n float32s of NaN poison.
func woPoisoned(tb testing.TB, ctx *cudadrv.Context, n int) woBuf {
	tb.Helper()
	d := woAlloc(tb, ctx, 4*n)
	if err := ctx.MemsetD32(d.p, woPoison, n); err != nil {
		tb.Fatal(err)
	}
	return d
}

func woF32s(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func woI32s(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

// woGauss returns n normal values; every row of cols gets its own scale,
// so blocks see varied magnitudes.
func woGauss(r *rand.Rand, n, cols int) []float32 {
	v := make([]float32, n)
	var s float64
	for i := range v {
		if i%cols == 0 {
			s = math.Exp(r.NormFloat64())
		}
		v[i] = float32(r.NormFloat64() * s)
	}
	return v
}

// ---- weights, cached per (type, rows, cols, experts)

type woWeight struct {
	m   Matrix
	raw []byte
	deq []float32 // rows*experts x cols, ops' dequantization
}

var woWeights = map[string]*woWeight{}

func woGetWeight(tb testing.TB, ctx *cudadrv.Context, t gguf.Type, rows, cols, experts int) *woWeight {
	tb.Helper()
	key := fmt.Sprint(t, rows, cols, experts)
	if w, ok := woWeights[key]; ok {
		return w
	}
	m := Matrix{Type: t, Rows: rows, Cols: cols}
	rb := m.RowBytes()
	n := rows * experts
	src := woGauss(woRand("w"+key), n*cols, cols)
	raw := make([]byte, n*rb)
	deq := make([]float32, n*cols)
	woParallel(n, func(r int) {
		if err := ops.Quantize(t, raw[r*rb:(r+1)*rb], src[r*cols:(r+1)*cols]); err != nil {
			panic(err)
		}
		if err := ops.DequantizeRow(t, deq[r*cols:(r+1)*cols], raw[r*rb:(r+1)*rb]); err != nil {
			panic(err)
		}
	})
	p, err := ctx.Alloc(len(raw))
	if err != nil {
		tb.Fatal(err)
	}
	if err := ctx.CopyHtoD(p, raw); err != nil {
		tb.Fatal(err)
	}
	m.Data = p
	w := &woWeight{m: m, raw: raw, deq: deq}
	woWeights[key] = w
	return w
}

func woFreeWeights(ctx *cudadrv.Context) {
	for k, w := range woWeights {
		ctx.Free(w.m.Data)
		delete(woWeights, k)
	}
}

// woParallel runs f(0..n-1) on all cores.
func woParallel(n int, f func(i int)) {
	nw := min(n, runtime.NumCPU())
	var wg sync.WaitGroup
	for w := range nw {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += nw {
				f(i)
			}
		}()
	}
	wg.Wait()
}

// ---- checks

// woCheck compares the nRows x rows outputs in got (rows ldOut floats
// apart; the pad after each row must still be poison) with the reference
// and fails above bound. It returns the normalised error
// sum (gpu-ref)^2 / max(sum ref^2, sum_outputs sum_k (w_k x_k)^2): the
// plain NMSE wherever there are many outputs, and for a handful of
// outputs, whose dot products may cancel far below the size of their
// terms, the error relative to the terms, which rounding and activation
// quantization errors scale with.
func woCheck(tb testing.TB, what string, got []byte, ldOut, rows int, ref woRef, bound float64) float64 {
	tb.Helper()
	nRows := len(ref.v) / rows
	var num, den, terms float64
	bad := 0
	for t := 0; t < nRows; t++ {
		for c := 0; c < ldOut; c++ {
			bits := binary.LittleEndian.Uint32(got[4*(t*ldOut+c):])
			if c >= rows {
				if bits != woPoison && bad < 5 {
					tb.Errorf("%s: pad [%d][%d] overwritten (%#x)", what, t, c, bits)
					bad++
				}
				continue
			}
			g := float64(math.Float32frombits(bits))
			r := ref.v[t*rows+c]
			terms += ref.terms[t*rows+c]
			if math.IsNaN(g) || math.IsInf(g, 0) {
				if bad < 5 {
					tb.Errorf("%s: out[%d][%d] = %v (ref %v)", what, t, c, g, r)
				}
				bad++
				continue
			}
			num += (g - r) * (g - r)
			den += r * r
		}
	}
	nmse := num / max(den, terms, 1e-300)
	if bad > 0 {
		tb.Fatalf("%s: %d bad outputs", what, bad)
	}
	if nmse > bound {
		tb.Errorf("%s: NMSE %.3g above %.1g", what, nmse, bound)
	}
	return nmse
}

// woQ8 decodes GPU Q8_1 activations (nRows x cols) to float64 values.
func woQ8(b []byte, nRows, cols int) []float64 {
	ds := b[align16(nRows*cols):]
	v := make([]float64, nRows*cols)
	for i := range v {
		d := math.Float32frombits(binary.LittleEndian.Uint32(ds[8*(i/32):]))
		v[i] = float64(int8(b[i])) * float64(d)
	}
	return v
}

// woQ8Planes is woQ8 of nRows rows in two planes: each row the sum of its
// planes' values.
func woQ8Planes(b []byte, nRows, cols int) []float64 {
	v := woQ8(b, 2*nRows, cols)
	for i := range nRows * cols {
		v[i] += v[nRows*cols+i]
	}
	return v[:nRows*cols]
}

// woRef holds reference outputs and, per output, the sum of its squared
// terms.
type woRef struct{ v, terms []float64 }

// woDot computes ref[t*rows + r] = sum_k deq[wrow(t, r)][k] * x[xrow(t)][k].
func woDot(deq []float32, cols int, x []float64, ldx int, nOut, rows int, wrow func(t, r int) int, xrow func(t int) int) woRef {
	ref := woRef{make([]float64, nOut*rows), make([]float64, nOut*rows)}
	woParallel(nOut*rows, func(i int) {
		t, r := i/rows, i%rows
		w := deq[wrow(t, r)*cols:][:cols]
		xv := x[xrow(t)*ldx:][:cols]
		var s, s2 float64
		for k, wv := range w {
			p := float64(wv) * xv[k]
			s += p
			s2 += p * p
		}
		ref.v[i], ref.terms[i] = s, s2
	})
	return ref
}

func woF64(v []float32) []float64 {
	o := make([]float64, len(v))
	for i, x := range v {
		o[i] = float64(x)
	}
	return o
}

// ---- the table

type woCase struct {
	op               string
	typ              gguf.Type
	rows, cols, ntok int
	variant          string // matvec: "ks=N", "r=N"; matmul: "bn=N"; moe: "k=K/perslot=B[/bn=N/ids=skew]"
}

func (c woCase) name() string {
	s := fmt.Sprintf("op=%s/type=%s/rows=%d/cols=%d/ntok=%d", c.op, c.typ, c.rows, c.cols, c.ntok)
	if c.op == "quantize" {
		s = fmt.Sprintf("op=quantize/ntok=%d/cols=%d", c.ntok, c.cols)
	}
	if c.variant != "" {
		s += "/" + c.variant
	}
	return s
}

func woColsFor(t gguf.Type) []int {
	info, _ := t.Info()
	switch {
	case info.BlockSize == 256:
		return []int{256, 1280, 5120}
	case info.BlockSize == 32:
		return []int{32, 1056, 5120}
	}
	return []int{32, 100, 1000, 5120}
}

func woCases() []woCase {
	var cs []woCase
	for _, sh := range [][2]int{{1, 32}, {3, 96}, {8, 5120}, {300, 4096}} {
		cs = append(cs, woCase{op: "quantize", ntok: sh[0], cols: sh[1]})
	}
	for _, t := range WeightTypes {
		cols := woColsFor(t)
		for _, rows := range []int{1, 7, 33, 4096 + 13} {
			for _, c := range cols {
				if rows > 33 && c > 1280 {
					continue
				}
				for _, n := range []int{1, 2, 3, 8} {
					if rows > 33 && (n == 2 || n == 3) {
						continue
					}
					cs = append(cs, woCase{op: "matvec", typ: t, rows: rows, cols: c, ntok: n})
				}
				for _, n := range []int{9, 64, 300} {
					if rows*c*n > 200_000_000 {
						continue
					}
					cs = append(cs, woCase{op: "matmul", typ: t, rows: rows, cols: c, ntok: n})
				}
			}
		}
		// The matvec over more tokens than a launch takes: in runs, and
		// on the tensor cores where the type has mvt_ kernels.
		if !isFloat(t) {
			for _, n := range []int{13, MatVecQ8_1MaxTokens} {
				cs = append(cs, woCase{op: "matvec", typ: t, rows: 33, cols: cols[1], ntok: n, variant: "chunked"})
				cs = append(cs, woCase{op: "matvec", typ: t, rows: 33, cols: cols[1], ntok: n, variant: "chunked/mvt=off"})
			}
			// Two planes: a launch's rows and their second planes, in
			// runs of half the tokens.
			for _, n := range []int{1, 2, 3, 4, 5, 8, 13, MatVecQ8_1MaxTokens} {
				cs = append(cs, woCase{op: "matvec", typ: t, rows: 33, cols: cols[1], ntok: n, variant: "chunked/planes=2/mvt=off"})
			}
			cs = append(cs, woCase{op: "matvec", typ: t, rows: 33, cols: cols[len(cols)-1], ntok: 1, variant: "chunked/planes=2/ks=4"})
			cs = append(cs, woCase{op: "group", typ: t, rows: 300, cols: cols[1], ntok: 3, variant: "dense/planes=2"})
		}
		if t == gguf.TypeQ4_K || t == gguf.TypeQ6_K {
			// Every fragment count and a partial last fragment; rows
			// short of a 16-row tile; one super-block, fewer than the
			// warps, and odd counts (Q6_K rows of 1280 values are 1050
			// bytes: 2-byte aligned).
			for _, rows := range []int{7, 33, 4096 + 13} {
				for _, c := range cols {
					for _, n := range []int{1, 5, 8, 9, 16, 17, 32, 33, 48} {
						if rows > 33 && (c > 1280 || n%8 != 1) {
							continue
						}
						cs = append(cs, woCase{op: "matvec", typ: t, rows: rows, cols: c, ntok: n, variant: "chunked/mvt=1"})
					}
				}
			}
			// The same in two planes: every fragment count of the
			// planes' tokens, and a partial last one.
			for _, rows := range []int{7, 33, 4096 + 13} {
				for _, n := range []int{1, 2, 4, 5, 8, 9, 16, 17, 24, 33, 48} {
					if rows > 33 && n%8 != 1 {
						continue
					}
					cs = append(cs, woCase{op: "matvec", typ: t, rows: rows, cols: cols[1], ntok: n, variant: "chunked/planes=2/mvt=1"})
				}
			}
			for _, ks := range []int{1, 2, 4} {
				cs = append(cs, woCase{op: "matvec", typ: t, rows: mvt2Rows + 13, cols: cols[1], ntok: 9, variant: fmt.Sprintf("chunked/planes=2/mvt=1/ks=%d", ks)})
			}
			// Launches of mvt2Rows rows and more: two tiles a warp (mvt2_).
			for _, sh := range [][2]int{{cols[1], 9}, {cols[1], 33}, {cols[0], 17}} {
				cs = append(cs, woCase{op: "matvec", typ: t, rows: mvt2Rows + 13, cols: sh[0], ntok: sh[1], variant: "chunked/mvt=1"})
			}
			cs = append(cs, woCase{op: "group", typ: t, rows: mvt2Rows + 7, cols: cols[1], ntok: 12, variant: "dense"})
			// Each K split, with super-blocks fewer than and not a
			// multiple of the warps that share them.
			for _, ks := range []int{1, 2, 4} {
				for _, c := range cols[1:] {
					cs = append(cs, woCase{op: "matvec", typ: t, rows: 4096 + 13, cols: c, ntok: 20, variant: fmt.Sprintf("chunked/mvt=1/ks=%d", ks)})
				}
			}
		}
		// The K split and row-group variants of the matvec.
		big := cols[len(cols)-1]
		for _, ks := range []int{1, 2, 4} {
			cs = append(cs, woCase{op: "matvec", typ: t, rows: 33, cols: big, ntok: 1, variant: fmt.Sprintf("ks=%d", ks)})
			cs = append(cs, woCase{op: "matvec", typ: t, rows: 33, cols: big, ntok: 8, variant: fmt.Sprintf("ks=%d", ks)})
		}
		if t == gguf.TypeQ4_K || t == gguf.TypeQ6_K || t == gguf.TypeQ8_0 {
			for _, r := range []int{1, 4} {
				cs = append(cs, woCase{op: "matvec", typ: t, rows: 33, cols: big, ntok: 1, variant: fmt.Sprintf("r=%d", r)})
				cs = append(cs, woCase{op: "matvec", typ: t, rows: 4096 + 13, cols: cols[1], ntok: 1, variant: fmt.Sprintf("r=%d", r)})
			}
		}
		for _, c := range cols[:2] {
			cs = append(cs, woCase{op: "getrows", typ: t, rows: 33, cols: c, ntok: 20})
		}
		for _, n := range []int{1, 5, 40, 300} {
			for _, perSlot := range []bool{false, true} {
				cs = append(cs, woCase{op: "moe", typ: t, rows: 33, cols: cols[1], ntok: n, variant: fmt.Sprintf("k=4/perslot=%v", perSlot)})
			}
		}
		// Several matrices of one type in one tensor-core launch (rows:
		// those of the first; the others 33 and 7 / 4096+13 rows).
		for _, sh := range [][3]int{{130, cols[1], 77}, {1, cols[0], 300}} {
			cs = append(cs, woCase{op: "multi", typ: t, rows: sh[0], cols: sh[1], ntok: sh[2]})
		}
		// Each token tile of the tensor-core kernel, forced: dense, and MoE
		// with experts of 0, 1 and many slots (ids=skew), odd counts.
		for _, bn := range mmTiles {
			for _, sh := range [][3]int{{33, cols[1], 9}, {4096 + 13, cols[0], 300}, {130, cols[1], 77}} {
				cs = append(cs, woCase{op: "matmul", typ: t, rows: sh[0], cols: sh[1], ntok: sh[2], variant: fmt.Sprintf("bn=%d", bn)})
			}
			for _, n := range []int{37, 300} {
				for _, perSlot := range []bool{false, true} {
					cs = append(cs, woCase{op: "moe", typ: t, rows: 130, cols: cols[1], ntok: n, variant: fmt.Sprintf("k=4/perslot=%v/bn=%d/ids=skew", perSlot, bn)})
				}
			}
			cs = append(cs, woCase{op: "moereuse", typ: t, rows: 130, cols: cols[1], ntok: 77, variant: fmt.Sprintf("bn=%d", bn)})
		}
		cs = append(cs, woCase{op: "graph", typ: t, rows: 33, cols: cols[1], ntok: 1})
		if !isFloat(t) {
			// Several matrices in one launch: Q, K, V (dense) and gate, up (MoE).
			for _, n := range []int{1, 3, 20, 41} {
				cs = append(cs, woCase{op: "group", typ: t, rows: 300, cols: cols[1], ntok: n, variant: "dense"})
			}
			cs = append(cs, woCase{op: "group", typ: t, rows: 33, cols: cols[1], ntok: 1, variant: "moe"})
			cs = append(cs, woCase{op: "group", typ: t, rows: 33, cols: cols[1], ntok: 3, variant: "moe"})
		}
	}
	return cs
}

func TestWeightOps(t *testing.T) {
	ctx, w := woSetup(t)
	t.Logf("%s (CC %d.%d, %d SMs): weight kernels loaded in %v; seed %d (WEIGHTOPS_SEED)",
		woFix.info.Name, woFix.info.Major, woFix.info.Minor, woFix.info.Multiprocessors, woFix.jit, woFix.seed)
	t.Cleanup(func() { woFreeWeights(ctx) })
	type worst struct {
		nmse float64
		name string
	}
	summary := map[string]*worst{}
	var mu sync.Mutex
	note := func(key string, nmse float64, name string) {
		mu.Lock()
		defer mu.Unlock()
		if summary[key] == nil || nmse > summary[key].nmse {
			summary[key] = &worst{nmse, name}
		}
	}
	counts := map[string][2]int{}
	for _, c := range woCases() {
		ok := t.Run(c.name(), func(t *testing.T) {
			switch c.op {
			case "quantize":
				woTestQuantize(t, ctx, w, c)
			case "matvec", "matmul":
				woTestMatMul(t, ctx, w, c, note)
			case "multi":
				woTestMulti(t, ctx, w, c, note)
			case "getrows":
				woTestGetRows(t, ctx, w, c)
			case "moe":
				woTestMoE(t, ctx, w, c, note)
			case "moereuse":
				woTestMoEReuse(t, ctx, w, c, note)
			case "graph":
				woTestGraph(t, ctx, w, c)
			case "group":
				woTestGroup(t, ctx, w, c, note)
			}
		})
		k := c.op
		if c.op != "quantize" {
			k = c.op + "/" + c.typ.String()
		}
		n := counts[k]
		n[0]++
		if !ok {
			n[1]++
		}
		counts[k] = n
	}
	// The summary: cases and failures per op and type, worst NMSE per check.
	var keys []string
	for _, op := range []string{"quantize", "matvec", "matmul", "multi", "getrows", "moe", "moereuse", "graph", "group"} {
		if op == "quantize" {
			keys = append(keys, op)
			continue
		}
		for _, typ := range WeightTypes {
			keys = append(keys, op+"/"+typ.String())
		}
	}
	var lines []string
	for _, k := range keys {
		n, ok := counts[k]
		if !ok {
			continue
		}
		line := fmt.Sprintf("%-16s cases %3d failed %d", k, n[0], n[1])
		for _, chk := range []string{"q8", "act", "f32", "f16"} {
			if s := summary[k+"/"+chk]; s != nil {
				line += fmt.Sprintf("  %s %.1e", chk, s.nmse)
			}
		}
		lines = append(lines, line)
	}
	t.Logf("op table (worst NMSE per check: q8 = vs the GPU's Q8_1 activations, act = vs f32 activations through Q8_1, f32 = float path, f16 = tensor cores):\n%s",
		joinLines(lines))
}

func joinLines(l []string) string {
	s := ""
	for _, x := range l {
		s += x + "\n"
	}
	return s
}

func woTestQuantize(t *testing.T, ctx *cudadrv.Context, w *WeightOps, c woCase) {
	ldx := c.cols + 3
	x := woGauss(woRand(c.name()), c.ntok*ldx, ldx)
	xd := woUpload(t, ctx, woF32s(x))
	q := woAlloc(t, ctx, Q8_1Bytes(c.ntok, c.cols))
	if err := ctx.MemsetD8(q.p, 0xa5, q.n); err != nil {
		t.Fatal(err)
	}
	if err := w.QuantizeQ8_1(nil, xd.p, ldx, c.ntok, c.cols, q.p); err != nil {
		t.Fatal(err)
	}
	got := woDownload(t, ctx, q)
	ds := got[align16(c.ntok*c.cols):]
	ref := make([]byte, c.cols/32*36)
	for tk := 0; tk < c.ntok; tk++ {
		if err := ops.Quantize(gguf.TypeQ8_1, ref, x[tk*ldx:tk*ldx+c.cols]); err != nil {
			t.Fatal(err)
		}
		for b := 0; b < c.cols/32; b++ {
			blk := ref[36*b:]
			gi := tk*c.cols/32 + b
			d := math.Float32frombits(binary.LittleEndian.Uint32(ds[8*gi:]))
			s := math.Float32frombits(binary.LittleEndian.Uint32(ds[8*gi+4:]))
			if h := ops.F32ToF16(d); h != binary.LittleEndian.Uint16(blk) {
				t.Fatalf("token %d block %d: d = %v (f16 %#x), ops has f16 %#x", tk, b, d, h, binary.LittleEndian.Uint16(blk))
			}
			sum := 0
			for j := 0; j < 32; j++ {
				g := got[tk*c.cols+32*b+j]
				if g != blk[4+j] {
					t.Fatalf("token %d value %d: q = %d, ops has %d", tk, 32*b+j, int8(g), int8(blk[4+j]))
				}
				sum += int(int8(g))
			}
			if s != float32(sum)*d {
				t.Fatalf("token %d block %d: d*sum = %v, want %v", tk, b, s, float32(sum)*d)
			}
		}
	}
	// The host twin, in one plane and in two, bit for bit.
	for _, planes := range []int{1, 2} {
		q := woAlloc(t, ctx, Q8_1PlanesBytes(planes, c.ntok, c.cols))
		if err := ctx.MemsetD8(q.p, 0xa5, q.n); err != nil {
			t.Fatal(err)
		}
		if err := w.QuantizeQ8_1Planes(nil, xd.p, ldx, c.ntok, c.cols, planes, q.p); err != nil {
			t.Fatal(err)
		}
		rows := make([]float32, 0, c.ntok*c.cols)
		for tk := 0; tk < c.ntok; tk++ {
			rows = append(rows, x[tk*ldx:tk*ldx+c.cols]...)
		}
		want, err := Q8_1Host(rows, c.ntok, c.cols, planes)
		if err != nil {
			t.Fatal(err)
		}
		if msg := Q8_1Compare(woDownload(t, ctx, q), want, c.ntok, c.cols, planes); msg != "" {
			t.Fatalf("%d planes: %s", planes, msg)
		}
	}
}

func woTestMatMul(t *testing.T, ctx *cudadrv.Context, w *WeightOps, c woCase, note func(string, float64, string)) {
	wt := woGetWeight(t, ctx, c.typ, c.rows, c.cols, 1)
	m := wt.m
	ldx := c.cols + 4
	if c.ntok%2 == 0 {
		ldx = c.cols + 3
	}
	ldOut := c.rows + 3
	x := woGauss(woRand(c.name()), c.ntok*ldx, ldx)
	xd := woUpload(t, ctx, woF32s(x))
	out := woPoisoned(t, ctx, c.ntok*ldOut)
	planes := max(woVariantInt(c.variant, "planes"), 1)
	scratch := woAlloc(t, ctx, max(MatMulScratchBytes(m, c.ntok), Q8_1PlanesBytes(planes, c.ntok, c.cols)))
	w.mvKS = woVariantInt(c.variant, "ks")
	switch c.variant {
	case "r=1", "r=4":
		w.mvRows = int(c.variant[2] - '0')
	}
	w.mmBN = woVariantInt(c.variant, "bn")
	switch {
	case strings.Contains(c.variant, "mvt=off"):
		w.SetDecodeMMA(0)
	case strings.Contains(c.variant, "mvt="):
		w.SetDecodeMMA(woVariantInt(c.variant, "mvt"))
	}
	defer func() { w.SetDecodeMMA(-1) }()
	var err error
	if strings.HasPrefix(c.variant, "chunked") {
		// More tokens than one matvec launch takes: MatVecQ8_1 in runs of
		// MatVecMaxTokens (the engine's decode rows of many sequences).
		if err = w.QuantizeQ8_1Planes(nil, xd.p, ldx, c.ntok, c.cols, planes, scratch.p); err == nil {
			err = w.MatVecQ8_1GroupPlanes(nil, []Matrix{m}, scratch.p, planes, c.ntok, []cudadrv.DevicePtr{out.p}, []int{ldOut})
		}
	} else {
		err = w.MatMul(nil, m, xd.p, ldx, c.ntok, out.p, ldOut, scratch.p)
	}
	w.mvKS, w.mvRows, w.mmBN = 0, 0, 0
	if err != nil {
		t.Fatal(err)
	}
	got := woDownload(t, ctx, out)
	key := c.op + "/" + c.typ.String()
	wrow := func(_, r int) int { return r }
	xrow := func(t int) int { return t }
	refAct := woDot(wt.deq, c.cols, woF64(x), ldx, c.ntok, c.rows, wrow, xrow)
	switch {
	case c.op == "matmul":
		note(key+"/f16", woCheck(t, "vs f32 activations", got, ldOut, c.rows, refAct, woBoundF16), c.name())
	case isFloat(c.typ):
		note(key+"/f32", woCheck(t, "vs f32 activations", got, ldOut, c.rows, refAct, woBoundFloat), c.name())
	case planes == 2:
		xq := woQ8Planes(woDownload(t, ctx, woBuf{scratch.p, Q8_1PlanesBytes(2, c.ntok, c.cols)}), c.ntok, c.cols)
		refQ := woDot(wt.deq, c.cols, xq, c.cols, c.ntok, c.rows, wrow, xrow)
		note(key+"/q8", woCheck(t, "vs GPU Q8_1 activations (two planes)", got, ldOut, c.rows, refQ, woBoundQuant), c.name())
		note(key+"/act2", woCheck(t, "vs f32 activations (two planes)", got, ldOut, c.rows, refAct, woBoundAct2), c.name())
	default:
		xq := woQ8(woDownload(t, ctx, woBuf{scratch.p, Q8_1Bytes(c.ntok, c.cols)}), c.ntok, c.cols)
		refQ := woDot(wt.deq, c.cols, xq, c.cols, c.ntok, c.rows, wrow, xrow)
		note(key+"/q8", woCheck(t, "vs GPU Q8_1 activations", got, ldOut, c.rows, refQ, woBoundQuant), c.name())
		note(key+"/act", woCheck(t, "vs f32 activations", got, ldOut, c.rows, refAct, woBoundAct), c.name())
	}
}

// woTestMulti: MatMulF16Multi of three matrices of the case's type and
// width (c.rows rows, then 33 or 4096+13, then 7) against each one's
// float64 product.
func woTestMulti(t *testing.T, ctx *cudadrv.Context, w *WeightOps, c woCase, note func(string, float64, string)) {
	rows := []int{c.rows, 33, 7}
	if c.rows < 33 {
		rows[1] = 4096 + 13
	}
	ldx := c.cols + 4
	x := woGauss(woRand(c.name()), c.ntok*ldx, ldx)
	xd := woUpload(t, ctx, woF32s(x))
	xh := woAlloc(t, ctx, F16Bytes(c.ntok, c.cols))
	if err := w.ConvertF16(nil, xd.p, ldx, c.ntok, c.cols, xh.p); err != nil {
		t.Fatal(err)
	}
	var ps []F16Product
	var wts []*woWeight
	var outs []woBuf
	for i, r := range rows {
		wt := woGetWeight(t, ctx, c.typ, r, c.cols, 1)
		out := woPoisoned(t, ctx, c.ntok*(r+i+1))
		wts, outs = append(wts, wt), append(outs, out)
		ps = append(ps, F16Product{M: wt.m, Out: out.p, LdOut: r + i + 1})
	}
	if err := w.MatMulF16Multi(nil, ps, xh.p, c.ntok); err != nil {
		t.Fatal(err)
	}
	for i, p := range ps {
		got := woDownload(t, ctx, outs[i])
		ref := woDot(wts[i].deq, c.cols, woF64(x), ldx, c.ntok, p.M.Rows, func(_, r int) int { return r }, func(t int) int { return t })
		note("multi/"+c.typ.String()+"/f16", woCheck(t, fmt.Sprintf("matrix %d vs f32 activations", i), got, p.LdOut, p.M.Rows, ref, woBoundF16), c.name())
	}
}

func woTestGetRows(t *testing.T, ctx *cudadrv.Context, w *WeightOps, c woCase) {
	wt := woGetWeight(t, ctx, c.typ, c.rows, c.cols, 1)
	r := woRand(c.name())
	ids := make([]int32, c.ntok)
	for i := range ids {
		ids[i] = int32(r.IntN(c.rows))
	}
	ids[0], ids[len(ids)-1] = 0, int32(c.rows-1)
	idd := woUpload(t, ctx, woI32s(ids))
	ldOut := c.cols + 3
	out := woPoisoned(t, ctx, c.ntok*ldOut)
	if err := w.GetRows(nil, wt.m, idd.p, c.ntok, out.p, ldOut); err != nil {
		t.Fatal(err)
	}
	got := woDownload(t, ctx, out)
	for i, id := range ids {
		for j := 0; j < ldOut; j++ {
			bits := binary.LittleEndian.Uint32(got[4*(i*ldOut+j):])
			want := uint32(woPoison)
			if j < c.cols {
				want = math.Float32bits(wt.deq[int(id)*c.cols+j])
			}
			if bits != want {
				t.Fatalf("row %d (id %d) value %d: %#x (%v), want %#x (%v)", i, id, j, bits,
					math.Float32frombits(bits), want, math.Float32frombits(want))
			}
		}
	}
}

func woMoEIDs(r *rand.Rand, nTok, k, nExp int) []int32 {
	ids := make([]int32, nTok*k)
	for tk := 0; tk < nTok; tk++ {
		perm := r.Perm(nExp)
		for j := 0; j < k; j++ {
			ids[tk*k+j] = int32(perm[j])
		}
	}
	return ids
}

// woMoEIDsSkewed gives nExp (>= k+2) experts very different loads: expert
// 0 no slot, expert 1 one (token 0's), experts 2..k+1 nearly every token.
func woMoEIDsSkewed(r *rand.Rand, nTok, k, nExp int) []int32 {
	ids := make([]int32, nTok*k)
	for tk := 0; tk < nTok; tk++ {
		pick := make([]int32, k)
		for j := range pick {
			pick[j] = int32(2 + j)
		}
		if tk == 0 {
			pick[0] = 1
		}
		r.Shuffle(k, func(a, b int) { pick[a], pick[b] = pick[b], pick[a] })
		copy(ids[tk*k:], pick)
	}
	return ids
}

// woVariantInt is the value of key=N in a case's variant, 0 if absent.
func woVariantInt(variant, key string) int {
	for _, f := range strings.Split(variant, "/") {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}

const woExperts = 6

func woTestMoE(t *testing.T, ctx *cudadrv.Context, w *WeightOps, c woCase, note func(string, float64, string)) {
	const k = 4
	perSlot := strings.Contains(c.variant, "perslot=true")
	wt := woGetWeight(t, ctx, c.typ, c.rows, c.cols, woExperts)
	e := MoE{Matrix: wt.m, NExpert: woExperts, K: k, PerSlot: perSlot}
	r := woRand(c.name())
	ids := woMoEIDs(r, c.ntok, k, woExperts)
	if strings.Contains(c.variant, "ids=skew") {
		ids = woMoEIDsSkewed(r, c.ntok, k, woExperts)
	}
	inRows := e.inputRows(c.ntok)
	ldx := c.cols + 4
	x := woGauss(r, inRows*ldx, ldx)
	xd := woUpload(t, ctx, woF32s(x))
	idd := woUpload(t, ctx, woI32s(ids))
	ldOut := c.rows + 3
	nslots := c.ntok * k
	out := woPoisoned(t, ctx, nslots*ldOut)
	scratch := woAlloc(t, ctx, MoEScratchBytes(e, c.ntok))
	w.moeBN = woVariantInt(c.variant, "bn")
	err := w.MoEMatMul(nil, e, idd.p, xd.p, ldx, c.ntok, out.p, ldOut, scratch.p)
	w.moeBN = 0
	if err != nil {
		t.Fatal(err)
	}
	got := woDownload(t, ctx, out)
	wrow := func(p, row int) int { return int(ids[p])*c.rows + row }
	xrow := func(p int) int {
		if perSlot {
			return p
		}
		return p / k
	}
	key := "moe/" + c.typ.String()
	refAct := woDot(wt.deq, c.cols, woF64(x), ldx, nslots, c.rows, wrow, xrow)
	switch {
	case c.ntok > MoEMatVecMaxTokens:
		note(key+"/f16", woCheck(t, "vs f32 activations", got, ldOut, c.rows, refAct, woBoundF16), c.name())
	case isFloat(c.typ):
		note(key+"/f32", woCheck(t, "vs f32 activations", got, ldOut, c.rows, refAct, woBoundFloat), c.name())
	default:
		xq := woQ8(woDownload(t, ctx, woBuf{scratch.p, Q8_1Bytes(inRows, c.cols)}), inRows, c.cols)
		refQ := woDot(wt.deq, c.cols, xq, c.cols, nslots, c.rows, wrow, xrow)
		note(key+"/q8", woCheck(t, "vs GPU Q8_1 activations", got, ldOut, c.rows, refQ, woBoundQuant), c.name())
		note(key+"/act", woCheck(t, "vs f32 activations", got, ldOut, c.rows, refAct, woBoundAct), c.name())
	}
}

// woTestGroup runs MatVecQ8_1Group over three matrices of different row
// counts (dense), or MoEMatVecQ8_1Group over two expert stacks (MoE), in
// one launch each, and checks every output against the products of its own
// matrix with the GPU's Q8_1 activations.
func woTestGroup(t *testing.T, ctx *cudadrv.Context, w *WeightOps, c woCase, note func(string, float64, string)) {
	r := woRand(c.name())
	key := "group/" + c.typ.String()
	if strings.HasPrefix(c.variant, "dense") {
		planes := max(woVariantInt(c.variant, "planes"), 1)
		rowsOf := []int{c.rows, 7, 33 + 64}
		var ms []Matrix
		var wts []*woWeight
		var outs []cudadrv.DevicePtr
		var bufs []woBuf
		var lds []int
		for _, rows := range rowsOf {
			wt := woGetWeight(t, ctx, c.typ, rows, c.cols, 1)
			wts, ms = append(wts, wt), append(ms, wt.m)
			b := woPoisoned(t, ctx, c.ntok*(rows+1))
			bufs, outs, lds = append(bufs, b), append(outs, b.p), append(lds, rows+1)
		}
		x := woGauss(r, c.ntok*c.cols, c.cols)
		xd := woUpload(t, ctx, woF32s(x))
		xq := woAlloc(t, ctx, Q8_1PlanesBytes(planes, c.ntok, c.cols))
		if err := w.QuantizeQ8_1Planes(nil, xd.p, c.cols, c.ntok, c.cols, planes, xq.p); err != nil {
			t.Fatal(err)
		}
		if err := w.MatVecQ8_1GroupPlanes(nil, ms, xq.p, planes, c.ntok, outs, lds); err != nil {
			t.Fatal(err)
		}
		xb := woDownload(t, ctx, woBuf{xq.p, Q8_1PlanesBytes(planes, c.ntok, c.cols)})
		q := woQ8(xb, c.ntok, c.cols)
		if planes == 2 {
			q = woQ8Planes(xb, c.ntok, c.cols)
		}
		for i, wt := range wts {
			ref := woDot(wt.deq, c.cols, q, c.cols, c.ntok, rowsOf[i], func(_, r int) int { return r }, func(t int) int { return t })
			note(key+"/dense", woCheck(t, fmt.Sprintf("matrix %d vs GPU Q8_1 activations", i), woDownload(t, ctx, bufs[i]), lds[i], rowsOf[i], ref, woBoundQuant), c.name())
		}
		return
	}
	const k = 4
	gate := woGetWeight(t, ctx, c.typ, c.rows, c.cols, woExperts)
	upw := woGetWeight(t, ctx, c.typ, c.rows+8, c.cols, woExperts)
	ids := woMoEIDs(r, c.ntok, k, woExperts)
	idd := woUpload(t, ctx, woI32s(ids))
	x := woGauss(r, c.ntok*c.cols, c.cols)
	xd := woUpload(t, ctx, woF32s(x))
	xq := woAlloc(t, ctx, Q8_1Bytes(c.ntok, c.cols))
	if err := w.QuantizeQ8_1(nil, xd.p, c.cols, c.ntok, c.cols, xq.p); err != nil {
		t.Fatal(err)
	}
	nslots := c.ntok * k
	wts := []*woWeight{gate, upw}
	var es []MoE
	var bufs []woBuf
	var outs []cudadrv.DevicePtr
	var lds []int
	for _, wt := range wts {
		es = append(es, MoE{Matrix: wt.m, NExpert: woExperts, K: k})
		b := woPoisoned(t, ctx, nslots*(wt.m.Rows+2))
		bufs, outs, lds = append(bufs, b), append(outs, b.p), append(lds, wt.m.Rows+2)
	}
	if err := w.MoEMatVecQ8_1Group(nil, es, idd.p, xq.p, c.ntok, outs, lds); err != nil {
		t.Fatal(err)
	}
	q := woQ8(woDownload(t, ctx, woBuf{xq.p, Q8_1Bytes(c.ntok, c.cols)}), c.ntok, c.cols)
	for i, wt := range wts {
		rows := wt.m.Rows
		ref := woDot(wt.deq, c.cols, q, c.cols, nslots, rows, func(p, r int) int { return int(ids[p])*rows + r }, func(p int) int { return p / k })
		note(key+"/moe", woCheck(t, fmt.Sprintf("stack %d vs GPU Q8_1 activations", i), woDownload(t, ctx, bufs[i]), lds[i], rows, ref, woBoundQuant), c.name())
	}
}

// woTestMoEReuse: an MoE layer's three products on one scratch, as the
// executor queues them: gate (c.rows rows, shared input), up (33 rows)
// reusing gate's grouping and gathered input, down (cols x 7 rows... of
// c.cols-wide per-slot input) reusing the grouping only.
func woTestMoEReuse(t *testing.T, ctx *cudadrv.Context, w *WeightOps, c woCase, note func(string, float64, string)) {
	const k = 4
	r := woRand(c.name())
	ids := woMoEIDsSkewed(r, c.ntok, k, woExperts)
	idd := woUpload(t, ctx, woI32s(ids))
	nslots := c.ntok * k
	ldx := c.cols + 4
	xTok := woGauss(r, c.ntok*ldx, ldx)
	xSlot := woGauss(r, nslots*ldx, ldx)
	xTokD, xSlotD := woUpload(t, ctx, woF32s(xTok)), woUpload(t, ctx, woF32s(xSlot))
	type step struct {
		rows    int
		perSlot bool
		reuse   MoEReuse
	}
	steps := []step{{c.rows, false, MoEReuseNothing}, {33, false, MoEReuseInput}, {7, true, MoEReuseGroups}}
	var scratchBytes int
	for _, st := range steps {
		wt := woGetWeight(t, ctx, c.typ, st.rows, c.cols, woExperts)
		scratchBytes = max(scratchBytes, MoEScratchBytes(MoE{Matrix: wt.m, NExpert: woExperts, K: k, PerSlot: st.perSlot}, c.ntok))
	}
	scratch := woAlloc(t, ctx, scratchBytes)
	w.moeBN = woVariantInt(c.variant, "bn")
	defer func() { w.moeBN = 0 }()
	for i, st := range steps {
		wt := woGetWeight(t, ctx, c.typ, st.rows, c.cols, woExperts)
		e := MoE{Matrix: wt.m, NExpert: woExperts, K: k, PerSlot: st.perSlot}
		x, xd := xTok, xTokD
		if st.perSlot {
			x, xd = xSlot, xSlotD
		}
		ldOut := st.rows + 1
		out := woPoisoned(t, ctx, nslots*ldOut)
		if err := w.MoEMatMulReusing(nil, e, idd.p, xd.p, ldx, c.ntok, out.p, ldOut, scratch.p, st.reuse); err != nil {
			t.Fatal(err)
		}
		got := woDownload(t, ctx, out)
		wrow := func(p, row int) int { return int(ids[p])*st.rows + row }
		xrow := func(p int) int {
			if st.perSlot {
				return p
			}
			return p / k
		}
		ref := woDot(wt.deq, c.cols, woF64(x), ldx, nslots, st.rows, wrow, xrow)
		note("moereuse/"+c.typ.String()+"/f16", woCheck(t, fmt.Sprintf("product %d vs f32 activations", i), got, ldOut, st.rows, ref, woBoundF16), c.name())
	}
}

// woTestGraph captures a decode matvec, a prefill matmul and both MoE paths
// on a stream, replays the graph into fresh poison and compares with direct
// launches: nothing in the launchers depends on the host between replays.
func woTestGraph(t *testing.T, ctx *cudadrv.Context, w *WeightOps, c woCase) {
	wt := woGetWeight(t, ctx, c.typ, c.rows, c.cols, 1)
	we := woGetWeight(t, ctx, c.typ, c.rows, c.cols, woExperts)
	e := MoE{Matrix: we.m, NExpert: woExperts, K: 2}
	r := woRand(c.name())
	const nBig = 40
	x := woGauss(r, nBig*c.cols, c.cols)
	xd := woUpload(t, ctx, woF32s(x))
	idd := woUpload(t, ctx, woI32s(woMoEIDs(r, nBig, 2, woExperts)))
	type job struct {
		n       int
		moe     bool
		scratch woBuf
		out     woBuf
	}
	jobs := []*job{{n: 1}, {n: nBig}, {n: 1, moe: true}, {n: nBig, moe: true}}
	for _, j := range jobs {
		if j.moe {
			j.scratch = woAlloc(t, ctx, MoEScratchBytes(e, j.n))
			j.out = woAlloc(t, ctx, 4*j.n*2*c.rows)
		} else {
			j.scratch = woAlloc(t, ctx, MatMulScratchBytes(wt.m, j.n))
			j.out = woAlloc(t, ctx, 4*j.n*c.rows)
		}
	}
	run := func(s *cudadrv.Stream) error {
		for _, j := range jobs {
			var err error
			if j.moe {
				err = w.MoEMatMul(s, e, idd.p, xd.p, c.cols, j.n, j.out.p, c.rows, j.scratch.p)
			} else {
				err = w.MatMul(s, wt.m, xd.p, c.cols, j.n, j.out.p, c.rows, j.scratch.p)
			}
			if err != nil {
				return err
			}
		}
		return nil
	}
	poison := func() {
		for _, j := range jobs {
			if err := ctx.MemsetD32(j.out.p, woPoison, j.out.n/4); err != nil {
				t.Fatal(err)
			}
		}
		// The memsets run on the legacy stream, which a non-blocking
		// stream does not wait for.
		if err := ctx.Synchronize(); err != nil {
			t.Fatal(err)
		}
	}
	poison()
	if err := run(nil); err != nil {
		t.Fatal(err)
	}
	var direct [][]byte
	for _, j := range jobs {
		direct = append(direct, woDownload(t, ctx, j.out))
	}
	s, err := ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	g, err := s.Capture(cudadrv.CaptureRelaxed, func() error { return run(s) })
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	ge, err := g.Instantiate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ge.Destroy()
	for rep := 0; rep < 2; rep++ {
		poison()
		if err := ge.Launch(s); err != nil {
			t.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			t.Fatal(err)
		}
		for i, j := range jobs {
			if got := woDownload(t, ctx, j.out); string(got) != string(direct[i]) {
				t.Fatalf("replay %d, job %d (ntok %d, moe %v): differs from the direct launch", rep, i, j.n, j.moe)
			}
		}
	}
}

// TestMVSplit pins the K-split choices measured best on an H200 (132 SMs,
// 2 rows per row group; run 3 of docs/bench/gpu-kernels.md in the git history): see mvSplit.
func TestMVSplit(t *testing.T) {
	cases := []struct {
		name           string
		groups, nchunk int
		direct         bool
		want           int
	}{
		{"ffn_up 17408x5120", 8704, 5, false, 1},
		{"attn_q 5120x5120", 2560, 5, false, 1},
		{"attn_k 1024x5120", 512, 5, false, 4},
		{"ffn_down 5120x17408, staged (Q6_K)", 2560, 17, false, 4},
		{"ffn_down 5120x17408, direct (Q4_K)", 2560, 17, true, 1},
		{"attn_k 1024x5120, direct (Q4_K)", 512, 5, true, 4},
		{"moe gate 768x2048, 8 slots", 3072, 2, true, 1},
		{"moe down 2048x768, 8 slots", 8192, 1, false, 1},
		{"tiny 1x256", 1, 1, false, 1},
		{"33x5120", 17, 5, false, 4},
	}
	for _, c := range cases {
		if got := mvSplit(c.groups, c.nchunk, 132, c.direct); got != c.want {
			t.Errorf("%s: mvSplit(%d, %d, direct=%v) = %d, want %d", c.name, c.groups, c.nchunk, c.direct, got, c.want)
		}
	}
}

// TestMVTSplit: the K split of the tensor-core decode kernels for Qwen3-14B's
// products on an H200 (132 SMs), against the fastest of BenchmarkDecodeBatch.
func TestMVTSplit(t *testing.T) {
	cases := []struct {
		name             string
		tiles, nsb, nTok int
		mt               int
		want             int
	}{
		{"ffn_up 17408x5120 (mvt2_), 8 tokens", 544, 20, 8, 1, 2},
		{"ffn_up 17408x5120 (mvt2_), 32 tokens", 544, 20, 32, 1, 2},
		{"ffn_down 5120x17408, 32 tokens", 320, 68, 32, 0, 4},
		{"attn_q 5120x5120, 8 tokens", 320, 20, 8, 0, 4},
		{"attn_k 1024x5120, 32 tokens", 64, 20, 32, 0, 4},
		{"one tile of one super-block: a tie, the first tried", 1, 1, 8, 0, 4},
	}
	for _, c := range cases {
		if got := mvtSplit(c.tiles, c.nsb, 132*mvtBlocksPerSM(c.nTok, c.mt)); got != c.want {
			t.Errorf("%s: mvtSplit = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestMVTUse: which products take the tensor-core decode kernels: each
// type's own fewest tokens, a count set, off, and never before CC 8.0 or
// for a type without them.
func TestMVTUse(t *testing.T) {
	withMVT := &typeKernels{mvtMin: mvtTypes[gguf.TypeQ6_K]}
	withMVT.mvt[0][0] = &cudadrv.Function{}
	without := &typeKernels{}
	cases := []struct {
		name    string
		ampere  bool
		setting int
		k       *typeKernels
		nTok    int
		want    bool
	}{
		{"Q6_K below its own", true, -1, withMVT, 8, false},
		{"Q6_K at its own", true, -1, withMVT, 9, true},
		{"set to 2", true, 2, withMVT, 2, true},
		{"set to 2, one token", true, 2, withMVT, 1, false},
		{"off", true, 0, withMVT, 32, false},
		{"before CC 8.0", false, -1, withMVT, 32, false},
		{"a type without them", true, -1, without, 32, false},
	}
	for _, c := range cases {
		w := &WeightOps{tensorCoreInt8: c.ampere}
		w.SetDecodeMMA(c.setting)
		if got := w.mvtUse(c.k, c.nTok); got != c.want {
			t.Errorf("%s: mvtUse(%d tokens) = %v, want %v", c.name, c.nTok, got, c.want)
		}
	}
	if mvtTypes[gguf.TypeQ4_K] != 4 || mvtTypes[gguf.TypeQ6_K] != 9 {
		t.Errorf("mvtTypes = %v: the measured minimums are Q4_K 4, Q6_K 9", mvtTypes)
	}
}

// TestLayCTAs: the blocks of a launch of several matrices, and where each
// member's begin (mv_member reads them), rows rounded up per matrix.
func TestLayCTAs(t *testing.T) {
	p := mvArgs{rows: 5120, nextra: 2}
	p.m[0].rows, p.m[1].rows = 1024, 1000
	if got := p.layCTAs(32); got != 160+32+32 || p.m[0].bx0 != 160 || p.m[1].bx0 != 192 {
		t.Errorf("32 rows a block: %d blocks, members at %d and %d; want 224, 160 and 192", got, p.m[0].bx0, p.m[1].bx0)
	}
	one := mvArgs{rows: 7}
	if got := one.layCTAs(16); got != 1 {
		t.Errorf("7 rows, 16 a block: %d blocks, want 1", got)
	}
}
