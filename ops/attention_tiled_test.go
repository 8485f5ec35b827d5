package ops

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"strings"
	"testing"
)

// attnSeq describes one sequence of a test batch: its tokens are at
// positions from..from+n-1 (one token: a decode step), and its first
// shared blocks are those of sequence 0 (a common prompt prefix).
type attnSeq struct {
	from, n, shared int
}

// attnCase is a cache, a batch and its queries.
type attnCase struct {
	a  *Attention
	kv *KVLayer
	b  *AttnBatch
	q  []float32
}

// newAttnCase fills a cache of type typ through block tables (blocks of
// sequences handed out in a shuffled order, so no table is the identity)
// with random keys and values for every position the batch reads, and
// random queries.
func newAttnCase(t testing.TB, rng *rand.Rand, typ KVType, nh, nkv, hs, block int, seqs []attnSeq) *attnCase {
	t.Helper()
	a := &Attention{NHeads: nh, NKVHeads: nkv, HeadSize: hs, Scale: DefaultScale(hs)}
	width := nkv * hs
	total := 0
	for _, s := range seqs {
		total += (s.from+s.n+block-1)/block + 1
	}
	kv, err := NewKVLayer(total*block, nkv, hs, typ)
	if err != nil {
		t.Fatal(err)
	}
	ids := rng.Perm(total)
	next := 0
	b := &AttnBatch{Block: block}
	for si, s := range seqs {
		nb := (s.from + s.n + block - 1) / block
		table := make([]int32, nb)
		for i := range table {
			if i < s.shared && si > 0 {
				table[i] = b.Tables[0][i]
				continue
			}
			table[i] = int32(ids[next])
			next++
		}
		b.Tables = append(b.Tables, table)
		for p := s.from; p < s.from+s.n; p++ {
			b.Pos = append(b.Pos, int32(p))
			b.Seq = append(b.Seq, int32(si))
		}
	}
	// Every position each sequence reads, shared blocks written once
	// (by sequence 0, whose blocks they are).
	for si, s := range seqs {
		for p := 0; p < s.from+s.n; p++ {
			if si > 0 && p/block < s.shared {
				continue
			}
			cell := int(b.Tables[si][p/block])*block + p%block
			if err := kv.Store(cell, randVec(rng, width, 1), randVec(rng, width, 1)); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Queries scaled so that the softmax is neither flat nor one-hot.
	q := randVec(rng, len(b.Pos)*nh*hs, 2)
	return &attnCase{a: a, kv: kv, b: b, q: q}
}

// queryAsSeen is a query head as the kernels of a cache use it: rotated
// as the keys were, then rounded to the cache's query format.
func queryAsSeen(kv *KVLayer, x []float32) []float64 {
	typ := kv.Type
	if kv.RotK > 0 {
		x = append([]float32(nil), x...)
		fwht(x, kv.RotK)
	}
	v := make([]float32, len(x))
	switch typ {
	case KVF16:
		for i, f := range x {
			v[i] = F16ToF32(F32ToF16(f))
		}
	case KVQ8_0, KVQ4_0:
		q8 := make([]byte, len(x)/qk*blockQ8_0)
		quantActQ8_0(q8, x)
		dequantQ8_0(v, q8)
	default:
		copy(v, x)
	}
	f := make([]float64, len(v))
	for i, e := range v {
		f[i] = float64(e)
	}
	return f
}

// reference is the batch's attention in float64 over the cache's decoded
// rows and the queries as the kernels see them.
func (c *attnCase) reference() []float64 {
	a, kv, b := c.a, c.kv, c.b
	hs, group := a.HeadSize, a.NHeads/a.NKVHeads
	qw := a.NHeads * hs
	rb := kv.RowBytes()
	out := make([]float64, len(b.Pos)*qw)
	// Each sequence's rows, decoded once.
	keyRows := make([][][]float32, len(b.Tables))
	valRows := make([][][]float32, len(b.Tables))
	for t := range b.Pos {
		s, n := b.Seq[t], int(b.Pos[t])+1
		for p := len(keyRows[s]); p < n; p++ {
			cell := int(b.Tables[s][p/b.Block])*b.Block + p%b.Block
			k, v := make([]float32, kv.Width), make([]float32, kv.Width)
			loadTileGeneric(kv.Type, k, kv.K[cell*rb:], rb, 1, kv.Width)
			loadTileGeneric(kv.Type, v, kv.V[cell*rb:], rb, 1, kv.Width)
			keyRows[s], valRows[s] = append(keyRows[s], k), append(valRows[s], v)
		}
	}
	for t := range b.Pos {
		s, last := b.Seq[t], int(b.Pos[t])
		keys, vals := keyRows[s], valRows[s]
		for h := range a.NHeads {
			qh := queryAsSeen(kv, c.q[t*qw+h*hs:t*qw+h*hs+hs])
			g := h / group
			sc := make([]float64, last+1)
			mx := math.Inf(-1)
			for p := range sc {
				for d, qv := range qh {
					sc[p] += qv * float64(keys[p][g*hs+d])
				}
				sc[p] *= float64(a.Scale)
				mx = math.Max(mx, sc[p])
			}
			var sum float64
			for p := range sc {
				sc[p] = math.Exp(sc[p] - mx)
				sum += sc[p]
			}
			o := out[t*qw+h*hs : t*qw+h*hs+hs]
			for p, w := range sc {
				for d := range o {
					o[d] += w / sum * float64(vals[p][g*hs+d])
				}
			}
			if kv.RotV > 0 {
				hadamard64(o, kv.RotV)
			}
		}
	}
	return out
}

// hadamard64 multiplies each chunk of n values of x by the orthonormal
// Walsh-Hadamard matrix of order n (Sylvester's), in float64.
func hadamard64(x []float64, n int) {
	for c := 0; c+n <= len(x); c += n {
		y := x[c : c+n]
		z := make([]float64, n)
		for i := range z {
			for j, v := range y {
				// H[i][j] = (-1)^popcount(i&j) / sqrt(n)
				if bits.OnesCount(uint(i&j))%2 == 1 {
					v = -v
				}
				z[i] += v
			}
			z[i] /= math.Sqrt(float64(n))
		}
		copy(y, z)
	}
}

// attnNMSE is Σ(got-want)² / Σwant², the oracles' measure.
func attnNMSE(got []float32, want []float64) float64 {
	var num, den float64
	for i, w := range want {
		d := float64(got[i]) - w
		num += d * d
		den += w * w
	}
	return num / den
}

// attnBound is the NMSE a cache type's kernel may be off the float64
// reference by: float32 sums for every type, and for f16 the weights
// rounded to f16 (a relative 2^-12 on average, over hundreds of terms).
func attnBound(typ KVType) float64 {
	if typ == KVF16 {
		return 1e-6
	}
	return 1e-9
}

func (c *attnCase) run(t testing.TB, p *Pool) []float32 {
	t.Helper()
	out := make([]float32, len(c.q))
	for i := range out {
		out[i] = guard
	}
	if err := c.a.Run(p, c.kv, c.q, out, c.b); err != nil {
		t.Fatal(err)
	}
	for i, v := range out {
		if isGuard(v) || math.IsNaN(float64(v)) {
			t.Fatalf("output %d not written (%v)", i, v)
		}
	}
	return out
}

// TestAttentionTiled compares Run with the float64 reference for every
// cache type, head layouts with KV groups of 1, 2, 5 and 8 heads and head
// sizes 64 and 128, over batches that mix prompt chunks (tails of the
// query and key tiles, positions across block boundaries) and decode
// steps, sequences that share prefix blocks, and decodes deep enough to
// be split over their keys.
func TestAttentionTiled(t *testing.T) {
	type layout struct{ nh, nkv, hs int }
	layouts := []layout{{4, 4, 64}, {8, 4, 128}, {10, 2, 64}, {40, 8, 128}, {16, 2, 64}}
	batches := []struct {
		name  string
		block int
		seqs  []attnSeq
	}{
		{"prompt", 64, []attnSeq{{0, 37, 0}}},
		{"chunk-across-blocks", 64, []attnSeq{{50, 90, 0}}},
		{"long-chunk", 256, []attnSeq{{300, 333, 0}}},
		{"decode-deep-split", 64, []attnSeq{{1500, 1, 0}}},
		{"mixed-shared-prefix", 64, []attnSeq{{130, 20, 0}, {140, 1, 2}, {200, 3, 1}, {10, 1, 0}, {129, 70, 2}}},
		{"decode-many", 256, []attnSeq{{700, 1, 0}, {256, 1, 1}, {0, 1, 0}, {1023, 1, 3}, {513, 1, 2}, {64, 1, 0}, {300, 1, 1}, {999, 1, 0}}},
	}
	pool := NewPool(3)
	defer pool.Close()
	for _, typ := range []KVType{KVF32, KVF16, KVQ8_0, KVQ4_0} {
		for li, l := range layouts {
			for bi, bt := range batches {
				name := fmt.Sprintf("%s/h%d-kv%d-hs%d/%s", typ, l.nh, l.nkv, l.hs, bt.name)
				t.Run(name, func(t *testing.T) {
					// Half the layout × batch pairs (a third with -short):
					// every layout meets several batches and every batch
					// several layouts, for every cache type.
					if (li+bi)%2 != 0 || testing.Short() && (li+bi)%3 != 0 {
						t.Skip("pair left out")
					}
					rng := rand.New(rand.NewPCG(uint64(typ)*100+uint64(li)*10+uint64(bi), 91))
					c := newAttnCase(t, rng, typ, l.nh, l.nkv, l.hs, bt.block, bt.seqs)
					got := c.run(t, pool)
					if e, bound := attnNMSE(got, c.reference()), attnBound(typ); e > bound {
						t.Errorf("NMSE %.3g over %.0e", e, bound)
					} else {
						t.Logf("NMSE %.3g", e)
					}
				})
			}
		}
	}
}

// TestAttentionTiledMatchesContiguous: over a cache holding one sequence
// in order, Run with the identity table agrees with RunContiguous, the
// flash-attention-off reference (whose weights are rounded to f16 after
// normalising), within the rounding of those weights.
func TestAttentionTiledMatchesContiguous(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	for _, c := range []struct {
		nh, nkv, hs, nTok, pos0 int
		typ                     KVType
	}{
		{40, 8, 128, 77, 0, KVF16}, {32, 4, 128, 1, 900, KVF16}, {8, 8, 64, 130, 63, KVF16},
		{16, 2, 64, 5, 300, KVF16}, {40, 8, 128, 40, 1000, KVF32}, {8, 4, 64, 1, 2000, KVF32},
	} {
		t.Run(fmt.Sprintf("%s/h%d-kv%d-hs%d/tok%d-pos%d", c.typ, c.nh, c.nkv, c.hs, c.nTok, c.pos0), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.nTok), uint64(c.pos0)))
			a := &Attention{NHeads: c.nh, NKVHeads: c.nkv, HeadSize: c.hs, Scale: DefaultScale(c.hs)}
			const block = 64
			rows := roundUp(c.pos0+c.nTok, block)
			kv, err := NewKVLayer(rows, c.nkv, c.hs, c.typ)
			if err != nil {
				t.Fatal(err)
			}
			for p := 0; p < c.pos0+c.nTok; p++ {
				if err := kv.Store(p, randVec(rng, kv.Width, 1), randVec(rng, kv.Width, 1)); err != nil {
					t.Fatal(err)
				}
			}
			q := randVec(rng, c.nTok*c.nh*c.hs, 2)
			b := contiguousBatch(c.nTok, c.pos0, rows, block)
			got := make([]float32, len(q))
			want := make([]float32, len(q))
			if err := a.Run(pool, kv, q, got, b); err != nil {
				t.Fatal(err)
			}
			if err := a.RunContiguous(pool, kv, q, want, c.nTok, c.pos0); err != nil {
				t.Fatal(err)
			}
			w := make([]float64, len(want))
			for i, v := range want {
				w[i] = float64(v)
			}
			bound := 1e-6
			if c.typ == KVF32 {
				bound = 1e-11
			}
			if e := attnNMSE(got, w); e > bound {
				t.Errorf("NMSE %.3g against RunContiguous, over %.0e", e, bound)
			} else {
				t.Logf("NMSE %.3g against RunContiguous", e)
			}
		})
	}
}

