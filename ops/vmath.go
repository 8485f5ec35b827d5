package ops

import "math"

// Vectorised SiLU and softmax. The assembly levels compute exp with ggml's
// ggml_v_expf approximation (as llama.cpp's SIMD SiLU and softmax do);
// expApprox is its pure-Go twin, used for the elements past the last whole
// vector so that every element of a row gets the same formula. The generic
// level keeps SwiGLU and Softmax in ops.go (math.Exp) as the reference.

// expApprox mirrors expVec in ops/_asm/vmath.go step by step (the fused
// multiply-adds are math.FMA in float64 rounded to float32: the same value
// except in rare double-rounding cases).
func expApprox(x float32) float32 {
	x = min(max(x, -87.3), 88.0)
	fma := func(a, b, c float32) float32 { return float32(math.FMA(float64(a), float64(b), float64(c))) }
	const round = 0x1.8p23
	z := fma(x, 0x1.715476p+0, round)
	n := z - round
	b := fma(-n, 0x1.62e4p-1, x)
	b = fma(-n, 0x1.7f7d1cp-20, b)
	u := b * b
	j := fma(0x1.0e4020p-7, b, 0x1.573e2ep-5)
	t := fma(0x1.555e66p-3, b, 0x1.fffdb6p-2)
	j = fma(j, u, t)
	j = fma(j, u, 0x1.ffffecp-1*b)
	k := math.Float32frombits(math.Float32bits(z)<<23 + math.Float32bits(1))
	return fma(k, j, k)
}

// siluApprox is x/(1+exp(-x)) with expApprox.
func siluApprox(x float32) float32 { return x / (1 + expApprox(-x)) }

// swigluFunc and expShiftFunc are the level's kernels: out = silu(gate)·up,
// and x = exp(x-m) in place returning the sum.
type (
	swigluFunc   func(out, gate, up []float32)
	expShiftFunc func(x []float32, m float32) float32
)

var (
	swigluKernel   swigluFunc   = swigluGeneric
	expShiftKernel expShiftFunc = nil // nil: attention uses Softmax
	// scaleRoundF16Kernel sets x[i] = f16(x[i]·scale); nil: the loop in
	// softmaxRoundF16.
	scaleRoundF16Kernel func(x []float32, scale float32)
)

// ExpShift sets x[i] = exp(x[i] - m) and returns their sum (float32), with
// the active level's vector exp (ggml's approximation), or math.Exp at the
// generic level: a sampler's softmax over a whole vocabulary.
func ExpShift(x []float32, m float32) float32 {
	if expShiftKernel != nil {
		return expShiftKernel(x, m)
	}
	var sum float32
	for i, v := range x {
		x[i] = float32(math.Exp(float64(v - m)))
		sum += x[i]
	}
	return sum
}

// softmaxRoundF16 is the attention's softmax: x normalised in place (with
// the level's exp; Softmax is the reference) and each weight rounded to
// f16, as llama.cpp converts the weights to the f16 cache's type.
func softmaxRoundF16(x []float32) {
	if expShiftKernel == nil || scaleRoundF16Kernel == nil {
		Softmax(x)
		for j, w := range x {
			x[j] = F16ToF32(F32ToF16(w))
		}
		return
	}
	mx := float32(math.Inf(-1))
	for _, v := range x {
		mx = max(mx, v)
	}
	scaleRoundF16Kernel(x, 1/expShiftKernel(x, mx))
}
