package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
)

// The kernels of the paged KV cache and the batch (attention.go's header)
// against CPU references written here: cache writes (StoreKV, the fused
// rope write) bit-exact against f16 rounding and ggml's
// quantize_row_q8_0_ref; the gather bit-exact against the dequantization;
// decode and prefill attention against a float64 attention over the same
// paged cache, by normalised mean squared error. Every case draws fresh
// random inputs (the seed is logged; KVBATCH_SEED=<n> repeats a run),
// fills outputs and unused cache cells with 0xff bytes first (NaN as f32
// and f16, a NaN scale as q8_0: a kernel that reads an unused cell or
// leaves an output unwritten shows as NaN) and checks every element
// written. Without a GPU the GPU tests skip and say why;
// TestKVBatchReference, TestKVBatchArgs and TestPlanDecodeKV run anywhere.
//
//	go test ./cudadrv/kernels -run 'TestKVBatch' -v
//	go test ./cudadrv/kernels -run '^$' -bench 'KVDecode' -benchtime 100x
//
// tools/bench/kvbatch.sh runs both and prints a table.

// Bound of the attention checks (NMSE per token). Q is rounded to f16 on
// both sides and K, V are the same values (for q8_0 both read f16(d*q),
// the values the gather writes bit-exactly; the references in the test
// check that), so what differs is the f16 rounding of the probabilities
// before P·V (the reference keeps them exact: a relative error up to 2^-11
// each, independent, about 4e-8 in mean square) and f32 sums against
// float64: about 1e-7, bound ten times that. The int8 decode kernel
// (DecodeKVInt8) is checked against a reference with its query, Q8_0 as
// the kernel quantizes it, and its keys, d*q exactly: the same bound.
const kvBound = 1e-6

var kvFix struct {
	once sync.Once
	ctx  *cudadrv.Context
	info cudadrv.DeviceInfo
	attn *Attention
	rope *Rope
	elem *Elementwise
	err  error
	seed uint64
}

// kvSetup returns the shared context and loaded kernels, or skips.
func kvSetup(tb testing.TB) {
	tb.Helper()
	if ok, reason := cudadrv.Available(); !ok {
		tb.Skip("skipping GPU KV-batch test: " + reason)
	}
	kvFix.once.Do(func() {
		d, err := cudadrv.GetDevice(0)
		if err == nil {
			kvFix.info, err = d.Info()
		}
		if err == nil {
			kvFix.ctx, err = d.RetainPrimaryContext()
		}
		if err == nil {
			kvFix.attn, err = LoadAttention(kvFix.ctx)
		}
		if err == nil {
			kvFix.rope, err = LoadRope(kvFix.ctx)
		}
		if err == nil {
			kvFix.elem, err = LoadElementwise(kvFix.ctx)
		}
		kvFix.err = err
		kvFix.seed = rand.Uint64()
		if s := os.Getenv("KVBATCH_SEED"); s != "" {
			kvFix.seed, _ = strconv.ParseUint(s, 10, 64)
		}
	})
	if kvFix.err != nil {
		tb.Fatalf("loading the kernels: %v", kvFix.err)
	}
}

// kvT is one case: its stream (every copy and fill is queued on it, so
// they are ordered with the case's kernels) and its random source.
type kvT struct {
	testing.TB
	s   *cudadrv.Stream
	rng *rand.Rand
}

func newKVT(tb testing.TB) *kvT {
	kvSetup(tb)
	s, err := kvFix.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { s.Destroy() })
	var h uint64 = 14695981039346656037
	for _, c := range []byte(tb.Name()) {
		h = (h ^ uint64(c)) * 1099511628211
	}
	tb.Logf("seed %d (KVBATCH_SEED)", kvFix.seed)
	return &kvT{TB: tb, s: s, rng: rand.New(rand.NewPCG(kvFix.seed, h))}
}

func (g *kvT) check(err error) {
	g.Helper()
	if err != nil {
		g.Fatal(err)
	}
}

func (g *kvT) alloc(n int) cudadrv.DevicePtr {
	g.Helper()
	p, err := kvFix.ctx.Alloc(max(n, 16))
	g.check(err)
	g.Cleanup(func() { kvFix.ctx.Free(p) })
	return p
}

// up copies b to a new device buffer.
func (g *kvT) up(b []byte) cudadrv.DevicePtr {
	g.Helper()
	p := g.alloc(len(b))
	g.check(g.s.CopyHtoD(p, b))
	return p
}

// zeros allocates n bytes of zeros.
func (g *kvT) zeros(n int) cudadrv.DevicePtr {
	g.Helper()
	p := g.alloc(n)
	g.check(g.s.MemsetD8(p, 0, max(n, 16)))
	return p
}

// poison allocates n bytes of 0xff.
func (g *kvT) poison(n int) cudadrv.DevicePtr {
	g.Helper()
	p := g.alloc(n)
	g.check(g.s.MemsetD8(p, 0xff, max(n, 16)))
	return p
}

// down waits for the stream and copies n bytes back.
func (g *kvT) down(p cudadrv.DevicePtr, n int) []byte {
	g.Helper()
	g.check(g.s.Synchronize())
	b := make([]byte, n)
	g.check(kvFix.ctx.CopyDtoH(b, p))
	return b
}

// randRows returns n rows of w normal values, each row with its own scale
// (e^N(0,1), so blocks see varied magnitudes); every seventh row is
// scaled by 1e-4, whose Q8_0 scales are subnormal in f16, and every
// thirteenth is zero.
func (g *kvT) randRows(n, w int) []float32 {
	v := make([]float32, n*w)
	for r := 0; r < n; r++ {
		s := math.Exp(g.rng.NormFloat64())
		switch {
		case r%13 == 12:
			s = 0
		case r%7 == 6:
			s = 1e-4
		}
		for i := range w {
			v[r*w+i] = float32(g.rng.NormFloat64() * s)
		}
	}
	return v
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func i32Bytes(v []int32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(x))
	}
	return b
}

// ---- the references

// refQ8_0 is ggml's quantize_row_q8_0_ref: per block of 32, d = amax/127
// in float, id = 1/d (0 for d = 0), q = roundf(x*id) (halves away from
// zero), d stored as f16 rounded to nearest even (no saturation).
func refQ8_0(dst []byte, x []float32) {
	for b := 0; b < len(x)/32; b++ {
		xs, o := x[32*b:32*b+32], dst[34*b:34*b+34]
		var amax float32
		for _, v := range xs {
			amax = max(amax, float32(math.Abs(float64(v))))
		}
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		binary.LittleEndian.PutUint16(o, ops.F32ToF16(d))
		for j, v := range xs {
			q := math.Round(float64(v * id))
			o[2+j] = byte(int8(max(-128, min(127, q))))
		}
	}
}

// refEncode is a row of width values in the cache's type (q4_0: ops'
// quantize_row_q4_0_ref, the CPU cache's own encoding).
func refEncode(t KVType, x []float32) []byte {
	b := make([]byte, t.RowBytes(len(x)))
	switch t {
	case KVQ8_0:
		refQ8_0(b, x)
		return b
	case KVQ4_0:
		if err := ops.Quantize(gguf.TypeQ4_0, b, x); err != nil {
			panic(err)
		}
		return b
	}
	for i, v := range x {
		binary.LittleEndian.PutUint16(b[2*i:], ops.F32ToF16(v))
	}
	return b
}

// refDecode is the values of a cache row: f16 exactly, q8_0 as d*q and
// q4_0 as d*(q-8) (exact in float32).
func refDecode(t KVType, b []byte, width int) []float32 {
	v := make([]float32, width)
	for i := range v {
		if t == KVQ4_0 {
			blk := b[18*(i/32):]
			q := blk[2+i%16]
			if i%32 >= 16 {
				q >>= 4
			}
			v[i] = ops.F16ToF32(binary.LittleEndian.Uint16(blk)) * float32(int(q&15)-8)
		} else if t == KVQ8_0 {
			blk := b[34*(i/32):]
			v[i] = ops.F16ToF32(binary.LittleEndian.Uint16(blk)) * float32(int8(blk[2+i%32]))
		} else {
			v[i] = ops.F16ToF32(binary.LittleEndian.Uint16(b[2*i:]))
		}
	}
	return v
}

// kernelValues is a cache row as the attention kernels read it: f16
// exactly; q8_0 as f16(d*q) and q4_0 as f16(d*(q-8)), the f16 the
// tensor-core path takes (the gather writes the same).
func kernelValues(t KVType, b []byte, width int) []float32 {
	v := refDecode(t, b, width)
	if t.Quantized() {
		for i, x := range v {
			v[i] = ops.F16ToF32(ops.F32ToF16(x))
		}
	}
	return v
}

// f16Round is v rounded to f16, as the kernels round Q.
func f16Round(v float32) float64 { return float64(ops.F16ToF32(ops.F32ToF16(v))) }

// refAttention is one query row's causal attention in float64: q (all
// heads, rounded to f16) against positions 0..len(ks)-1 whose K and V rows
// are ks[j], vs[j] (NKV*hs values).
func refAttention(q []float32, ks, vs [][]float32, heads, nkv, hs int, scale float32) []float64 {
	qr := make([]float64, len(q))
	for i, v := range q {
		qr[i] = f16Round(v)
	}
	return refAttentionQ(qr, ks, vs, heads, nkv, hs, scale)
}

// q8_0Query is q quantized to Q8_0 and decoded (d*q in float64), as the
// int8 decode kernel quantizes its queries (refQ8_0's rounding).
func q8_0Query(q []float32) []float64 {
	b := make([]byte, len(q)/32*34)
	refQ8_0(b, q)
	out := make([]float64, len(q))
	for i, v := range refDecode(KVQ8_0, b, len(q)) {
		out[i] = float64(v) // d*q: an f16 times an int8, exact in float32
	}
	return out
}

// refAttentionQ is refAttention with the query's values as given.
func refAttentionQ(q []float64, ks, vs [][]float32, heads, nkv, hs int, scale float32) []float64 {
	out := make([]float64, heads*hs)
	group := heads / nkv
	sc := make([]float64, len(ks))
	for h := 0; h < heads; h++ {
		kvh := h / group
		mx := math.Inf(-1)
		for j := range ks {
			var s float64
			for d := 0; d < hs; d++ {
				s += q[h*hs+d] * float64(ks[j][kvh*hs+d])
			}
			sc[j] = s * float64(scale)
			mx = math.Max(mx, sc[j])
		}
		var sum float64
		for j := range ks {
			sc[j] = math.Exp(sc[j] - mx)
			sum += sc[j]
		}
		for j := range ks {
			w := sc[j] / sum
			for d := 0; d < hs; d++ {
				out[h*hs+d] += w * float64(vs[j][kvh*hs+d])
			}
		}
	}
	return out
}

