package ops

import "math"

// Rope describes a rotary position embedding as ggml_rope_ext applies it.
type Rope struct {
	Dims      int       // rotated dimensions of each head (n_rot), even, <= head size
	Base      float32   // freq_base
	FreqScale float32   // 1/linear scaling factor (1 when unscaled)
	Factors   []float32 // optional per-pair divisors of theta (Llama 3 rope_freqs), len Dims/2
	NeoX      bool      // pairs (i, i+Dims/2) instead of (2i, 2i+1)
}

// Table fills cos/sin (len Dims/2 each) for position pos. theta advances by
// repeated float32 multiplication, as ggml's rope cache does, so angles
// match llama.cpp's to the last bit before cos/sin.
func (r *Rope) Table(pos int, cos, sin []float32) {
	thetaScale := float32(math.Pow(float64(r.Base), -2.0/float64(r.Dims)))
	theta := float32(pos)
	fs := r.FreqScale
	if fs == 0 {
		fs = 1
	}
	for i := 0; i < r.Dims/2; i++ {
		t := theta
		if r.Factors != nil {
			t /= r.Factors[i]
		}
		t *= fs
		cos[i] = float32(math.Cos(float64(t)))
		sin[i] = float32(math.Sin(float64(t)))
		theta *= thetaScale
	}
}

// Apply rotates every head of x in place (x holds nHeads rows of headSize)
// with a table made by Table.
func (r *Rope) Apply(x []float32, nHeads, headSize int, cos, sin []float32) {
	half := r.Dims / 2
	for h := 0; h < nHeads; h++ {
		v := x[h*headSize : h*headSize+r.Dims]
		if r.NeoX {
			for i := 0; i < half; i++ {
				x0, x1 := v[i], v[i+half]
				v[i] = x0*cos[i] - x1*sin[i]
				v[i+half] = x0*sin[i] + x1*cos[i]
			}
		} else {
			for i := 0; i < half; i++ {
				x0, x1 := v[2*i], v[2*i+1]
				v[2*i] = x0*cos[i] - x1*sin[i]
				v[2*i+1] = x0*sin[i] + x1*cos[i]
			}
		}
	}
}

// Llama3Factors computes the per-pair theta divisors of Llama 3.1's rope
// scaling, for files that carry the scaling keys but no rope_freqs tensor.
func Llama3Factors(dims int, base, factor, lowFreqFactor, highFreqFactor float32, origCtx int) []float32 {
	out := make([]float32, dims/2)
	lowWavelen := float64(origCtx) / float64(lowFreqFactor)
	highWavelen := float64(origCtx) / float64(highFreqFactor)
	for i := range out {
		freq := 1 / math.Pow(float64(base), float64(2*i)/float64(dims))
		wavelen := 2 * math.Pi / freq
		switch {
		case wavelen < highWavelen:
			out[i] = 1
		case wavelen > lowWavelen:
			out[i] = factor
		default:
			smooth := (float64(origCtx)/wavelen - float64(lowFreqFactor)) / float64(highFreqFactor-lowFreqFactor)
			out[i] = float32(1 / ((1-smooth)/float64(factor) + smooth))
		}
	}
	return out
}
