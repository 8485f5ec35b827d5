package ops

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// Attention is causal grouped-query attention for a batch of nTok query
// rows at positions pos0..pos0+nTok-1, over the cache rows 0..pos of each.
type Attention struct {
	NHeads, NKVHeads, HeadSize int
	Scale                      float32 // usually 1/sqrt(HeadSize)
}

// Check validates the head layout.
func (a *Attention) Check() error {
	if a.NHeads <= 0 || a.NKVHeads <= 0 || a.HeadSize <= 0 || a.NHeads%a.NKVHeads != 0 {
		return fmt.Errorf("attention: %d heads over %d KV heads of %d: heads must be a positive multiple of KV heads", a.NHeads, a.NKVHeads, a.HeadSize)
	}
	return nil
}

// checkCache validates the head layout against a cache: its rows hold
// every KV head, and with a quantized type each head is whole blocks.
func (a *Attention) checkCache(kv *KVLayer) error {
	if err := a.Check(); err != nil {
		return err
	}
	if kv == nil {
		return fmt.Errorf("attention: no KV cache")
	}
	if kv.Width != a.NKVHeads*a.HeadSize || kv.HeadSize != a.HeadSize {
		return fmt.Errorf("attention: %d KV heads of %d over a cache of rows of %d values, heads of %d", a.NKVHeads, a.HeadSize, kv.Width, kv.HeadSize)
	}
	if kv.RotK < 0 || kv.RotK&(kv.RotK-1) != 0 || kv.RotK > 0 && a.HeadSize%kv.RotK != 0 ||
		kv.RotV < 0 || kv.RotV&(kv.RotV-1) != 0 || kv.RotV > 0 && a.HeadSize%kv.RotV != 0 {
		return fmt.Errorf("attention: KV cache rotations of %d and %d do not divide heads of %d", kv.RotK, kv.RotV, a.HeadSize)
	}
	if err := kv.Type.checkWidth("head size", a.HeadSize); err != nil {
		return fmt.Errorf("attention: %w", err)
	}
	if rb := kv.RowBytes(); len(kv.K) < kv.Rows*rb || len(kv.V) < kv.Rows*rb {
		return fmt.Errorf("attention: KV cache of %d rows of %d bytes holds %d/%d bytes", kv.Rows, rb, len(kv.K), len(kv.V))
	}
	return nil
}

// RunContiguous computes out[t] (NHeads*HeadSize) from q[t] for t < nTok,
// tokens at positions pos0+t that attend to cells 0..pos0+t of an f16 or
// f32 cache (a single sequence stored in order). It is the attention
// before the paged cache, kept as the reference of llama.cpp's
// flash-attention-off semantics that Run approximates (and for the
// benchmarks that compare the two): with an f16 cache the query and the
// normalised attention weights are rounded to f16 before their products,
// as llama.cpp's CPU path converts them to the cache's type, and the
// products run on the level's F16 kernels: per job, one head and up to
// attnTokens tokens, whose scores share each key row's conversion. Each
// job reads every key and value row it sees, so its memory traffic grows
// with tokens times heads times depth; Run reads each row once per tile
// of queries and KV head. Every (token, head) is computed the same way
// whatever the job it falls in, so threads do not change the result.
func (a *Attention) RunContiguous(p *Pool, kv *KVLayer, q, out []float32, nTok, pos0 int) error {
	if err := a.checkCache(kv); err != nil {
		return err
	}
	if nTok < 0 || pos0 < 0 || pos0+nTok > kv.Rows || len(q) < nTok*a.NHeads*a.HeadSize || len(out) < nTok*a.NHeads*a.HeadSize {
		return fmt.Errorf("attention: %d tokens from position %d over %d cells, %d query and %d output values", nTok, pos0, kv.Rows, len(q), len(out))
	}
	switch kv.Type {
	case KVF32:
		a.runF32(p, kv, q, out, nTok, pos0)
		return nil
	case KVF16:
	default:
		return fmt.Errorf("attention: RunContiguous takes an f16 or f32 cache, not %s", kv.Type)
	}
	hs := a.HeadSize
	qw := a.NHeads * hs
	group := a.NHeads / a.NKVHeads
	blocks := (nTok + attnTokens - 1) / attnTokens
	kb, vb := kv.K, kv.V
	ws := 2 * kv.Width
	// One job is a head over up to attnTokens tokens: microseconds at
	// short contexts, so decode hands out a few per chunk.
	size := 1
	if pos0+nTok < 256 && nTok == 1 {
		size = 2
	}
	p.RunChunks(a.NHeads*blocks, size, func(lo, hi int) {
		sc := attnScratchPool.Get().(*attnScratch)
		defer attnScratchPool.Put(sc)
		for job := lo; job < hi; job++ {
			h, b := job%a.NHeads, job/a.NHeads
			t0, t1 := b*attnTokens, min(nTok, (b+1)*attnTokens)
			nt := t1 - t0
			npos := pos0 + t1 // keys the last token of the block sees
			scores := sc.floats(&sc.scores, nt*npos)
			q16 := sc.halves(nt * hs)
			for t := t0; t < t1; t++ {
				cvtF16Kernel(q16[(t-t0)*hs:(t-t0+1)*hs], q[t*qw+h*hs:t*qw+h*hs+hs])
			}
			kvo := 2 * (h / group) * hs
			f16Rows(hs, kb[kvo:], ws, npos, u16Bytes(q16), 2*hs, nt, scores, npos)
			for t := t0; t < t1; t++ {
				n := pos0 + t + 1 // causal: positions 0..pos0+t
				s := scores[(t-t0)*npos : (t-t0)*npos+n]
				for j := range s {
					s[j] *= a.Scale
				}
				softmaxRoundF16(s)
				dst := out[t*qw+h*hs : t*qw+h*hs+hs]
				clear(dst)
				f16Axpy(s, vb[kvo:], ws, hs, dst)
			}
		}
	})
	return nil
}

