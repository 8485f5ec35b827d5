package cpu

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/internal/testenv"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/google/go-cmp/cmp"
)

// openTinyMoE opens the MoE oracle model (closed with the test), or
// skips the test without it.
func openTinyMoE(t *testing.T) (*gguf.File, ir.Hyper) {
	t.Helper()
	path := filepath.Join(testenv.SharedDir(t), "testdata", "oracle", "tiny-qwen3moe-q4_k_m.gguf")
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	f, err := gguf.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	h, err := ir.ReadHyper(f)
	if err != nil {
		t.Fatal(err)
	}
	return f, h
}

// moeProgram is a program of one op: layer's MoE FFN of f, top topK,
// from buffer in to out.
func moeProgram(t *testing.T, f *gguf.File, h ir.Hyper, layer, topK int) (p *ir.Program, in, out ir.BufID) {
	t.Helper()
	b := ir.NewBuilder(f, h)
	in, out = b.Buf("in", h.NEmbd), b.Buf("out", h.NEmbd)
	b.MoE(in,
		b.Weight(ir.Blk(layer, "ffn_gate_inp.weight"), h.NEmbd, h.NExpert),
		b.Weight(ir.Blk(layer, "ffn_gate_exps.weight"), h.NEmbd, h.NFFExpert, h.NExpert),
		b.Weight(ir.Blk(layer, "ffn_up_exps.weight"), h.NEmbd, h.NFFExpert, h.NExpert),
		b.Weight(ir.Blk(layer, "ffn_down_exps.weight"), h.NFFExpert, h.NEmbd, h.NExpert),
		topK, true, out)
	p, err := b.Finish(out)
	if err != nil {
		t.Fatal(err)
	}
	return p, in, out
}

// TestMoESlotsMatchExpertLoop checks that the few-token MoE path (one
// dispatch for every slot's gate and up, one for the downs) computes what
// the per-expert loop does, bit for bit, with top-k from 1 to all experts.
func TestMoESlotsMatchExpertLoop(t *testing.T) {
	f, h := openTinyMoE(t)
	pool := ops.NewPool(3)
	defer pool.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	for _, topK := range []int{1, 2, 5, h.NExpert} {
		for _, n := range []int{1, 3, 4} { // with top-k of all experts, every expert is shared
			p, in, out := moeProgram(t, f, h, 1, topK)
			if n*topK > maxMoESlots {
				continue
			}
			be := newTestBackend(t, fileWeights(t, p), pool, 4)
			x := be.Buf(in)
			for i := range x {
				x[i] = float32(rng.NormFloat64())
			}
			runAll(t, be, n) // n*topK slots: moeSlots
			slots := slices.Clone(be.Buf(out)[:n*h.NEmbd])
			// The expert loop, forced: route and run as when slots overflow.
			op := &p.Ops[0]
			be.moeLoop(op, n)
			loop := be.Buf(out)[:n*h.NEmbd]
			if !slices.Equal(slots, loop) {
				t.Errorf("top-%d of %d, %d tokens: the slot path differs from the expert loop", topK, h.NExpert, n)
			}
		}
	}
}

// Route's selection chooses what a stable sort by decreasing probability
// does, ties to the lower id, with the same weights.
func TestRouteMatchesStableSort(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for trial := range 500 {
		ne := 1 + rng.IntN(160)
		k := 1 + rng.IntN(ne)
		logits := make([]float32, ne)
		for i := range logits {
			logits[i] = float32(rng.IntN(7)) / 2 // few values: many ties
			if trial%2 == 1 {
				logits[i] = float32(rng.NormFloat64())
			}
		}
		for _, norm := range []bool{false, true} {
			p := slices.Clone(logits)
			choice, weight := make([]int, k), make([]float32, k)
			Route(p, k, norm, choice, weight, make([]int, ne))

			q := slices.Clone(logits)
			ops.Softmax(q)
			idx := make([]int, ne)
			for i := range idx {
				idx[i] = i
			}
			sort.SliceStable(idx, func(a, b int) bool { return q[idx[a]] > q[idx[b]] })
			var sum float32
			for j := 0; j < k; j++ {
				sum += q[idx[j]]
			}
			for j := 0; j < k; j++ {
				w := q[idx[j]]
				if norm {
					w /= sum
				}
				if choice[j] != idx[j] || weight[j] != w {
					t.Fatalf("trial %d (%d experts, top %d, norm %v): slot %d chose %d (%g), the sort %d (%g)", trial, ne, k, norm, j, choice[j], weight[j], idx[j], w)
				}
			}
		}
	}
}

