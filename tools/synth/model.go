package synth

import (
	"fmt"
	"math"
	"strings"

	"github.com/atsinfer/ats/gguf"
)

// role says what a tensor is for, which decides its values (see values.go)
// and, with its name, its type in a layout.
type role int

const (
	roleMatrix    role = iota // a projection: mean 0, std 1/sqrt(row length)
	roleEmbed                 // token_embd: as a matrix (it doubles as output when tied)
	roleOutput                // output.weight
	roleRouter                // ffn_gate_inp: kept F32, as llama.cpp does
	roleNorm                  // RMSNorm weights: 1 ± 0.1
	roleBias                  // Q/K/V biases: small
	roleRopeFreqs             // rope_freqs.weight: computed, not random
)

// tensorDef is a tensor of a preset before a layout gives it a type.
type tensorDef struct {
	name  string
	dims  []uint64 // ggml order: dims[0] is the row length
	role  role
	layer int // block index, -1 for global tensors
}

func (t tensorDef) elements() int64 {
	n := int64(1)
	for _, d := range t.dims {
		n *= int64(d)
	}
	return n
}

// kind is the tensor's name inside its block ("attn_v", "ffn_down_exps").
func (t tensorDef) kind() string {
	s := t.name
	if t.layer >= 0 {
		s = s[strings.IndexByte(s[len("blk."):], '.')+len("blk.")+1:]
	}
	return strings.TrimSuffix(strings.TrimSuffix(s, ".weight"), ".bias")
}

func dims(d ...int) []uint64 {
	out := make([]uint64, len(d))
	for i, x := range d {
		out[i] = uint64(x)
	}
	return out
}

// tensors lists the preset's tensors in file order, named as llama.cpp
// names them for the architecture.
func (p Preset) tensors() []tensorDef {
	var ts []tensorDef
	add := func(layer int, name string, r role, d ...int) {
		if layer >= 0 {
			name = fmt.Sprintf("blk.%d.%s", layer, name)
		}
		ts = append(ts, tensorDef{name: name, dims: dims(d...), role: r, layer: layer})
	}
	h, q, kv := p.Hidden, p.Heads*p.HeadDim, p.KVHeads*p.HeadDim
	add(-1, "token_embd.weight", roleEmbed, h, p.Vocab)
	if p.RopeScaling != nil {
		add(-1, "rope_freqs.weight", roleRopeFreqs, p.RopeDim/2)
	}
	for i := range p.Layers {
		add(i, "attn_norm.weight", roleNorm, h)
		add(i, "attn_q.weight", roleMatrix, h, q)
		if p.Arch == "glm4" {
			add(i, "attn_q.bias", roleBias, q)
		}
		add(i, "attn_k.weight", roleMatrix, h, kv)
		if p.Arch == "glm4" {
			add(i, "attn_k.bias", roleBias, kv)
		}
		add(i, "attn_v.weight", roleMatrix, h, kv)
		if p.Arch == "glm4" {
			add(i, "attn_v.bias", roleBias, kv)
		}
		if p.Arch == "qwen3" || p.Arch == "qwen3moe" {
			add(i, "attn_q_norm.weight", roleNorm, p.HeadDim)
			add(i, "attn_k_norm.weight", roleNorm, p.HeadDim)
		}
		add(i, "attn_output.weight", roleMatrix, q, h)
		if p.Arch == "glm4" {
			add(i, "post_attention_norm.weight", roleNorm, h)
		}
		add(i, "ffn_norm.weight", roleNorm, h)
		switch p.Arch {
		case "qwen3moe":
			add(i, "ffn_gate_inp.weight", roleRouter, h, p.Experts)
			add(i, "ffn_gate_exps.weight", roleMatrix, h, p.ExpertFFN, p.Experts)
			add(i, "ffn_up_exps.weight", roleMatrix, h, p.ExpertFFN, p.Experts)
			add(i, "ffn_down_exps.weight", roleMatrix, p.ExpertFFN, h, p.Experts)
		case "glm4":
			// GLM-4 keeps gate and up in one matrix, gate rows first.
			add(i, "ffn_up.weight", roleMatrix, h, 2*p.FFN)
			add(i, "ffn_down.weight", roleMatrix, p.FFN, h)
			add(i, "post_ffw_norm.weight", roleNorm, h)
		default:
			add(i, "ffn_gate.weight", roleMatrix, h, p.FFN)
			add(i, "ffn_up.weight", roleMatrix, h, p.FFN)
			add(i, "ffn_down.weight", roleMatrix, p.FFN, h)
		}
	}
	add(-1, "output_norm.weight", roleNorm, h)
	if !p.TiedEmbeddings {
		add(-1, "output.weight", roleOutput, h, p.Vocab)
	}
	return ts
}

// Layouts lists the weight layouts Write knows, as --layout takes them.
func Layouts() []string { return []string{"f32", "f16", "q8_0", "q4_k_m"} }

// fileType is general.file_type (llama_ftype) for a layout.
func fileType(layout string) (uint32, error) {
	switch layout {
	case "f32":
		return 0, nil // LLAMA_FTYPE_ALL_F32
	case "f16":
		return 1, nil // LLAMA_FTYPE_MOSTLY_F16
	case "q8_0":
		return 7, nil // LLAMA_FTYPE_MOSTLY_Q8_0
	case "q4_k_m":
		return 15, nil // LLAMA_FTYPE_MOSTLY_Q4_K_M
	}
	return 0, fmt.Errorf("synth: unknown layout %q (have: %s)", layout, strings.Join(Layouts(), ", "))
}