// attnTokens is how many tokens of one head a job takes together.
const attnTokens = 4

// attnScratch is one job's working memory, reused across calls.
type attnScratch struct {
	scores []float32
	q16    []uint16
}

var attnScratchPool = sync.Pool{New: func() any { return new(attnScratch) }}

func (s *attnScratch) floats(b *[]float32, n int) []float32 {
	if cap(*b) < n {
		*b = make([]float32, n+n/4)
	}
	return (*b)[:n]
}

func (s *attnScratch) halves(n int) []uint16 {
	if cap(s.q16) < n {
		s.q16 = make([]uint16, n)
	}
	return s.q16[:n]
}

// u16Bytes views a []uint16 as its little-endian bytes (amd64 and arm64 are
// little-endian, as GGUF is).
func u16Bytes(s []uint16) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), 2*len(s))
}

// runF32 is attention over an f32 cache, in float64 like ggml's f32 dots.
func (a *Attention) runF32(p *Pool, kv *KVLayer, q, out []float32, nTok, pos0 int) {
	qw := a.NHeads * a.HeadSize
	group := a.NHeads / a.NKVHeads
	hs := a.HeadSize
	k32, v32 := bytesF32(kv.K), bytesF32(kv.V)
	p.Run(nTok*a.NHeads, 1, func(lo, hi int) {
		scores := make([]float32, pos0+nTok)
		acc := make([]float64, hs)
		for job := lo; job < hi; job++ {
			t, h := job/a.NHeads, job%a.NHeads
			kvh := h / group
			qh := q[t*qw+h*hs : t*qw+h*hs+hs]
			n := pos0 + t + 1 // causal: positions 0..pos0+t
			s := scores[:n]
			for j := 0; j < n; j++ {
				o := j*kv.Width + kvh*hs
				k := k32[o : o+hs]
				var dot float64
				for i, v := range qh {
					dot += float64(v) * float64(k[i])
				}
				s[j] = float32(dot) * a.Scale
			}
			Softmax(s)
			clear(acc)
			for j := 0; j < n; j++ {
				w := s[j]
				o := j*kv.Width + kvh*hs
				vr := v32[o : o+hs]
				for i := range acc {
					acc[i] += float64(w) * float64(vr[i])
				}
			}
			dst := out[t*qw+h*hs : t*qw+h*hs+hs]
			for i, v := range acc {
				dst[i] = float32(v)
			}
		}
	})
}

// DefaultScale is 1/sqrt(headSize).
func DefaultScale(headSize int) float32 { return float32(1 / math.Sqrt(float64(headSize))) }
