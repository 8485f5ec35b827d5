package synth

import (
	"fmt"
	"strings"
)

// Preset is the shape of a model: every hyperparameter that decides tensor
// shapes and the metadata a runtime reads. The real presets copy the
// values of the published config.json files (as llama.cpp's
// convert_hf_to_gguf.py turns them into GGUF metadata); the tiny ones copy
// the shapes of the numerics oracles in testdata/oracle.
type Preset struct {
	Name        string // what --preset takes: "qwen3-14b"
	Description string // the model it stands in for
	Arch        string // general.architecture: qwen3, qwen3moe, glm4 or llama

	Layers  int // block_count
	Hidden  int // embedding_length
	FFN     int // feed_forward_length (per branch; GLM-4's fused ffn_up is 2*FFN wide)
	Heads   int // attention.head_count
	KVHeads int // attention.head_count_kv
	HeadDim int // attention.key_length = value_length
	RopeDim int // rope.dimension_count: rotated dims per head (GLM-4 rotates half)
	Vocab   int // rows of token_embd / output
	Context int // context_length

	RopeBase float32 // rope.freq_base
	RMSEps   float32 // attention.layer_norm_rms_epsilon

	// TiedEmbeddings: no output.weight; token_embd doubles as the output
	// projection (Qwen3-0.6B).
	TiedEmbeddings bool

	// MoE (qwen3moe): expert_count, expert_used_count and the per-expert FFN
	// width (expert_feed_forward_length).
	Experts, ExpertsUsed, ExpertFFN int

	// Llama 3.1 rope scaling ("rope_type": "llama3"). llama.cpp's converter
	// writes no rope.scaling.* keys for this type; it bakes the per-dimension
	// factors into a rope_freqs.weight tensor instead, and so do we.
	RopeScaling *Llama3RopeScaling

	// VocabSizeKey writes <arch>.vocab_size, which llama.cpp's converter
	// writes for the llama architecture (the tiny-llama oracle lacks it).
	VocabSizeKey bool

	// Embedding models. Pooling writes <arch>.pooling_type (llama.cpp's
	// values: 1 mean, 2 cls, 3 last; 0 writes nothing, as for generative
	// models). NoBOS and AddEOS set the tokenizer's add_bos_token false and
	// add_eos_token true: Qwen3-Embedding's tokenizer adds no BOS and
	// appends its end-of-text token, whose final hidden state is the
	// embedding.
	Pooling       int
	NoBOS, AddEOS bool
}

// Llama3RopeScaling holds the "rope_scaling" block of a Llama 3.1 config.
type Llama3RopeScaling struct {
	Factor         float64 // 8
	LowFreqFactor  float64 // 1
	HighFreqFactor float64 // 4
	OrigContext    int     // original_max_position_embeddings: 8192
}

// The presets. Sources: the config.json files of Qwen/Qwen3-0.6B, -8B, -14B,
// -30B-A3B, THUDM/GLM-Z1-9B-0414 and meta-llama/Llama-3.1-8B; the tiny ones
// follow testdata/oracle/README.md and the oracle files' metadata.
var presets = []Preset{
	{
		Name: "qwen3-0.6b", Description: "Qwen3-0.6B", Arch: "qwen3",
		Layers: 28, Hidden: 1024, FFN: 3072, Heads: 16, KVHeads: 8, HeadDim: 128, RopeDim: 128,
		Vocab: 151936, Context: 40960, RopeBase: 1e6, RMSEps: 1e-6, TiedEmbeddings: true,
	},
	{
		Name: "qwen3-8b", Description: "Qwen3-8B", Arch: "qwen3",
		Layers: 36, Hidden: 4096, FFN: 12288, Heads: 32, KVHeads: 8, HeadDim: 128, RopeDim: 128,
		Vocab: 151936, Context: 40960, RopeBase: 1e6, RMSEps: 1e-6,
	},
	{
		Name: "qwen3-14b", Description: "Qwen3-14B", Arch: "qwen3",
		Layers: 40, Hidden: 5120, FFN: 17408, Heads: 40, KVHeads: 8, HeadDim: 128, RopeDim: 128,
		Vocab: 151936, Context: 40960, RopeBase: 1e6, RMSEps: 1e-6,
	},
	{
		Name: "qwen3-30b-a3b", Description: "Qwen3-30B-A3B (MoE, 128 experts, 8 used)", Arch: "qwen3moe",
		Layers: 48, Hidden: 2048, FFN: 6144, Heads: 32, KVHeads: 4, HeadDim: 128, RopeDim: 128,
		Vocab: 151936, Context: 40960, RopeBase: 1e6, RMSEps: 1e-6,
		Experts: 128, ExpertsUsed: 8, ExpertFFN: 768,
	},
	{
		Name: "glm4-9b", Description: "GLM-Z1-9B-0414 (GLM-4-0414 architecture)", Arch: "glm4",
		Layers: 40, Hidden: 4096, FFN: 13696, Heads: 32, KVHeads: 2, HeadDim: 128, RopeDim: 64,
		Vocab: 151552, Context: 32768, RopeBase: 10000, RMSEps: 1e-5,
	},
	{
		Name: "llama3-8b", Description: "Llama 3.1 8B", Arch: "llama",
		Layers: 32, Hidden: 4096, FFN: 14336, Heads: 32, KVHeads: 8, HeadDim: 128, RopeDim: 128,
		Vocab: 128256, Context: 131072, RopeBase: 500000, RMSEps: 1e-5,
		RopeScaling:  &Llama3RopeScaling{Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OrigContext: 8192},
		VocabSizeKey: true,
	},
	{
		Name: "tiny-qwen3", Description: "oracle shape: qwen3, 3 layers, 256 wide", Arch: "qwen3",
		Layers: 3, Hidden: 256, FFN: 768, Heads: 8, KVHeads: 2, HeadDim: 64, RopeDim: 64,
		Vocab: 512, Context: 512, RopeBase: 1e6, RMSEps: 1e-6,
	},
	{
		Name: "tiny-qwen3moe", Description: "oracle shape: qwen3moe, 3 layers, 8 experts, 2 used", Arch: "qwen3moe",
		Layers: 3, Hidden: 256, FFN: 768, Heads: 8, KVHeads: 2, HeadDim: 64, RopeDim: 64,
		Vocab: 512, Context: 512, RopeBase: 1e6, RMSEps: 1e-6,
		Experts: 8, ExpertsUsed: 2, ExpertFFN: 256,
	},
	{
		Name: "tiny-glm4", Description: "oracle shape: glm4, 3 layers, 256 wide", Arch: "glm4",
		Layers: 3, Hidden: 256, FFN: 512, Heads: 8, KVHeads: 2, HeadDim: 64, RopeDim: 32,
		Vocab: 512, Context: 512, RopeBase: 10000, RMSEps: 1e-6,
	},
	{
		Name: "tiny-qwen3-embed", Description: "oracle shape: Qwen3-Embedding (qwen3, last-token pooling, EOS appended), 2 layers, 64 wide", Arch: "qwen3",
		Layers: 2, Hidden: 64, FFN: 128, Heads: 4, KVHeads: 2, HeadDim: 32, RopeDim: 32,
		Vocab: 512, Context: 512, RopeBase: 1e6, RMSEps: 1e-6, TiedEmbeddings: true,
		Pooling: 3, NoBOS: true, AddEOS: true,
	},
	{
		Name: "tiny-llama", Description: "oracle shape: llama, 3 layers, 256 wide", Arch: "llama",
		Layers: 3, Hidden: 256, FFN: 768, Heads: 8, KVHeads: 4, HeadDim: 32, RopeDim: 32,
		Vocab: 512, Context: 512, RopeBase: 10000, RMSEps: 1e-6,
	},
}