// kvNMSE is sum (got-want)^2 / sum want^2; NaN or Inf in got fails.
func kvNMSE(tb testing.TB, what string, got []float32, want []float64, bound float64) float64 {
	tb.Helper()
	var num, den float64
	for i, v := range got {
		if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
			tb.Fatalf("%s: value %d is %v (want %v): unwritten, or a poisoned cell was read", what, i, v, want[i])
		}
		e := float64(v) - want[i]
		num += e * e
		den += want[i] * want[i]
	}
	nmse := num / max(den, 1e-300)
	if nmse > bound {
		worst := 0
		for i := range got {
			if math.Abs(float64(got[i])-want[i]) > math.Abs(float64(got[worst])-want[worst]) {
				worst = i
			}
		}
		tb.Fatalf("%s: NMSE %.3g over the bound %.0e (worst at %d: %v, want %v)", what, nmse, bound, worst, got[worst], want[worst])
	}
	return nmse
}

// checkQ8_1 checks that raw (QuantizeQ8_1Planes's layout of one row of
// len(x) values in planes planes) holds x quantized as quantize_q8_1 does,
// exactly (Q8_1Host).
func checkQ8_1(tb testing.TB, raw []byte, x []float32, planes int) {
	tb.Helper()
	want, err := Q8_1Host(x, 1, len(x), planes)
	if err != nil {
		tb.Fatal(err)
	}
	if msg := Q8_1Compare(raw, want, 1, len(x), planes); msg != "" {
		tb.Fatalf("Q8_1 in %d planes: %s", planes, msg)
	}
}

// ---- a paged cache on the host

// kvPaged is a layer's paged cache as the host builds it: sequences' block
// tables over shuffled block ids, rows of random values in the cache's
// type where a sequence has positions, 0xff bytes everywhere else.
type kvPaged struct {
	t          KVType
	width      int
	block      int
	maxBlocks  int
	rows       int
	tables     [][]int32
	lens       []int
	k, v       []byte // [rows][RowBytes]
	used       []bool // by row: some sequence has the cell
	kvals      [][]float32
	vvals      [][]float32 // by row: the values the kernels read (kernelValues)
	kexact     [][]float32 // by row: the keys decoded exactly (d*q), as the int8 kernel reads them
	nSeq, nBlk int
}

// newPaged lays out sequences of the given lengths in blocks of block
// positions (plus spare, never used blocks), the first share blocks of
// every sequence being sequence 0's (a common prefix; the lengths must
// cover them), and fills the cells the sequences use.
func newPaged(g *kvT, t KVType, width, block int, lens []int, share, spare int) *kvPaged {
	p := &kvPaged{t: t, width: width, block: block, lens: lens, nSeq: len(lens)}
	need := 0
	for _, l := range lens {
		nb := (l + block - 1) / block
		p.maxBlocks = max(p.maxBlocks, nb)
		need += nb // some are shared: a few spare ids
	}
	p.maxBlocks++ // a longer table than any sequence needs: its tail is never read
	p.nBlk = need + spare
	perm := g.rng.Perm(p.nBlk)
	next := 0
	p.tables = make([][]int32, len(lens))
	for s, l := range lens {
		nb := (l + block - 1) / block
		tab := make([]int32, p.maxBlocks)
		for i := range tab {
			tab[i] = -1 // never read
		}
		for i := 0; i < nb; i++ {
			// Only whole blocks of both sequences are shared.
			if s > 0 && i < share && (i+1)*block <= l && (i+1)*block <= lens[0] {
				tab[i] = p.tables[0][i]
				continue
			}
			tab[i] = int32(perm[next])
			next++
		}
		p.tables[s] = tab
	}
	p.rows = p.nBlk * block
	rb := t.RowBytes(width)
	p.k, p.v = make([]byte, p.rows*rb), make([]byte, p.rows*rb)
	for i := range p.k {
		p.k[i], p.v[i] = 0xff, 0xff
	}
	p.used = make([]bool, p.rows)
	p.kvals, p.vvals, p.kexact = make([][]float32, p.rows), make([][]float32, p.rows), make([][]float32, p.rows)
	for s, l := range lens {
		for pos := 0; pos < l; pos++ {
			p.used[p.cell(s, pos)] = true
		}
	}
	var cells []int
	for r, u := range p.used {
		if u {
			cells = append(cells, r)
		}
	}
	kv, vv := g.randRows(len(cells), width), g.randRows(len(cells), width)
	for i := range kv {
		// Scores of about unit size with unit queries: a softmax spread
		// over many positions, where a position missed or read twice
		// shows.
		kv[i] /= 3
	}
	for i, r := range cells {
		copy(p.k[r*rb:], refEncode(t, kv[i*width:(i+1)*width]))
		copy(p.v[r*rb:], refEncode(t, vv[i*width:(i+1)*width]))
		p.kvals[r] = kernelValues(t, p.k[r*rb:(r+1)*rb], width)
		p.vvals[r] = kernelValues(t, p.v[r*rb:(r+1)*rb], width)
		p.kexact[r] = refDecode(t, p.k[r*rb:(r+1)*rb], width)
	}
	return p
}

func (p *kvPaged) cell(s, pos int) int {
	return int(p.tables[s][pos/p.block])*p.block + pos%p.block
}

// flatTables is the tables as the device reads them, [nSeq][maxBlocks].
func (p *kvPaged) flatTables() []int32 {
	var f []int32
	for _, t := range p.tables {
		f = append(f, t...)
	}
	return f
}

// upload copies the cache to the device.
func (p *kvPaged) upload(g *kvT) KVCache {
	return KVCache{K: g.up(p.k), V: g.up(p.v), Type: p.t, Width: p.width}
}

// batch uploads a batch of tokens (seq, pos) with the cache's tables.
func (p *kvPaged) batch(g *kvT, seq, pos []int32) *Batch {
	return &Batch{Pos: g.up(i32Bytes(pos)), Seq: g.up(i32Bytes(seq)), Tables: g.up(i32Bytes(p.flatTables())),
		MaxBlocks: p.maxBlocks, Block: p.block}
}

// rowsOf returns the K and V rows of positions 0..n-1 of sequence s as
// the kernels read them; with exactKeys the keys as the int8 kernel does.
func (p *kvPaged) rowsOf(s, n int, exactKeys bool) (ks, vs [][]float32) {
	for pos := 0; pos < n; pos++ {
		c := p.cell(s, pos)
		k := p.kvals[c]
		if exactKeys {
			k = p.kexact[c]
		}
		ks, vs = append(ks, k), append(vs, p.vvals[c])
	}
	return ks, vs
}

var kvTypesAll = []KVType{KVF16, KVQ8_0, KVQ4_0}

// ---- tests that need no GPU

// TestKVBatchReference checks the test's Q8_0 quantizer against ops'
// (ops.Quantize saturates scales past f16's range, which these inputs
// never reach).
func TestKVBatchReference(t *testing.T) {
	g := &kvT{TB: t, rng: rand.New(rand.NewPCG(1, 2))}
	x := g.randRows(64, 256)
	got, want := make([]byte, 64*8*34), make([]byte, 64*8*34)
	refQ8_0(got, x)
	if err := ops.Quantize(gguf.TypeQ8_0, want, x); err != nil {
		t.Fatal(err)
	}
	for i := range got {
		if got[i] != want[i] {
			t.Fatalf("byte %d: %#x, ops has %#x", i, got[i], want[i])
		}
	}
	deq := make([]float32, len(x))
	if err := ops.DequantizeRow(gguf.TypeQ8_0, deq, want); err != nil {
		t.Fatal(err)
	}
	for r := 0; r < 64; r++ {
		v := refDecode(KVQ8_0, got[r*8*34:], 256)
		for i, f := range v {
			if f != deq[r*256+i] {
				t.Fatalf("row %d value %d: %v, ops has %v", r, i, f, deq[r*256+i])
			}
		}
	}
	// q4_0: refDecode's nibbles against ops' dequantization.
	q4 := refEncode(KVQ4_0, x)
	if err := ops.DequantizeRow(gguf.TypeQ4_0, deq, q4); err != nil {
		t.Fatal(err)
	}
	for i, f := range refDecode(KVQ4_0, q4, len(x)) {
		if f != deq[i] {
			t.Fatalf("q4_0 value %d: %v, ops has %v", i, f, deq[i])
		}
	}
}

// TestPlanDecodeKV checks the paged decode kernel's launch shapes.
func TestPlanDecodeKV(t *testing.T) {
	const h200, a100, ada, turing = 232448, 166912, 101376, 65536
	for _, c := range []struct {
		hs            int
		t             KVType
		int8          bool
		optin         int
		warps, stages int
		shared        int
	}{
		{128, KVF16, false, h200, 8, 2, 32*136 + 8*2*2*16*272},               // 140 KiB: one block a multiprocessor
		{128, KVQ8_0, false, h200, 8, 2, 32*136 + 8*(2*2*16*140+2*16*136*2)}, // rows of 35 words
		{128, KVQ4_0, false, h200, 8, 2, 32*136 + 8*(2*2*16*76+2*16*136*2)},  // 72 bytes: 19 words
		{64, KVQ4_0, false, h200, 8, 2, 32*72 + 8*(2*2*16*36+2*16*72*2)},     // 36 bytes: 9 words
		{256, KVF16, false, h200, 4, 3, 32*264 + 4*3*2*16*528},
		{64, KVQ8_0, false, h200, 8, 2, 32*72 + 8*(2*2*16*68+2*16*72*2)}, // 17 words
		{32, KVF16, false, h200, 8, 2, 32*40 + 8*2*2*16*80},
		{128, KVF16, false, ada, 4, 2, 32*136 + 4*2*2*16*272},
		{128, KVF16, false, a100, 8, 2, 32*136 + 8*2*2*16*272},
		{128, KVF16, false, turing, 2, 2, 32*136 + 2*2*2*16*272},
		{256, KVF16, false, turing, 2, 1, 32*264 + 2*(16*264*4+128)}, // the merge's O outgrows one buffer
		// The int8 kernel: rows staged as copied, 16 bytes at a time from a
		// 16-byte boundary (int8Row), V's tile alone.
		{128, KVQ8_0, true, h200, 12, 2, 32*136 + 12*(2*2*16*144+16*136*2)}, // 136 bytes in 144
		{64, KVQ8_0, true, h200, 12, 2, 32*72 + 12*(2*2*16*80+16*72*2)},     // 68 at 4 past a boundary: 80
		{256, KVQ8_0, true, h200, 8, 2, 32*264 + 8*(2*2*16*272+16*264*2)},   // 272 aligned; 12 warps do not fit
		{128, KVQ8_0, true, ada, 4, 3, 32*136 + 4*(3*2*16*144+16*136*2)},
	} {
		p, err := planDecodeKV(c.hs, c.t, c.int8, c.optin)
		if err != nil {
			t.Errorf("hs %d %v optin %d: %v", c.hs, c.t, c.optin, err)
			continue
		}
		if p.warps != c.warps || p.stages != c.stages || p.shared != c.shared || p.region%16 != 0 {
			t.Errorf("hs %d %v optin %d: %d warps, %d buffers, %d bytes (region %d); want %d, %d, %d",
				c.hs, c.t, c.optin, p.warps, p.stages, p.shared, p.region, c.warps, c.stages, c.shared)
		}
	}
	if _, err := planDecodeKV(256, KVQ8_0, false, 32<<10); err == nil {
		t.Error("head size 256 in 32 KiB: no error")
	}
}