// useMoreBits is llama.cpp's rule (llama-quant.cpp) for which layers of a
// Q4_K_M file get Q6_K attn_v and ffn_down: the first and last eighth, and
// every third layer in between.
func useMoreBits(i, n int) bool {
	return i < n/8 || i >= 7*n/8 || (i-n/8)%3 == 2
}

// tensorType picks the type of t in a layout the way llama.cpp does: the
// converter (convert_hf_to_gguf.py) for f32/f16, llama-quantize
// (llama_tensor_get_type) for q8_0 and q4_k_m. One-dimensional tensors (norms,
// biases, rope_freqs) and the MoE router always stay F32.
func (p Preset) tensorType(t tensorDef, layout string) gguf.Type {
	if len(t.dims) == 1 || t.role == roleRouter {
		return gguf.TypeF32
	}
	switch layout {
	case "f32":
		return gguf.TypeF32
	case "f16":
		return gguf.TypeF16
	case "q8_0":
		return gguf.TypeQ8_0
	}
	// q4_k_m
	typ := gguf.TypeQ4_K
	kind := t.kind()
	switch {
	case t.role == roleOutput || (t.role == roleEmbed && p.TiedEmbeddings):
		// The output projection (or the embedding standing in for it).
		typ = gguf.TypeQ6_K
	case kind == "attn_v":
		if useMoreBits(t.layer, p.Layers) {
			typ = gguf.TypeQ6_K
		}
		if p.Experts == 8 {
			// "for the 8-expert model, bumping this to Q8_0 trades just ~128MB"
			typ = gguf.TypeQ8_0
		}
	case kind == "attn_k":
		if p.Experts == 8 {
			typ = gguf.TypeQ8_0
		}
	case kind == "attn_output":
		if p.Experts == 8 {
			typ = gguf.TypeQ5_K
		}
	case kind == "ffn_down" || kind == "ffn_down_exps":
		// Merged expert tensors count one per layer, so the layer rule is
		// the same as for dense models.
		if useMoreBits(t.layer, p.Layers) {
			typ = gguf.TypeQ6_K
		}
	}
	// k-quants need rows of whole 256-element super-blocks; llama.cpp falls
	// back to a 32-block type (GLM-4-9B's ffn_down rows are 13696 long).
	if t.dims[0]%gguf.QK_K != 0 {
		switch typ {
		case gguf.TypeQ4_K:
			typ = gguf.TypeQ5_0
		case gguf.TypeQ5_K:
			typ = gguf.TypeQ5_1
		case gguf.TypeQ6_K:
			typ = gguf.TypeQ8_0
		}
	}
	return typ
}

// TensorSpec is one tensor of a synthetic model as it will be written.
type TensorSpec struct {
	Name  string
	Type  gguf.Type
	Dims  []uint64 // ggml order: Dims[0] is the row length
	Bytes uint64
}

// Tensors lists the tensors Write would write for a preset in a layout,
// without writing anything.
func (p Preset) Tensors(layout string) ([]TensorSpec, error) {
	if _, err := fileType(layout); err != nil {
		return nil, err
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	defs := p.tensors()
	out := make([]TensorSpec, len(defs))
	for i, t := range defs {
		typ := p.tensorType(t, layout)
		n, err := typ.RowBytes(uint64(t.elements()))
		if err != nil {
			return nil, fmt.Errorf("synth: preset %s, tensor %s: %w", p.Name, t.name, err)
		}
		out[i] = TensorSpec{Name: t.name, Type: typ, Dims: t.dims, Bytes: n}
	}
	return out, nil
}

// WeightBytes is the total size of the tensor data in a layout (what
// llama-bench reports as the model size).
func (p Preset) WeightBytes(layout string) (int64, error) {
	ts, err := p.Tensors(layout)
	if err != nil {
		return 0, err
	}
	var n int64
	for _, t := range ts {
		n += int64(t.Bytes)
	}
	return n, nil
}

// ropeFreqs are the Llama 3.1 per-dimension rope factors, computed as
// llama.cpp's converter does (LlamaModel.generate_extra_tensors): 1 for
// short wavelengths, the scaling factor for long ones, a smooth blend
// between.
func (p Preset) ropeFreqs() []float32 {
	rs := p.RopeScaling
	dim := p.RopeDim
	out := make([]float32, dim/2)
	lowWavelen := float64(rs.OrigContext) / rs.LowFreqFactor
	highWavelen := float64(rs.OrigContext) / rs.HighFreqFactor
	for i := range out {
		// torch computes the base frequencies in float32.
		freq := float32(1 / math.Pow(float64(p.RopeBase), float64(float32(2*i)/float32(dim))))
		wavelen := 2 * math.Pi / float64(freq)
		switch {
		case wavelen < highWavelen:
			out[i] = 1
		case wavelen > lowWavelen:
			out[i] = float32(rs.Factor)
		default:
			smooth := (float64(rs.OrigContext)/wavelen - rs.LowFreqFactor) / (rs.HighFreqFactor - rs.LowFreqFactor)
			out[i] = float32(1 / ((1-smooth)/rs.Factor + smooth))
		}
	}
	return out
}
