package ops

import (
	"fmt"
	"math"
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
		for i := 0; i < l.Width; i++ {
			l.K16[o+i] = F32ToF16(k[i])
			l.V16[o+i] = F32ToF16(v[i])
		}
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

// Run computes out[t] (NHeads*HeadSize) from q[t] for t < nTok. Work is
// split by (token, head) across the pool. With an f16 cache the query and
// the attention weights are rounded to f16 before their products, as
// llama.cpp's CPU path converts them to the cache's type.
func (a *Attention) Run(p *Pool, kv *KVLayer, q, out []float32, nTok, pos0 int) {
	qw := a.NHeads * a.HeadSize
	group := a.NHeads / a.NKVHeads
	hs := a.HeadSize
	p.Run(nTok*a.NHeads, 1, func(lo, hi int) {
		scores := make([]float32, pos0+nTok)
		q16 := make([]float32, hs)
		acc := make([]float64, hs)
		for job := lo; job < hi; job++ {
			t, h := job/a.NHeads, job%a.NHeads
			kvh := h / group
			qh := q[t*qw+h*hs : t*qw+h*hs+hs]
			if kv.F16 {
				for i, v := range qh {
					q16[i] = F16ToF32(F32ToF16(v))
				}
				qh = q16
			}
			n := pos0 + t + 1 // causal: positions 0..pos0+t
			s := scores[:n]
			for j := 0; j < n; j++ {
				o := j*kv.Width + kvh*hs
				var dot float64
				if kv.F16 {
					k := kv.K16[o : o+hs]
					for i, v := range qh {
						dot += float64(v) * float64(F16ToF32(k[i]))
					}
				} else {
					k := kv.K32[o : o+hs]
					for i, v := range qh {
						dot += float64(v) * float64(k[i])
					}
				}
				s[j] = float32(dot) * a.Scale
			}
			Softmax(s)
			clear(acc)
			for j := 0; j < n; j++ {
				w := s[j]
				o := j*kv.Width + kvh*hs
				if kv.F16 {
					w = F16ToF32(F32ToF16(w))
					vr := kv.V16[o : o+hs]
					for i := range acc {
						acc[i] += float64(w) * float64(F16ToF32(vr[i]))
					}
				} else {
					vr := kv.V32[o : o+hs]
					for i := range acc {
						acc[i] += float64(w) * float64(vr[i])
					}
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
