//go:build !noasm

package ops

import (
	"github.com/atsinfer/ats/gguf"
	"github.com/klauspost/cpuid/v2"
)

// archLevels: Advanced SIMD (NEON) is part of every arm64 CPU Go runs on.
var archLevels = []Level{LevelGeneric, LevelNEON}

// hasSDOT reports the dot-product extension (FEAT_DotProd: SDOT/UDOT);
// without it the NEON kernels use SMULL/SADALP. A variable so that tests
// can exercise both paths.
var hasSDOT = cpuid.CPU.Supports(cpuid.ASIMDDP)

// archImpl returns the NEON kernels of weight type t; the zero impl (the
// generic kernels) for what NEON does not accelerate.
func archImpl(l Level, t gguf.Type) impl {
	if l != LevelNEON {
		return impl{}
	}
	var dot func(n int, w, x []byte) float32
	switch t {
	case gguf.TypeQ8_0:
		if hasSDOT {
			return impl{dot: dotQ8_0SDOT, mul: mulQ8_0With(true)}
		}
		return impl{dot: dotQ8_0NEON, mul: mulQ8_0With(false)}
	case gguf.TypeQ4_0:
		dot = dotQ4_0NEON
		if hasSDOT {
			dot = dotQ4_0SDOT
		}
	case gguf.TypeQ4_K:
		dot = dotQ4_KNEON
	case gguf.TypeQ5_K:
		dot = dotQ5_KNEON
	case gguf.TypeQ6_K:
		dot = dotQ6_KNEON
	case gguf.TypeF32:
		dot = dotF32NEON
	case gguf.TypeF16:
		dot = dotF16NEON
	default:
		return impl{}
	}
	return impl{dot: dot, mul: mulFromDot(dot)}
}

func archFloat(Level) (rowsFunc, axpyFunc) { return nil, nil }

// archPacked: arm64 has no kernels for repacked weights (Matrix.Repack
// reports false there); its products read the original blocks.
func archPacked(Level, gguf.Type) packedMulFunc { return nil }

func archVMath(Level) (swigluFunc, expShiftFunc) { return nil, nil }

func archAttn(Level) *attnKernels { return nil }

func archCvtF16(Level) (func(dst []uint16, src []float32), func(x []float32, scale float32)) {
	return nil, nil
}

func archMaxF32(Level) func([]float32) float32 { return nil }

func archLogits(Level) (func(dst, src []float32), func([]float32, float32) int) { return nil, nil }
