package cpu

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/atsinfer/ats/gguf"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// BenchmarkMoEDecode times one MoE op of Qwen3-30B-A3B's shape (128
// experts of 768×2048, top 8, gate and up Q4_K, down Q6_K, repacked as
// the model loader does) at decode, one token, for 1, 2 and all threads:
// the CPU part of a hybrid decode step, 48 of them per token; and a step
// of 4 sequences (tok4: 32 slots, some sharing an expert). The inputs
// cycle through 64 random rows, so that the routing changes from call to
// call; the experts' weights (about 350 MB) are a few distinct rows
// repeated, which speed does not depend on. The router's logits are about
// N(0, 1): larger ones make the weights of the last experts subnormal, whose
// products a CPU computes many times slower. ATS_CPU_OPS_PROFILE=1 logs
// the time of each part.
func BenchmarkMoEDecode(b *testing.B) {
	const experts, topK, emb = 128, 8, 2048
	program, inputs := moeBench(b, true)
	fileProgram, _ := moeBench(b, false)
	threads := []int{1}
	for _, t := range []int{2, ops.DefaultThreads()} {
		if t > threads[len(threads)-1] {
			threads = append(threads, t)
		}
	}
	// "hot" has only the 8 experts it uses (about 30 MB), which the caches
	// may hold: what is left is the op's fixed cost (dispatches, barriers,
	// serial parts) over cache bandwidth.
	// "file" is "cold" in the file's blocks, not repacked: a hybrid
	// context repacks only as many experts as host memory allows.
	for _, c := range []struct {
		name    string
		experts int
		file    bool
	}{{"cold", experts, false}, {"hot", topK, false}, {"file", experts, true}} {
		_, pw := program(c.experts)
		if c.file {
			_, pw = fileProgram(c.experts)
		}
		for _, threads := range threads {
			for _, tok := range []int{1, 4} {
				name := fmt.Sprintf("%s/t%d", c.name, threads)
				if tok > 1 {
					name += fmt.Sprintf("/tok%d", tok) // a decode step of tok sequences
				}
				b.Run(name, func(b *testing.B) {
					pool := ops.NewPool(threads)
					defer pool.Close()
					be := newTestBackend(b, pw, pool, tok)
					for i := 0; b.Loop(); i++ {
						for t := range tok {
							copy(be.Buf(0)[t*emb:(t+1)*emb], inputs[(i*tok+t)%64*emb:][:emb])
						}
						runAll(b, be, tok)
						be.CountBatch(tok)
					}
					if be.prof != nil {
						var parts strings.Builder
						be.notes = func(s string) { parts.WriteString(s) }
						be.report()
						b.Log("\n" + parts.String())
					}
				})
			}
		}
	}
}

// BenchmarkMoEPrefill times one MoE op of BenchmarkMoEDecode's shape over
// a prompt batch (64 and 512 tokens; each expert gets about n/16 of them),
// for 1, 2 and all threads: the batch path (moeGrouped) and the expert
// loop it replaced (moeLoop, after the same routing), and the batch path
// over stacks in the file's layout (not repacked); and the CPU's quarter
// of a split layer (MoEPartial), with the routing even or skewed, the
// weights hot or cold; and a whole layer with skewed routing.
func BenchmarkMoEPrefill(b *testing.B) {
	const emb = 2048
	packed, inputs := moeBench(b, true)
	orig, _ := moeBench(b, false)
	threads := []int{1}
	for _, t := range []int{2, ops.DefaultThreads()} {
		if t > threads[len(threads)-1] {
			threads = append(threads, t)
		}
	}
	for _, n := range []int{64, 512} {
		for _, threads := range threads {
			for _, path := range []string{"grouped", "loop", "grouped-orig", "quarter", "quarter-skewed", "all-skewed", "quarter-cold", "quarter-cold-idle"} {
				p, pw := packed(128)
				if path == "grouped-orig" {
					p, pw = orig(128) // the file's layout, as a hybrid context runs the stacks it did not repack
				}
				b.Run(fmt.Sprintf("n%d/t%d/%s", n, threads, path), func(b *testing.B) {
					pool := ops.NewPool(threads)
					defer pool.Close()
					be := newTestBackend(b, pw, pool, n)
					for t := range n {
						copy(be.Buf(0)[t*emb:], inputs[t%64*emb:][:emb])
					}
					runAll(b, be, n) // routes the batch
					// The quarter path is MoEPartial over the first 32
					// experts, as a prefill batch split with the GPU runs it.
					op := &p.Ops[0]
					ids, w := make([]int32, n*op.TopK), slices.Clone(be.moe.weight[:n*op.TopK])
					host := 0
					for i, e := range be.moe.choice[:n*op.TopK] {
						ids[i] = int32(e)
						if e < 32 {
							host++
						}
					}
					switch path {
					case "quarter-skewed":
						// The quarter's slots on Zipf-distributed experts: a
						// few take most of them, as trained routers often do.
						z := rand.NewZipf(rand.New(rand.NewPCG(5, 6)), 1.3, 1, 31)
						for i := range ids {
							if ids[i] < 32 {
								ids[i] = int32(z.Uint64())
							}
						}
					case "all-skewed":
						// Every slot so (a CPU prefill's whole layer).
						z := rand.NewZipf(rand.New(rand.NewPCG(5, 6)), 1.3, 1, 127)
						for i := range ids {
							ids[i] = int32(z.Uint64())
						}
					}
					x, out := slices.Clone(be.Buf(0)[:n*emb]), make([]float32, n*emb)
					// quarter-cold rotates over the quarters of five layers'
					// stacks (1.7 GB), as a prefill batch meets each layer's
					// experts once: their weights are not in the caches.
					var cold []*Backend
					if strings.HasPrefix(path, "quarter-cold") {
						for range 5 {
							more, _ := moeBench(b, true)
							_, mw := more(128)
							cold = append(cold, newTestBackend(b, mw, pool, n))
						}
					}
					for i := 0; b.Loop(); i++ {
						switch path {
						case "loop":
							be.moeLoop(op, n)
						case "quarter", "quarter-skewed":
							if err := be.MoEPartial(op, n, 0, 32, x, ids, w, out); err != nil {
								b.Fatal(err)
							}
						case "all-skewed":
							if err := be.MoEPartial(op, n, 0, 128, x, ids, w, out); err != nil {
								b.Fatal(err)
							}
						case "quarter-cold", "quarter-cold-idle":
							if path == "quarter-cold-idle" {
								// The CPU idles between layers' shares while
								// the GPU computes, as in a split prefill.
								b.StopTimer()
								time.Sleep(5 * time.Millisecond)
								b.StartTimer()
							}
							// The experts renumbered so the slots fall in the quarter.
							q := i % 4
							for j := range ids {
								ids[j] = (ids[j] + 32) % 128
							}
							cb := cold[i/4%len(cold)]
							if err := cb.MoEPartial(&cb.prog.Ops[0], n, 32*q, 32*q+32, x, ids, w, out); err != nil {
								b.Fatal(err)
							}
						default:
							runAll(b, be, n)
						}
					}
					if strings.HasPrefix(path, "quarter") {
						b.ReportMetric(float64(host)/float64(len(ids)), "slot-share")
					}
					b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
				})
			}
		}
	}
}

