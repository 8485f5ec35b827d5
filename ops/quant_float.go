package ops

import (
	"encoding/binary"
	"math"
)

// The float formats F32, F16 and BF16. Their activations use the same format
// as the weights, and the dot products follow ggml's scalar
// ggml_vec_dot_f32/_f16/_bf16: each product is formed in float32 (exact for
// F16 and BF16 inputs) and the sum is accumulated in float64 (ggml_float).

func dequantF32(dst []float32, src []byte) {
	src = src[:4*len(dst)]
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

func quantF32(dst []byte, src []float32) {
	dst = dst[:4*len(src)]
	for i, f := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(f))
	}
}

func dotF32(n int, w, x []byte) float32 {
	w, x = w[:4*n], x[:4*n]
	var sum float64
	for i := 0; i < 4*n; i += 4 {
		a := math.Float32frombits(binary.LittleEndian.Uint32(w[i:]))
		b := math.Float32frombits(binary.LittleEndian.Uint32(x[i:]))
		sum += float64(a * b)
	}
	return float32(sum)
}

func dequantF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = f16Table[binary.LittleEndian.Uint16(src[2*i:])]
	}
}

func quantF16(dst []byte, src []float32) {
	dst = dst[:2*len(src)]
	for i, f := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToF16(f))
	}
}

func dotF16(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	var sum float64
	for i := 0; i < 2*n; i += 2 {
		a := f16Table[binary.LittleEndian.Uint16(w[i:])]
		b := f16Table[binary.LittleEndian.Uint16(x[i:])]
		sum += float64(a * b)
	}
	return float32(sum)
}

func dequantBF16(dst []float32, src []byte) {
	src = src[:2*len(dst)]
	for i := range dst {
		dst[i] = BF16ToF32(binary.LittleEndian.Uint16(src[2*i:]))
	}
}

func quantBF16(dst []byte, src []float32) {
	dst = dst[:2*len(src)]
	for i, f := range src {
		binary.LittleEndian.PutUint16(dst[2*i:], F32ToBF16(f))
	}
}

func dotBF16(n int, w, x []byte) float32 {
	w, x = w[:2*n], x[:2*n]
	var sum float64
	for i := 0; i < 2*n; i += 2 {
		a := BF16ToF32(binary.LittleEndian.Uint16(w[i:]))
		b := BF16ToF32(binary.LittleEndian.Uint16(x[i:]))
		sum += float64(a * b)
	}
	return float32(sum)
}
