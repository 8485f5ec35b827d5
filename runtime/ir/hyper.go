package ir

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/atsinfer/ats/gguf"
)

// Hyper holds the hyperparameters an architecture reads from GGUF metadata
// (keys "<arch>.<name>").
type Hyper struct {
	Arch        string
	NLayer      int     // block_count
	NCtxTrain   int     // context_length
	NEmbd       int     // embedding_length
	NFF         int     // feed_forward_length
	NHead       int     // attention.head_count
	NKVHead     int     // attention.head_count_kv (defaults to NHead)
	HeadK       int     // attention.key_length (defaults to NEmbd/NHead)
	HeadV       int     // attention.value_length (defaults to HeadK)
	NRot        int     // rope.dimension_count (defaults to HeadK)
	RopeBase    float32 // rope.freq_base (default 10000)
	RopeScale   float32 // 1/rope.scaling.factor for linear scaling, else 1
	RMSEps      float32 // attention.layer_norm_rms_epsilon
	NExpert     int     // expert_count (MoE)
	NExpertUsed int     // expert_used_count (MoE)
	NFFExpert   int     // expert_feed_forward_length (MoE)
	NVocab      int     // rows of token_embd.weight
}

// ReadHyper reads the keys every architecture shares. Keys an architecture
// needs beyond these it reads itself.
func ReadHyper(f *gguf.File) (Hyper, error) {
	arch, err := f.Arch()
	if err != nil {
		return Hyper{}, err
	}
	h := Hyper{Arch: arch, RopeBase: 10000, RopeScale: 1}
	need := func(dst *int, key string) {
		if err != nil {
			return
		}
		var v uint64
		v, err = f.ArchUint(key)
		if err == nil && (v == 0 || v > 1<<24) {
			err = fmt.Errorf("%s: %s.%s is %d, out of range", f.Path, arch, key, v)
		}
		*dst = int(v)
	}
	opt := func(dst *int, key string, def int) {
		if err != nil {
			return
		}
		v, e := f.ArchUint(key)
		var missing *gguf.MissingKeyError
		switch {
		case errors.As(e, &missing):
			*dst = def
		case e != nil:
			err = e
		case v > 1<<24:
			err = fmt.Errorf("%s: %s.%s is %d, out of range", f.Path, arch, key, v)
		default:
			*dst = int(v)
		}
	}
	optF := func(dst *float32, key string, def float32) {
		if err != nil {
			return
		}
		v, e := f.ArchFloat(key)
		var missing *gguf.MissingKeyError
		switch {
		case errors.As(e, &missing):
			*dst = def
		case e != nil:
			err = e
		default:
			*dst = float32(v)
		}
	}
	need(&h.NLayer, "block_count")
	need(&h.NEmbd, "embedding_length")
	need(&h.NHead, "attention.head_count")
	opt(&h.NCtxTrain, "context_length", 4096)
	opt(&h.NFF, "feed_forward_length", 0)
	opt(&h.NKVHead, "attention.head_count_kv", h.NHead)
	if err == nil {
		opt(&h.HeadK, "attention.key_length", h.NEmbd/h.NHead)
		opt(&h.HeadV, "attention.value_length", h.HeadK)
		opt(&h.NRot, "rope.dimension_count", h.HeadK)
	}
	optF(&h.RopeBase, "rope.freq_base", 10000)
	optF(&h.RMSEps, "attention.layer_norm_rms_epsilon", 1e-5)
	opt(&h.NExpert, "expert_count", 0)
	opt(&h.NExpertUsed, "expert_used_count", 0)
	opt(&h.NFFExpert, "expert_feed_forward_length", 0)
	if err != nil {
		return h, err
	}
	if st, e := f.String(arch + ".rope.scaling.type"); e == nil && st == "linear" {
		var factor float32
		optF(&factor, "rope.scaling.factor", 1)
		if err != nil {
			return h, err
		}
		if !(factor > 0) || math.IsInf(float64(factor), 0) {
			return h, fmt.Errorf("%s: %s.rope.scaling.factor is %g: it must be a finite number above 0", f.Path, arch, factor)
		}
		h.RopeScale = 1 / factor
	}
	if err := checkFinite(f, arch, h); err != nil {
		return h, err
	}
	// A block_count past the file's blocks is a corrupt or hostile header:
	// say so before anything is sized by it.
	if last := lastBlock(f); h.NLayer > last+1 {
		return h, fmt.Errorf("%s: %s.block_count is %d but the file's tensors stop at block %d", f.Path, arch, h.NLayer, last)
	}
	if h.NKVHead == 0 || h.NHead%h.NKVHead != 0 {
		return h, fmt.Errorf("%s: %d attention heads are not a multiple of %d KV heads", f.Path, h.NHead, h.NKVHead)
	}
	if h.NRot > h.HeadK || h.NRot%2 != 0 {
		return h, fmt.Errorf("%s: rope.dimension_count %d must be even and at most the head size %d", f.Path, h.NRot, h.HeadK)
	}
	if h.NExpertUsed > h.NExpert {
		return h, fmt.Errorf("%s: %d experts used of %d", f.Path, h.NExpertUsed, h.NExpert)
	}
	return h, err
}

// checkFinite rejects hyperparameters that would make every logit NaN or
// the model print one token forever: a norm epsilon or rope base that is
// zero, negative, NaN or infinite.
func checkFinite(f *gguf.File, arch string, h Hyper) error {
	for _, v := range []struct {
		key string
		x   float32
	}{
		{"attention.layer_norm_rms_epsilon", h.RMSEps},
		{"rope.freq_base", h.RopeBase},
	} {
		x := float64(v.x)
		if math.IsNaN(x) || math.IsInf(x, 0) || x <= 0 {
			return fmt.Errorf("%s: %s.%s is %g: it must be a finite number above 0", f.Path, arch, v.key, x)
		}
	}
	if h.RMSEps >= 1 {
		return fmt.Errorf("%s: %s.attention.layer_norm_rms_epsilon is %g: an epsilon that large swamps the activations", f.Path, arch, h.RMSEps)
	}
	return nil
}

// lastBlock is the highest N of the file's "blk.N." tensors, -1 without any.
func lastBlock(f *gguf.File) int {
	last := -1
	for _, t := range f.Tensors {
		rest, ok := strings.CutPrefix(t.Name, "blk.")
		if !ok {
			continue
		}
		num, _, _ := strings.Cut(rest, ".")
		if n, err := strconv.Atoi(num); err == nil && n > last {
			last = n
		}
	}
	return last
}