// contiguousBatch is nTok tokens of one sequence at positions pos0...,
// stored in cells in order (the identity table of a cache of rows cells).
func contiguousBatch(nTok, pos0, rows, block int) *AttnBatch {
	b := &AttnBatch{Block: block, Tables: [][]int32{make([]int32, rows/block)}}
	for i := range b.Tables[0] {
		b.Tables[0][i] = int32(i)
	}
	for i := range nTok {
		b.Pos = append(b.Pos, int32(pos0+i))
		b.Seq = append(b.Seq, 0)
	}
	return b
}

// TestAttentionTiledThreads: the result does not depend on the number of
// threads, bit for bit, split decodes included.
func TestAttentionTiledThreads(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for _, typ := range []KVType{KVF16, KVQ8_0} {
		c := newAttnCase(t, rng, typ, 8, 2, 64, 64, []attnSeq{{900, 1, 0}, {100, 45, 1}, {1200, 1, 0}})
		var first []float32
		for _, threads := range []int{1, 2, 3, 5} {
			p := NewPool(threads)
			got := c.run(t, p)
			p.Close()
			if first == nil {
				first = got
				continue
			}
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(first[i]) {
					t.Fatalf("%s: %d threads: output %d = %v, with 1 thread %v", typ, threads, i, got[i], first[i])
				}
			}
		}
	}
}

