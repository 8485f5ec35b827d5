package ops

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
	"testing"

	"github.com/atsinfer/ats/gguf"
)

func randVec(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func relErr(got []float32, want []float64) float64 {
	var num, den float64
	for i := range want {
		d := float64(got[i]) - want[i]
		num += d * d
		den += want[i] * want[i]
	}
	return math.Sqrt(num / den)
}

func TestPoolCoversEveryItemOnce(t *testing.T) {
	for _, threads := range []int{1, 2, 3, 8, 17} {
		p := NewPool(threads)
		for _, n := range []int{0, 1, 2, 7, 64, 1000, 1001} {
			for _, grain := range []int{1, 3, 8, 64} {
				hits := make([]int32, n)
				p.Run(n, grain, func(lo, hi int) {
					if lo%grain != 0 {
						t.Errorf("range [%d,%d) does not start on a multiple of grain %d", lo, hi, grain)
					}
					for i := lo; i < hi; i++ {
						atomic.AddInt32(&hits[i], 1)
					}
				})
				for i, h := range hits {
					if h != 1 {
						t.Fatalf("threads %d n %d grain %d: item %d run %d times", threads, n, grain, i, h)
					}
				}
			}
		}
		p.Close()
	}
	var nilPool *Pool
	ran := 0
	nilPool.Run(5, 1, func(lo, hi int) { ran += hi - lo })
	if ran != 5 {
		t.Fatalf("nil pool ran %d of 5", ran)
	}
}

func TestRMSNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 7, 64, 257} {
		x, w := randVec(r, n, 2), randVec(r, n, 1)
		var ss float64
		for _, v := range x {
			ss += float64(v) * float64(v)
		}
		scale := 1 / math.Sqrt(ss/float64(n)+1e-6)
		want := make([]float64, n)
		for i := range want {
			want[i] = float64(x[i]) * scale * float64(w[i])
		}
		got := make([]float32, n)
		RMSNorm(got, x, w, 1e-6)
		if e := relErr(got, want); e > 1e-6 {
			t.Errorf("n=%d: relative error %g", n, e)
		}
		RMSNorm(x, x, w, 1e-6) // in place
		if e := relErr(x, want); e > 1e-6 {
			t.Errorf("n=%d in place: relative error %g", n, e)
		}
	}
}

func TestSoftmax(t *testing.T) {
	x := []float32{1, 2, 3, float32(math.Inf(-1))}
	Softmax(x)
	e := []float64{math.Exp(-2), math.Exp(-1), 1, 0}
	s := e[0] + e[1] + e[2]
	for i := range e {
		e[i] /= s
	}
	if err := relErr(x, e); err > 1e-6 {
		t.Fatalf("softmax %v, want %v", x, e)
	}
}

// TestRope checks both pair layouts against the rotation written out in
// float64, including partial rotation (the tail of each head unchanged).
func TestRope(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, neox := range []bool{false, true} {
		for _, dims := range []int{8, 16} {
			const heads, hs, pos = 3, 16, 37
			rp := &Rope{Dims: dims, Base: 10000, FreqScale: 1, NeoX: neox}
			x := randVec(r, heads*hs, 1)
			want := make([]float64, len(x))
			for i, v := range x {
				want[i] = float64(v)
			}
			for h := 0; h < heads; h++ {
				for i := 0; i < dims/2; i++ {
					theta := pos * math.Pow(10000, -2*float64(i)/float64(dims))
					a, b := h*hs+2*i, h*hs+2*i+1
					if neox {
						a, b = h*hs+i, h*hs+i+dims/2
					}
					x0, x1 := float64(x[a]), float64(x[b])
					want[a] = x0*math.Cos(theta) - x1*math.Sin(theta)
					want[b] = x0*math.Sin(theta) + x1*math.Cos(theta)
				}
			}
			cos, sin := make([]float32, dims/2), make([]float32, dims/2)
			rp.Table(pos, cos, sin)
			rp.Apply(x, heads, hs, cos, sin)
			if e := relErr(x, want); e > 1e-5 {
				t.Errorf("neox=%v dims=%d: relative error %g", neox, dims, e)
			}
		}
	}
}