// TestDecodeKVInt8 checks which q8_0 caches take the int8 kernel: groups
// of up to 8 heads, heads of 64, 128 and 256, and cache rows it can copy
// 16 bytes at a time.
func TestDecodeKVInt8(t *testing.T) {
	k := &Attention{int8: true}
	for _, c := range []struct {
		hs, heads, kv int
		typ           KVType
		want          bool
	}{
		{128, 40, 8, KVQ8_0, true},  // Qwen3-14B: rows of 1088 bytes
		{128, 32, 4, KVQ8_0, true},  // Qwen3-30B-A3B: 544
		{128, 16, 2, KVQ8_0, true},  // 272
		{128, 8, 1, KVQ8_0, false},  // 136: not a multiple of 16
		{128, 24, 3, KVQ8_0, false}, // 408
		{64, 16, 8, KVQ8_0, true},   // 544
		{64, 8, 2, KVQ8_0, false},   // 136
		{256, 7, 1, KVQ8_0, true},   // 272
		{128, 80, 8, KVQ8_0, false}, // a group of 10
		{32, 16, 8, KVQ8_0, false},  // heads of 32
		{128, 40, 8, KVF16, false},
		{128, 40, 0, KVQ8_0, false},
		{128, 40, 6, KVQ8_0, false}, // 40 heads do not split over 6
	} {
		if got := k.DecodeKVInt8(c.hs, c.heads, c.kv, c.typ); got != c.want {
			t.Errorf("hs %d, %d heads over %d, %v: int8 %v, want %v", c.hs, c.heads, c.kv, c.typ, got, c.want)
		}
	}
	if (&Attention{}).DecodeKVInt8(128, 40, 8, KVQ8_0) {
		t.Error("int8 kernel chosen where the device or the environment rules it out")
	}
	for hs, want := range map[int]int{64: 80, 128: 144, 256: 272} {
		if got := int8Row(hs); got != want {
			t.Errorf("int8Row(%d) = %d, want %d", hs, got, want)
		}
	}
}

// TestDecodeSplits checks the split-K layout: about 8 warps a
// multiprocessor, whole chunks of 64 positions.
func TestDecodeSplits(t *testing.T) {
	for _, c := range []struct{ ctx, kv, warps, sms, splits, chunk int }{
		{16384, 8, 4, 132, 32, 512},  // two blocks of 4 a multiprocessor (33 wanted, whole chunks)
		{16384, 8, 8, 132, 16, 1024}, // one of 8
		{4096, 8, 8, 132, 16, 256},
		{100, 8, 8, 132, 2, 64},       // chunks of at least 64
		{16384, 8, 1, 132, 128, 128},  // blocks of one warp: 8 a multiprocessor
		{16384, 8, 12, 132, 16, 1024}, // one block of 12
	} {
		splits, chunk := DecodeSplits(c.ctx, c.kv, c.warps, c.sms)
		if splits != c.splits || chunk != c.chunk || chunk%64 != 0 || splits*chunk < c.ctx {
			t.Errorf("DecodeSplits(%d, %d, %d, %d) = %d, %d; want %d, %d", c.ctx, c.kv, c.warps, c.sms, splits, chunk, c.splits, c.chunk)
		}
	}
}

// TestKVBatchArgs checks the launchers' validation (no GPU: each call
// fails before the module would load).
func TestKVBatchArgs(t *testing.T) {
	k := &Attention{optin: 232448}
	batch := func() *Batch { return &Batch{Pos: 1 << 20, Seq: 2 << 20, Tables: 3 << 20, MaxBlocks: 4, Block: 256} }
	cache := func(t KVType) KVCache { return KVCache{K: 4 << 20, V: 5 << 20, Type: t, Width: 1024} }
	dec := func() *DecodeKVArgs {
		return &DecodeKVArgs{Out: 6 << 20, Q: 7 << 20, Cache: cache(KVQ8_0), Batch: batch(), NTok: 2, NHeads: 40, NKV: 8, HeadSize: 128, Scale: 0.1}
	}
	for _, c := range []struct {
		name string
		err  error
		want string
	}{
		{"decode without a batch", func() error { a := dec(); a.Batch = nil; return k.DecodeKV(nil, a) }(), "no batch"},
		{"block of 100", func() error { a := dec(); a.Batch.Block = 100; return k.DecodeKV(nil, a) }(), "power of two"},
		{"block of 32", func() error { a := dec(); a.Batch.Block = 32; return k.DecodeKV(nil, a) }(), "power of two"},
		{"no tables", func() error { a := dec(); a.Batch.Tables = 0; return k.DecodeKV(nil, a) }(), "int32 arrays"},
		{"no max blocks", func() error { a := dec(); a.Batch.MaxBlocks = 0; return k.DecodeKV(nil, a) }(), "block tables"},
		{"q8_0 width 1000", func() error { a := dec(); a.Cache.Width = 1000; return k.DecodeKV(nil, a) }(), "multiple of 32"},
		{"unaligned cache", func() error { a := dec(); a.Cache.K += 2; return k.DecodeKV(nil, a) }(), "16-byte aligned"},
		{"type 7", func() error { a := dec(); a.Cache.Type = 7; return k.DecodeKV(nil, a) }(), "type KVType(7)"},
		{"head size 96", func() error {
			a := dec()
			a.HeadSize, a.Cache.Width = 96, 768
			return k.DecodeKV(nil, a)
		}(), "head size 96"},
		{"heads 40 over 6", func() error { a := dec(); a.NKV = 6; return k.DecodeKV(nil, a) }(), "40 heads over 6"},
		{"width mismatch", func() error { a := dec(); a.NKV = 4; return k.DecodeKV(nil, a) }(), "rows of 1024 values"},
		{"unaligned Q", func() error { a := dec(); a.Q += 4; return k.DecodeKV(nil, a) }(), "Q"},
		{"split chunk 100", func() error {
			a := dec()
			a.Splits, a.Chunk, a.Part, a.ML = 4, 100, 8<<20, 9<<20
			return k.DecodeKV(nil, a)
		}(), "multiple of 64"},
		{"split without scratch", func() error { a := dec(); a.Splits, a.Chunk = 4, 128; return k.DecodeKV(nil, a) }(), "scratch"},
		{"rotation of 48", func() error { a := dec(); a.Rot = 48; return k.DecodeKV(nil, a) }(), "chunks of 48"},
		{"rotation of 16", func() error { a := dec(); a.Rot = 16; return k.DecodeKV(nil, a) }(), "chunks of 16"},
		{"rotation of 512", func() error {
			a := dec()
			a.HeadSize, a.NKV, a.NHeads = 256, 4, 40
			a.Rot = 512
			return k.DecodeKV(nil, a)
		}(), "chunks of 512"},
		{"rotation of 256 in heads of 128", func() error { a := dec(); a.Rot = 256; return k.DecodeKV(nil, a) }(), "divides the head"},
		{"store q8_0 width 48", func() error {
			return k.StoreKV(nil, &StoreKVArgs{Cache: KVCache{K: 4 << 20, V: 5 << 20, Type: KVQ8_0, Width: 48}, Batch: batch(), K: 1, V: 1, NTok: 3})
		}(), "multiple of 32"},
		{"store without a batch", func() error {
			return k.StoreKV(nil, &StoreKVArgs{Cache: cache(KVF16), K: 1, V: 1, NTok: 3})
		}(), "no batch"},
		{"gather without scratch", func() error {
			return k.GatherKV(nil, &GatherKVArgs{Cache: cache(KVF16), Batch: batch(), MaxLen: 10})
		}(), "16-byte aligned"},
		{"gather of no rows", func() error {
			return k.GatherKV(nil, &GatherKVArgs{Cache: cache(KVF16), Batch: batch(), K: 1 << 20, V: 2 << 20})
		}(), "into 0 rows"},
	} {
		if c.err == nil || !strings.Contains(c.err.Error(), c.want) {
			t.Errorf("%s: error %v, want one saying %q", c.name, c.err, c.want)
		}
	}

	// The rope launch's positions and cache write.
	rope := func() *RopeArgs {
		return &RopeArgs{NTensors: 2, T: [2]RopeTensor{{X: 1, Heads: 40}, {X: 2, Heads: 8}}, HeadSize: 128, Dims: 128, Base: 1e6, NTok: 3}
	}
	for _, c := range []struct {
		name string
		a    func() *RopeArgs
		want string // "" for no error
	}{
		{"no positions", rope, "exactly one"},
		{"both positions", func() *RopeArgs { a := rope(); a.Pos0, a.Batch = 8, batch(); return a }, "exactly one"},
		{"pos0", func() *RopeArgs { a := rope(); a.Pos0 = 8; return a }, ""},
		{"batch", func() *RopeArgs { a := rope(); a.Batch = batch(); return a }, ""},
		{"pos0 into a paged cache", func() *RopeArgs {
			a := rope()
			c := cache(KVF16)
			a.Pos0, a.KV = 8, &RopeKV{T: 1, V: 9, Cache: &c}
			return a
		}, "contiguous"},
		{"batch into KC", func() *RopeArgs {
			a := rope()
			a.Batch, a.KV = batch(), &RopeKV{T: 1, V: 9, KC: 10, VC: 11}
			return a
		}, "paged Cache"},
		{"batch into a cache of another width", func() *RopeArgs {
			a := rope()
			c := cache(KVQ8_0)
			a.Batch, a.KV = batch(), &RopeKV{T: 0, V: 9, Cache: &c}
			return a
		}, "rows of 5120 values"},
		{"q8_0 heads of 80", func() *RopeArgs {
			a := rope()
			a.HeadSize, a.Dims, a.T[1].Heads = 80, 80, 8
			c := cache(KVQ8_0)
			c.Width = 640
			a.Batch, a.KV = batch(), &RopeKV{T: 1, V: 9, Cache: &c}
			return a
		}, "whole blocks of 32"},
		{"batch into q8_0", func() *RopeArgs {
			a := rope()
			c := cache(KVQ8_0)
			a.Batch, a.KV = batch(), &RopeKV{T: 1, V: 9, Cache: &c}
			return a
		}, ""},
	} {
		_, err := c.a().locate()
		if (err == nil) != (c.want == "") || (err != nil && !strings.Contains(err.Error(), c.want)) {
			t.Errorf("rope, %s: error %v, want %q", c.name, err, c.want)
		}
	}

	// The rotations (checked before anything else of the launch).
	for _, c := range []struct {
		name string
		a    func() *RopeArgs
		want string
	}{
		{"rotation of 48", func() *RopeArgs { a := rope(); a.Rot = 48; return a }, "chunks of 48"},
		{"rotation of 512", func() *RopeArgs { a := rope(); a.HeadSize, a.Dims, a.Rot = 512, 512, 512; return a }, "chunks of 512"},
		{"rotation of 256 in heads of 128", func() *RopeArgs { a := rope(); a.Rot = 256; return a }, "divides the head"},
		{"value rotation of 96", func() *RopeArgs {
			a := rope()
			c := cache(KVQ8_0)
			a.Batch, a.KV = batch(), &RopeKV{T: 1, V: 9, Cache: &c, RotV: 96}
			return a
		}, "chunks of 96"},
	} {
		err := (&Rope{}).Run(nil, c.a())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("rope, %s: error %v, want %q", c.name, err, c.want)
		}
	}
}