// TestAttentionTiledReads is the test that would have caught issue 28's
// collapse: the K and V rows a batch reads must grow with its attention
// work divided by the query tile, not with tokens times heads. The old
// kernel read every key row once per head and four tokens and every value
// row once per head and token: a 512-token chunk of a 5-head group read
// each row 640 and 2560 times.
func TestAttentionTiledReads(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	const nh, nkv, hs, chunk = 10, 2, 32, 512
	group := nh / nkv
	tq := attnTileTokens(group)
	reads := map[int]int64{}
	for _, depth := range []int{1024, 2048} {
		rng := rand.New(rand.NewPCG(uint64(depth), 1))
		c := newAttnCase(t, rng, KVF32, nh, nkv, hs, 256, []attnSeq{{depth, chunk, 0}})
		before := attnRowsRead.Load()
		c.run(t, pool)
		r := attnRowsRead.Load() - before
		reads[depth] = r
		// Each key and value row at most ceil(chunk/tile) times per KV head.
		if most := int64(2 * nkv * ((chunk + tq - 1) / tq) * (depth + chunk)); r > most {
			t.Errorf("depth %d: %d rows read, over %d (each row once per %d-token tile and KV head)", depth, r, most, tq)
		}
		// Against the work: Σ over tokens and heads of the positions
		// attended, divided by the rows of a tile; 2 for keys and
		// values, 2 for the tiles' triangles.
		var work int64
		for _, p := range c.b.Pos {
			work += int64(nh) * int64(p+1)
		}
		if most := 2 * 2 * work / int64(tq*group); r > most {
			t.Errorf("depth %d: %d rows read for %d positions attended: over %d", depth, r, work, most)
		}
		t.Logf("depth %d: %d K/V rows read, %d positions attended", depth, r, work)
	}
	if reads[2048] > 2*reads[1024] {
		t.Errorf("doubling the depth more than doubled the rows read: %d then %d", reads[1024], reads[2048])
	}
	// Decode of several sequences: each row of each KV head once.
	rng := rand.New(rand.NewPCG(3, 1))
	seqs := []attnSeq{{3000, 1, 0}, {100, 1, 0}, {2047, 1, 0}}
	c := newAttnCase(t, rng, KVF32, nh, nkv, hs, 256, seqs)
	before := attnRowsRead.Load()
	c.run(t, pool)
	want := int64(0)
	for _, s := range seqs {
		want += int64(2 * nkv * (s.from + 1))
	}
	if r := attnRowsRead.Load() - before; r != want {
		t.Errorf("decode: %d rows read, want %d (each once per KV head)", r, want)
	}
}