// Presets lists the built-in presets, real models first.
func Presets() []Preset { return append([]Preset(nil), presets...) }

// Lookup finds a preset by name.
func Lookup(name string) (Preset, error) {
	for _, p := range presets {
		if p.Name == name {
			return p, nil
		}
	}
	names := make([]string, len(presets))
	for i, p := range presets {
		names[i] = p.Name
	}
	return Preset{}, fmt.Errorf("synth: unknown preset %q (have: %s)", name, strings.Join(names, ", "))
}

// Params is the number of weights of the model (every tensor's elements).
func (p Preset) Params() int64 {
	var n int64
	for _, t := range p.tensors() {
		n += t.elements()
	}
	return n
}

// validate catches presets whose shapes could not be a model (for callers
// that build their own Preset).
func (p Preset) validate() error {
	switch {
	case p.Arch != "qwen3" && p.Arch != "qwen3moe" && p.Arch != "glm4" && p.Arch != "llama":
		return fmt.Errorf("synth: preset %q: architecture %q is not one of qwen3, qwen3moe, glm4, llama", p.Name, p.Arch)
	case p.Layers <= 0 || p.Hidden <= 0 || p.FFN <= 0 || p.Heads <= 0 || p.KVHeads <= 0 || p.HeadDim <= 0 || p.Vocab <= 0:
		return fmt.Errorf("synth: preset %q: layers, widths, heads and vocab must be positive", p.Name)
	case p.Heads%p.KVHeads != 0:
		return fmt.Errorf("synth: preset %q: %d heads are not a multiple of %d KV heads", p.Name, p.Heads, p.KVHeads)
	case p.RopeDim <= 0 || p.RopeDim > p.HeadDim || p.RopeDim%2 != 0:
		return fmt.Errorf("synth: preset %q: rope dimension %d must be even and at most the head size %d", p.Name, p.RopeDim, p.HeadDim)
	case p.Arch == "qwen3moe" && (p.Experts <= 0 || p.ExpertsUsed <= 0 || p.ExpertsUsed > p.Experts || p.ExpertFFN <= 0):
		return fmt.Errorf("synth: preset %q: a qwen3moe preset needs experts, experts used (at most experts) and the expert FFN width", p.Name)
	case p.Pooling < 0 || p.Pooling > 3:
		return fmt.Errorf("synth: preset %q: pooling type %d: want 0 (none), 1 (mean), 2 (cls) or 3 (last)", p.Name, p.Pooling)
	case p.Hidden%32 != 0 || p.FFN%32 != 0 || p.HeadDim%32 != 0 || p.ExpertFFN%32 != 0:
		// Every matrix row must hold whole 32-element blocks (Q8_0, Q5_0).
		return fmt.Errorf("synth: preset %q: widths must be multiples of 32", p.Name)
	}
	return nil
}
