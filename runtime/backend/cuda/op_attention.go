package cuda

// Attention over the paged KV cache: the cache write, decode rows of
// every sequence in one launch, prompt chunks through the prefill kernels.

import (
	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

func (g *Exec) attentionStep(op *ir.Op, store bool) step {
	a := op.Attn
	width := a.NKVHeads * a.HeadSize
	cache := kernels.KVCache{K: g.kvK[op.Layer], V: g.kvV[op.Layer], Type: g.kvType, Width: width}
	q, k, v, out := g.bufs[op.In], g.bufs[op.In2], g.bufs[op.In3], g.bufs[op.Out]
	qRow := 4 * a.NHeads * a.HeadSize // bytes of a query (and an output) row
	name := "attention"
	if store {
		name = "kv_store+attention"
	}
	// The output projection's Q8_1 input can come from the attention's
	// epilogue when a head is whole blocks of 32.
	var link *q8Link
	if a.HeadSize%32 == 0 {
		link = &q8Link{}
	}
	// A quantized cache holds its keys and values rotated (llama.cpp's
	// Walsh-Hadamard rotation, as the CPU's): the keys and the queries
	// alike, the values, and the outputs back. The rope launch before
	// rotates the first three when it writes the cache (!store); else this
	// step does. The decode kernel rotates its rows back as it writes
	// them; prompt chunks' rows take an FWHT launch after (the prefill
	// kernels write a row's heads from several blocks and warps).
	rotK, rotV := g.kvRotation(a)
	qw := a.NHeads * a.HeadSize
	if rotK > 0 && store {
		name = "rotate+" + name
	}
	return step{name: name, out: op.Out, link: link, run: func(s *cudadrv.Stream, n int) error {
		if rotK > 0 && store {
			for _, r := range []struct {
				x        cudadrv.DevicePtr
				w, chunk int
			}{{q, qw, rotK}, {k, width, rotK}, {v, width, rotV}} {
				if err := g.dev.elem.FWHT(s, r.x, n*r.w/r.chunk, r.chunk); err != nil {
					return err
				}
			}
		}
		if store {
			if err := g.dev.attn.StoreKV(s, &kernels.StoreKVArgs{Cache: cache, Batch: &g.kvb, K: k, V: v, NTok: n}); err != nil {
				return err
			}
		}
		plan := &g.plan
		planes := 0
		if link != nil {
			planes = g.q8Ready(link.group, n)
		}
		q8 := planes > 0
		// The epilogue writes the Q8_1 rows of its own launch: one launch
		// must cover the step (and a prompt chunk's outputs need no
		// rotation back; the decode kernel rotates its rows before their
		// Q8_1 write), else the rows are quantized afterwards.
		one := (plan.decode == n && len(plan.chunks) == 0) || (rotV == 0 && plan.decode == 0 && len(plan.chunks) == 1)
		if plan.decode > 0 {
			d := plan.decode
			args := kernels.DecodeKVArgs{Out: out, Q: q, Cache: cache, Batch: &g.kvb, NTok: d,
				NHeads: a.NHeads, NKV: a.NKVHeads, HeadSize: a.HeadSize, Scale: a.Scale, Rot: rotV, Short: plan.short}
			if splits, chunk := g.decodeSplits(d); splits > 1 {
				args.Splits, args.Chunk, args.Part, args.ML, args.Count = splits, chunk, g.attn.part, g.attn.ml, g.attn.count
			}
			if q8 && one {
				args.Q8, args.Q8Planes = g.act, planes
			}
			if err := g.dev.attn.DecodeKV(s, &args); err != nil {
				return err
			}
		}
		for _, c := range plan.chunks {
			args := kernels.AttnArgs{Out: out.Add(c.lo * qRow), Q: q.Add(c.lo * qRow), Pos0: g.kvb.Pos.Add(4 * c.lo),
				NTok: c.hi - c.lo, NHeads: a.NHeads, NKV: a.NKVHeads, HeadSize: a.HeadSize, Scale: a.Scale}
			if c.first >= 0 { // the sequence's cells in order: the cache itself
				args.K, args.V = cache.K.Add(c.first*2*width), cache.V.Add(c.first*2*width)
			} else {
				if err := g.dev.attn.GatherKV(s, &kernels.GatherKVArgs{Cache: cache, Batch: &g.kvb, Tok: c.hi - 1,
					MaxLen: g.cfg.KV.Rows, K: g.gatherK, V: g.gatherV}); err != nil {
					return err
				}
				args.K, args.V = g.gatherK, g.gatherV
			}
			if q8 && one {
				args.Q8, args.Q8Planes = g.act, planes
			}
			if err := g.dev.attn.Run(s, &args); err != nil {
				return err
			}
		}
		if rotV > 0 && len(plan.chunks) > 0 {
			// The chunks' rows, after the decode rows (setInput's plan).
			lo, hi := plan.chunks[0].lo, plan.chunks[len(plan.chunks)-1].hi
			if err := g.dev.elem.FWHT(s, out.Add(lo*qRow), (hi-lo)*qw/rotV, rotV); err != nil {
				return err
			}
		}
		if q8 && !one {
			return g.w.(preparedOps).Prepare(s, g.format(link.group, n), out, n, qw, g.act)
		}
		return nil
	}}
}

// kvRotation is the rotation of the cache's keys (and the queries) and
// values for attention a: the CPU's rule (ops.KVRotation), on the GPU's
// cache type.
func (g *Exec) kvRotation(a *ir.Attention) (k, v int) {
	switch g.kvType {
	case kernels.KVQ8_0:
		return ops.KVRotation(ops.KVQ8_0, a.HeadSize)
	case kernels.KVQ4_0:
		return ops.KVRotation(ops.KVQ4_0, a.HeadSize)
	}
	return 0, 0
}
