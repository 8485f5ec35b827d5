package ops

import (
	"fmt"
	"math"
	"sync"
	"unsafe"
)

// KVLayer is the key and value cache of one layer: Ctx rows of
// Width = nKVHeads*headSize values, in f16 (llama.cpp's default) or f32.
type KVLayer struct {
	F16      bool
	Ctx      int
	Width    int
	K16, V16 []uint16  // [Ctx][Width] when F16
	K32, V32 []float32 // [Ctx][Width] otherwise
}

// NewKVLayer allocates the cache of one layer.
func NewKVLayer(ctx, width int, f16 bool) *KVLayer {
	l := &KVLayer{F16: f16, Ctx: ctx, Width: width}
	if f16 {
		l.K16 = make([]uint16, ctx*width)
		l.V16 = make([]uint16, ctx*width)
	} else {
		l.K32 = make([]float32, ctx*width)
		l.V32 = make([]float32, ctx*width)
	}
	return l
}

// Bytes is the memory the layer's cache holds.
func (l *KVLayer) Bytes() int64 {
	if l.F16 {
		return int64(len(l.K16)+len(l.V16)) * 2
	}
	return int64(len(l.K32)+len(l.V32)) * 4
}

// Store writes the key and value rows of position pos.
func (l *KVLayer) Store(pos int, k, v []float32) {
	o := pos * l.Width
	if l.F16 {
		cvtF16Kernel(l.K16[o:o+l.Width], k[:l.Width])
		cvtF16Kernel(l.V16[o:o+l.Width], v[:l.Width])
		return
	}
	copy(l.K32[o:o+l.Width], k)
	copy(l.V32[o:o+l.Width], v)
}

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

// Run computes out[t] (NHeads*HeadSize) from q[t] for t < nTok. With an f16
// cache (llama.cpp's default) the query and the attention weights are
// rounded to f16 before their products, as llama.cpp's CPU path converts
// them to the cache's type, and the products run on the level's F16
// kernels: per job, one head and up to attnTokens tokens, whose scores
// share each key row's conversion. Every (token, head) is computed the same
// way whatever the job it falls in, so threads do not change the result.
func (a *Attention) Run(p *Pool, kv *KVLayer, q, out []float32, nTok, pos0 int) {
	if !kv.F16 {
		a.runF32(p, kv, q, out, nTok, pos0)
		return
	}
	hs := a.HeadSize
	qw := a.NHeads * hs
	group := a.NHeads / a.NKVHeads
	blocks := (nTok + attnTokens - 1) / attnTokens
	kb, vb := u16Bytes(kv.K16), u16Bytes(kv.V16)
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
				k := kv.K32[o : o+hs]
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
				vr := kv.V32[o : o+hs]
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