// ---- GPU tests

// TestKVBatch runs every kernel of the paged cache against its reference.
func TestKVBatch(t *testing.T) {
	t.Run("store", testKVStore)
	t.Run("rope", testKVRope)
	t.Run("gather", testKVGather)
	t.Run("decode", testKVDecode)
	t.Run("prefill", testKVPrefill)
	t.Run("graph", testKVGraph)
	t.Run("gatherrows", testGatherRows)
	t.Run("contiguous", testKVContiguous)
}

// testKVStore: a step's tokens (a prompt chunk crossing a block boundary,
// decode tokens of other sequences, a token not at the batch's start)
// stored into their cells; every cell written equals the reference
// encoding, every other byte is still poison.
func testKVStore(t *testing.T) {
	for _, typ := range kvTypesAll {
		for _, width := range []int{1024, 96, 4096} {
			t.Run(fmt.Sprintf("%v/width=%d", typ, width), func(t *testing.T) {
				g := newKVT(t)
				const block = 64
				// Tables only: the cells' contents here are the store's.
				p := newPaged(g, typ, width, block, []int{150, 70, 1, 300}, 0, 2)
				for i := range p.k {
					p.k[i], p.v[i] = 0xff, 0xff
				}
				// Batch: a dummy token, sequence 0's chunk at 120..149 (crossing
				// 128), then one decode token of each other sequence.
				seq, pos := []int32{3}, []int32{0}
				for q := 120; q < 150; q++ {
					seq, pos = append(seq, 0), append(pos, int32(q))
				}
				seq, pos = append(seq, 1, 2, 3), append(pos, 69, 0, 299)
				first, n := 1, len(seq)-1
				kx, vx := g.randRows(n, width), g.randRows(n, width)
				c := p.upload(g)
				b := p.batch(g, seq, pos)
				g.check(kvFix.attn.StoreKV(g.s, &StoreKVArgs{Cache: c, Batch: b, First: first, K: g.up(f32Bytes(kx)), V: g.up(f32Bytes(vx)), NTok: n}))
				rb := typ.RowBytes(width)
				gk, gv := g.down(c.K, len(p.k)), g.down(c.V, len(p.v))
				want := map[int]int{} // cell -> token
				for i := 0; i < n; i++ {
					want[p.cell(int(seq[first+i]), int(pos[first+i]))] = i
				}
				for r := 0; r < p.rows; r++ {
					wk, wv := p.k[r*rb:(r+1)*rb], p.v[r*rb:(r+1)*rb]
					if i, ok := want[r]; ok {
						wk, wv = refEncode(typ, kx[i*width:(i+1)*width]), refEncode(typ, vx[i*width:(i+1)*width])
					}
					for j := 0; j < rb; j++ {
						if gk[r*rb+j] != wk[j] || gv[r*rb+j] != wv[j] {
							t.Fatalf("cell %d byte %d: k %#02x v %#02x, want %#02x %#02x", r, j, gk[r*rb+j], gv[r*rb+j], wk[j], wv[j])
						}
					}
				}
				t.Logf("%d tokens, %d cells of %d bytes exact", n, p.rows, rb)
			})
		}
	}
}

// testKVRope: rope with per-token positions (a batch of two sequences at
// unrelated positions), head norms, the keys and values stored through
// the tables; the rotations against ops.Rope, the cells bit-exact against
// the encoding of the kernel's own rotated keys. With the Walsh-Hadamard
// rotations (Rot, RotV: a q8_0 cache's, and other chunk sizes): the
// queries and keys bit for bit ops.FWHT of the launch's unrotated ones
// (the same launch without rotations), the cells bit for bit the encoding
// of those rotated by ops.FWHT and of the values so rotated, the values
// themselves untouched; and all against ops.Rope then ops.FWHT by NMSE.
func testKVRope(t *testing.T) {
	for _, typ := range kvTypesAll {
		for _, c := range []struct {
			heads, kv, hs int
			neox          bool
			rots          [][2]int // (Rot, RotV) besides none and ops.KVRotation's
		}{{40, 8, 128, true, [][2]int{{32, 128}}}, {8, 2, 64, false, nil}, {16, 4, 256, true, [][2]int{{128, 256}}}} {
			t.Run(fmt.Sprintf("%v/heads=%d/%d,hs=%d", typ, c.heads, c.kv, c.hs), func(t *testing.T) {
				g := newKVT(t)
				width := c.kv * c.hs
				p := newPaged(g, typ, width, 64, []int{4000, 70}, 0, 1)
				for i := range p.k {
					p.k[i], p.v[i] = 0xff, 0xff
				}
				seq := []int32{1, 0, 0, 0, 1, 1}
				pos := []int32{0, 3999, 1000, 64, 63, 69} // the first is a dummy token
				first, n := 1, 5
				r := &ops.Rope{Dims: c.hs, Base: 1e6, FreqScale: 1, NeoX: c.neox}
				qx, kx, vx := g.randRows(n, c.heads*c.hs), g.randRows(n, width), g.randRows(n, width)
				qn, kn := g.randRows(1, c.hs), g.randRows(1, c.hs)
				for i := range qn {
					qn[i], kn[i] = 1+qn[i]/8, 1+kn[i]/8
				}
				wantQ, wantK := append([]float32(nil), qx...), append([]float32(nil), kx...)
				cos, sin := make([]float32, c.hs/2), make([]float32, c.hs/2)
				for i := 0; i < n; i++ {
					r.Table(int(pos[first+i]), cos, sin)
					for _, x := range []struct {
						v     []float32
						heads int
						w     []float32
					}{{wantQ[i*c.heads*c.hs:], c.heads, qn}, {wantK[i*width:], c.kv, kn}} {
						row := x.v[:x.heads*c.hs]
						for h := 0; h < x.heads; h++ {
							ops.RMSNorm(row[h*c.hs:(h+1)*c.hs], row[h*c.hs:(h+1)*c.hs], x.w, 1e-6)
						}
						r.Apply(row, x.heads, c.hs, cos, sin)
					}
				}
				rk, rv := ops.KVRotation(ops.KVQ8_0, c.hs)
				rots := append([][2]int{{0, 0}, {rk, rv}}, c.rots...)
				var baseQ, baseK []float32 // the launch's unrotated queries and keys
				for _, rot := range rots {
					cache := p.upload(g)
					a := RopeArgs{NTensors: 2, HeadSize: c.hs, Dims: c.hs, NeoX: c.neox, Base: r.Base, FreqScale: 1, Eps: 1e-6,
						Batch: p.batch(g, seq, pos), First: first, NTok: n, Rot: rot[0]}
					a.T[0] = RopeTensor{X: g.up(f32Bytes(qx)), Heads: c.heads, NormW: g.up(f32Bytes(qn))}
					a.T[1] = RopeTensor{X: g.up(f32Bytes(kx)), Heads: c.kv, NormW: g.up(f32Bytes(kn))}
					vd := g.up(f32Bytes(vx))
					a.KV = &RopeKV{T: 1, V: vd, Cache: &cache, RotV: rot[1]}
					g.check(kvFix.rope.Run(g.s, &a))
					gotQ := bytesF32(g.down(a.T[0].X, 4*len(qx)))
					gotK := bytesF32(g.down(a.T[1].X, 4*len(kx)))
					wq, wk, storedV := wantQ, wantK, vx
					if rot[0] == 0 {
						baseQ, baseK = gotQ, gotK
					} else {
						wq, wk = append([]float32(nil), wantQ...), append([]float32(nil), wantK...)
						ops.FWHT(wq, rot[0])
						ops.FWHT(wk, rot[0])
						for _, x := range []struct {
							name      string
							got, base []float32
						}{{"Q", gotQ, baseQ}, {"K", gotK, baseK}} {
							exact := append([]float32(nil), x.base...)
							ops.FWHT(exact, rot[0])
							for i := range exact {
								if math.Float32bits(x.got[i]) != math.Float32bits(exact[i]) {
									t.Fatalf("rotation %v: %s value %d = %v, want %v (ops.FWHT of the unrotated launch's)", rot, x.name, i, x.got[i], exact[i])
								}
							}
						}
					}
					if rot[1] > 0 {
						storedV = append([]float32(nil), vx...)
						ops.FWHT(storedV, rot[1])
					}
					if gotV := bytesF32(g.down(vd, 4*len(vx))); !slicesEqualBits(gotV, vx) {
						t.Fatalf("rotation %v: the values were changed", rot)
					}
					for _, x := range []struct {
						name      string
						got, want []float32
					}{{"Q", gotQ, wq}, {"K", gotK, wk}} {
						w := make([]float64, len(x.want))
						for i, v := range x.want {
							w[i] = float64(v)
						}
						e := kvNMSE(t, x.name, x.got, w, 1e-11)
						t.Logf("rotation %v: %s against ops.Rope (and ops.FWHT): NMSE %.3g", rot, x.name, e)
					}
					rb := typ.RowBytes(width)
					gk, gv := g.down(cache.K, len(p.k)), g.down(cache.V, len(p.v))
					want := map[int]int{}
					for i := 0; i < n; i++ {
						want[p.cell(int(seq[first+i]), int(pos[first+i]))] = i
					}
					for row := 0; row < p.rows; row++ {
						wkc, wvc := p.k[row*rb:(row+1)*rb], p.v[row*rb:(row+1)*rb]
						if i, ok := want[row]; ok {
							// The kernel's own keys: for a rotation, ops.FWHT of
							// its unrotated ones, which they equal (above).
							wkc, wvc = refEncode(typ, gotK[i*width:(i+1)*width]), refEncode(typ, storedV[i*width:(i+1)*width])
						}
						for j := 0; j < rb; j++ {
							if gk[row*rb+j] != wkc[j] || gv[row*rb+j] != wvc[j] {
								t.Fatalf("rotation %v: cell %d byte %d: k %#02x v %#02x, want %#02x %#02x", rot, row, j, gk[row*rb+j], gv[row*rb+j], wkc[j], wvc[j])
							}
						}
					}
				}
			})
		}
	}
}

