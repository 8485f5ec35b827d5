package ops

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/atsinfer/ats/gguf"
)

// Every CPU level's kernels against the generic (pure-Go) reference, on
// random data: odd block counts, rows and token counts that exercise every
// token grouping, slices misaligned within larger buffers, and guard values
// around the outputs that must stay untouched.

// asmLevels are the levels other than generic this machine runs.
func asmLevels() []Level {
	var ls []Level
	for _, l := range SupportedLevels() {
		if l != LevelGeneric {
			ls = append(ls, l)
		}
	}
	return ls
}

// forEachLevel runs f for each accelerated level, or logs why none runs.
func forEachLevel(t *testing.T, f func(t *testing.T, l Level)) {
	ls := asmLevels()
	if len(ls) == 0 {
		t.Logf("no assembly kernels in this build or on this CPU (levels %v); generic only", SupportedLevels())
		// Still run against the generic level: mul's loops are checked too.
		ls = []Level{LevelGeneric}
	}
	for _, l := range ls {
		t.Run(l.String(), func(t *testing.T) { f(t, l) })
	}
}

// guard is the bit pattern written around outputs: a NaN no kernel makes.
var guard = math.Float32frombits(0x7fa5a5a5)

func isGuard(f float32) bool { return math.Float32bits(f) == 0x7fa5a5a5 }

// misaligned returns a copy of b starting off bytes into a larger buffer.
func misaligned(b []byte, off int) []byte {
	buf := make([]byte, len(b)+off+64)
	for i := range buf {
		buf[i] = 0xee
	}
	copy(buf[off:], b)
	return buf[off : off+len(b) : off+len(b)]
}

// kernelCase is a matrix of random weights and quantized activations.
type kernelCase struct {
	typ       gguf.Type
	k         *Kernel
	n, rows   int
	nTok      int
	w, xq     []byte
	rb, ab    int
	realistic bool
}

func newKernelCase(typ gguf.Type, n, rows, nTok int, realistic bool, off int, rng *rand.Rand) *kernelCase {
	k, _ := KernelFor(typ)
	c := &kernelCase{typ: typ, k: k, n: n, rows: rows, nTok: nTok, rb: k.RowBytes(n), ab: k.ActRowBytes(n), realistic: realistic}
	w := make([]byte, 0, rows*c.rb)
	for range rows {
		if realistic {
			row := make([]byte, c.rb)
			if err := Quantize(typ, row, gaussRow(n, rng)); err != nil {
				panic(err)
			}
			w = append(w, row...)
		} else {
			w = append(w, randomRow(typ, n, rng)...)
		}
	}
	xq := make([]byte, nTok*c.ab)
	gq := genericImpl(typ).quantAct
	for t := range nTok {
		gq(xq[t*c.ab:(t+1)*c.ab], gaussRow(n, rng))
	}
	c.w, c.xq = misaligned(w, off), misaligned(xq, (off*7)%64)
	return c
}

// want is the generic product and a bound on each output's rounding error.
func (c *kernelCase) want() (out, tol []float64) {
	g := genericImpl(c.typ)
	out = make([]float64, c.nTok*c.rows)
	tol = make([]float64, c.nTok*c.rows)
	for t := range c.nTok {
		x := c.xq[t*c.ab : (t+1)*c.ab]
		for r := range c.rows {
			w := c.w[r*c.rb : (r+1)*c.rb]
			out[t*c.rows+r] = float64(g.dot(c.n, w, x))
			_, mag := refDot(c.typ, c.k.ActType, w, x, c.n)
			tol[t*c.rows+r] = 2e-5*mag + 1e-30
		}
	}
	return out, tol
}

// run computes the case with level l's mul into an output with a leading
// dimension wider than rows, guards all around.
func (c *kernelCase) run(l Level) (got []float32, ok bool, where string) {
	ld := c.rows + 3
	const pad = 16
	buf := make([]float32, pad+c.nTok*ld+pad)
	for i := range buf {
		buf[i] = guard
	}
	out := buf[pad : pad+(c.nTok-1)*ld+c.rows]
	implFor(l, c.typ).mul(c.n, c.w, c.rb, c.rows, c.xq, c.ab, c.nTok, out, ld)
	got = make([]float32, c.nTok*c.rows)
	for i, v := range buf {
		j := i - pad
		t, r := j/ld, j%ld
		inside := j >= 0 && t < c.nTok && r < c.rows
		if inside {
			got[t*c.rows+r] = v
		} else if !isGuard(v) {
			return nil, false, fmt.Sprintf("buffer index %d (token %d, column %d) was written", j, t, r)
		}
	}
	return got, true, ""
}