// TestAttentionTiledErrors: bad batches and caches are errors that say
// what is wrong, not panics.
func TestAttentionTiledErrors(t *testing.T) {
	a := &Attention{NHeads: 4, NKVHeads: 2, HeadSize: 64, Scale: 0.125}
	kv, err := NewKVLayer(256, 2, 64, KVQ8_0)
	if err != nil {
		t.Fatal(err)
	}
	q := make([]float32, 2*256)
	out := make([]float32, 2*256)
	good := func() *AttnBatch {
		return &AttnBatch{Pos: []int32{5, 6}, Seq: []int32{0, 0}, Tables: [][]int32{{1, 0}}, Block: 128}
	}
	for _, c := range []struct {
		name string
		mod  func(b *AttnBatch, a *Attention) (*KVLayer, []float32)
		want string
	}{
		{"seq", func(b *AttnBatch, _ *Attention) (*KVLayer, []float32) { b.Seq[1] = 1; return kv, q }, "sequence 1"},
		{"pos", func(b *AttnBatch, _ *Attention) (*KVLayer, []float32) { b.Pos[1] = 256; return kv, q }, "position 256"},
		{"negative pos", func(b *AttnBatch, _ *Attention) (*KVLayer, []float32) { b.Pos[0] = -1; return kv, q }, "position -1"},
		{"block id", func(b *AttnBatch, _ *Attention) (*KVLayer, []float32) { b.Tables[0][0] = 2; return kv, q }, "block 2"},
		{"block size", func(b *AttnBatch, _ *Attention) (*KVLayer, []float32) { b.Block = 96; return kv, q }, "block size 96"},
		{"lengths", func(b *AttnBatch, _ *Attention) (*KVLayer, []float32) { b.Seq = b.Seq[:1]; return kv, q }, "positions"},
		{"query", func(b *AttnBatch, _ *Attention) (*KVLayer, []float32) { return kv, q[:300] }, "query buffer"},
		{"heads", func(b *AttnBatch, a *Attention) (*KVLayer, []float32) { a.NKVHeads = 3; return kv, q }, "heads"},
		{"width", func(b *AttnBatch, a *Attention) (*KVLayer, []float32) { a.NHeads, a.NKVHeads = 8, 4; return kv, q }, "a cache of rows"},
		{"head blocks", func(b *AttnBatch, a *Attention) (*KVLayer, []float32) {
			a.NHeads, a.NKVHeads, a.HeadSize = 8, 8, 16
			bad := *kv // made by hand: NewKVLayer refuses it
			bad.HeadSize, bad.RotK, bad.RotV = 16, 0, 0
			return &bad, q
		}, "head size 16"},
		{"rotation", func(b *AttnBatch, a *Attention) (*KVLayer, []float32) {
			bad := *kv
			bad.RotK = 48
			return &bad, q
		}, "rotations"},
	} {
		t.Run(c.name, func(t *testing.T) {
			b, aa := good(), *a
			kv, q := c.mod(b, &aa)
			err := aa.Run(nil, kv, q, out, b)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %v, want one that mentions %q", err, c.want)
			}
		})
	}
	if _, err := NewKVLayer(10, 1, 48, KVQ8_0); err == nil || !strings.Contains(err.Error(), "multiple of its block size") {
		t.Errorf("q8_0 rows of 48: error %v", err)
	}
	if _, err := ParseKVType("q5_1"); err == nil {
		t.Error("q5_1 parsed")
	}
	if err := kv.Store(256, q, q); err == nil {
		t.Error("store past the last cell: no error")
	}
}

