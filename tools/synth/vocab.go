package synth

import (
	"fmt"
	"strings"

	"github.com/atsinfer/ats/gguf"
)

// SentencePiece token types (llama_token_type), as tokenizer.ggml.token_type
// stores them.
const (
	tokNormal  = 1
	tokUnknown = 2
	tokControl = 3
	tokUnused  = 5
	tokByte    = 6
)

// firstPiece is the id of the first generated piece of the made-up
// vocabulary: after <unk>, <s>, </s> and the 256 byte tokens.
const firstPiece = 3 + 256

// madeUpVocab is the tokenizer metadata of a made-up SentencePiece
// vocabulary of n tokens, the same one the oracle files carry: <unk>, <s>,
// </s>, the byte tokens <0x00>..<0xFF>, then pieces named by counting in
// base 26 ("a", "b", ... "z", "ba", "bb", ...), every other one with the
// word-start mark "▁", scored by -id so earlier pieces win merges.
func madeUpVocab(n int) ([]gguf.KV, error) {
	if n < firstPiece+1 {
		return nil, fmt.Errorf("synth: a made-up vocabulary needs at least %d tokens, the preset has %d", firstPiece+1, n)
	}
	tokens := make([]string, n)
	scores := make([]float32, n)
	types := make([]int32, n)
	tokens[0], types[0] = "<unk>", tokUnknown
	tokens[1], types[1] = "<s>", tokControl
	tokens[2], types[2] = "</s>", tokControl
	for b := range 256 {
		tokens[3+b], types[3+b] = fmt.Sprintf("<0x%02X>", b), tokByte
	}
	var buf []byte
	for id := firstPiece; id < n; id++ {
		j := id - firstPiece
		buf = buf[:0]
		for x := j; ; x /= 26 {
			buf = append(buf, byte('a'+x%26))
			if x < 26 {
				break
			}
		}
		for l, r := 0, len(buf)-1; l < r; l, r = l+1, r-1 {
			buf[l], buf[r] = buf[r], buf[l]
		}
		tokens[id], types[id] = string(buf), tokNormal
		if j%2 == 0 {
			tokens[id] = "▁" + tokens[id]
		}
	}
	for i := range scores {
		scores[i] = -float32(i)
	}
	return []gguf.KV{
		{Key: "tokenizer.ggml.model", Value: gguf.String("llama")},
		{Key: "tokenizer.ggml.tokens", Value: gguf.MustArray(tokens)},
		{Key: "tokenizer.ggml.scores", Value: gguf.MustArray(scores)},
		{Key: "tokenizer.ggml.token_type", Value: gguf.MustArray(types)},
		{Key: "tokenizer.ggml.unknown_token_id", Value: gguf.Uint32(0)},
		{Key: "tokenizer.ggml.bos_token_id", Value: gguf.Uint32(1)},
		{Key: "tokenizer.ggml.eos_token_id", Value: gguf.Uint32(2)},
		{Key: "tokenizer.ggml.add_bos_token", Value: gguf.Bool(true)},
	}, nil
}

// fileVocab copies every tokenizer.* entry (tokens, scores, types, merges,
// special ids, chat template, ...) from a GGUF file. A vocabulary smaller
// than want is padded to want tokens with unused "[PAD<id>]" tokens (score
// -1000), which is what llama.cpp's converter does when a model's embedding
// has more rows than its tokenizer has tokens (Qwen3: 151669 tokens, 151936
// rows), so the model keeps its real shapes. A larger one cannot shrink: the
// model's vocabulary dimension follows it. n is the final token count; note
// says what was done, if anything.
func fileVocab(path string, want int) (kvs []gguf.KV, n int, note string, err error) {
	f, err := gguf.Open(path)
	if err != nil {
		return nil, 0, "", fmt.Errorf("synth: vocabulary %s: %w", path, err)
	}
	defer f.Close()
	tokens, err := f.Strings("tokenizer.ggml.tokens")
	if err != nil {
		return nil, 0, "", fmt.Errorf("synth: vocabulary %s: %w", path, err)
	}
	have := len(tokens)
	pad := max(want-have, 0)
	if pad > 0 {
		seen := make(map[string]bool, have)
		for _, t := range tokens {
			seen[t] = true
		}
		for id := have; id < want; id++ {
			t := fmt.Sprintf("[PAD%d]", id)
			if seen[t] {
				return nil, 0, "", fmt.Errorf("synth: vocabulary %s: cannot pad to %d tokens: it already has a token %q", path, want, t)
			}
			tokens = append(tokens, t)
		}
		note = fmt.Sprintf("vocabulary %s has %d tokens; padded with %d unused [PAD] tokens to the preset's %d, as llama.cpp's converter does", path, have, pad, want)
	} else if have > want {
		note = fmt.Sprintf("vocabulary %s has %d tokens, more than the preset's %d: token_embd and output get %d rows", path, have, want, have)
	}
	for _, kv := range f.KVs {
		if !strings.HasPrefix(kv.Key, "tokenizer.") {
			continue
		}
		v := kv.Value
		if pad > 0 && v.Type == gguf.ValArray && v.Len() == have {
			switch a := v.Data().(type) {
			case []string:
				if kv.Key == "tokenizer.ggml.tokens" {
					v = gguf.MustArray(tokens)
				}
			case []float32: // scores
				s := append(append(make([]float32, 0, have+pad), a...), make([]float32, pad)...)
				for i := have; i < len(s); i++ {
					s[i] = -1000
				}
				v = gguf.MustArray(s)
			case []int32: // token types
				s := append(append(make([]int32, 0, have+pad), a...), make([]int32, pad)...)
				for i := have; i < len(s); i++ {
					s[i] = tokUnused
				}
				v = gguf.MustArray(s)
			}
		}
		kvs = append(kvs, gguf.KV{Key: kv.Key, Value: v})
	}
	return kvs, max(have, want), note, nil
}
