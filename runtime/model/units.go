package model

import (
	"fmt"
	"strings"

	"github.com/atsinfer/ats/runtime/ir"
	"github.com/atsinfer/ats/runtime/kvcache"
)

// Unit is what the planner places: an op that is the anchor of a unit
// (ir.Anchor: one that consumes weights, such as an embedding, a matrix
// product, an MoE layer with its router and expert stacks; or one that
// keeps a KV cache, attention), together with the elementwise ops that
// feed it since the previous unit (norms, rope, adds, SwiGLU). Every op of the program belongs to exactly one unit, so a
// placement of units is a placement of ops: nothing is computed twice and
// nothing moves silently.
type Unit struct {
	Index  int
	Name   string    // the anchor's tensor, or blk.N.attention
	Role   string    // the name without blk.N. and .weight: attn_q, ffn_down, attention, ffn_moe, output, ...
	Layer  int       // -1 outside the blocks
	Op     ir.OpKind // the anchor op's kind
	Anchor ir.Anchor // what the unit's bytes are: weights, or a KV cache
	Lo, Hi int       // ops[Lo:Hi]
	Type   string    // the anchor tensor's type, kv_f16 (kv_q8_0, ...) for a KV cache
	// Mats are the matrices the unit's ops read (vectors such as norms
	// and biases always live on the GPU: they are tiny).
	Mats []*ir.Weight
	// Bytes is the device memory the unit takes when resident: its
	// matrices in the GPU's format, or the KV cache at the context size.
	Bytes int64
	// KVRows is the positions of a KV cache unit's cache.
	KVRows int
	// Experts is the expert count of an expert unit (ir.Class.Experts),
	// of whose stacks a token reads top-k; 0 for other units.
	Experts int
	// Lookup marks a unit whose op reads rows of its weight by token id
	// (ir.Class.Lookup: the embedding).
	Lookup bool
	// Streamable units may run on the GPU without being resident, their
	// matrices copied into the staging ring for the batch (prefill).
	Streamable bool
	// DecodeBytes is what a decode step reads of the unit's weights: all
	// of them, but for an MoE layer only its router and the chosen
	// experts (top-k of the stacks).
	DecodeBytes int64
	// Output marks the output head's unit (norm and logits).
	Output bool
	// InBytes is the activations, per token, a switch of backend just
	// before the unit moves: the buffers its ops read that earlier units
	// wrote.
	InBytes int64
	// Sig identifies units of the same shape and types: they cost the
	// same, so a profile measures one of each.
	Sig string
}

// KV describes the KV cache a unit of attention keeps: rows (positions)
// of a type.
type KV struct {
	Rows int
	Type kvcache.Type
}

// Products says whether the unit multiplies by its weights: not a KV
// cache, not a lookup (a decode step reads all of its weights, or its
// experts' share).
func (u *Unit) Products() bool { return u.Anchor == ir.AnchorWeights && !u.Lookup }

// Bytes is the cache of one layer of attention a: its keys and values.
func (kv KV) Bytes(a *ir.Attention) int64 {
	return 2 * int64(kv.Rows) * kv.Type.RowBytes(a.KVWidth())
}

// Units cuts p into units. deviceBytes is a matrix's size in the GPU's
// weight format (nil: its size in the file); kv sizes the KV caches.
func Units(p *ir.Program, kv KV, deviceBytes func(*ir.Weight) int64) []Unit {
	if deviceBytes == nil {
		deviceBytes = (*ir.Weight).Bytes
	}
	var units []Unit
	lo := 0
	for i := range p.Ops {
		op := &p.Ops[i]
		cl := op.Class()
		if cl.Anchor == ir.AnchorNone {
			continue
		}
		u := Unit{Index: len(units), Layer: op.Layer, Op: op.Kind, Anchor: cl.Anchor, Lookup: cl.Lookup, Lo: lo, Hi: i + 1, Output: op.Output}
		switch {
		case cl.Anchor == ir.AnchorCache:
			u.Name = ir.Blk(op.Layer, "attention")
			u.Role, u.Type = "attention", "kv_"+kv.Type.String()
			u.Bytes, u.KVRows = kv.Bytes(op.Attn), kv.Rows
		case cl.Experts:
			u.Name = ir.Blk(op.Layer, "ffn_"+op.Kind.String())
			u.Role, u.Type = "ffn_"+op.Kind.String(), op.Gate.Type.String()
			u.Streamable = true
			u.Experts = op.Experts()
			// A token reads the router and top-k of each stack's experts.
			ne := int64(u.Experts)
			u.DecodeBytes = deviceBytes(op.W)
			for _, w := range []*ir.Weight{op.Gate, op.Up, op.Down} {
				u.DecodeBytes += deviceBytes(w) * int64(op.TopK) / ne
			}
		default:
			u.Name, u.Role, u.Type = op.W.Name, role(op.W.Name), op.W.Type.String()
			u.Streamable = cl.Streams && !op.Output
		}
		units = append(units, u)
		lo = i + 1
	}
	if len(units) > 0 {
		units[len(units)-1].Hi = len(p.Ops) // trailing ops join the last unit
	}
	written := map[ir.BufID]bool{}
	for k := range units {
		u := &units[k]
		var sig []string
		mine := map[ir.BufID]bool{}
		in := map[ir.BufID]bool{}
		for i := u.Lo; i < u.Hi; i++ {
			op := &p.Ops[i]
			for _, b := range op.Reads() {
				if !mine[b] && written[b] {
					in[b] = true
				}
			}
			for _, b := range op.Writes() {
				mine[b] = true
			}
			sig = append(sig, op.Kind.String())
			for _, w := range op.Weights() {
				if len(w.Dims) > 1 {
					u.Mats = append(u.Mats, w)
					u.Bytes += deviceBytes(w)
				}
				sig = append(sig, fmt.Sprintf("%s%v", w.Type, w.Dims))
			}
		}
		for b := range mine {
			written[b] = true
		}
		for b := range in {
			u.InBytes += 4 * int64(p.Bufs[b].Width)
		}
		if u.DecodeBytes == 0 {
			u.DecodeBytes = u.Bytes
		}
		if u.Output {
			sig = append(sig, "output")
		}
		u.Sig = strings.Join(sig, " ")
	}
	return units
}

// role is a tensor's name without blk.N. and .weight.
func role(name string) string {
	if rest, ok := strings.CutPrefix(name, "blk."); ok {
		if _, after, ok := strings.Cut(rest, "."); ok {
			name = after
		}
	}
	return strings.TrimSuffix(name, ".weight")
}

// UnitOfOp maps each op to the index of its unit.
func UnitOfOp(units []Unit, nOps int) []int {
	of := make([]int, nOps)
	for _, u := range units {
		for i := u.Lo; i < u.Hi; i++ {
			of[i] = u.Index
		}
	}
	return of
}