// TestKVRotation: the rotation is the orthonormal Walsh-Hadamard matrix
// (Sylvester's order) in llama.cpp's sizes, and a quantized cache keeps
// its rows rotated: decoded and rotated back they are the stored values
// within the quantization error.
func TestKVRotation(t *testing.T) {
	for _, c := range []struct {
		typ        KVType
		hs, rk, rv int
	}{{KVQ8_0, 128, 128, 64}, {KVQ8_0, 64, 64, 64}, {KVQ4_0, 256, 256, 64}, {KVQ8_0, 192, 64, 64}, {KVQ8_0, 96, 0, 0}, {KVF16, 128, 0, 0}} {
		if rk, rv := c.typ.rotation(c.hs); rk != c.rk || rv != c.rv {
			t.Errorf("%s heads of %d: rotations %d, %d, want %d, %d", c.typ, c.hs, rk, rv, c.rk, c.rv)
		}
	}
	rng := rand.New(rand.NewPCG(5, 5))
	for _, n := range []int{64, 128, 256} {
		x := randVec(rng, 2*n, 1)
		y := append([]float32(nil), x...)
		fwht(y, n)
		want := make([]float64, len(x))
		for i, v := range x {
			want[i] = float64(v)
		}
		hadamard64(want, n)
		for i := range y {
			if math.Abs(float64(y[i])-want[i]) > 1e-6 {
				t.Fatalf("fwht %d: value %d = %g, want %g", n, i, y[i], want[i])
			}
		}
		fwht(y, n) // an involution
		for i := range y {
			if math.Abs(float64(y[i]-x[i])) > 1e-6 {
				t.Fatalf("fwht %d twice: value %d = %g, want %g", n, i, y[i], x[i])
			}
		}
	}
	kv, err := NewKVLayer(1, 2, 128, KVQ8_0)
	if err != nil {
		t.Fatal(err)
	}
	k, v := randVec(rng, 256, 1), randVec(rng, 256, 1)
	k[5] = 20 // an outlier, which the rotation spreads
	if err := kv.Store(0, k, v); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		row  []byte
		rot  int
		want []float32
	}{{"keys", kv.K, kv.RotK, k}, {"values", kv.V, kv.RotV, v}} {
		got := make([]float32, 256)
		dequantQ8_0(got, c.row)
		fwht(got, c.rot)
		var num, den float64
		for i := range got {
			num += float64(got[i]-c.want[i]) * float64(got[i]-c.want[i])
			den += float64(c.want[i]) * float64(c.want[i])
		}
		if e := num / den; e > 1e-4 {
			t.Errorf("%s: rotated, quantized and rotated back: NMSE %.3g", c.name, e)
		}
	}
}

