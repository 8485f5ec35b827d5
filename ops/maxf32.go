package ops

import "math"

// MaxF32 is the largest element of x, NaN ignored: -Inf when x is empty or
// holds only NaN. A greedy draw scans a vocabulary of 150k logits with it
// every token, where a plain loop took about 0.1 ms.
func MaxF32(x []float32) float32 { return maxF32Kernel(x) }

// maxF32Kernel is the active level's MaxF32 (SetLevel).
var maxF32Kernel = maxF32Generic

// maxF32Generic is the assembly kernels' twin.
func maxF32Generic(x []float32) float32 {
	m := float32(math.Inf(-1))
	for _, v := range x {
		if v > m {
			m = v
		}
	}
	return m
}