// kernelTypes are the weight types with kernels to compare: every type,
// since levels fall back to generic where they have no assembly.
func kernelTypes() []gguf.Type { return SupportedTypes() }

func sizesFor(typ gguf.Type) []int {
	info, _ := typ.Info()
	if info.BlockSize == 1 {
		return []int{1, 15, 16, 17, 63, 64, 65, 200, 1024}
	}
	return []int{info.BlockSize, 3 * info.BlockSize, 16 * info.BlockSize, 33 * info.BlockSize}
}

func TestKernelsMatchGeneric(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		rng := rand.New(rand.NewPCG(uint64(l), 77))
		for _, typ := range kernelTypes() {
			for _, n := range sizesFor(typ) {
				for _, realistic := range []bool{false, true} {
					rows := 1 + rng.IntN(9)
					nTok := 1 + rng.IntN(9)
					c := newKernelCase(typ, n, rows, nTok, realistic, rng.IntN(64), rng)
					want, tol := c.want()
					got, ok, where := c.run(l)
					if !ok {
						t.Fatalf("%s n=%d rows=%d nTok=%d: %s", typ, n, rows, nTok, where)
					}
					for i := range want {
						if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol[i]) {
							t.Errorf("%s n=%d rows=%d nTok=%d realistic=%v: token %d row %d = %g, generic %g (diff %g > %g)",
								typ, n, rows, nTok, realistic, i/rows, i%rows, got[i], want[i], d, tol[i])
							break
						}
					}
				}
			}
		}
	})
}

// TestKernelTokenGroups checks that a token's result does not depend on how
// many tokens are computed with it (the kernels group 4, 2 and 1), nor on
// the row range a thread gets: bit for bit, as the engine's thread-count
// independence needs.
func TestKernelTokenGroups(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		rng := rand.New(rand.NewPCG(uint64(l), 78))
		for _, typ := range kernelTypes() {
			n := sizesFor(typ)[2]
			c := newKernelCase(typ, n, 11, 9, true, 5, rng)
			all, ok, where := c.run(l)
			if !ok {
				t.Fatalf("%s: %s", typ, where)
			}
			im := implFor(l, typ)
			one := make([]float32, 1)
			for tok := range c.nTok {
				for r := range c.rows {
					im.mul(c.n, c.w[r*c.rb:(r+1)*c.rb], c.rb, 1, c.xq[tok*c.ab:], c.ab, 1, one, 1)
					if math.Float32bits(one[0]) != math.Float32bits(all[tok*c.rows+r]) {
						t.Fatalf("%s token %d row %d: %g alone, %g in a group of %d tokens", typ, tok, r, one[0], all[tok*c.rows+r], c.nTok)
					}
					if d := im.dot(c.n, c.w[r*c.rb:(r+1)*c.rb], c.xq[tok*c.ab:(tok+1)*c.ab]); math.Float32bits(d) != math.Float32bits(one[0]) {
						t.Fatalf("%s token %d row %d: dot %g, mul %g", typ, tok, r, d, one[0])
					}
				}
			}
		}
	})
}

// TestKernelArgumentChecks: the assembly trusts its arguments, so the Go
// side must refuse slices that are too short.
func TestKernelArgumentChecks(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		rng := rand.New(rand.NewPCG(1, 2))
		for _, typ := range kernelTypes() {
			if archImpl(l, typ).mul == nil {
				continue // generic: Go's bounds checks
			}
			n := sizesFor(typ)[1]
			c := newKernelCase(typ, n, 3, 2, false, 0, rng)
			im := implFor(l, typ)
			short := func(b []byte) []byte { return append([]byte(nil), b[:len(b)-1]...) }
			mustPanic := func(what string, f func()) {
				defer func() {
					if recover() == nil {
						t.Errorf("%s %s: no panic", typ, what)
					}
				}()
				f()
			}
			out := make([]float32, 2*3)
			mustPanic("short weights", func() { im.mul(c.n, short(c.w), c.rb, 3, c.xq, c.ab, 2, out, 3) })
			mustPanic("short activations", func() { im.mul(c.n, c.w, c.rb, 3, short(c.xq), c.ab, 2, out, 3) })
			mustPanic("short output", func() { im.mul(c.n, c.w, c.rb, 3, c.xq, c.ab, 2, out[:5:5], 3) })
			mustPanic("short dot", func() { im.dot(c.n, short(c.w[:c.rb]), c.xq) })
		}
	})
}