// TestMoESlotsOddShapes checks the few-token MoE path (moeSlots) and the
// batch path (moeGrouped) against the expert loop on made-up weights:
// repacked and plain K-quants, legacy and float types, gate and up of
// different types, and row counts that are not whole groups of
// ops.RowGroup (so that chunk edges fall everywhere); batches from one
// token to more than the experts have rows, with experts that no token
// chose.
func TestMoESlotsOddShapes(t *testing.T) {
	type shape struct {
		gate, up, down gguf.Type
		emb, ff        int
		experts, topK  int
		repack         bool
	}
	shapes := []shape{
		{gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ6_K, 512, 256, 16, 8, true},
		{gguf.TypeQ4_K, gguf.TypeQ4_K, gguf.TypeQ6_K, 512, 256, 16, 8, false},
		{gguf.TypeQ4_K, gguf.TypeQ5_K, gguf.TypeQ4_K, 256, 512, 6, 4, true},
		{gguf.TypeQ8_0, gguf.TypeQ4_0, gguf.TypeQ8_0, 96, 160, 7, 2, false},
		{gguf.TypeF16, gguf.TypeF16, gguf.TypeF16, 40, 24, 5, 3, false},
		{gguf.TypeF32, gguf.TypeF32, gguf.TypeF32, 20, 36, 9, 9, false},
	}
	rng := rand.New(rand.NewPCG(7, 8))
	// matrix makes rows×cols random weights of type typ, each of the
	// experts' rows a matrix of its own.
	mats := map[*ir.Weight]*Mat{}
	matrix := func(typ gguf.Type, rows, cols, experts int, repack bool) *ir.Weight {
		k, err := ops.KernelFor(typ)
		if err != nil {
			t.Fatal(err)
		}
		x := make([]float32, experts*rows*cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		data := make([]byte, experts*rows*k.RowBytes(cols))
		if err := ops.Quantize(typ, data, x); err != nil {
			t.Fatal(err)
		}
		m, err := ops.NewMatrix(k, experts*rows, cols, data)
		if err != nil {
			t.Fatal(err)
		}
		if repack {
			m, _ = m.Repack()
		}
		ne := experts
		if ne == 1 {
			ne = 0 // the router: a plain matrix
		}
		w, mat := testMat(ir.Weight{Type: typ}, m, ne)
		mats[w] = mat
		return w
	}
	for _, sh := range shapes {
		p := &ir.Program{Bufs: []ir.Buf{{Name: "in", Width: sh.emb}, {Name: "out", Width: sh.emb}}}
		p.Ops = []ir.Op{{
			Kind: ir.OpMoE, In: 0, Out: 1, TopK: sh.topK, NormTopK: true,
			W:    matrix(gguf.TypeF32, sh.experts, sh.emb, 1, false),
			Gate: matrix(sh.gate, sh.ff, sh.emb, sh.experts, sh.repack),
			Up:   matrix(sh.up, sh.ff, sh.emb, sh.experts, sh.repack),
			Down: matrix(sh.down, sh.emb, sh.ff, sh.experts, sh.repack),
		}}
		for _, threads := range []int{1, 3} {
			pool := ops.NewPool(threads)
			be := newTestBackend(t, testWeights(p, mats), pool, 70)
			for _, n := range []int{1, 2, 3, 4, 5, 9, 17, 70} {
				x := be.Buf(0)
				for i := range x {
					x[i] = float32(rng.NormFloat64())
				}
				runAll(t, be, n)
				slots := slices.Clone(be.Buf(1)[:n*sh.emb])
				be.moeLoop(&p.Ops[0], n)
				if loop := be.Buf(1)[:n*sh.emb]; !slices.Equal(slots, loop) {
					t.Errorf("%v/%v/%v experts %d×%d (repacked %v), top %d of %d, %d threads, %d tokens (%d slots): the %s path differs from the expert loop",
						sh.gate, sh.up, sh.down, sh.ff, sh.emb, sh.repack, sh.topK, sh.experts, threads, n, n*sh.topK, map[bool]string{true: "slot", false: "grouped"}[n*sh.topK <= maxMoESlots])
				}
			}
			pool.Close()
		}
	}
}

// topK's one pass chooses what the selection does, on any values but NaN
// (infinities, signed zeros, many ties), and declines when there is a NaN.
func TestTopKMatchesSelection(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	specials := []float32{float32(math.Inf(1)), float32(math.Inf(-1)), 0, float32(math.Copysign(0, -1)), float32(math.NaN())}
	for trial := range 2000 {
		ne := 1 + rng.IntN(160)
		k := 1 + rng.IntN(ne)
		p := make([]float32, ne)
		nan := false
		for i := range p {
			p[i] = float32(rng.IntN(5))
			if trial%2 == 1 {
				p[i] = float32(rng.NormFloat64())
			}
			if rng.IntN(20) == 0 {
				p[i] = specials[rng.IntN(len(specials))]
			}
			nan = nan || p[i] != p[i]
		}
		choice, weight := make([]int, k), make([]float32, k)
		ok := topK(p, k, choice, weight)
		if ok == nan {
			t.Fatalf("trial %d: topK says %v with NaN %v", trial, ok, nan)
		}
		if !ok {
			continue
		}
		wantC, wantW := make([]int, k), make([]float32, k)
		selectTopK(p, k, wantC, wantW, make([]int, ne))
		for j := range k {
			if choice[j] != wantC[j] || math.Float32bits(weight[j]) != math.Float32bits(wantW[j]) {
				t.Fatalf("trial %d (%d values, top %d): slot %d is %d (%g), the selection's %d (%g)", trial, ne, k, j, choice[j], weight[j], wantC[j], wantW[j])
			}
		}
	}
}

// TestMoEPartialSplitsTheLayer checks the CPU's share of a split MoE
// layer (MoEPartial): over every expert it is the layer's own path bit for
// bit (moeSlots for a few tokens, the grouped path for more), and the shares of [0, ks) and [ks, ne) add up to the whole layer
// (to rounding), for batches small and large and splits at both ends.
func TestMoEPartialSplitsTheLayer(t *testing.T) {
	f, h := openTinyMoE(t)
	pool := ops.NewPool(3)
	defer pool.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	p, in, out := moeProgram(t, f, h, 0, h.NExpertUsed)
	const batch = 40
	be := newTestBackend(t, fileWeights(t, p), pool, batch)
	op, k, emb, ne := &p.Ops[0], h.NExpertUsed, h.NEmbd, h.NExpert
	for _, n := range []int{1, 3, batch} {
		x := be.Buf(in)[:n*emb]
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		runAll(t, be, n)
		whole := slices.Clone(be.Buf(out)[:n*emb])
		ids := make([]int32, n*k)
		for i, e := range be.moe.choice[:n*k] {
			ids[i] = int32(e)
		}
		weights := slices.Clone(be.moe.weight[:n*k])
		xs := slices.Clone(x)
		all := make([]float32, n*emb)
		if err := be.MoEPartial(op, n, 0, ne, xs, ids, weights, all); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(all, whole) {
			t.Errorf("%d tokens: MoEPartial over every expert differs from the layer's own path", n)
		}
		for _, ks := range []int{0, 1, ne / 3, ne - 1, ne} {
			lo, hi := make([]float32, n*emb), make([]float32, n*emb)
			for i := range lo {
				lo[i], hi[i] = float32(math.NaN()), float32(math.NaN()) // every row must be written
			}
			if err := be.MoEPartial(op, n, 0, ks, xs, ids, weights, lo); err != nil {
				t.Fatal(err)
			}
			if err := be.MoEPartial(op, n, ks, ne, xs, ids, weights, hi); err != nil {
				t.Fatal(err)
			}
			var num, den float64
			for i := range whole {
				d := float64(lo[i]+hi[i]) - float64(whole[i])
				num += d * d
				den += float64(whole[i]) * float64(whole[i])
			}
			if e := num / den; !(e < 1e-10) {
				t.Errorf("%d tokens, split at %d of %d: the two shares add up to the layer with error %.3g", n, ks, ne, e)
			}
		}
	}
	if err := be.MoEPartial(op, 2, 0, ne+1, make([]float32, 2*emb), make([]int32, 2*k), make([]float32, 2*k), make([]float32, 2*emb)); err == nil {
		t.Error("an expert range past the stack was taken")
	}
	bad := make([]int32, 2*k)
	bad[1] = int32(ne)
	if err := be.MoEPartial(op, 2, 0, ne, make([]float32, 2*emb), bad, make([]float32, 2*k), make([]float32, 2*emb)); err == nil {
		t.Error("a slot routed past the stack was taken")
	}
}

// TestExpertCostsCoverEachUnitOnce: however the costs are cut into chunks,
// the chunks' units [unit(lo), unit(hi)) cover every unit once, in order,
// and a chunk's units cost about what the chunk spans (the guided chunks
// balance the work, not the unit count); experts no token chose, first,
// last or between, cost nothing.
func TestExpertCostsCoverEachUnitOnce(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := range 200 {
		ne, per := 1+rng.IntN(12), 1+rng.IntN(9)
		start := make([]int, ne+1)
		for e := range ne {
			rows := 0
			if rng.IntN(3) > 0 {
				rows = rng.IntN(40)
				if rng.IntN(6) == 0 {
					rows = 300 + rng.IntN(200) // a hot expert
				}
			}
			start[e+1] = start[e] + rows
		}
		c := expertCosts{per: per, cum: make([]int, ne+1)}
		c.weigh(start)
		costOf := func(u int) int {
			rows := start[u/per+1] - start[u/per]
			if rows == 0 {
				return 0
			}
			return rows + unitOverhead
		}
		want := 0
		for u := range ne * per {
			want += costOf(u)
		}
		if c.total() > 0 && c.mean() < unitOverhead {
			t.Fatalf("trial %d: mean unit cost %d below the overhead", trial, c.mean())
		}
		if c.total() != want {
			t.Fatalf("trial %d: total %d, want %d", trial, c.total(), want)
		}
		seen := make([]int, ne*per)
		for x := 0; x < c.total(); {
			y := min(c.total(), x+1+rng.IntN(3*per*(unitOverhead+40)))
			lo, hi := c.unit(x), c.unit(y)
			if lo > hi {
				t.Fatalf("trial %d: chunk [%d, %d) gives units [%d, %d)", trial, x, y, lo, hi)
			}
			spent := 0
			for u := lo; u < hi; u++ {
				seen[u]++
				spent += costOf(u)
			}
			// A chunk's units cost what it spans, give or take a unit at each end.
			if slack := 2 * (500 + unitOverhead); spent > y-x+slack || spent < y-x-slack {
				t.Fatalf("trial %d: chunk [%d, %d) of cost %d took units of cost %d", trial, x, y, y-x, spent)
			}
			x = y
		}
		if c.unit(0) != 0 && costOf(0) != 0 {
			t.Fatalf("trial %d: unit(0) = %d", trial, c.unit(0))
		}
		for u, n := range seen {
			if n > 1 || (n == 0 && costOf(u) > 0) {
				t.Fatalf("trial %d: unit %d (expert %d, cost %d) taken %d times", trial, u, u/per, costOf(u), n)
			}
		}
	}
}

// TestMoEPartialSkewedRouting: with most slots on two experts (the
// chunks are then cut by cost, not by unit count), every thread count
// computes the same rows bit for bit, and each row is its slots' sum.
func TestMoEPartialSkewedRouting(t *testing.T) {
	f, h := openTinyMoE(t)
	p, _, _ := moeProgram(t, f, h, 0, h.NExpertUsed)
	op, k, emb, ne := &p.Ops[0], h.NExpertUsed, h.NEmbd, h.NExpert
	const n = 48
	x, ids, w := skewedBatch(rand.New(rand.NewPCG(9, 10)), n, emb, k, ne, func(rng *rand.Rand, i int) int {
		if rng.IntN(4) > 0 {
			return i % k % 2 // three slots in four on experts 0 and 1
		}
		return -1
	})
	var first []float32
	for _, threads := range []int{1, 3, 8} {
		pool := ops.NewPool(threads)
		be := newTestBackend(t, fileWeights(t, p), pool, n)
		out := make([]float32, n*emb)
		for i := range out {
			out[i] = float32(math.NaN())
		}
		if err := be.MoEPartial(op, n, 0, ne, x, ids, w, out); err != nil {
			t.Fatal(err)
		}
		pool.Close()
		if first == nil {
			first = out
			for i, v := range out {
				if math.IsNaN(float64(v)) {
					t.Fatalf("row %d not written", i/emb)
				}
			}
			continue
		}
		if !slices.Equal(out, first) {
			t.Errorf("%d threads differ from one", threads)
		}
	}
}

// TestMoEPartialSegmentsHotExperts: an expert with several segments'
// worth of tokens (moeSegRows each) gives every token what it gets
// computed alone, bit for bit, at any thread count.
func TestMoEPartialSegmentsHotExperts(t *testing.T) {
	f, h := openTinyMoE(t)
	p, _, _ := moeProgram(t, f, h, 0, h.NExpertUsed)
	op, k, emb, ne := &p.Ops[0], h.NExpertUsed, h.NEmbd, h.NExpert
	n := 3*moeSegRows + 17 // expert 0 takes every token: four segments
	x, ids, w := skewedBatch(rand.New(rand.NewPCG(15, 16)), n, emb, k, ne, func(rng *rand.Rand, i int) int {
		switch {
		case i%k == 0:
			return 0
		case i%k == 1 && rng.IntN(3) > 0:
			return 1 // two tokens in three: three segments
		}
		return -1
	})
	pool := ops.NewPool(1)
	be := newTestBackend(t, fileWeights(t, p), pool, n)
	alone := make([]float32, n*emb)
	for tok := range n {
		if err := be.MoEPartial(op, 1, 0, ne, x[tok*emb:(tok+1)*emb], ids[tok*k:(tok+1)*k], w[tok*k:(tok+1)*k], alone[tok*emb:(tok+1)*emb]); err != nil {
			t.Fatal(err)
		}
	}
	pool.Close()
	for _, threads := range []int{1, 4} {
		pool := ops.NewPool(threads)
		be := newTestBackend(t, fileWeights(t, p), pool, n)
		out := make([]float32, n*emb)
		if err := be.MoEPartial(op, n, 0, ne, x, ids, w, out); err != nil {
			t.Fatal(err)
		}
		pool.Close()
		for tok := range n {
			if !slices.Equal(out[tok*emb:(tok+1)*emb], alone[tok*emb:(tok+1)*emb]) {
				t.Fatalf("%d threads: token %d of %d differs from the token computed alone", threads, tok, n)
			}
		}
	}
}

// skewedBatch is the input of n tokens ([n][emb], N(0, 1)) and a routing
// of k slots each over ne experts with random weights: slot i's expert is
// hot(rng, i), or a random one where that is negative.
func skewedBatch(rng *rand.Rand, n, emb, k, ne int, hot func(rng *rand.Rand, i int) int) (x []float32, ids []int32, w []float32) {
	x = make([]float32, n*emb)
	for i := range x {
		x[i] = float32(rng.NormFloat64())
	}
	ids, w = make([]int32, n*k), make([]float32, n*k)
	for i := range ids {
		ids[i] = int32(rng.IntN(ne))
		if e := hot(rng, i); e >= 0 {
			ids[i] = int32(e)
		}
		w[i] = rng.Float32()
	}
	return x, ids, w
}

// TestGroupSlots checks how moeSlots groups the slots that share an
// expert: groups in the order of their first slot, rows consecutive within
// a group, in slot order.
func TestGroupSlots(t *testing.T) {
	choice := []int{3, 5, 5, 2, 3, 5} // three tokens' top 2
	sel := []int{0, 1, 2, 3, 4, 5}
	rows := make([]int, len(sel))
	groups := groupSlots(choice, sel, nil, rows)
	want := []slotGroup{{expert: 3, row: 0, n: 2, first: 0}, {expert: 5, row: 2, n: 3, first: 1}, {expert: 2, row: 5, n: 1, first: 3}}
	if diff := cmp.Diff(want, groups, cmp.AllowUnexported(slotGroup{})); diff != "" {
		t.Errorf("groups (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 2, 3, 5, 1, 4}, rows); diff != "" {
		t.Errorf("rows (-want +got):\n%s", diff)
	}
	// A range's slots: experts 2 and 3 only (sel skips the others).
	sel = []int{0, 3, 4}
	rows = rows[:len(sel)]
	groups = groupSlots(choice, sel, nil, rows)
	want = []slotGroup{{expert: 3, row: 0, n: 2, first: 0}, {expert: 2, row: 2, n: 1, first: 1}}
	if diff := cmp.Diff(want, groups, cmp.AllowUnexported(slotGroup{})); diff != "" {
		t.Errorf("groups of a range (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int{0, 2, 1}, rows); diff != "" {
		t.Errorf("rows of a range (-want +got):\n%s", diff)
	}
}
