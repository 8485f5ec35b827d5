package cuda

// Head norms and rotations, with the cache write of the attention after
// them fused in where the cache type allows.

import (
	"fmt"
	"strings"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
	"github.com/atsinfer/ats/runtime/ir"
)

// ropeTensor is one buffer of a rope/head-norm group.
type ropeTensor struct {
	buf      ir.BufID
	heads    int
	norm     *ir.Weight
	rope     *ir.Rope
	headSize int
	eps      float32
}

// ropeStep compiles ops[i], a head norm or a rotation, together with the
// head norms and rotations right after it when they fit one rope_norm
// launch: at most two buffers, each normalised at most once and then
// rotated at most once, all with the same rope and head size, either all
// rotated or none. When the attention op that reads them comes next, the
// launch also writes its keys and values to the cache (kvStored). It
// returns the step and how many ops it covers.
func (g *Exec) ropeStep(i, hi int, kvStored map[int]bool) (step, int, error) {
	ops := g.prog.Ops
	// valid: the tensors agree on what they share; a tensor not yet rotated
	// (or normalised) may still be, by a later op of the group.
	valid := func(ts []ropeTensor) bool {
		for _, t := range ts {
			for _, u := range ts {
				if t.headSize != u.headSize || (t.rope != nil && u.rope != nil && t.rope != u.rope) ||
					(t.norm != nil && u.norm != nil && t.eps != u.eps) {
					return false
				}
			}
		}
		return true
	}
	var ts, pending []ropeTensor // the launch so far; the ops scanned so far
	used := 0
	for j := i; j < hi && (ops[j].Kind == ir.OpHeadNorm || ops[j].Kind == ir.OpRoPE) && ops[j].Output == ops[i].Output; j++ {
		op := &ops[j]
		next := append([]ropeTensor(nil), pending...)
		k := -1
		for x := range next {
			if next[x].buf == op.In {
				k = x
			}
		}
		if k < 0 {
			next = append(next, ropeTensor{buf: op.In, heads: op.Heads, headSize: op.HeadSize})
			k = len(next) - 1
		}
		t := &next[k]
		ok := len(next) <= 2 && t.heads == op.Heads && t.headSize == op.HeadSize
		if op.Kind == ir.OpHeadNorm {
			ok = ok && t.norm == nil && t.rope == nil && op.W != nil
			t.norm, t.eps = op.W, op.Eps
		} else {
			ok = ok && t.rope == nil
			t.rope = op.Rope
		}
		if !ok || !valid(next) {
			break
		}
		// Keep the longest prefix that is a launch by itself: rotated and
		// unrotated buffers cannot share one.
		mixed := false
		for _, t := range next {
			mixed = mixed || (t.rope == nil) != (next[0].rope == nil)
		}
		if !mixed {
			ts, used = next, j-i+1
		}
		pending = next
	}
	if used == 0 {
		// ops[i] alone always fits.
		op := &ops[i]
		t := ropeTensor{buf: op.In, heads: op.Heads, headSize: op.HeadSize}
		if op.Kind == ir.OpHeadNorm {
			if op.W == nil {
				return step{}, 0, fmt.Errorf("head norm without a weight")
			}
			t.norm, t.eps = op.W, op.Eps
		} else {
			t.rope = op.Rope
		}
		ts, used = []ropeTensor{t}, 1
	}
	args := kernels.RopeArgs{NTensors: len(ts), HeadSize: ts[0].headSize, Batch: &g.kvb}
	var name []string
	for x, t := range ts {
		args.T[x] = kernels.RopeTensor{X: g.bufs[t.buf], Heads: t.heads, NormW: g.vec(t.norm)}
		if t.norm != nil {
			args.Eps = t.eps
			name = append(name, "head_norm")
		}
	}
	if r := ts[0].rope; r != nil {
		args.Dims, args.NeoX, args.Base, args.FreqScale = r.Dims, r.NeoX, r.Base, r.FreqScale
		if r.Factors != nil {
			args.Factors = g.ws.ropes[r]
		}
		name = append(name, "rope")
	}
	// The cache write of the attention right after, when it reads these
	// keys: the values were computed before (they are not in this launch).
	// A cache that holds its keys and values rotated (q8_0) takes the
	// write only with the rotations: of the queries and keys in place, of
	// the values on their way in; so the launch must hold the queries too.
	// Else the attention step rotates and stores them itself.
	if j := i + used; j < hi && ops[j].Kind == ir.OpAttention && ops[j].Output == ops[i].Output {
		at := &ops[j]
		a := at.Attn
		rk, rv := g.kvRotation(a)
		for x, t := range ts {
			if t.buf != at.In2 || t.heads*t.headSize != a.NKVHeads*a.HeadSize || t.buf == at.In3 || (g.kvType != kernels.KVF16 && t.headSize%32 != 0) {
				continue
			}
			if rk > 0 {
				// The queries must be the launch's other tensor; the
				// kernel rotates chunks of at most RotMax.
				if len(ts) != 2 || rk > kernels.RotMax || rv > kernels.RotMax || t.headSize != a.HeadSize {
					continue
				}
				if q := ts[1-x]; q.buf != at.In || q.buf == at.In3 || q.heads*q.headSize != a.NHeads*a.HeadSize {
					continue
				}
				args.Rot = rk
				name = append(name, "rotate")
			}
			cache := &kernels.KVCache{K: g.kvK[at.Layer], V: g.kvV[at.Layer], Type: g.kvType, Width: a.NKVHeads * a.HeadSize}
			args.KV = &kernels.RopeKV{T: x, V: g.bufs[at.In3], Cache: cache, RotV: rv}
			kvStored[j] = true
			name = append(name, "kv_store")
		}
	}
	return step{name: fmt.Sprintf("%s ×%d", strings.Join(name, "+"), len(ts)), run: func(s *cudadrv.Stream, n int) error {
		a := args
		a.NTok = n
		return g.dev.rope.Run(s, &a)
	}}, used, nil
}