func TestKernelQuantizeAct(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		rng := rand.New(rand.NewPCG(uint64(l), 79))
		for _, typ := range kernelTypes() {
			k, _ := KernelFor(typ)
			for _, n := range sizesFor(typ) {
				for rep := range 6 {
					x := gaussRow(n, rng)
					switch rep {
					case 1:
						clear(x[:min(len(x), 40)]) // an all-zero block
					case 2:
						for i := range x {
							x[i] = float32(rng.IntN(7)-3) * 0.25 // ties and repeated maxima
						}
					case 3:
						for i := range x {
							x[i] *= 1e-30 // tiny: subnormal products
						}
					case 4:
						if k.ActType != gguf.TypeQ8_K {
							continue // Q8_0: NaN handling is ggml's MAX order, not reproduced
						}
						for i := 0; i < len(x); i += 37 {
							x[i] = float32(math.NaN()) // skipped by the maximum, quantized to 0
						}
					case 5:
						x[len(x)/2] = float32(math.Inf(-1))
					}
					want := make([]byte, k.ActRowBytes(n))
					genericImpl(typ).quantAct(want, x)
					ab := k.ActRowBytes(n)
					buf := misaligned(make([]byte, ab+2), 1+rng.IntN(62))
					for i := range buf {
						buf[i] = 0xa5
					}
					implFor(l, typ).quantAct(buf[1:1+ab], x)
					if buf[0] != 0xa5 || buf[ab+1] != 0xa5 {
						t.Fatalf("%s n=%d: QuantizeAct wrote outside its row", typ, n)
					}
					if got := buf[1 : 1+ab]; string(got) != string(want) {
						i := 0
						for got[i] == want[i] {
							i++
						}
						t.Fatalf("%s %s n=%d rep=%d: activation bytes differ from generic at byte %d: %#x, want %#x", l, k.ActType, n, rep, i, got[i], want[i])
					}
				}
			}
		}
	})
}

// FuzzKernels compares every level with generic on fuzzed weights.
func FuzzKernels(f *testing.F) {
	f.Add(uint8(9), uint16(3), uint8(2), uint8(3), uint64(1))
	f.Add(uint8(11), uint16(1), uint8(1), uint8(5), uint64(2))
	f.Add(uint8(6), uint16(7), uint8(3), uint8(4), uint64(3))
	f.Fuzz(func(t *testing.T, ti uint8, blocks uint16, rows, nTok uint8, seed uint64) {
		types := kernelTypes()
		typ := types[int(ti)%len(types)]
		info, _ := typ.Info()
		n := (1 + int(blocks)%40) * info.BlockSize
		if info.BlockSize == 1 {
			n = 1 + int(blocks)%2000
		}
		r, nt := 1+int(rows)%12, 1+int(nTok)%9
		rng := rand.New(rand.NewPCG(seed, 80))
		c := newKernelCase(typ, n, r, nt, seed%2 == 0, int(seed%64), rng)
		want, tol := c.want()
		for _, l := range SupportedLevels() {
			got, ok, where := c.run(l)
			if !ok {
				t.Fatalf("%s %s: %s", l, typ, where)
			}
			for i := range want {
				if d := math.Abs(float64(got[i]) - want[i]); !(d <= tol[i]) {
					t.Fatalf("%s %s n=%d: output %d = %g, generic %g", l, typ, n, i, got[i], want[i])
				}
			}
		}
	})
}

// TestAVX2KernelsUseVEXRegisters: the AVX2 and AVX-VNNI kernels must run on CPUs without
// AVX-512, so they may only name X0-X15/Y0-Y15 (registers 16-31 need EVEX
// encoding). avo allocates from all 32, so check what it produced.
func TestAVX2KernelsUseVEXRegisters(t *testing.T) {
	src, err := os.ReadFile("dot_amd64.s")
	if err != nil {
		t.Skip("no amd64 assembly:", err)
	}
	high := regexp.MustCompile(`\b[XYZ](1[6-9]|2[0-9]|3[01])\b|\bZ[0-9]+\b|\bK[1-7]\b`)
	var fn string
	for i, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "TEXT ") {
			fn = line
			continue
		}
		if (strings.Contains(fn, "AVX2") || strings.Contains(fn, "AVXVNNI")) && high.MatchString(line) {
			t.Errorf("dot_amd64.s:%d in %s: %s", i+1, fn, strings.TrimSpace(line))
		}
	}
}