// refQ8_0 is ggml's quantize_row_q8_0_ref, written out again: d =
// amax/127 stored as f16, q = roundf(x/d) (halves away from zero).
func refQ8_0(x []float32) []byte {
	var out []byte
	for b := 0; b < len(x); b += qk {
		var amax float32
		for _, v := range x[b : b+qk] {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		h := F32ToF16(d)
		out = append(out, byte(h), byte(h>>8))
		for _, v := range x[b : b+qk] {
			out = append(out, byte(int8(math.Round(float64(v*id)))))
		}
	}
	return out
}

// TestKVStoreQ8_0: a q8_0 cache row is ggml's reference quantization of
// the row, bit for bit; rotated (llama.cpp's default), of the rotated row.
func TestKVStoreQ8_0(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	for _, rot := range []bool{false, true} {
		kv, err := NewKVLayer(4, 2, 128, KVQ8_0)
		if err != nil {
			t.Fatal(err)
		}
		if !rot {
			kv.RotK, kv.RotV = 0, 0
		}
		rows := [][]float32{randVec(rng, 256, 1), randVec(rng, 256, 1e-3), make([]float32, 256), randVec(rng, 256, 100)}
		rows[2][40] = -3 // one value in a block of zeros
		// Values whose x/d falls on a half: amax 127 makes d 1.
		rows[3][0], rows[3][1], rows[3][2] = 127, 2.5, -0.5
		for i := 3; i < qk; i++ {
			rows[3][i] = float32(i%7) - 3.5
		}
		for r, x := range rows {
			if err := kv.Store(r, x, x); err != nil {
				t.Fatal(err)
			}
			want := append([]float32(nil), x...)
			if rot {
				fwht(want, kv.RotK)
			}
			rb := kv.RowBytes()
			if got, w := kv.K[r*rb:(r+1)*rb], refQ8_0(want); string(got) != string(w) {
				t.Errorf("rotated=%v row %d: key bytes differ from the reference quantizer", rot, r)
			}
			if rot {
				want = append(want[:0], x...)
				fwht(want, kv.RotV)
			}
			if got, w := kv.V[r*rb:(r+1)*rb], refQ8_0(want); string(got) != string(w) {
				t.Errorf("rotated=%v row %d: value bytes differ from the reference quantizer", rot, r)
			}
		}
	}
}

// TestAttentionTiledBatchInvariant: a token's result is the same bit for
// bit whatever batch it comes in: with its whole prompt chunk, in a piece
// of it, alone (as a decode step), or beside another sequence's tokens
// (the server's prompt cache evaluates a repeated prompt in other pieces
// than the first time, and must give the same logits).
func TestAttentionTiledBatchInvariant(t *testing.T) {
	pool := NewPool(2)
	defer pool.Close()
	rng := rand.New(rand.NewPCG(11, 11))
	for _, typ := range []KVType{KVF16, KVQ8_0} {
		// The whole batch has enough units (10 runs × 8 KV heads) to run
		// each unit's chunks in one job; the pieces split them.
		c := newAttnCase(t, rng, typ, 40, 8, 64, 64, []attnSeq{{2500, 130, 0}, {700, 1, 1}, {10, 1, 0}, {1100, 1, 0}, {3000, 1, 0}, {64, 1, 1}, {1024, 1, 0}, {2047, 1, 0}})
		if units, nparts, _ := c.a.plan(c.b); nparts != 0 || len(units) < attnMinUnits {
			t.Fatalf("the whole batch is split (%d units, %d partials)", len(units), nparts)
		}
		full := c.run(t, pool)
		qw := c.a.NHeads * c.a.HeadSize
		for _, sub := range [][]int{{0}, {129}, {57}, {3, 4, 5, 6, 7, 8, 9, 10}, {100, 101, 102, 103, 104, 105, 106, 107, 108, 109, 110, 111, 112, 113, 114, 115, 116, 117, 118, 119, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129}, {130, 60, 61}} {
			b := &AttnBatch{Block: c.b.Block, Tables: c.b.Tables}
			var q []float32
			for _, tk := range sub {
				b.Pos = append(b.Pos, c.b.Pos[tk])
				b.Seq = append(b.Seq, c.b.Seq[tk])
				q = append(q, c.q[tk*qw:(tk+1)*qw]...)
			}
			out := make([]float32, len(q))
			if err := c.a.Run(pool, c.kv, q, out, b); err != nil {
				t.Fatal(err)
			}
			for i, tk := range sub {
				for j := range qw {
					if g, w := out[i*qw+j], full[tk*qw+j]; math.Float32bits(g) != math.Float32bits(w) {
						t.Fatalf("%s: token %d in the batch %v: value %d = %v, in the whole batch %v", typ, tk, sub, j, g, w)
					}
				}
			}
		}
	}
}