// moeBench makes BenchmarkMoEDecode's weights: program(ne) is the op over
// the first ne experts; inputs are 64 rows.
func moeBench(b *testing.B, repack bool) (program func(ne int) (*ir.Program, *Weights), inputs []float32) {
	const experts, topK, emb, ff = 128, 8, 2048, 768
	rng := rand.New(rand.NewPCG(1, 2))
	stack := func(typ gguf.Type, rows, cols, n int) *Mat {
		k, err := ops.KernelFor(typ)
		if err != nil {
			b.Fatal(err)
		}
		const distinct = 61 // a prime: the experts differ
		x := make([]float32, distinct*cols)
		for i := range x {
			x[i] = float32(rng.NormFloat64())
		}
		rb := k.RowBytes(cols)
		some := make([]byte, distinct*rb)
		if err := ops.Quantize(typ, some, x); err != nil {
			b.Fatal(err)
		}
		data := make([]byte, n*rows*rb)
		for r := 0; r < n*rows; r++ {
			copy(data[r*rb:(r+1)*rb], some[r%distinct*rb:])
		}
		m, err := ops.NewMatrix(k, n*rows, cols, data)
		if err != nil {
			b.Fatal(err)
		}
		if repack {
			m, _ = m.Repack()
		}
		return &Mat{Matrix: m, Stack: stackOf(m, n)}
	}
	router := make([]float32, experts*emb)
	for i := range router {
		router[i] = float32(rng.NormFloat64() / math.Sqrt(emb)) // logits about N(0, 1), as trained routers give
	}
	rm, err := ops.NewMatrix(mustKernel(b, gguf.TypeF32), experts, emb, f32Bytes(router))
	if err != nil {
		b.Fatal(err)
	}
	gate, up := stack(gguf.TypeQ4_K, ff, emb, experts), stack(gguf.TypeQ4_K, ff, emb, experts)
	down := stack(gguf.TypeQ6_K, emb, ff, experts)
	// program is the op over the first ne experts.
	program = func(ne int) (*ir.Program, *Weights) {
		mats := map[*ir.Weight]*Mat{}
		sub := func(typ gguf.Type, m *Mat) *ir.Weight {
			rows := m.Stack[0].Rows
			w, mat := testMat(ir.Weight{Type: typ}, m.Matrix.Slice(0, ne*rows), ne)
			mat.Stack = m.Stack[:ne]
			mats[w] = mat
			return w
		}
		router, rmat := testMat(ir.Weight{Type: gguf.TypeF32}, rm.Slice(0, ne), 0)
		mats[router] = rmat
		p := &ir.Program{Bufs: []ir.Buf{{Name: "in", Width: emb}, {Name: "out", Width: emb}}}
		p.Ops = []ir.Op{{
			Kind: ir.OpMoE, In: 0, Out: 1, TopK: topK, NormTopK: true,
			W:    router,
			Gate: sub(gguf.TypeQ4_K, gate), Up: sub(gguf.TypeQ4_K, up), Down: sub(gguf.TypeQ6_K, down),
		}}
		return p, testWeights(p, mats)
	}
	inputs = make([]float32, 64*emb)
	for i := range inputs {
		inputs[i] = float32(rng.NormFloat64())
	}
	return program, inputs
}

func mustKernel(b *testing.B, t gguf.Type) *ops.Kernel {
	k, err := ops.KernelFor(t)
	if err != nil {
		b.Fatal(err)
	}
	return k
}

func f32Bytes(x []float32) []byte {
	out := make([]byte, 4*len(x))
	if err := ops.Quantize(gguf.TypeF32, out, x); err != nil {
		panic(err)
	}
	return out
}