// slicesEqualBits reports whether a and b hold the same float32 bits.
func slicesEqualBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// testKVGather: a sequence sharing its first blocks with another, gathered
// up to a position inside a block; the scratch rows equal the cache's
// values as f16 (f16(d*q) for q8_0), rows past the length stay poison.
func testKVGather(t *testing.T) {
	for _, typ := range kvTypesAll {
		for _, c := range []struct {
			width, block, pos int
		}{{1024, 64, 1000}, {96, 64, 64}, {4100, 128, 300}, {512, 256, 0}} {
			if typ.Quantized() && c.width%32 != 0 {
				continue
			}
			t.Run(fmt.Sprintf("%v/width=%d,block=%d,pos=%d", typ, c.width, c.block, c.pos), func(t *testing.T) {
				g := newKVT(t)
				lens := []int{c.pos + 1 + 2*c.block, c.pos + 1}
				share := min(2, c.pos/c.block)
				p := newPaged(g, typ, c.width, c.block, lens, share, 1)
				cache := p.upload(g)
				b := p.batch(g, []int32{0, 1}, []int32{int32(lens[0] - 1), int32(c.pos)})
				maxLen := c.pos + 1 + 7
				ko, vo := g.poison(2*maxLen*c.width), g.poison(2*maxLen*c.width)
				g.check(kvFix.attn.GatherKV(g.s, &GatherKVArgs{Cache: cache, Batch: b, Tok: 1, MaxLen: maxLen, K: ko, V: vo}))
				gk, gv := g.down(ko, 2*maxLen*c.width), g.down(vo, 2*maxLen*c.width)
				for j := 0; j < maxLen; j++ {
					for i := 0; i < c.width; i++ {
						wk, wv := uint16(0xffff), uint16(0xffff)
						if j <= c.pos {
							cell := p.cell(1, j)
							wk, wv = ops.F32ToF16(p.kvals[cell][i]), ops.F32ToF16(p.vvals[cell][i])
						}
						o := 2 * (j*c.width + i)
						if k, v := binary.LittleEndian.Uint16(gk[o:]), binary.LittleEndian.Uint16(gv[o:]); k != wk || v != wv {
							t.Fatalf("row %d value %d: k %#04x v %#04x, want %#04x %#04x", j, i, k, v, wk, wv)
						}
					}
				}
			})
		}
	}
}

// kvDecCase is a decode launch: one token per sequence at its last
// position, plus extra tokens of sequence 0 at earlier positions.
type kvDecCase struct {
	heads, kv, hs int
	block         int
	lens          []int // sequence lengths: the decode token's position + 1
	extra         []int // more tokens of sequence 0, at these positions
	share         int   // leading blocks of sequence 0 every sequence shares
	splitCtx      int   // split-K over a cache of this many positions; 0: one split
	first         int   // batch tokens before the decode tokens
	qScale        float64
}

func (c kvDecCase) name(t KVType) string {
	return fmt.Sprintf("%v/heads=%d/%d,hs=%d,block=%d,lens=%v+%v,share=%d,split=%d,first=%d",
		t, c.heads, c.kv, c.hs, c.block, c.lens, c.extra, c.share, c.splitCtx, c.first)
}

var kvDecCases = []kvDecCase{
	// Qwen3-14B's heads (group 5): three sequences with a common prefix of
	// two blocks, split-K with empty splits, runs cut at 1, 300 and 1000.
	{40, 8, 128, 64, []int{1000, 300, 129}, nil, 2, 2048, 0, 1},
	// Qwen3-30B-A3B's (group 8): eight sequences, one crossing 4096, the
	// engine's block of 256, a batch with tokens before the decode ones.
	{32, 4, 128, 256, []int{4097, 1, 17, 16, 64, 65, 255, 257}, nil, 0, 8192, 3, 1},
	// One split, positions on and off the runs of 16 and the warps' 64.
	{32, 4, 128, 64, []int{63, 64, 65, 200}, []int{0, 31}, 0, 0, 0, 1},
	// Group 2, head size 64, peaked scores.
	{16, 8, 64, 64, []int{777, 5, 128, 1500, 33}, []int{700}, 1, 2048, 1, 3},
	// MHA (group 1), head size 64.
	{8, 8, 64, 128, []int{300, 1, 129}, nil, 0, 0, 0, 1},
	// Head size 32 (q8_0 rows of 34 bytes: plain copies), group 4.
	{8, 2, 32, 64, []int{90, 513, 2}, nil, 0, 1024, 0, 1},
	// Head size 256, group 8.
	{16, 2, 256, 64, []int{70, 300, 1}, nil, 1, 1024, 0, 1},
	// Group 8 over two KV heads of 128 (rows of 272 bytes: the second
	// head's starts 8 bytes past a 16-byte boundary), and group 4 over
	// three of 64 (rows of 204: the int8 kernel does not take them).
	{16, 2, 128, 64, []int{500, 77}, nil, 0, 1024, 0, 1},
	{12, 3, 64, 64, []int{300, 40}, nil, 0, 1024, 0, 1},
	// Group 20: two blocks of heads a group (16 and 4).
	{40, 2, 128, 64, []int{400, 90}, nil, 0, 1024, 0, 1},
	// MQA, 32 heads over one: two blocks of 16.
	{32, 1, 64, 64, []int{150, 3}, nil, 0, 0, 2, 1},
	// Lone rows (an f16 cache takes attn_dec1): split over a large cache,
	// a short row in it (one split holds it), one split, head sizes 32
	// and 256, a row after another sequence's token.
	{40, 8, 128, 256, []int{1000}, nil, 0, 4096, 0, 1},
	{40, 8, 128, 256, []int{22}, nil, 0, 4096, 0, 1},
	{32, 4, 128, 64, []int{129}, nil, 0, 0, 0, 1},
	{8, 2, 32, 64, []int{513}, nil, 0, 1024, 0, 1},
	{16, 2, 256, 64, []int{300}, nil, 0, 1024, 0, 1},
	{16, 8, 64, 64, []int{700, 1500}, nil, 0, 2048, 1, 3},
	// Lone rows of other groups: 20 (blocks of 5 heads, split), MHA, and 7
	// at head size 256 (a block a head).
	{40, 2, 128, 64, []int{400}, nil, 0, 1024, 0, 1},
	{8, 8, 64, 128, []int{300}, nil, 0, 0, 0, 1},
	{14, 2, 256, 64, []int{200}, nil, 0, 1024, 0, 1},
}

// testKVDecode: every case with both cache types, with and without the
// Q8_1 output, checked token by token.
func testKVDecode(t *testing.T) {
	for _, typ := range kvTypesAll {
		for _, c := range kvDecCases {
			t.Run(c.name(typ), func(t *testing.T) {
				g := newKVT(t)
				runKVDecode(g, typ, c)
			})
		}
	}
}

// runKVDecode builds case c's cache and batch, runs DecodeKV and checks
// it, without and with the Q8_1 output.
func runKVDecode(g *kvT, typ KVType, c kvDecCase) {
	width := c.kv * c.hs
	p := newPaged(g, typ, width, c.block, c.lens, c.share, 2)
	var seq, pos []int32
	for i := 0; i < c.first; i++ {
		seq, pos = append(seq, int32(len(c.lens)-1)), append(pos, 0)
	}
	for s, l := range c.lens {
		seq, pos = append(seq, int32(s)), append(pos, int32(l-1))
	}
	for _, x := range c.extra {
		seq, pos = append(seq, 0), append(pos, int32(x))
	}
	n := len(seq) - c.first
	q := g.randRows(n, c.heads*c.hs)
	for i := range q {
		q[i] = float32(float64(q[i]) * c.qScale)
	}
	scale := float32(1 / math.Sqrt(float64(c.hs)))
	a := DecodeKVArgs{Q: g.up(f32Bytes(q)), Cache: p.upload(g), Batch: p.batch(g, seq, pos), First: c.first,
		NTok: n, NHeads: c.heads, NKV: c.kv, HeadSize: c.hs, Scale: scale}
	if c.splitCtx > 0 {
		a.Splits, a.Chunk = DecodeSplits(c.splitCtx, c.kv, 4, kvFix.info.Multiprocessors)
		pb, mb := AttnScratch(n, c.heads, c.hs, a.Splits)
		a.Part, a.ML, a.Count = g.poison(pb), g.poison(mb), g.zeros(DecodeCounters(n, c.heads))
	}
	want := make([][]float64, n)
	int8 := kvFix.attn.DecodeKVInt8(c.hs, c.heads, c.kv, typ)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			qi := q[i*c.heads*c.hs : (i+1)*c.heads*c.hs]
			ks, vs := p.rowsOf(int(seq[c.first+i]), int(pos[c.first+i])+1, int8)
			if int8 {
				want[i] = refAttentionQ(q8_0Query(qi), ks, vs, c.heads, c.kv, c.hs, scale)
			} else {
				want[i] = refAttention(qi, ks, vs, c.heads, c.kv, c.hs, scale)
			}
		}()
	}
	wg.Wait()
	// The output rotated back (Rot: a q8_0 cache's chunks of 64, 32 for
	// heads of 32, and whole heads): against the reference rotated in
	// float64, and bit for bit ops.FWHT of the unrotated launch's rows,
	// which the kernel rotates as they are (not when the unrotated launch
	// took attn_dec1, a short lone row over an f16 cache: another kernel).
	// A lone row runs long and short (attn_dec1 over an f16 cache).
	rots := []int{0, min(64, c.hs)}
	if c.hs >= 128 {
		rots = append(rots, c.hs)
	}
	w := c.heads * c.hs
	shorts := []bool{false}
	if n == 1 {
		shorts = append(shorts, true)
	}
	for _, short := range shorts {
		a.Short = short
		sameKernel := !(short && typ == KVF16 && !kvFix.attn.mma1)
		runKVDecodeRots(g, &a, c, typ, rots, want, w, n, seq, pos, q, sameKernel)
	}
}

