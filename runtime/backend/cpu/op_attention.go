package cpu

import (
	"fmt"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
)

// attention stores the batch's keys and values in the layer's cache, each
// token at its sequence's cell for its position, then attends: the tiled
// kernel reads every sequence's cells through its block table, all the
// batch's sequences in one call.
func (b *Backend) attention(op *ir.Op, bt *ir.Batch, n int) error {
	kv := b.kv[op.Layer]
	ab := &ops.AttnBatch{Pos: bt.Pos[:n], Seq: bt.Seq[:n], Tables: bt.Tables, Block: bt.Block}
	kw, vw := b.prog.Bufs[op.In2].Width, b.prog.Bufs[op.In3].Width
	var err error
	if kw == kv.Width && vw == kv.Width {
		err = kv.StoreBatch(b.pool, ab, b.bufs[op.In2][:n*kw], b.bufs[op.In3][:n*vw])
	} else {
		for t := 0; t < n && err == nil; t++ {
			err = kv.Store(ab.Cell(t), b.row(op.In2, t)[:kv.Width], b.row(op.In3, t)[:kv.Width])
		}
	}
	if err != nil {
		return fmt.Errorf("cpu: layer %d's KV cache: %w", op.Layer, err)
	}
	qw := b.prog.Bufs[op.In].Width
	if err := b.attns[op.Attn].Run(b.pool, kv, b.bufs[op.In][:n*qw], b.bufs[op.Out][:n*qw], ab); err != nil {
		return fmt.Errorf("cpu: layer %d's attention: %w", op.Layer, err)
	}
	return nil
}

// kvTypes are the CPU kernels' cache types, by the engine's.
var kvTypes = map[kvcache.Type]ops.KVType{kvcache.F16: ops.KVF16, kvcache.Q8_0: ops.KVQ8_0, kvcache.Q4_0: ops.KVQ4_0, kvcache.F32: ops.KVF32}

// newKVLayer makes the cache of an attention layer: every cell of the
// engine's cache (whole blocks), in its type.
func newKVLayer(kv kvcacheSpec, a *ir.Attention) (*ops.KVLayer, error) {
	t, ok := kvTypes[kv.Type]
	if !ok {
		return nil, fmt.Errorf("cpu: a %s KV cache is not supported by this build's attention", kv.Type)
	}
	rows := (kv.Rows + kvcache.DefaultBlock - 1) / kvcache.DefaultBlock * kvcache.DefaultBlock
	l, err := ops.NewKVLayer(rows, a.NKVHeads, a.HeadSize, t)
	if err != nil {
		return nil, fmt.Errorf("cpu: %w", err)
	}
	return l, nil
}

// opsAttention is a as the CPU's kernels take it.
func opsAttention(a *ir.Attention) *ops.Attention {
	return &ops.Attention{NHeads: a.NHeads, NKVHeads: a.NKVHeads, HeadSize: a.HeadSize, Scale: a.Scale}
}
