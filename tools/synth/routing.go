package synth

import (
	"fmt"

	"github.com/atsinfer/ats/gguf"
)

// MoE routing of a synthetic model (Options.Routing).
//
// Random weights route worse than trained ones. The tokens' hidden states
// grow alike with depth (every layer adds much the same to each), and a
// random router sends them to the same few experts: in the Qwen3-30B-A3B
// shape, past the first layers a prompt of 512 random tokens uses 3 to 13
// of the first 32 experts of most layers. A trained router, balanced by
// its training loss, spreads a prompt over nearly all of them, and what a
// hybrid runtime computes or streams per layer follows the routing.
//
// RoutingBalanced keeps a subspace of the residual stream for the token
// alone: nothing after the embedding writes its first routeDims dimensions
// (the rows of attn_output and ffn_down* that would add into them are
// zero), and the routers read only those dimensions. Every layer then
// routes a token by its embedding through its own random router, so a
// random prompt spreads evenly over the experts, differently in each
// layer. The shapes, types, sizes and every other byte are the default
// file's.
const (
	RoutingRandom   = "random"   // the default: routers read the whole state (routing drifts onto a few experts with depth)
	RoutingBalanced = "balanced" // routers read a subspace only the embedding writes (routing spread evenly in every layer)
)

// routeDims is the width of the token's subspace: enough dimensions that
// random routers rank the experts independently of each other.
const routeDims = 64

// Routings lists the routings Write knows, as --routing takes them.
func Routings() []string { return []string{RoutingRandom, RoutingBalanced} }

// checkRouting validates opt.Routing for preset p.
func checkRouting(routing string, p Preset) error {
	switch routing {
	case "", RoutingRandom:
		return nil
	case RoutingBalanced:
		if p.Experts == 0 {
			return fmt.Errorf("synth: --routing %s: the preset %s has no experts to route", routing, p.Name)
		}
		if p.Hidden < 2*routeDims {
			return fmt.Errorf("synth: --routing %s: the preset %s is %d wide, under the %d its routing subspace needs", routing, p.Name, p.Hidden, 2*routeDims)
		}
		return nil
	}
	return fmt.Errorf("synth: --routing %q: want one of %v", routing, Routings())
}

// balanced wraps the generator of tensor t (of type typ) for
// RoutingBalanced: the rows that add into the token's subspace zeroed,
// the routers' columns outside it zeroed; other tensors unchanged.
func balanced(t tensorDef, typ gguf.Type, g generator) generator {
	info, _ := typ.Info()
	m := masked{g: g, blockBytes: int64(info.BlockBytes), rowBlocks: int64(t.dims[0]) / int64(info.BlockSize)}
	switch {
	case t.role == roleRouter:
		// [hidden, experts], F32: a block is one element, colBlock its column.
		m.zero = func(_, col int64) bool { return col >= routeDims }
	case t.layer >= 0 && (t.kind() == "attn_output" || t.kind() == "ffn_down" || t.kind() == "ffn_down_exps" || t.kind() == "ffn_down_shexp"):
		// [in, hidden(, experts)]: row r writes dimension r mod hidden.
		out := int64(t.dims[1])
		m.zero = func(row, _ int64) bool { return row%out < routeDims }
	default:
		return g
	}
	return m
}

// masked is a generator whose blocks zero says are all zero bytes, which
// every type decodes to 0 (the scales are 0). The random stream is the
// inner generator's, so the other blocks are the default file's bytes.
type masked struct {
	g                     generator
	blockBytes, rowBlocks int64
	zero                  func(row, colBlock int64) bool
}

func (m masked) fill(dst []byte, first int64, r *rng) {
	m.g.fill(dst, first, r)
	for b := range int64(len(dst)) / m.blockBytes {
		i := first + b
		if m.zero(i/m.rowBlocks, i%m.rowBlocks) {
			clear(dst[b*m.blockBytes : (b+1)*m.blockBytes])
		}
	}
}