// runKVDecodeRots runs a (case c) at each output rotation, with and
// without the Q8_1 output, against want rotated, and the rotated rows bit
// for bit against the unrotated launch's when sameKernel.
func runKVDecodeRots(g *kvT, a *DecodeKVArgs, c kvDecCase, typ KVType, rots []int, want [][]float64, w, n int, seq, pos []int32, q []float32, sameKernel bool) {
	var base []float32 // the unrotated rows
	for _, rot := range rots {
		a.Rot = rot
		wantR := want
		if rot > 0 {
			wantR = make([][]float64, n)
			for i := range want {
				wantR[i] = fwht64(want[i], rot)
			}
		}
		for _, planes := range []int{0, 1, 2} {
			q8 := planes > 0
			a.Out = g.poison(4 * len(q))
			a.Q8, a.Q8Planes = 0, planes
			if q8 {
				a.Q8 = g.poison(Q8_1PlanesBytes(planes, n, c.heads*c.hs))
			}
			g.check(kvFix.attn.DecodeKV(g.s, a))
			got := bytesF32(g.down(a.Out, 4*len(q)))
			worst := 0.0
			for i := 0; i < n; i++ {
				e := kvNMSE(g, fmt.Sprintf("rotation %d: token %d (sequence %d, position %d)", rot, i, seq[c.first+i], pos[c.first+i]), got[i*w:(i+1)*w], wantR[i], kvBound)
				worst = max(worst, e)
			}
			if q8 {
				checkQ8_1(g, g.down(a.Q8, Q8_1PlanesBytes(planes, n, w)), got, planes)
			}
			switch {
			case rot == 0:
				base = got
			case sameKernel:
				exact := append([]float32(nil), base...)
				ops.FWHT(exact, rot)
				for i := range exact {
					if math.Float32bits(got[i]) != math.Float32bits(exact[i]) {
						g.Fatalf("rotation %d: value %d = %v, want %v (ops.FWHT of the unrotated launch's)", rot, i, got[i], exact[i])
					}
				}
			}
			g.Logf("%d tokens (short %v), %d splits of %d, rotation %d: worst NMSE %.3g (bound %.0e), Q8_1 output %v", n, a.Short, max(1, a.Splits), a.Chunk, rot, worst, kvBound, q8)
		}
	}
}

// fwht64 is x rotated in chunks of n by the orthonormal Walsh-Hadamard
// transform, in float64 (the references').
func fwht64(x []float64, n int) []float64 {
	y := append([]float64(nil), x...)
	s := 1 / math.Sqrt(float64(n))
	for c := 0; c+n <= len(y); c += n {
		z := y[c : c+n]
		for i := range z {
			z[i] *= s
		}
		for span := 1; span < n; span *= 2 {
			for i := 0; i < n; i += 2 * span {
				for j := i; j < i+span; j++ {
					z[j], z[j+span] = z[j]+z[j+span], z[j]-z[j+span]
				}
			}
		}
	}
	return y
}

// testKVPrefill: a prompt chunk of one sequence (after other tokens of the
// batch) by the engine's recipe: GatherKV of positions 0..its last, then
// Run (the tensor-core or CUDA-core prefill kernel) on the scratch with
// Pos0 at its first token's position.
func testKVPrefill(t *testing.T) {
	for _, typ := range kvTypesAll {
		for _, c := range []struct {
			heads, kv, hs, block int
			start, nTok          int
			simt                 bool
		}{
			{40, 8, 128, 64, 300, 77, false}, // tensor cores, group 5
			{32, 4, 128, 256, 0, 130, false}, // a whole prompt, group 8
			{8, 2, 64, 64, 1000, 33, false},  // group 4, continued from a cache
			{8, 2, 64, 64, 1000, 33, true},   // the CUDA-core kernel
			{6, 2, 80, 64, 100, 9, false},    // head size 80: the CUDA-core kernel
		} {
			t.Run(fmt.Sprintf("%v/heads=%d/%d,hs=%d,start=%d,tok=%d,simt=%v", typ, c.heads, c.kv, c.hs, c.start, c.nTok, c.simt), func(t *testing.T) {
				g := newKVT(t)
				width := c.kv * c.hs
				end := c.start + c.nTok
				p := newPaged(g, typ, width, c.block, []int{500, end}, 0, 1)
				// The batch: a decode token of sequence 0, then the chunk.
				seq, pos := []int32{0}, []int32{499}
				for i := 0; i < c.nTok; i++ {
					seq, pos = append(seq, 1), append(pos, int32(c.start+i))
				}
				cache := p.upload(g)
				b := p.batch(g, seq, pos)
				maxLen := end + 5
				ko, vo := g.poison(2*maxLen*width), g.poison(2*maxLen*width)
				g.check(kvFix.attn.GatherKV(g.s, &GatherKVArgs{Cache: cache, Batch: b, Tok: len(seq) - 1, MaxLen: maxLen, K: ko, V: vo}))
				q := g.randRows(c.nTok, c.heads*c.hs)
				scale := float32(1 / math.Sqrt(float64(c.hs)))
				a := AttnArgs{Out: g.poison(4 * len(q)), Q: g.up(f32Bytes(q)), K: ko, V: vo, Pos0: b.Pos.Add(4),
					NTok: c.nTok, NHeads: c.heads, NKV: c.kv, HeadSize: c.hs, Scale: scale, SIMT: c.simt}
				mma, why := kvFix.attn.TensorCores(&a)
				g.check(kvFix.attn.Run(g.s, &a))
				got := bytesF32(g.down(a.Out, 4*len(q)))
				w := c.heads * c.hs
				worst := 0.0
				for i := 0; i < c.nTok; i++ {
					ks, vs := p.rowsOf(1, c.start+i+1, false)
					want := refAttention(q[i*w:(i+1)*w], ks, vs, c.heads, c.kv, c.hs, scale)
					worst = max(worst, kvNMSE(t, fmt.Sprintf("token %d (position %d)", i, c.start+i), got[i*w:(i+1)*w], want, kvBound))
				}
				t.Logf("tensor cores %v (%s): worst NMSE %.3g (bound %.0e)", mma, why, worst, kvBound)
			})
		}
	}
}

// testKVGraph: StoreKV and DecodeKV captured once into a graph, replayed
// for two steps of other positions and tables (the arrays rewritten in
// place between replays): each replay matches its reference.
func testKVGraph(t *testing.T) {
	for _, typ := range kvTypesAll {
		t.Run(typ.String(), func(t *testing.T) {
			g := newKVT(t)
			const heads, kv, hs, block, n = 32, 4, 128, 64, 3
			width := kv * hs
			var ge *cudadrv.GraphExec
			defer func() {
				if ge != nil {
					ge.Destroy()
				}
			}()
			// The device arrays of the graph, sized for the larger step.
			const maxBlocks = 48
			dPos, dSeq, dTab := g.alloc(4*n), g.alloc(4*n), g.alloc(4*n*maxBlocks)
			rows := 3 * maxBlocks * block
			rb := typ.RowBytes(width)
			cache := KVCache{K: g.poison(rows * rb), V: g.poison(rows * rb), Type: typ, Width: width}
			dq, dk, dv, out := g.alloc(4*n*heads*hs), g.alloc(4*n*width), g.alloc(4*n*width), g.alloc(4*n*heads*hs)
			splits, chunk := DecodeSplits(maxBlocks*block, kv, 4, kvFix.info.Multiprocessors)
			pb, mb := AttnScratch(n, heads, hs, splits)
			part, ml, count := g.alloc(pb), g.alloc(mb), g.zeros(DecodeCounters(n, heads))
			bt := &Batch{Pos: dPos, Seq: dSeq, Tables: dTab, MaxBlocks: maxBlocks, Block: block}
			step := func() error {
				if err := kvFix.attn.StoreKV(g.s, &StoreKVArgs{Cache: cache, Batch: bt, K: dk, V: dv, NTok: n}); err != nil {
					return err
				}
				return kvFix.attn.DecodeKV(g.s, &DecodeKVArgs{Out: out, Q: dq, Cache: cache, Batch: bt, NTok: n,
					NHeads: heads, NKV: kv, HeadSize: hs, Scale: 0.1, Splits: splits, Chunk: chunk, Part: part, ML: ml, Count: count})
			}
			for rep, lens := range [][]int{{100, 1, 2000}, {2500, 700, 65}} {
				// A fresh paged cache for this step: its used cells are
				// uploaded over the poison, the step's tokens' rows come
				// from the store.
				p := newPaged(g, typ, width, block, lens, 0, 0)
				if p.maxBlocks > maxBlocks || p.rows > rows {
					t.Fatalf("step %d: %d blocks a table, %d rows", rep, p.maxBlocks, p.rows)
				}
				tab := make([]int32, n*maxBlocks)
				for s := range lens {
					copy(tab[s*maxBlocks:], p.tables[s])
				}
				seq, pos := []int32{0, 1, 2}, []int32{int32(lens[0] - 1), int32(lens[1] - 1), int32(lens[2] - 1)}
				q, kx, vx := g.randRows(n, heads*hs), g.randRows(n, width), g.randRows(n, width)
				g.check(g.s.MemsetD8(cache.K, 0xff, rows*rb))
				g.check(g.s.MemsetD8(cache.V, 0xff, rows*rb))
				g.check(g.s.CopyHtoD(cache.K, p.k))
				g.check(g.s.CopyHtoD(cache.V, p.v))
				for _, x := range []struct {
					d cudadrv.DevicePtr
					b []byte
				}{{dPos, i32Bytes(pos)}, {dSeq, i32Bytes(seq)}, {dTab, i32Bytes(tab)}, {dq, f32Bytes(q)}, {dk, f32Bytes(kx)}, {dv, f32Bytes(vx)}} {
					g.check(g.s.CopyHtoD(x.d, x.b))
				}
				g.check(g.s.MemsetD8(out, 0xff, 4*n*heads*hs))
				if ge == nil {
					g.check(g.s.Synchronize())
					gr, err := g.s.Capture(cudadrv.CaptureRelaxed, step)
					g.check(err)
					ge, err = gr.Instantiate(0)
					gr.Destroy()
					g.check(err)
				}
				g.check(ge.Launch(g.s))
				got := bytesF32(g.down(out, 4*n*heads*hs))
				for i := 0; i < n; i++ {
					c := p.cell(i, lens[i]-1)
					p.kvals[c] = kernelValues(typ, refEncode(typ, kx[i*width:(i+1)*width]), width)
					p.vvals[c] = kernelValues(typ, refEncode(typ, vx[i*width:(i+1)*width]), width)
					p.kexact[c] = refDecode(typ, refEncode(typ, kx[i*width:(i+1)*width]), width)
				}
				w := heads * hs
				int8 := kvFix.attn.DecodeKVInt8(hs, heads, kv, typ)
				for i := 0; i < n; i++ {
					ks, vs := p.rowsOf(i, lens[i], int8)
					want := refAttention(q[i*w:(i+1)*w], ks, vs, heads, kv, hs, 0.1)
					if int8 {
						want = refAttentionQ(q8_0Query(q[i*w:(i+1)*w]), ks, vs, heads, kv, hs, 0.1)
					}
					e := kvNMSE(t, fmt.Sprintf("replay %d token %d", rep, i), got[i*w:(i+1)*w], want, kvBound)
					t.Logf("replay %d token %d (position %d): NMSE %.3g", rep, i, lens[i]-1, e)
				}
			}
		})
	}
}

