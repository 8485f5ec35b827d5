package model

import (
	"github.com/atsinfer/ats/runtime/ir"
)

// Pieces shared by the decoder-only architectures. Each arch_*.go file
// lists its own sequence of ops and calls these for the common parts.

// attnOpts are the variations of the attention block between families.
type attnOpts struct {
	biases bool // Q/K/V biases (qwen2, glm4)
	qkNorm bool // RMSNorm of each Q and K head before rope (qwen3)
	neox   bool // rope pairs (i, i+n/2) rather than (2i, 2i+1)
}

// embeddings starts a program: the token embedding into x, returning the
// table (reused as the output matrix by models with tied embeddings).
func embeddings(b *ir.Builder) (*ir.Weight, ir.BufID) {
	h := &b.H
	tok, _ := b.File.Tensor("token_embd.weight")
	if tok != nil && len(tok.Dims) == 2 {
		h.NVocab = int(tok.Dims[1])
	}
	emb := b.Weight("token_embd.weight", h.NEmbd, h.NVocab)
	x := b.Buf("x", h.NEmbd)
	b.Embed(emb, x)
	return emb, x
}

// rope makes the rotary embedding of the model (with Llama 3's frequency
// factors when the file carries rope_freqs.weight).
func rope(b *ir.Builder, neox bool) *ir.Rope {
	h := &b.H
	r := &ir.Rope{Dims: h.NRot, Base: h.RopeBase, FreqScale: h.RopeScale, NeoX: neox}
	if f := b.OptWeight("rope_freqs.weight", h.NRot/2); f != nil {
		r.Factors = f.Vector
	}
	return r
}

// selfAttention appends attention block l: q/k/v projections, optional
// biases and head norms, rope, attention over the cache, output projection
// into out. in is the normed input.
func selfAttention(b *ir.Builder, l int, in ir.BufID, r *ir.Rope, o attnOpts, out ir.BufID) {
	h := &b.H
	qw, kw := h.NHead*h.HeadK, h.NKVHead*h.HeadK
	q, k, v := b.Buf("q", qw), b.Buf("k", kw), b.Buf("v", h.NKVHead*h.HeadV)
	var bq, bk, bv *ir.Weight
	if o.biases {
		bq, bk, bv = b.Weight(ir.Blk(l, "attn_q.bias"), qw), b.Weight(ir.Blk(l, "attn_k.bias"), kw), b.Weight(ir.Blk(l, "attn_v.bias"), h.NKVHead*h.HeadV)
	}
	b.MatMul(in, b.Weight(ir.Blk(l, "attn_q.weight"), h.NEmbd, qw), bq, q)
	b.MatMul(in, b.Weight(ir.Blk(l, "attn_k.weight"), h.NEmbd, kw), bk, k)
	b.MatMul(in, b.Weight(ir.Blk(l, "attn_v.weight"), h.NEmbd, h.NKVHead*h.HeadV), bv, v)
	if o.qkNorm {
		b.HeadNorm(q, b.Weight(ir.Blk(l, "attn_q_norm.weight"), h.HeadK), h.NHead, h.HeadK)
		b.HeadNorm(k, b.Weight(ir.Blk(l, "attn_k_norm.weight"), h.HeadK), h.NKVHead, h.HeadK)
	}
	b.RoPE(q, r, h.NHead, h.HeadK)
	b.RoPE(k, r, h.NKVHead, h.HeadK)
	att := b.Buf("att", qw)
	b.Attention(q, k, v, &ir.Attention{NHeads: h.NHead, NKVHeads: h.NKVHead, HeadSize: h.HeadK, Scale: ir.DefaultScale(h.HeadK)}, att)
	b.MatMul(att, b.Weight(ir.Blk(l, "attn_output.weight"), qw, h.NEmbd), nil, out)
}

// swigluFFN appends the gated FFN of block l: down(silu(gate·in) * up·in).
func swigluFFN(b *ir.Builder, l int, in, out ir.BufID) {
	h := &b.H
	gate, up := b.Buf("gate", h.NFF), b.Buf("up", h.NFF)
	b.MatMul(in, b.Weight(ir.Blk(l, "ffn_gate.weight"), h.NEmbd, h.NFF), nil, gate)
	b.MatMul(in, b.Weight(ir.Blk(l, "ffn_up.weight"), h.NEmbd, h.NFF), nil, up)
	b.SwiGLU(gate, up, gate)
	b.MatMul(gate, b.Weight(ir.Blk(l, "ffn_down.weight"), h.NFF, h.NEmbd), nil, out)
}

// outputHead appends the final norm and the logits projection (tied to the
// embedding table when the file has no output.weight).
func outputHead(b *ir.Builder, x ir.BufID, emb *ir.Weight) ir.BufID {
	h := &b.H
	b.Layer(-1)
	b.Output()
	xn := b.Buf("xn", h.NEmbd)
	b.Norm(x, b.Weight("output_norm.weight", h.NEmbd), xn)
	out := b.OptWeight("output.weight", h.NEmbd, h.NVocab)
	if out == nil {
		out = emb
	}
	logits := b.Buf("logits", h.NVocab)
	b.MatMul(xn, out, nil, logits)
	return logits
}
