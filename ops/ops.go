package ops

import (
	"math"
)

// RMSNorm writes out = x / sqrt(mean(x²) + eps) * w for one row. w may be
// nil (no weight). The sum is kept in float64 as ggml does.
func RMSNorm(out, x, w []float32, eps float32) {
	var sum float64
	for _, v := range x {
		sum += float64(v) * float64(v)
	}
	mean := float32(sum / float64(len(x)))
	scale := float32(1 / math.Sqrt(float64(mean+eps)))
	if w == nil {
		for i, v := range x {
			out[i] = v * scale
		}
		return
	}
	w = w[:len(x)]
	for i, v := range x {
		out[i] = (v * scale) * w[i]
	}
}

// Add writes out[i] = a[i] + b[i].
func Add(out, a, b []float32) {
	b = b[:len(a)]
	out = out[:len(a)]
	for i := range a {
		out[i] = a[i] + b[i]
	}
}

// AddTo adds b into a.
func AddTo(a, b []float32) {
	b = b[:len(a)]
	for i := range a {
		a[i] += b[i]
	}
}

// Scale multiplies x by s in place.
func Scale(x []float32, s float32) {
	for i := range x {
		x[i] *= s
	}
}

// SiLU is x·sigmoid(x), as ggml_silu_f32 computes it.
func SiLU(x float32) float32 { return x / (1 + float32(math.Exp(float64(-x)))) }

// SwiGLU writes out[i] = silu(gate[i]) * up[i], with the active CPU
// level's kernel (swigluGeneric is the reference).
func SwiGLU(out, gate, up []float32) { swigluKernel(out, gate, up) }

func swigluGeneric(out, gate, up []float32) {
	up = up[:len(gate)]
	out = out[:len(gate)]
	for i, g := range gate {
		out[i] = SiLU(g) * up[i]
	}
}

// Softmax normalises x in place: exp(x - max) / sum, sum in float64.
func Softmax(x []float32) {
	mx := float32(math.Inf(-1))
	for _, v := range x {
		mx = max(mx, v)
	}
	var sum float64
	for i, v := range x {
		e := float32(math.Exp(float64(v - mx)))
		x[i] = e
		sum += float64(e)
	}
	inv := float32(1 / sum)
	for i := range x {
		x[i] *= inv
	}
}

// Argmax is the index of the largest value (the first one on ties).
func Argmax(x []float32) int {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return best
}