// testGatherRows: rows picked in any order, repeated, from a wider set.
func testGatherRows(t *testing.T) {
	g := newKVT(t)
	const width, nSrc = 5003, 37
	src := g.randRows(nSrc, width)
	idx := []int32{36, 0, 5, 5, 17, 2, 36}
	dst := g.poison(4 * len(idx) * width)
	g.check(kvFix.elem.GatherRows(g.s, dst, g.up(f32Bytes(src)), g.up(i32Bytes(idx)), width, len(idx)))
	got := bytesF32(g.down(dst, 4*len(idx)*width))
	for i, r := range idx {
		for c := 0; c < width; c++ {
			if math.Float32bits(got[i*width+c]) != math.Float32bits(src[int(r)*width+c]) {
				t.Fatalf("row %d value %d: %v, want %v", i, c, got[i*width+c], src[int(r)*width+c])
			}
		}
	}
}

// testKVContiguous: the launchers of one sequence's contiguous cache
// (Store and the rope write at Pos0 + t, Run's decode), whose kernels took
// the paged parameters: rows 0..total-1 stored, the last nTok rewritten by
// the rope, then the decode of the last position against the reference
// over the rows written; rows past total stay poison.
func testKVContiguous(t *testing.T) {
	g := newKVT(t)
	const heads, kv, hs, pos0, nTok, ctx = 8, 2, 64, 40, 5, 64
	const total = pos0 + nTok
	width := kv * hs
	kx, vx := g.randRows(total, width), g.randRows(total, width)
	kc, vc := g.poison(2*ctx*width), g.poison(2*ctx*width)
	g.check(kvFix.attn.Store(g.s, kc, vc, g.up(f32Bytes(kx)), g.up(f32Bytes(vx)), width, g.up(i32Bytes([]int32{0})), total))
	// The rope write at Pos0 into rows pos0.. of the same caches.
	r := &ops.Rope{Dims: hs, Base: 1e4, FreqScale: 1}
	kr, vr := g.randRows(nTok, width), g.randRows(nTok, width)
	want := append([]float32(nil), kr...)
	cos, sin := make([]float32, hs/2), make([]float32, hs/2)
	for i := 0; i < nTok; i++ {
		r.Table(pos0+i, cos, sin)
		r.Apply(want[i*width:(i+1)*width], kv, hs, cos, sin)
	}
	a := RopeArgs{NTensors: 1, HeadSize: hs, Dims: hs, Base: r.Base, FreqScale: 1, Pos0: g.up(i32Bytes([]int32{pos0})), NTok: nTok}
	a.T[0] = RopeTensor{X: g.up(f32Bytes(kr)), Heads: kv}
	a.KV = &RopeKV{T: 0, V: g.up(f32Bytes(vr)), KC: kc, VC: vc}
	g.check(kvFix.rope.Run(g.s, &a))
	gotK := bytesF32(g.down(a.T[0].X, 4*len(kr)))
	w := make([]float64, len(want))
	for i, v := range want {
		w[i] = float64(v)
	}
	kvNMSE(t, "rope at Pos0", gotK, w, 1e-11)
	copy(kx[pos0*width:], gotK)
	copy(vx[pos0*width:], vr)
	gk, gv := g.down(kc, 2*ctx*width), g.down(vc, 2*ctx*width)
	var ks, vs [][]float32
	for j := 0; j < ctx; j++ {
		rk, rv := make([]float32, width), make([]float32, width)
		for i := 0; i < width; i++ {
			wk, wv := uint16(0xffff), uint16(0xffff)
			if j < total {
				wk, wv = ops.F32ToF16(kx[j*width+i]), ops.F32ToF16(vx[j*width+i])
			}
			o := 2 * (j*width + i)
			k, v := binary.LittleEndian.Uint16(gk[o:]), binary.LittleEndian.Uint16(gv[o:])
			if k != wk || v != wv {
				t.Fatalf("row %d value %d: k %#04x v %#04x, want %#04x %#04x", j, i, k, v, wk, wv)
			}
			rk[i], rv[i] = ops.F16ToF32(k), ops.F16ToF32(v)
		}
		if j < total {
			ks, vs = append(ks, rk), append(vs, rv)
		}
	}
	// Run's decode (attn_dec_e2) at the last position.
	q := g.randRows(1, heads*hs)
	out := g.poison(4 * heads * hs)
	args := &AttnArgs{Out: out, Q: g.up(f32Bytes(q)), K: kc, V: vc, Pos0: g.up(i32Bytes([]int32{total - 1})),
		NTok: 1, NHeads: heads, NKV: kv, HeadSize: hs, Scale: 0.125}
	if ok, why := kvFix.attn.Decode(args); !ok && os.Getenv(EnvAttention) == "" {
		t.Fatalf("Run does not take attn_dec: %s", why)
	}
	g.check(kvFix.attn.Run(g.s, args))
	e := kvNMSE(t, "decode at Pos0", bytesF32(g.down(out, 4*heads*hs)), refAttention(q, ks, vs, heads, kv, hs, 0.125), kvBound)
	t.Logf("Store, rope at Pos0 exact; decode NMSE %.3g", e)
}

// ---- benchmark

// BenchmarkKVDecode times one layer's decode attention at Qwen3-14B's
// heads (40 over 8 KV heads of 128) and Qwen3-30B-A3B's (32 over 4), at
// depth 4096 and 16384, for 1 and 8 sequences, each at that depth, in a
// cache of 16384 positions a sequence (the split-K layout of DecodeSplits
// over 16384, as the engine sizes it for -c 16384): the paged kernel on
// an f16 and on a q8_0 cache (one launch for all sequences), and the
// contiguous attn_dec of Run (one launch a sequence, each sequence's
// blocks consecutive so that the same f16 bytes serve both). Device time
// from events around b.N launches; us/step a layer's attention for all
// sequences, GB/s the K and V bytes of the attended positions over it.
func BenchmarkKVDecode(b *testing.B) {
	s := kvBenchStream(b)
	ctx := kvFix.ctx
	const hs, maxCtx, block, maxSeqs = 128, 16384, 256, 8
	rng := rand.New(rand.NewPCG(7, 7))
	for _, m := range []struct {
		name      string
		heads, kv int
	}{{"qwen3-14b", 40, 8}, {"qwen3-30b-a3b", 32, 4}} {
		width := m.kv * hs
		f16Row, q8Row := KVF16.RowBytes(width), KVQ8_0.RowBytes(width)
		// Sequence s's blocks are s*64 .. s*64+63: consecutive, so the old
		// kernel reads sequence s at K + s*16384 rows.
		kb := newKVDecodeBench(b, rng, width, maxCtx, block, maxSeqs)
		alloc, upload, caches, blocks, dTab, dSeq := kb.alloc, kb.upload, kb.caches, kb.blocks, kb.tab, kb.seq
		splits, chunk := DecodeSplits(maxCtx, m.kv, kvFix.attn.DecodeWarps(hs, m.heads, m.kv, KVF16), kvFix.info.Multiprocessors)
		pb, mb := AttnScratch(maxSeqs, m.heads, hs, splits)
		part, ml, count := alloc(pb), alloc(mb), alloc(DecodeCounters(maxSeqs, m.heads))
		if err := ctx.MemsetD32(count, 0, DecodeCounters(maxSeqs, m.heads)/4); err != nil {
			b.Fatal(err)
		}
		qs := make([]float32, maxSeqs*m.heads*hs)
		for i := range qs {
			qs[i] = float32(rng.NormFloat64())
		}
		q := upload(f32Bytes(qs))
		out := alloc(4 * maxSeqs * m.heads * hs)
		for _, depth := range []int{256, 1024, 4096, 16384} {
			pos := make([]int32, maxSeqs)
			for i := range pos {
				pos[i] = int32(depth - 1)
			}
			dPos := upload(i32Bytes(pos))
			for _, nSeq := range []int{1, 8} {
				// q8_0rot: with the output rotated back (a q8_0 cache's
				// DecodeKVArgs.Rot, chunks of 64), as the engine runs it.
				kernels := []string{"old", "f16", "q8_0", "q8_0rot"}
				if nSeq == 1 {
					// The lone row's CUDA-core kernel (attn_dec1), which
					// the engine takes for short rows only.
					kernels = append(kernels, "f16-short")
				}
				for _, kernel := range kernels {
					b.Run(fmt.Sprintf("model=%s/depth=%d/seqs=%d/kernel=%s", m.name, depth, nSeq, kernel), func(b *testing.B) {
						var step func() error
						rowBytes := f16Row
						switch kernel {
						case "old":
							c := caches[KVF16]
							args := make([]AttnArgs, nSeq)
							for sq := range args {
								args[sq] = AttnArgs{Out: out.Add(4 * sq * m.heads * hs), Q: q.Add(4 * sq * m.heads * hs),
									K: c.K.Add(sq * maxCtx * f16Row), V: c.V.Add(sq * maxCtx * f16Row), Pos0: dPos.Add(4 * sq),
									NTok: 1, NHeads: m.heads, NKV: m.kv, HeadSize: hs, Scale: 0.088,
									Splits: splits, Chunk: chunk, Part: part, ML: ml}
								if ok, why := kvFix.attn.Decode(&args[sq]); !ok {
									b.Fatalf("the old decode kernel does not take the launch: %s", why)
								}
							}
							step = func() error {
								for sq := range args {
									if err := kvFix.attn.Run(s, &args[sq]); err != nil {
										return err
									}
								}
								return nil
							}
						default:
							t := KVF16
							if strings.HasPrefix(kernel, "q8_0") {
								t, rowBytes = KVQ8_0, q8Row
							}
							a := DecodeKVArgs{Out: out, Q: q, Cache: caches[t],
								Batch: &Batch{Pos: dPos, Seq: dSeq, Tables: dTab, MaxBlocks: blocks, Block: block},
								NTok:  nSeq, NHeads: m.heads, NKV: m.kv, HeadSize: hs, Scale: 0.088,
								Splits: splits, Chunk: chunk, Part: part, ML: ml, Count: count}
							if kernel == "q8_0rot" {
								a.Rot = 64
							}
							a.Short = kernel == "f16-short"
							step = func() error { return kvFix.attn.DecodeKV(s, &a) }
						}
						d := kvTime(b, s, step)
						bytes := float64(2 * nSeq * depth * rowBytes)
						b.ReportMetric(d*1e6, "us/step")
						b.ReportMetric(bytes/d/1e9, "GB/s")
					})
				}
			}
		}
	}
}