// TestAttentionKernels checks the strided F16 row products and the value
// accumulation of each level against the generic ones.
func TestAttentionKernels(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		dots, axpy := archFloat(l)
		if l == LevelGeneric || dots == nil {
			dots, axpy = rowsF16Generic, axpyF16Generic
		}
		rng := rand.New(rand.NewPCG(uint64(l), 81))
		for _, hs := range []int{8, 16, 64, 80, 128, 256} {
			for _, npos := range []int{1, 3, 17, 64} {
				width := 3*hs + 8 // a row of the cache: several heads
				cache := randomRow(gguf.TypeF16, npos*width, rng)
				kb := misaligned(cache, rng.IntN(64))
				nt := 1 + rng.IntN(6)
				q := make([]byte, nt*2*hs)
				quantF16(q, gaussRow(nt*hs, rng))
				off := 2 * hs // the second head
				got := make([]float32, nt*npos)
				want := make([]float32, nt*npos)
				dots(hs, kb[off:], 2*width, npos, q, 2*hs, nt, got, npos)
				rowsF16Generic(hs, kb[off:], 2*width, npos, q, 2*hs, nt, want, npos)
				for i := range want {
					var mag float64
					tk, r := i/npos, i%npos
					for e := 0; e < hs; e++ {
						kv := F16ToF32(uint16(kb[off+r*2*width+2*e]) | uint16(kb[off+r*2*width+2*e+1])<<8)
						qv := F16ToF32(uint16(q[tk*2*hs+2*e]) | uint16(q[tk*2*hs+2*e+1])<<8)
						mag += math.Abs(float64(kv) * float64(qv))
					}
					if d := math.Abs(float64(got[i] - want[i])); d > 1e-5*mag+1e-30 {
						t.Fatalf("hs=%d npos=%d: score %d = %g, generic %g", hs, npos, i, got[i], want[i])
					}
				}
				p := make([]float32, npos)
				for i := range p {
					p[i] = rng.Float32()
				}
				buf := make([]float32, hs+2)
				buf[0], buf[hs+1] = guard, guard
				ref := make([]float32, hs)
				for i := range ref {
					ref[i] = float32(i)
					buf[1+i] = float32(i)
				}
				axpy(p, kb[off:], 2*width, hs, buf[1:1+hs])
				axpyF16Generic(p, kb[off:], 2*width, hs, ref)
				if !isGuard(buf[0]) || !isGuard(buf[hs+1]) {
					t.Fatalf("hs=%d: axpy wrote outside its row", hs)
				}
				for i := range ref {
					// The kernels fuse p·v into the sum (FMA), the reference
					// rounds it first: allow for that relative to the terms'
					// magnitude as well, since they may cancel.
					mag := math.Abs(float64(i))
					for j := range p {
						e := off + j*2*width + 2*i
						mag += math.Abs(float64(p[j]) * float64(F16ToF32(uint16(kb[e])|uint16(kb[e+1])<<8)))
					}
					if d := math.Abs(float64(buf[1+i] - ref[i])); d > 1e-4*(1+math.Abs(float64(ref[i]))) && d > 1e-5*mag {
						t.Fatalf("hs=%d npos=%d: axpy[%d] = %g, generic %g", hs, npos, i, buf[1+i], ref[i])
					}
				}
			}
		}
	})
}

func TestExpApprox(t *testing.T) {
	for x := float32(-87); x < 88; x += 0.0137 {
		want := math.Exp(float64(x))
		if got := float64(expApprox(x)); math.Abs(got-want) > 4e-7*want {
			t.Fatalf("expApprox(%g) = %g, want %g (rel %g)", x, got, want, math.Abs(got-want)/want)
		}
	}
	if v := expApprox(-1000); !(v >= 0 && v < 1e-37) {
		t.Errorf("expApprox(-1000) = %g", v)
	}
	if v := expApprox(1000); !(v > 1e38 && !math.IsInf(float64(v), 0)) {
		t.Errorf("expApprox(1000) = %g", v)
	}
}

