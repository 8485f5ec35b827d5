// Package cpu is the host backend of the executor: it runs a program's ops
// over activation buffers in host memory on the worker pool, and keeps the
// KV cache of the layers whose attention it runs. It knows nothing of the
// GPU or of placement: the executor (runtime/exec) hands it ranges of ops
// and moves activations in and out of its buffers. Each op kind has its
// file (op_<kind>.go).
package cpu

import (
	"fmt"
	"time"

	"github.com/atsinfer/ats/ops"
	"github.com/atsinfer/ats/runtime/backend"
	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/model"
)

// kvcacheSpec is the cache every layer whose attention runs here keeps.
type kvcacheSpec = model.KV

// Options size a Backend.
type Options struct {
	Batch int // most rows of a buffer (tokens computed together)
	// LogitRows is the rows of the logits buffer (at most Batch): a
	// batch whose every logit is wanted must not be longer.
	LogitRows int
	KV        model.KV // the cache of each layer whose attention runs here
	// Runs says which ops may run here, by op (nil: all). Buffers,
	// scratch and KV caches are made only for those.
	Runs []bool
	// Shared provides the memory of buffers that cross to an accelerator
	// (mapped pinned memory, at least Batch rows); the others are Go
	// memory.
	Shared map[ir.BufID][]float32
	// Profile times every op (wall time, the pool's threads included) and
	// reports the time per kind of op and batch size at Close, to Notes.
	Profile bool
	Notes   backend.Notes
}

// Backend runs ops on the CPU. It is not safe for concurrent use.
type Backend struct {
	prog    *ir.Program
	w       *Weights
	pool    *ops.Pool
	kv      []*ops.KVLayer // by layer: nil where attention runs elsewhere
	bufs    [][]float32    // by BufID: Batch rows of the buffer's width, nil if unused here
	scratch []byte         // quantized activations
	moe     moeScratch
	ropes   map[*ir.Rope]*ops.Rope
	attns   map[*ir.Attention]*ops.Attention
	ropeTab ropeCache  // rotation table of the current step
	step    uint64     // steps begun
	prof    *opProfile // Options.Profile; nil when off
	// routeInspector receives every MoE op's routing (InspectRoutes);
	// nil outside tests.
	routeInspector backend.RouteInspector
	notes          backend.Notes
}

// New sizes the buffers, scratch and KV caches of the ops that may run on
// the CPU, over the model's CPU weights w.
func New(w *Weights, pool *ops.Pool, opt Options) (*Backend, error) {
	p := w.Program()
	b := &Backend{prog: p, w: w, pool: pool, kv: make([]*ops.KVLayer, p.Hyper.NLayer), bufs: make([][]float32, len(p.Bufs)),
		ropes: map[*ir.Rope]*ops.Rope{}, attns: map[*ir.Attention]*ops.Attention{}, notes: opt.Notes}
	if opt.Profile {
		b.prof = &opProfile{}
	}
	runs := func(i int) bool { return opt.Runs == nil || opt.Runs[i] }
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
		case ir.OpRoPE:
			if b.ropes[op.Rope] == nil {
				b.ropes[op.Rope] = opsRope(op.Rope)
			}
		case ir.OpAttention:
			if b.attns[op.Attn] == nil {
				b.attns[op.Attn] = opsAttention(op.Attn)
			}
			if b.kv[op.Layer] == nil {
				kv, err := newKVLayer(opt.KV, op.Attn)
				if err != nil {
					return nil, err
				}
				b.kv[op.Layer] = kv
			}
		case ir.OpMatMul:
			scratch = max(scratch, w.Of(op.W).ActBytes(opt.Batch))
		case ir.OpMoE:
			scratch = max(scratch, w.Of(op.W).ActBytes(opt.Batch), w.Of(op.Gate).Stack[0].ActBytes(opt.Batch), w.Of(op.Down).Stack[0].ActBytes(opt.Batch))
			b.moe.grow(w, opt.Batch, op)
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
		if m, ok := opt.Shared[ir.BufID(id)]; ok {
			if len(m) < n {
				return nil, fmt.Errorf("cpu: buffer %s: %d floats of shared memory for %d", buf.Name, len(m), n)
			}
			b.bufs[id] = m[:n]
			continue
		}
		b.bufs[id] = make([]float32, n)
	}
	w.enter()
	return b, nil
}