// kvTime runs fn b.N times after a warm-up and returns the device seconds
// per call.
func kvTime(b *testing.B, s *cudadrv.Stream, fn func() error) float64 {
	for range 3 {
		if err := fn(); err != nil {
			b.Fatal(err)
		}
	}
	e0, err := kvFix.ctx.NewEvent(cudadrv.EventDefault)
	if err != nil {
		b.Fatal(err)
	}
	defer e0.Destroy()
	e1, err := kvFix.ctx.NewEvent(cudadrv.EventDefault)
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
		if err := fn(); err != nil {
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
	return d.Seconds() / float64(b.N)
}

// BenchmarkKVDecodeShape sweeps the paged decode kernel's launch shape at
// Qwen3-14B's heads over a full cache of 16384 positions: the split-K
// layout, as the blocks of 4 warps a multiprocessor it aims at (perSM=2
// was DecodeSplits' layout for blocks of 4; perSM=1 is its layout for
// blocks of 8, planDecodeKV's choice on an H200), and the warps and
// buffers a block (forceDecKV; 0x0 is planDecodeKV's choice), for an f16
// and a q8_0 cache (output rotated back, as the engine runs it; q8_0 with
// the kernel the engine takes, q8_0k16 with the f16 keys where that is
// the int8 one). One sequence reads each of 8 sequences' caches in turn, so
// that the cache comes from device memory, not L2, as in a model's step.
func BenchmarkKVDecodeShape(b *testing.B) {
	s := kvBenchStream(b)
	ctx := kvFix.ctx
	const hs, heads, kv, maxCtx, block, maxSeqs = 128, 40, 8, 16384, 256, 8
	rng := rand.New(rand.NewPCG(9, 9))
	width := kv * hs
	kb := newKVDecodeBench(b, rng, width, maxCtx, block, maxSeqs)
	alloc, upload, caches, blocks, dTab, dSeq := kb.alloc, kb.upload, kb.caches, kb.blocks, kb.tab, kb.seq
	qs := make([]float32, maxSeqs*heads*hs)
	for i := range qs {
		qs[i] = float32(rng.NormFloat64())
	}
	q := upload(f32Bytes(qs))
	out := alloc(4 * maxSeqs * heads * hs)
	const maxSplits = 256
	pb, mb := AttnScratch(maxSeqs, heads, hs, maxSplits)
	part, ml, count := alloc(pb), alloc(mb), alloc(DecodeCounters(maxSeqs, heads))
	if err := ctx.MemsetD32(count, 0, DecodeCounters(maxSeqs, heads)/4); err != nil {
		b.Fatal(err)
	}
	// q8_0 runs the kernel the engine takes (the int8 one, on CC 8.0 and
	// later) and, as q8_0k16, the one that reads its keys as f16.
	int8 := kvFix.attn.int8
	defer func() { kvFix.attn.forceDecKV.warps, kvFix.attn.int8 = 0, int8 }()
	for _, depth := range []int{4096, 16384} {
		pos := make([]int32, maxSeqs)
		for i := range pos {
			pos[i] = int32(depth - 1)
		}
		dPos := upload(i32Bytes(pos))
		for _, nSeq := range []int{1, 8} {
			for _, perSM := range []int{1, 2, 3} {
				splits, chunk := DecodeSplits(maxCtx, kv, 4, perSM*kvFix.info.Multiprocessors/2)
				if nSeq > 1 {
					// The engine's decodeSplits: the one-row layout's blocks shared among the rows.
					splits = max(1, (splits+nSeq-1)/nSeq)
					chunk = ((maxCtx+splits-1)/splits + 63) &^ 63
					splits = (maxCtx + chunk - 1) / chunk
				}
				for _, shape := range [][2]int{{0, 0}, {8, 2}, {8, 3}, {4, 3}, {4, 2}, {12, 2}, {12, 3}} {
					for _, kt := range []struct {
						name string
						t    KVType
						int8 bool
					}{{"f16", KVF16, false}, {"q8_0", KVQ8_0, int8}, {"q8_0k16", KVQ8_0, false}, {"q4_0", KVQ4_0, false}} {
						t := kt.t
						if kt.name == "q8_0k16" && !int8 {
							continue // the same kernel as q8_0
						}
						name := fmt.Sprintf("depth=%d/seqs=%d/perSM=%d/shape=%dx%d/kv=%s", depth, nSeq, perSM, shape[0], shape[1], kt.name)
						b.Run(name, func(b *testing.B) {
							kvFix.attn.forceDecKV.warps, kvFix.attn.forceDecKV.stages = shape[0], shape[1]
							kvFix.attn.int8 = kt.int8
							args := make([]DecodeKVArgs, maxSeqs)
							for i := range args {
								sq := dSeq
								if nSeq == 1 {
									sq = dSeq.Add(4 * i)
								}
								args[i] = DecodeKVArgs{Out: out, Q: q, Cache: caches[t],
									Batch: &Batch{Pos: dPos, Seq: sq, Tables: dTab, MaxBlocks: blocks, Block: block},
									NTok:  nSeq, NHeads: heads, NKV: kv, HeadSize: hs, Scale: 0.088,
									Splits: splits, Chunk: chunk, Part: part, ML: ml, Count: count}
								if t.Quantized() {
									args[i].Rot = 64
								}
							}
							_, plan, err := kvFix.attn.checkDecodeKV(&args[0])
							if err != nil {
								b.Fatal(err)
							}
							if shape[0] > 0 && (plan.warps != shape[0] || plan.stages != shape[1]) {
								b.Skipf("shape %dx%d does not fit the shared memory", shape[0], shape[1])
							}
							i := 0
							d := kvTime(b, s, func() error {
								i++
								return kvFix.attn.DecodeKV(s, &args[i%maxSeqs])
							})
							b.ReportMetric(d*1e6, "us/step")
							b.ReportMetric(float64(2*nSeq*depth*t.RowBytes(width))/d/1e9, "GB/s")
							b.ReportMetric(float64(splits), "splits")
							b.ReportMetric(float64(plan.shared)/1024, "KiB")
						})
					}
				}
			}
		}
	}
}

// kvBenchStream starts a decode benchmark: the GPU fixture (or a skip)
// and a stream destroyed when the benchmark ends.
func kvBenchStream(b *testing.B) *cudadrv.Stream {
	kvSetup(b)
	s, err := kvFix.ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Destroy() })
	return s
}

// kvDecodeBench is what the decode benchmarks share: device memory freed
// when the benchmark ends, and f16 and q8_0 caches of maxSeqs sequences of
// maxCtx positions, every sequence holding the same random rows, with
// their block tables (sequence s's blocks consecutive: s*blocks ..) and
// sequence indexes 0..maxSeqs-1.
type kvDecodeBench struct {
	b        *testing.B
	ctx      *cudadrv.Context
	caches   map[KVType]KVCache
	tab, seq cudadrv.DevicePtr
	blocks   int
}

func newKVDecodeBench(b *testing.B, rng *rand.Rand, width, maxCtx, block, maxSeqs int) *kvDecodeBench {
	k := &kvDecodeBench{b: b, ctx: kvFix.ctx, caches: map[KVType]KVCache{}, blocks: maxCtx / block}
	one := make([]float32, width)
	seqs := map[KVType][]byte{}
	for _, t := range kvTypesAll {
		seqs[t] = make([]byte, maxCtx*t.RowBytes(width))
	}
	for r := 0; r < maxCtx; r++ {
		for i := range one {
			one[i] = float32(rng.NormFloat64())
		}
		for t, seq := range seqs {
			n := t.RowBytes(width)
			copy(seq[r*n:], refEncode(t, one))
		}
	}
	for t, seq := range seqs {
		kc, vc := k.alloc(maxSeqs*len(seq)), k.alloc(maxSeqs*len(seq))
		for sq := 0; sq < maxSeqs; sq++ {
			for _, p := range []cudadrv.DevicePtr{kc, vc} {
				if err := k.ctx.CopyHtoD(p.Add(sq*len(seq)), seq); err != nil {
					b.Fatal(err)
				}
			}
		}
		k.caches[t] = KVCache{K: kc, V: vc, Type: t, Width: width}
	}
	tab := make([]int32, maxSeqs*k.blocks)
	for i := range tab {
		tab[i] = int32(i)
	}
	k.tab = k.upload(i32Bytes(tab))
	seqIdx := make([]int32, maxSeqs)
	for i := range seqIdx {
		seqIdx[i] = int32(i)
	}
	k.seq = k.upload(i32Bytes(seqIdx))
	return k
}

func (k *kvDecodeBench) alloc(n int) cudadrv.DevicePtr {
	p, err := k.ctx.Alloc(n)
	if err != nil {
		k.b.Fatal(err)
	}
	k.b.Cleanup(func() { k.ctx.Free(p) })
	return p
}

func (k *kvDecodeBench) upload(raw []byte) cudadrv.DevicePtr {
	p := k.alloc(len(raw))
	if err := k.ctx.CopyHtoD(p, raw); err != nil {
		k.b.Fatal(err)
	}
	return p
}
