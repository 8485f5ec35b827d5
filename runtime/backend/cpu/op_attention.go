package cpu

import (
	"fmt"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
)

// attention stores the batch's keys and values in the layer's cache, each
// token at its sequence's cell for its position, then attends: each run
// of one sequence's tokens over that sequence's cells.
func (b *Backend) attention(op *ir.Op, bt *ir.Batch, n int) error {
	kv := b.kv[op.Layer]
	for t := 0; t < n; t++ {
		kv.Store(bt.Cell(t), b.row(op.In2, t), b.row(op.In3, t))
	}
	a := b.attns[op.Attn]
	qw := b.prog.Bufs[op.In].Width
	var err error
	bt.Runs(func(seq, lo, hi int) {
		if err != nil {
			return
		}
		q, out := b.bufs[op.In][lo*qw:hi*qw], b.bufs[op.Out][lo*qw:hi*qw]
		pos0 := int(bt.Pos[lo])
		cache := kv
		if !contiguous(bt.Tables[seq], pos0+hi-lo, bt.Block) {
			// The kernel reads positions 0..p as rows 0..p: gather the
			// sequence's rows when its blocks are not in order.
			if cache, err = b.gather(kv, bt.Tables[seq], pos0+hi-lo, bt.Block); err != nil {
				return
			}
		}
		a.Run(b.pool, cache, q, out, hi-lo, pos0)
	})
	return err
}

// contiguous says whether the first n positions of a table lie in rows
// 0..n-1.
func contiguous(table []int32, n, block int) bool {
	for k := 0; k*block < n; k++ {
		if int(table[k]) != k {
			return false
		}
	}
	return true
}

// gather copies the first n positions of a sequence into the backend's
// gather cache, in order.
func (b *Backend) gather(kv *ops.KVLayer, table []int32, n, block int) (*ops.KVLayer, error) {
	g := b.gathered
	if g == nil || g.Ctx < n || g.Width != kv.Width || g.F16 != kv.F16 {
		g = ops.NewKVLayer(kv.Ctx, kv.Width, kv.F16)
		b.gathered = g
	}
	w := kv.Width
	for p := 0; p < n; p += block {
		src, dst := int(table[p/block])*block*w, p*w
		m := min(block, n-p) * w
		if kv.F16 {
			copy(g.K16[dst:dst+m], kv.K16[src:src+m])
			copy(g.V16[dst:dst+m], kv.V16[src:src+m])
		} else {
			copy(g.K32[dst:dst+m], kv.K32[src:src+m])
			copy(g.V32[dst:dst+m], kv.V32[src:src+m])
		}
	}
	return g, nil
}

// newKVLayer makes the cache of a layer of width values a row.
func newKVLayer(kv kvcacheSpec, width int) (*ops.KVLayer, error) {
	switch kv.Type {
	case kvcache.F16:
		return ops.NewKVLayer(kv.Rows, width, true), nil
	case kvcache.F32:
		return ops.NewKVLayer(kv.Rows, width, false), nil
	}
	return nil, fmt.Errorf("cpu: a %s KV cache is not supported by this build's attention", kv.Type)
}

// opsAttention is a as the CPU's kernels take it.
func opsAttention(a *ir.Attention) *ops.Attention {
	return &ops.Attention{NHeads: a.NHeads, NKVHeads: a.NKVHeads, HeadSize: a.HeadSize, Scale: a.Scale}
}
