// Package cpu is the CPU backend of the executor: it runs a program's ops
// over activation buffers in host memory on the worker pool, and keeps the
// KV cache of the layers whose attention it runs. It knows nothing of the
// GPU or of placement: the executor (runtime/exec.go) hands it ranges of
// ops and moves activations in and out of its buffers.
package cpu

import (
	"fmt"
	"time"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/ir"
)

// Options size a Backend.
type Options struct {
	Batch   int        // most rows of a buffer (tokens computed together)
	CtxSize int        // tokens a KV cache holds
	KVType  ops.KVType // the KV cache's cell type (zero: f16)
	// LogitRows is the rows of the logits buffer (at most Batch): a
	// batch whose every logit is wanted must not be longer.
	LogitRows int
	// Runs says which ops may run here (nil: all). Buffers, scratch and
	// KV caches are made only for those.
	Runs func(op int) bool
	// Alloc, when set, provides the memory of a buffer of n floats (the
	// executor hands out mapped pinned memory for buffers that cross to
	// the GPU); nil allocates Go memory.
	Alloc func(id ir.BufID, n int) ([]float32, error)
}

// Backend runs ops on the CPU. It is not safe for concurrent use.
type Backend struct {
	prog    *ir.Program
	pool    *ops.Pool
	kv      []*ops.KVLayer // by layer: nil where attention runs elsewhere
	batch   ops.AttnBatch  // the current batch: one sequence, cells in position order
	bufs    [][]float32    // by BufID: Batch rows of the buffer's width, nil if unused here
	scratch []byte         // quantized activations
	moe     moeScratch
	rope    ropeCache  // rotation table of the current batch
	prof    *opProfile // ATS_CPU_OPS_PROFILE; nil when off
}

// New sizes the buffers, scratch and KV caches of the ops that may run on
// the CPU.
func New(p *ir.Program, pool *ops.Pool, opt Options) (*Backend, error) {
	b := &Backend{prog: p, pool: pool, kv: make([]*ops.KVLayer, p.Hyper.NLayer), bufs: make([][]float32, len(p.Bufs)), prof: newOpProfile()}
	// The cache is whole blocks of kvBlock cells; the one sequence's table
	// is the identity.
	rows := (max(opt.CtxSize, 1) + kvBlock - 1) / kvBlock * kvBlock
	b.batch.Block = kvBlock
	b.batch.Tables = [][]int32{make([]int32, rows/kvBlock)}
	for i := range b.batch.Tables[0] {
		b.batch.Tables[0][i] = int32(i)
	}
	runs := opt.Runs
	if runs == nil {
		runs = func(int) bool { return true }
	}
	used := make([]bool, len(p.Bufs))
	scratch := 0
	for i := range p.Ops {
		if !runs(i) {
			continue
		}
		op := &p.Ops[i]
		for _, id := range op.Buffers() {
			used[id] = true
		}
		switch op.Kind {
		case ir.OpAttention:
			if b.kv[op.Layer] == nil {
				kv, err := ops.NewKVLayer(rows, op.Attn.NKVHeads, op.Attn.HeadSize, opt.KVType)
				if err != nil {
					return nil, fmt.Errorf("cpu: KV cache of layer %d: %w", op.Layer, err)
				}
				b.kv[op.Layer] = kv
			}
		case ir.OpMatMul:
			scratch = max(scratch, op.W.Mat.ActBytes(opt.Batch))
		case ir.OpMoE:
			scratch = max(scratch, op.W.Mat.ActBytes(opt.Batch), op.Gate.Stack[0].ActBytes(opt.Batch), op.Down.Stack[0].ActBytes(opt.Batch))
			b.moe.grow(opt.Batch, op)
		}
	}
	b.scratch = make([]byte, scratch)
	for id, buf := range p.Bufs {
		if !used[id] {
			continue
		}
		n := opt.Batch * buf.Width
		if ir.BufID(id) == p.Logits && opt.LogitRows > 0 {
			n = min(opt.Batch, opt.LogitRows) * buf.Width
		}
		if opt.Alloc == nil {
			b.bufs[id] = make([]float32, n)
			continue
		}
		m, err := opt.Alloc(ir.BufID(id), n)
		if err != nil {
			return nil, fmt.Errorf("cpu: buffer %s: %w", buf.Name, err)
		}
		b.bufs[id] = m
	}
	return b, nil
}

// kvBlock is the cells of a block of the KV cache.
const kvBlock = 256

// Buf is the host memory of buffer id (nil when no op here uses it).
func (b *Backend) Buf(id ir.BufID) []float32 { return b.bufs[id] }

// KVBytes is the host memory of the KV caches this backend keeps.
func (b *Backend) KVBytes() int64 {
	var n int64
	for _, kv := range b.kv {
		if kv != nil {
			n += kv.Bytes()
		}
	}
	return n
}

// Run executes ops[lo:hi] over n rows (tokens at positions pos0...). The
// output head runs as mode says: not at all (Run stops before it and
// returns 0), on the last row only (its first op moves the last row of its
// input to row 0), or on every row. Run returns the rows its last op
// produced.
func (b *Backend) Run(lo, hi int, tokens []int, n, pos0 int, mode ir.OutputMode) int {
	prog := b.prog.Ops
	n0 := n // the batch, for the op profile
	for i := lo; i < hi; i++ {
		op := &prog[i]
		if op.Output && mode == ir.OutputNone {
			return 0 // the head is the program's tail
		}
		if op.Output && mode == ir.OutputLast && n > 1 {
			// Only the last token's logits are wanted: move its row first.
			w := b.prog.Bufs[op.In].Width
			copy(b.bufs[op.In][:w], b.bufs[op.In][(n-1)*w:n*w])
			n = 1
		}
		start := b.lapStart()
		j := min(matMulGroup(prog, i), hi)
		if j > i+1 {
			b.execMatMuls(prog[i:j], n)
		} else {
			j = i + 1
			b.exec(op, tokens, n, pos0)
		}
		if b.prof != nil {
			b.prof.add(n0, groupName(prog[i:j]), time.Since(start))
		}
		i = j - 1
	}
	return n
}

// CountBatch tells the op profile that a batch of n tokens is done (its
// figures are per batch); nothing when the profile is off.
func (b *Backend) CountBatch(n int) {
	if b.prof != nil {
		b.prof.step(n)
	}
}
