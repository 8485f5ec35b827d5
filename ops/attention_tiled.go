package ops

import (
	"fmt"
	"math"
	"slices"
	"sync"
	"sync/atomic"
)

// The tiled attention over a paged KV cache (flash attention with an
// online softmax).
//
// A unit of work is a tile of up to attnTileTokens(group) query tokens of
// one sequence times the heads of one KV group: its m query rows (token
// major, the group's heads within a token) share every key and value row
// the unit reads. The unit walks its sequence's cells in chunks of
// attnChunkKeys keys, each in tiles of attnTileKeys keys; for each tile
// it
//
//  1. converts the tile's key rows of its KV head to float32 (Kf, exact:
//     f16 and the dequantized blocks are floats),
//  2. computes the scores S^T[key][row] = Kf·Qt, Qt being the unit's
//     query rows transposed, prepared once (rounded to f16 with an f16
//     cache, quantized to Q8_0 and dequantized with a quantized one),
//  3. updates each row's online softmax (the running maximum M, the sum
//     L of exp(s-M)), masking the keys past the row's position, and
//     turns the scores into weights P^T = exp(s-M) (rounded to f16 with
//     an f16 cache, as llama.cpp rounds the weights to the cache's type),
//  4. rescales the output rows O by exp(Mold-M) and adds P·Vf, Vf the
//     tile's value rows converted like the keys.
//
// Every step keeps the query rows in vector lanes, so each is a
// register-blocked float32 product or a vertical vector operation; the
// key and value rows are read from memory once per unit, and a 512-token
// prompt chunk reads each row about 512·group/attnTileRows times per KV
// head instead of once per token and head.
//
// Each chunk's softmax starts afresh and the chunks' states (M, L, O)
// merge in order. When the batch has few units (decode of a few long
// sequences) the chunks run as separate jobs (split-K) and a second pass
// merges them; otherwise a unit's job runs them one after the other. The
// arithmetic of a row is the same either way, and the same whatever
// other rows share its unit, so a token's result depends on its query,
// its position and its sequence's keys and values only: not on the
// batch it comes in (a prompt evaluated whole or in pieces, a decode
// alone or beside others) nor on the threads.

// attnTileRows is about how many query rows (tokens × heads of a group) a
// unit takes: each key and value row it reads is used by that many rows.
// 256 rows keep the unit's working set (the transposed queries, scores,
// outputs and the converted key and value tiles, about 500 KiB at head
// size 128) in a core's L2 on current server cores (1-2 MiB); 128 rows
// took 10% more CPU time at depth 4096 on a Zen 5.
const attnTileRows = 256

// attnTileTokens is the query tile, in tokens, for a KV group of group
// heads.
func attnTileTokens(group int) int { return max(1, attnTileRows/group) }

// attnChunkKeys is the keys of a chunk, whose softmax starts afresh:
// small enough that one long decode splits over many threads, big
// enough that merging the chunks' outputs costs little.
const attnChunkKeys = 1024

// attnMinUnits is the number of units below which a unit's chunks run as
// jobs of their own: enough for the threads of a large machine to share,
// with some left to balance their ends.
const attnMinUnits = 64

// noMax is the running maximum before any key: finite, so that
// exp(noMax-M) is 0 (clamped) rather than exp(-inf+inf).
const noMax = -math.MaxFloat32

// attnRowsRead counts the K and V rows of one KV head that Run has read
// (a key and its value count two), for the tests that bound the
// attention's memory traffic.
var attnRowsRead atomic.Int64

// attnUnit is one query tile of one sequence run times one KV head.
type attnUnit struct {
	t0, t1 int   // the tile's tokens
	seq    int32 // its sequence
	kvh    int   // the KV head
	keys   int   // positions it reads: 0..keys-1 (its last position + 1)
	nchunk int
	part   int // index of its first partial; -1 when not split
}

