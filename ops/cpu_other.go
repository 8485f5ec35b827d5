//go:build noasm || !(amd64 || arm64)

package ops

import "github.com/atsinfer/ats/gguf"

// archLevels: without assembly only the pure-Go kernels exist.
var archLevels = []Level{LevelGeneric}

func archImpl(Level, gguf.Type) impl { return impl{} }

func archFloat(Level) (rowsFunc, axpyFunc) { return nil, nil }

func archVMath(Level) (swigluFunc, expShiftFunc) { return nil, nil }

func archAttn(Level) *attnKernels { return nil }

func archCvtF16(Level) (func(dst []uint16, src []float32), func(x []float32, scale float32)) {
	return nil, nil
}

func archPacked(Level, gguf.Type) packedMulFunc { return nil }

func archMaxF32(Level) func([]float32) float32 { return nil }

func archLogits(Level) (func(dst, src []float32), func([]float32, float32) int) { return nil, nil }