// Close reports the op profile (when on) and stops counting the backend
// among its weights' users. The pool is the caller's.
func (b *Backend) Close() {
	if b.w != nil {
		b.w.leave()
		b.w = nil
	}
	b.report()
}

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

// Begin starts a step: per-step tables (rotations) are made afresh.
func (b *Backend) Begin() { b.step++ }

// Run executes ops[lo:hi] of the step's batch over n rows. The output head
// runs on the batch's logits rows only: not at all (Run stops before it and
// returns 0), or on those rows, moved to the front first. Run returns the
// rows its last op produced.
func (b *Backend) Run(lo, hi int, bt *ir.Batch, n int) (int, error) {
	prog := b.prog.Ops
	n0 := n // the batch, for the op profile
	for i := lo; i < hi; i++ {
		op := &prog[i]
		if bt.Hidden && op.Out == b.prog.Logits {
			return n, nil // the hidden rows are wanted, not the logits
		}
		if op.Output && n == bt.Len() {
			if len(bt.Logits) == 0 {
				return 0, nil // the head is the program's tail
			}
			b.gatherRows(op.In, bt.Logits)
			n = len(bt.Logits)
		}
		start := b.lapStart()
		j := min(b.matMulGroup(prog, i), hi)
		if j > i+1 {
			b.execMatMuls(prog[i:j], n)
		} else {
			j = i + 1
			if err := b.exec(op, bt, n); err != nil {
				return 0, fmt.Errorf("cpu: op %d (%s, layer %d): %w", i, op.Kind, op.Layer, err)
			}
		}
		if b.prof != nil {
			b.prof.add(n0, groupName(prog[i:j]), time.Since(start))
		}
		i = j - 1
	}
	return n, nil
}

// gatherRows moves rows of buffer id to the front, in order (rows is
// ascending, so no row is overwritten before it is read).
func (b *Backend) gatherRows(id ir.BufID, rows []int32) {
	w := b.prog.Bufs[id].Width
	buf := b.bufs[id]
	for k, r := range rows {
		if int(r) != k {
			copy(buf[k*w:(k+1)*w], buf[int(r)*w:(int(r)+1)*w])
		}
	}
}

// exec runs one op over n rows.
func (b *Backend) exec(op *ir.Op, bt *ir.Batch, n int) error {
	switch op.Kind {
	case ir.OpEmbed:
		b.embed(op, bt, n)
	case ir.OpNorm:
		b.norm(op, n)
	case ir.OpHeadNorm:
		b.headNorm(op, n)
	case ir.OpMatMul:
		b.matMul(op, n)
	case ir.OpRoPE:
		b.rope(op, bt, n)
	case ir.OpAttention:
		return b.attention(op, bt, n)
	case ir.OpSwiGLU:
		b.swiglu(op, n)
	case ir.OpAdd:
		b.add(op, n)
	case ir.OpMoE:
		return b.moeFFN(op, bt, n)
	default:
		return fmt.Errorf("op %v has no CPU implementation", op.Kind)
	}
	return nil
}

// CountBatch tells the op profile that a batch of n tokens is done (its
// figures are per batch); nothing when the profile is off.
func (b *Backend) CountBatch(n int) {
	if b.prof != nil {
		b.prof.step(n)
	}
}

// Host is the backend as an accelerator's host: it computes the host's
// share of expert layers split with the device.
func (b *Backend) Host() backend.Host { return hostShare{b} }

type hostShare struct{ b *Backend }

func (h hostShare) MoEPartial(op *ir.Op, n, ks int, x []float32, ids []int32, weights []float32, out []float32) error {
	return h.b.MoEPartial(op, n, 0, ks, x, ids, weights, out)
}

func (h hostShare) Expect(d time.Duration) { h.b.pool.Expect(d) }