// Run computes out[t] (NHeads*HeadSize floats) for every query token t of
// the batch from q[t], attending causally to positions 0..b.Pos[t] of the
// token's sequence through its block table. The batch's own keys and
// values must be stored already. Numerics by cache type:
//
//   - f16: the query rounded to f16 before Q·K and the weights rounded to
//     f16 before P·V, float32 sums, as llama.cpp's CPU path without flash
//     attention, except that the weights rounded are the online
//     softmax's exp(s-M) before the division by the sum rather than the
//     normalised ones;
//   - q8_0, q4_0: as llama.cpp's CPU flash attention with that cache: the
//     query quantized to Q8_0 per head; the products of the dequantized
//     query and keys are exact floats, summed in float32 (llama.cpp sums
//     each block's integer dot and then the blocks: the same terms, added
//     in another order); the online softmax in float32, the values
//     dequantized and accumulated in float32; the queries rotated as
//     the cache's keys were (kv.RotK) and the outputs rotated back
//     (kv.RotV), as llama.cpp's graph does around its attention;
//   - f32: float32 products and sums.
//
// Every row's arithmetic depends on its own query, position and keys
// only, and how the keys are split over jobs on the batch only, so the
// thread count never changes the result.
func (a *Attention) Run(p *Pool, kv *KVLayer, q, out []float32, b *AttnBatch) error {
	if err := a.checkCache(kv); err != nil {
		return err
	}
	if b == nil {
		return fmt.Errorf("attention: no batch")
	}
	if err := b.check(kv); err != nil {
		return err
	}
	n := len(b.Pos)
	qw := a.NHeads * a.HeadSize
	if len(q) < n*qw || len(out) < n*qw {
		return fmt.Errorf("attention: %d tokens of %d values, query buffer %d, output %d", n, qw, len(q), len(out))
	}
	if n == 0 {
		return nil
	}
	units, nparts, partRows := a.plan(b)
	jobs := make([]attnJob, 0, len(units))
	for i, u := range units {
		if u.part < 0 {
			jobs = append(jobs, attnJob{unit: i, chunk: -1, cost: u.keys * (u.t1 - u.t0)})
			continue
		}
		for c := range u.nchunk {
			jobs = append(jobs, attnJob{unit: i, chunk: c, cost: min(attnChunkKeys, u.keys-c*attnChunkKeys) * (u.t1 - u.t0)})
		}
	}
	// Longest first: the pool hands them out in order, so the short ones
	// fill in at the end.
	slices.SortStableFunc(jobs, func(x, y attnJob) int { return y.cost - x.cost })
	var parts *attnPartials
	if nparts > 0 {
		parts = attnPartialsPool.Get().(*attnPartials)
		defer attnPartialsPool.Put(parts)
		parts.grow(nparts, partRows, a.HeadSize)
	}
	p.RunChunks(len(jobs), 1, func(lo, hi int) {
		sc := attnTilePool.Get().(*attnTileScratch)
		defer attnTilePool.Put(sc)
		var reads int64
		for _, j := range jobs[lo:hi] {
			reads += a.runJob(kv, q, out, b, &units[j.unit], j.chunk, sc, parts)
		}
		attnRowsRead.Add(reads)
	})
	if nparts > 0 {
		var split []int
		for i := range units {
			if units[i].part >= 0 {
				split = append(split, i)
			}
		}
		p.Run(len(split), 1, func(lo, hi int) {
			for _, i := range split[lo:hi] {
				a.combine(kv, out, &units[i], parts)
			}
		})
	}
	return nil
}

// attnJob is a unit (chunk -1) or one chunk of a split unit.
type attnJob struct {
	unit, chunk int
	cost        int // keys × tokens, for the order
}

// plan splits the batch into units (query tiles of each run of a
// sequence's tokens, times KV heads) and, when there are few, has their
// chunks run as jobs of their own. It returns the units, the number of
// partials and the most query rows of a split unit.
func (a *Attention) plan(b *AttnBatch) (units []attnUnit, nparts, partRows int) {
	group := a.NHeads / a.NKVHeads
	tq := attnTileTokens(group)
	n := len(b.Pos)
	for t0 := 0; t0 < n; {
		t1 := t0 + 1
		for t1 < n && b.Seq[t1] == b.Seq[t0] && t1-t0 < tq {
			t1++
		}
		last := int32(0)
		for _, p := range b.Pos[t0:t1] {
			last = max(last, p)
		}
		for h := range a.NKVHeads {
			keys := int(last) + 1
			units = append(units, attnUnit{t0: t0, t1: t1, seq: b.Seq[t0], kvh: h, keys: keys,
				nchunk: (keys + attnChunkKeys - 1) / attnChunkKeys, part: -1})
		}
		t0 = t1
	}
	if len(units) >= attnMinUnits {
		return units, 0, 0
	}
	for i := range units {
		if u := &units[i]; u.nchunk > 1 {
			u.part = nparts
			nparts += u.nchunk
			partRows = max(partRows, (u.t1-u.t0)*group)
		}
	}
	return units, nparts, partRows
}

// roundF16 rounds x to f16 precision in place.
func roundF16(x []float32) {
	if scaleRoundF16Kernel != nil {
		scaleRoundF16Kernel(x, 1)
		return
	}
	for i, v := range x {
		x[i] = F16ToF32(F32ToF16(v))
	}
}

func roundUp(x, m int) int { return (x + m - 1) / m * m }

// attnRowsPad is the padded row count of a unit of m query rows: the
// lanes of the tile kernels (8 at the least, 16 past that).
func attnRowsPad(m int) int {
	if m <= 8 {
		return 8
	}
	return roundUp(m, 16)
}