func TestLlama3Factors(t *testing.T) {
	f := Llama3Factors(128, 500000, 8, 1, 4, 8192)
	if f[0] != 1 || f[63] != 8 {
		t.Fatalf("factors start %g end %g, want 1 and 8", f[0], f[63])
	}
	for i := 1; i < len(f); i++ {
		if f[i] < f[i-1] {
			t.Fatalf("factors not monotonic at %d: %g < %g", i, f[i], f[i-1])
		}
	}
}

// TestAttention compares causal GQA attention over an f32 cache with a
// float64 reference, for a batch starting at a non-zero position.
func TestAttention(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	const nh, nkv, hs, pos0, nTok = 8, 2, 16, 5, 4
	a := &Attention{NHeads: nh, NKVHeads: nkv, HeadSize: hs, Scale: DefaultScale(hs)}
	for _, f16 := range []bool{false, true} {
		typ := KVF32
		if f16 {
			typ = KVF16
		}
		kv, err := NewKVLayer(16, nkv, hs, typ)
		if err != nil {
			t.Fatal(err)
		}
		keys := make([][]float32, pos0+nTok)
		vals := make([][]float32, pos0+nTok)
		for p := range keys {
			keys[p], vals[p] = randVec(r, nkv*hs, 1), randVec(r, nkv*hs, 1)
			if err := kv.Store(p, keys[p], vals[p]); err != nil {
				t.Fatal(err)
			}
		}
		q := randVec(r, nTok*nh*hs, 1)
		out := make([]float32, nTok*nh*hs)
		if err := a.RunContiguous(NewPool(3), kv, q, out, nTok, pos0); err != nil {
			t.Fatal(err)
		}
		want := make([]float64, len(out))
		for tk := 0; tk < nTok; tk++ {
			for h := 0; h < nh; h++ {
				g := h / (nh / nkv)
				n := pos0 + tk + 1
				s := make([]float64, n)
				mx := math.Inf(-1)
				for p := 0; p < n; p++ {
					for i := 0; i < hs; i++ {
						s[p] += float64(q[tk*nh*hs+h*hs+i]) * float64(keys[p][g*hs+i])
					}
					s[p] /= math.Sqrt(hs)
					mx = math.Max(mx, s[p])
				}
				var sum float64
				for p := range s {
					s[p] = math.Exp(s[p] - mx)
					sum += s[p]
				}
				for p := range s {
					for i := 0; i < hs; i++ {
						want[tk*nh*hs+h*hs+i] += s[p] / sum * float64(vals[p][g*hs+i])
					}
				}
			}
		}
		bound := 1e-6
		if f16 {
			bound = 2e-3 // keys, values, queries and weights rounded to f16
		}
		if e := relErr(out, want); e > bound {
			t.Errorf("f16=%v: relative error %g over %g", f16, e, bound)
		}
	}
}

// TestMatMul checks batched products against dequantized float64 sums for
// every supported type, with thread counts that split rows unevenly.
func TestMatMul(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	for _, typ := range SupportedTypes() {
		k, err := KernelFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		const rows, nTok = 37, 3
		cols := 2 * max(k.BlockSize, 64)
		src := randVec(r, rows*cols, 0.5)
		data := make([]byte, rows*k.RowBytes(cols))
		if err := Quantize(typ, data, src); err != nil {
			t.Fatal(err)
		}
		m, err := NewMatrix(k, rows, cols, data)
		if err != nil {
			t.Fatal(err)
		}
		x := randVec(r, nTok*cols, 1)
		deq := make([]float32, cols)
		want := make([]float64, nTok*rows)
		for row := 0; row < rows; row++ {
			m.DequantizeRow(row, deq)
			for tk := 0; tk < nTok; tk++ {
				for i := range deq {
					want[tk*rows+row] += float64(deq[i]) * float64(x[tk*cols+i])
				}
			}
		}
		bound := 1e-6
		switch k.ActType {
		case gguf.TypeQ8_0, gguf.TypeQ8_1, gguf.TypeQ8_K:
			bound = 2e-2 // activations quantized to 8 bits
		case gguf.TypeF16, gguf.TypeBF16:
			bound = 1e-2
		}
		for _, threads := range []int{1, 3} {
			out := make([]float32, nTok*rows)
			m.Mul(NewPool(threads), x, nTok, out, rows, make([]byte, m.ActBytes(nTok)))
			if e := relErr(out, want); e > bound {
				t.Errorf("%s, %d threads: relative error %g over %g", typ, threads, e, bound)
			}
		}
	}
}
