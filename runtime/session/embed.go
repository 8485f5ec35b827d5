package session

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/atsinfer/ats/gguf"
)

// Pooling is how a text's embedding is made of its tokens' final hidden
// states, as the GGUF key {arch}.pooling_type says (llama.cpp's values).
type Pooling int

const (
	PoolingUnset Pooling = -1
	PoolingNone  Pooling = 0 // one embedding per token: not a text embedding
	PoolingMean  Pooling = 1
	PoolingCLS   Pooling = 2 // the first token's
	PoolingLast  Pooling = 3 // the last token's (Qwen3-Embedding)
	PoolingRank  Pooling = 4 // a reranker's score: not an embedding
)

func (p Pooling) String() string {
	switch p {
	case PoolingNone:
		return "none"
	case PoolingMean:
		return "mean"
	case PoolingCLS:
		return "cls"
	case PoolingLast:
		return "last"
	case PoolingRank:
		return "rank"
	}
	return "unset"
}

// ParsePooling reads a pooling's name (mean, cls, last).
func ParsePooling(s string) (Pooling, error) {
	for _, p := range []Pooling{PoolingMean, PoolingCLS, PoolingLast} {
		if s == p.String() {
			return p, nil
		}
	}
	return PoolingUnset, fmt.Errorf("pooling %q: use mean, cls or last", s)
}

// FilePooling is the pooling the model file asks for (PoolingUnset when it
// says none, as generative models' files do).
func FilePooling(f *gguf.File) (Pooling, error) {
	v, err := f.ArchUint("pooling_type")
	var missing *gguf.MissingKeyError
	if errors.As(err, &missing) {
		return PoolingUnset, nil
	}
	if err != nil {
		return PoolingUnset, fmt.Errorf("%s: %w", f.Path, err)
	}
	switch p := Pooling(v); p {
	case PoolingNone:
		return PoolingUnset, nil
	case PoolingMean, PoolingCLS, PoolingLast:
		return p, nil
	default:
		return PoolingUnset, fmt.Errorf("%s: %s is %d (%s): ats makes text embeddings with mean, cls or last pooling", f.Path, f.ArchKey("pooling_type"), v, p)
	}
}

// EmbedTokens tokenizes a text to embed as the model's tokenizer wants a
// whole text, as llama.cpp does: BOS and EOS where the file says its
// tokenizer adds them (Qwen3-Embedding adds no BOS and appends its
// end-of-text token, whose final hidden state is the text's embedding
// under last-token pooling). Special tokens written in the text stay
// text.
func (s *Session) EmbedTokens(text string) []int {
	ids := s.Tok.Encode(text, s.Tok.AddBOS(), false)
	if s.Tok.AddEOS() && s.Tok.EOS() >= 0 {
		ids = append(ids, s.Tok.EOS())
	}
	return ids
}

// Embed returns the embedding of tokens: their final hidden states (after
// the output norm) pooled as pooling says and, with normalize, scaled to
// unit length (as OpenAI's embeddings are). The tokens are a sequence of
// their own in the cache, gone after the call: the session's conversation
// stays.
func (s *Session) Embed(ctx context.Context, tokens []int, pooling Pooling, normalize bool) ([]float32, error) {
	if err := s.checkTokens(tokens); err != nil {
		return nil, fmt.Errorf("embed: %w", err)
	}
	return s.Engine.Embed(ctx, tokens, pooling, normalize)
}

// Embed is Session.Embed on the engine.
func (e *Engine) Embed(ctx context.Context, tokens []int, pooling Pooling, normalize bool) ([]float32, error) {
	if len(tokens) == 0 {
		return nil, errors.New("embed: no tokens")
	}
	if len(tokens) > e.CtxSize() {
		return nil, fmt.Errorf("%w: the text has %d tokens, the context holds %d", ErrContextFull, len(tokens), e.CtxSize())
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	seq := e.Ctx.KV().NewSeq()
	defer seq.Close()
	if err := seq.Reserve(len(tokens)); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrContextFull, err)
	}
	hidden := make([]float32, 0, len(tokens)*e.Model.Hyper().NEmbd)
	for start := 0; start < len(tokens); start += e.Ctx.Batch() {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		chunk := tokens[start:min(len(tokens), start+e.Ctx.Batch())]
		b := SingleBatch(seq, chunk, len(chunk))
		b.Hidden = true
		h, err := e.Ctx.Step(b)
		if err != nil {
			return nil, err
		}
		hidden = append(hidden, h...)
		if err := seq.Append(b.Tokens); err != nil {
			return nil, err
		}
	}
	return Pool(hidden, len(tokens), pooling, normalize)
}

// Pool makes one embedding of n rows of hidden states.
func Pool(hidden []float32, n int, pooling Pooling, normalize bool) ([]float32, error) {
	if n <= 0 || len(hidden)%n != 0 {
		return nil, fmt.Errorf("pool: %d floats are not %d rows", len(hidden), n)
	}
	w := len(hidden) / n
	out := make([]float32, w)
	switch pooling {
	case PoolingMean:
		sum := make([]float64, w)
		for r := range n {
			for i, v := range hidden[r*w : (r+1)*w] {
				sum[i] += float64(v)
			}
		}
		for i := range out {
			out[i] = float32(sum[i] / float64(n))
		}
	case PoolingCLS:
		copy(out, hidden[:w])
	case PoolingLast:
		copy(out, hidden[(n-1)*w:])
	default:
		return nil, fmt.Errorf("pool: pooling %s makes no text embedding", pooling)
	}
	if normalize {
		var ss float64
		for _, v := range out {
			ss += float64(v) * float64(v)
		}
		if ss > 0 {
			inv := 1 / math.Sqrt(ss)
			for i := range out {
				out[i] = float32(float64(out[i]) * inv)
			}
		}
	}
	return out, nil
}