// TestVectorMath checks each level's SwiGLU and exp-shift against the
// reference (math.Exp) and the twin (expApprox), with guards around the
// output and misaligned rows.
func TestVectorMath(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		sw, ex := archVMath(l)
		if sw == nil {
			t.Skip("no vector math at this level")
		}
		rng := rand.New(rand.NewPCG(uint64(l), 82))
		for _, n := range []int{1, 7, 8, 15, 16, 17, 33, 100, 3072} {
			off := rng.IntN(16)
			gate := append(make([]float32, off), gaussRow(n, rng)...)[off:]
			up := gaussRow(n, rng)
			gate[0] = -100 // exp overflows: silu → -0
			if n > 1 {
				gate[1] = 100
			}
			buf := make([]float32, n+2)
			buf[0], buf[n+1] = guard, guard
			sw(buf[1:n+1], gate, up)
			if !isGuard(buf[0]) || !isGuard(buf[n+1]) {
				t.Fatalf("n=%d: SwiGLU wrote outside its row", n)
			}
			want := make([]float32, n)
			swigluGeneric(want, gate, up)
			for i := range want {
				if d := math.Abs(float64(buf[1+i] - want[i])); d > 1e-6*math.Abs(float64(want[i]))+1e-30 {
					t.Fatalf("n=%d: SwiGLU[%d] = %g, reference %g", n, i, buf[1+i], want[i])
				}
			}
			x := gaussRow(n, rng)
			y := append([]float32(nil), x...)
			sum := ex(y, 1.5)
			var ref float64
			for i := range x {
				w := expApprox(x[i] - 1.5)
				if d := math.Abs(float64(y[i] - w)); d > 2.5e-7*float64(w) {
					t.Fatalf("n=%d: exp(x-m)[%d] = %g, twin %g", n, i, y[i], w)
				}
				ref += math.Exp(float64(x[i]) - 1.5)
			}
			if math.Abs(float64(sum)-ref) > 1e-5*ref {
				t.Fatalf("n=%d: sum %g, want %g", n, sum, ref)
			}
		}
	})
}

func TestCvtF16(t *testing.T) {
	forEachLevel(t, func(t *testing.T, l Level) {
		cv, sr := archCvtF16(l)
		if cv == nil {
			t.Skip("no conversion kernel at this level")
		}
		rng := rand.New(rand.NewPCG(uint64(l), 83))
		for _, n := range []int{1, 7, 8, 16, 17, 100, 1024} {
			src := make([]float32, n)
			for i := range src {
				switch i % 4 {
				case 0:
					src[i] = float32(rng.NormFloat64())
				case 1: // anywhere in (and past) the f16 range, subnormals included
					src[i] = math.Float32frombits(uint32(rng.IntN(2))<<31 | uint32(100+rng.IntN(45))<<23 | uint32(rng.IntN(1<<23)))
				case 2: // ties: exactly halfway between two halves
					src[i] = F16ToF32(uint16(rng.IntN(0x7bff))) + 0x1p-25
				case 3:
					src[i] = math.Float32frombits(0x477ff000 + uint32(rng.IntN(3)) - 1) // around the overflow threshold
				}
			}
			buf := make([]uint16, n+2)
			buf[0], buf[n+1] = 0xa5a5, 0xa5a5
			cv(buf[1:n+1], src)
			if buf[0] != 0xa5a5 || buf[n+1] != 0xa5a5 {
				t.Fatalf("n=%d: wrote outside", n)
			}
			for i, v := range src {
				if want := F32ToF16(v); buf[1+i] != want {
					t.Fatalf("n=%d: f16(%g) = %#x, want %#x", n, v, buf[1+i], want)
				}
			}
			x := gaussRow(n, rng)
			y := append([]float32(nil), x...)
			sr(y, 0.37)
			for i, v := range x {
				if want := F16ToF32(F32ToF16(v * 0.37)); math.Float32bits(y[i]) != math.Float32bits(want) {
					t.Fatalf("n=%d: round(%g·0.37) = %g, want %g", n, v, y[i], want)
				}
			}
		}
	})
}