// attnTileScratch is one job's working memory.
type attnTileScratch struct {
	qt, st, kf, vf []float32
	mx, l, ms      []float32
	lim            []int32
	q8             []byte
	qrow, qrot     []float32
	total, next    attnStateBuf
}

var attnTilePool = sync.Pool{New: func() any { return new(attnTileScratch) }}

func growF32(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n)
	}
	return (*b)[:n]
}

// attnPartials holds the split units' partial results: per partial, the
// running maximum and sum of each row and its output rows.
type attnPartials struct {
	rows, hs int
	m, l, o  []float32
}

var attnPartialsPool = sync.Pool{New: func() any { return new(attnPartials) }}

func (p *attnPartials) grow(n, rows, hs int) {
	p.rows, p.hs = rows, hs
	p.m = growF32(&p.m, n*rows)
	p.l = growF32(&p.l, n*rows)
	p.o = growF32(&p.o, n*rows*hs)
}

// attnState is the online softmax of a unit's rows over some keys: the
// running maximum and sum of each row and its (unnormalised) output.
type attnState struct {
	mx, l, o []float32
}

func (st *attnState) grow(b *attnStateBuf, m, hs int) {
	st.mx = growF32(&b.mx, m)
	st.l = growF32(&b.l, m)
	st.o = growF32(&b.o, m*hs)
}

type attnStateBuf struct{ mx, l, o []float32 }

// runJob runs a unit whole (chunk -1) into out, or one chunk of a split
// unit into its partial. It returns the K and V rows it read.
func (a *Attention) runJob(kv *KVLayer, q, out []float32, b *AttnBatch, u *attnUnit, chunk int, sc *attnTileScratch, parts *attnPartials) int64 {
	hs := a.HeadSize
	m := (u.t1 - u.t0) * (a.NHeads / a.NKVHeads)
	mp := a.prepQueries(kv, q, b, u, sc)
	if chunk >= 0 {
		var st attnState
		pi := u.part + chunk
		st.mx = parts.m[pi*parts.rows : pi*parts.rows+m]
		st.l = parts.l[pi*parts.rows : pi*parts.rows+m]
		st.o = parts.o[pi*parts.rows*hs : (pi*parts.rows+m)*hs]
		return a.runChunk(kv, b, u, chunk, m, mp, sc, st)
	}
	var total, next attnState
	total.grow(&sc.total, m, hs)
	next.grow(&sc.next, m, hs)
	var reads int64
	for c := range u.nchunk {
		if c == 0 {
			reads += a.runChunk(kv, b, u, c, m, mp, sc, total)
			continue
		}
		reads += a.runChunk(kv, b, u, c, m, mp, sc, next)
		mergeSoftmax(total, next, m, hs)
	}
	a.writeOut(kv, out, u, total)
	return reads
}

// prepQueries fills the scratch with the unit's query rows, transposed
// (Qt[d][row], row = token*group + head) and as the cache's type sees
// them, and their positions; padding rows mask every key. It returns the
// padded row count.
func (a *Attention) prepQueries(kv *KVLayer, q []float32, b *AttnBatch, u *attnUnit, sc *attnTileScratch) int {
	hs := a.HeadSize
	group := a.NHeads / a.NKVHeads
	qw := a.NHeads * hs
	m := (u.t1 - u.t0) * group
	mp := attnRowsPad(m)
	qt := growF32(&sc.qt, hs*mp)
	clear(qt)
	if cap(sc.lim) < mp {
		sc.lim = make([]int32, mp)
	}
	lim := sc.lim[:mp]
	qrow := growF32(&sc.qrow, hs)
	for r := range mp {
		if r >= m {
			lim[r] = -1
			continue
		}
		t := u.t0 + r/group
		h := u.kvh*group + r%group
		lim[r] = b.Pos[t]
		src := q[t*qw+h*hs : t*qw+h*hs+hs]
		if kv.RotK > 0 {
			// The keys were rotated before they were quantized.
			qr := growF32(&sc.qrot, hs)
			copy(qr, src)
			fwht(qr, kv.RotK)
			src = qr
		}
		switch kv.Type {
		case KVF16:
			copy(qrow, src)
			roundF16(qrow)
		case KVQ8_0, KVQ4_0:
			// llama.cpp's vec_dot_type of both: the query quantized per head.
			if cap(sc.q8) < hs/qk*blockQ8_0 {
				sc.q8 = make([]byte, hs/qk*blockQ8_0)
			}
			q8 := sc.q8[:hs/qk*blockQ8_0]
			kvQuantQ8_0(q8, src)
			dequantQ8_0(qrow, q8)
		default:
			copy(qrow, src)
		}
		for d, v := range qrow {
			qt[d*mp+r] = v
		}
	}
	return mp
}