// TestMulQGroup: a group of matrices (different types, same activation
// format) split together over the pool gives what each MulQ gives alone,
// bit for bit, at any thread count.
func TestMulQGroup(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	const n, nTok = 512, 5
	var ms []Matrix
	for i, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ6_K, gguf.TypeQ5_K} {
		k, _ := KernelFor(typ)
		rows := 37 + 50*i
		w := make([]byte, 0, rows*k.RowBytes(n))
		for range rows {
			w = append(w, randomRow(typ, n, rng)...)
		}
		m, err := NewMatrix(k, rows, n, w)
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	x := gaussRow(nTok*n, rng)
	xq := ms[0].QuantizeActs(nil, x, nTok, make([]byte, ms[0].ActBytes(nTok)))
	want := make([][]float32, len(ms))
	for i, m := range ms {
		want[i] = make([]float32, nTok*m.Rows)
		m.MulQ(nil, xq, nTok, want[i], m.Rows)
	}
	for _, threads := range []int{1, 2, 5} {
		p := NewPool(threads)
		outs := make([][]float32, len(ms))
		lds := make([]int, len(ms))
		for i, m := range ms {
			outs[i] = make([]float32, nTok*m.Rows)
			lds[i] = m.Rows
		}
		MulQGroup(p, ms, xq, nTok, outs, lds)
		for i := range ms {
			for j := range want[i] {
				if math.Float32bits(outs[i][j]) != math.Float32bits(want[i][j]) {
					t.Fatalf("threads %d matrix %d output %d: %g, alone %g", threads, i, j, outs[i][j], want[i][j])
				}
			}
		}
		p.Close()
	}
}

// TestAVXVNNIMatchesAVX2: the AVX-VNNI kernels compute the same int32 lanes
// as the AVX2 ones (VPDPBUSD in place of VPMADDUBSW+VPMADDWD, which never
// saturates on these operands) and convert them to float the same way, so
// their results must be bit for bit AVX2's.
func TestAVXVNNIMatchesAVX2(t *testing.T) {
	if !levelSupported(LevelAVXVNNI) {
		t.Skipf("no AVX-VNNI level here (levels %v)", SupportedLevels())
	}
	rng := rand.New(rand.NewPCG(5, 79))
	for _, typ := range []gguf.Type{gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ6_K, gguf.TypeQ8_0, gguf.TypeQ4_0} {
		for _, n := range sizesFor(typ) {
			for _, realistic := range []bool{false, true} {
				rows, nTok := 1+rng.IntN(9), 1+rng.IntN(9)
				c := newKernelCase(typ, n, rows, nTok, realistic, rng.IntN(64), rng)
				a, okA, whereA := c.run(LevelAVX2)
				v, okV, whereV := c.run(LevelAVXVNNI)
				if !okA || !okV {
					t.Fatalf("%s n=%d: %s %s", typ, n, whereA, whereV)
				}
				for i := range a {
					if math.Float32bits(a[i]) != math.Float32bits(v[i]) {
						t.Errorf("%s n=%d rows=%d nTok=%d: output %d: avxvnni %g, avx2 %g", typ, n, rows, nTok, i, v[i], a[i])
						break
					}
				}
			}
		}
	}
}

// TestExpShift checks the exported ExpShift at every level the CPU runs
// (SetCPULevel), the generic one included: exp(x-m) within the vector
// approximation's error of math.Exp, its sum, and a banned (-Inf) entry
// at most e^-87.
func TestExpShift(t *testing.T) {
	defer SetCPULevel(CPULevel())
	for _, l := range SupportedLevels() {
		if err := SetCPULevel(l); err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(uint64(l), 91))
		for _, n := range []int{1, 15, 16, 17, 1000} {
			x := gaussRow(n, rng)
			x[n/2] = float32(math.Inf(-1))
			y := append([]float32(nil), x...)
			sum := ExpShift(y, 2)
			var ref float64
			for i, v := range x {
				want := math.Exp(float64(v - 2)) // x - m in float32, as the kernels
				ref += want
				if d := math.Abs(float64(y[i]) - want); d > 4e-7*want+2e-38 {
					t.Fatalf("%s n=%d: exp(x[%d]-2) = %g, want %g", l, n, i, y[i], want)
				}
			}
			if math.Abs(float64(sum)-ref) > 1e-5*ref+2e-38 {
				t.Fatalf("%s n=%d: sum %g, want %g", l, n, sum, ref)
			}
		}
	}
}