// runChunk computes chunk c of unit u (its queries prepared) from a
// fresh softmax into st, and returns the K and V rows it read.
func (a *Attention) runChunk(kv *KVLayer, b *AttnBatch, u *attnUnit, c, m, mp int, sc *attnTileScratch, st attnState) int64 {
	hs := a.HeadSize
	k := attnKernelsActive
	k0 := c * attnChunkKeys
	k1 := min(u.keys, k0+attnChunkKeys)
	for i := range st.mx {
		st.mx[i], st.l[i] = noMax, 0
	}
	clear(st.o)
	qt, lim := sc.qt[:hs*mp], sc.lim[:mp]
	// The row state of the padding too: the softmax kernel runs over
	// every column.
	mx := growF32(&sc.mx, mp)
	l := growF32(&sc.l, mp)
	ms := growF32(&sc.ms, mp)
	for i := range mx {
		mx[i], l[i] = noMax, 0
	}
	st0 := growF32(&sc.st, attnTileKeys*mp)
	kf := growF32(&sc.kf, attnTileKeys*hs)
	vf := growF32(&sc.vf, attnTileKeys*hs)
	rb := kv.RowBytes()
	hb := kv.Type.RowBytes(hs) // a head's bytes within a row
	table := b.Tables[u.seq]
	for kt0 := k0; kt0 < k1; kt0 += attnTileKeys {
		kt := min(attnTileKeys, k1-kt0)
		cell := int(table[kt0/b.Block])*b.Block + kt0%b.Block
		off := cell*rb + u.kvh*hb
		if next := kt0 + attnTileKeys; next < k1 {
			// The next tile's rows, while this one computes.
			nc := int(table[next/b.Block])*b.Block + next%b.Block
			no := nc*rb + u.kvh*hb
			nk := min(attnTileKeys, k1-next)
			k.prefetch(kv.K[no:], rb, nk, hb)
			k.prefetch(kv.V[no:], rb, nk, hb)
		}
		s := st0[:kt*mp]
		clear(s)
		k.load(kv.Type, kf, kv.K[off:], rb, kt, hs)
		k.gemm(kt, mp, hs, kf, hs, 1, qt, mp, s, mp, nil)
		k.softmax(s, kt, mp, mp, lim, int32(kt0), a.Scale, mx, l, ms, kv.Type == KVF16)
		k.load(kv.Type, vf, kv.V[off:], rb, kt, hs)
		k.gemm(m, hs, kt, s, 1, mp, vf, hs, st.o, hs, ms[:m])
	}
	copy(st.mx, mx[:m])
	copy(st.l, l[:m])
	return 2 * int64(k1-k0)
}

// mergeSoftmax folds the state of later keys (b) into a, row by row.
func mergeSoftmax(a, b attnState, m, hs int) {
	for r := range m {
		mn := max(a.mx[r], b.mx[r])
		fa, fb := expApprox(a.mx[r]-mn), expApprox(b.mx[r]-mn)
		a.mx[r] = mn
		a.l[r] = a.l[r]*fa + b.l[r]*fb
		x, y := a.o[r*hs:(r+1)*hs], b.o[r*hs:(r+1)*hs]
		y = y[:len(x)]
		for j, v := range y {
			x[j] = x[j]*fa + v*fb
		}
	}
}

// writeOut normalises a unit's output rows into out, rotated back when
// the cache's values were rotated.
func (a *Attention) writeOut(kv *KVLayer, out []float32, u *attnUnit, st attnState) {
	hs := a.HeadSize
	group := a.NHeads / a.NKVHeads
	qw := a.NHeads * hs
	for r := range st.l {
		t := u.t0 + r/group
		h := u.kvh*group + r%group
		dst := out[t*qw+h*hs : t*qw+h*hs+hs]
		inv := float32(0)
		if st.l[r] > 0 {
			inv = 1 / st.l[r]
		}
		for d, v := range st.o[r*hs : r*hs+hs] {
			dst[d] = v * inv
		}
		if kv.RotV > 0 {
			fwht(dst, kv.RotV) // the values' rotation, undone
		}
	}
}

// combine merges the partials of a split unit, in chunk order, into its
// output rows: the arithmetic of runJob's loop over the chunks.
func (a *Attention) combine(kv *KVLayer, out []float32, u *attnUnit, parts *attnPartials) {
	hs := a.HeadSize
	m := (u.t1 - u.t0) * (a.NHeads / a.NKVHeads)
	state := func(c int) attnState {
		pi := u.part + c
		return attnState{
			mx: parts.m[pi*parts.rows : pi*parts.rows+m],
			l:  parts.l[pi*parts.rows : pi*parts.rows+m],
			o:  parts.o[pi*parts.rows*hs : (pi*parts.rows+m)*hs],
		}
	}
	total := state(0)
	for c := 1; c < u.nchunk; c++ {
		mergeSoftmax(total, state(c), m, hs)
	}
	a.writeOut(kv, out, u, total)
}
