package ops

import (
	"fmt"
	"os"
	"strings"
	"sync"

	"github.com/atsinfer/ats/gguf"
)

// Level is a set of CPU instructions that kernels may use. Each weight type
// has a pure-Go kernel (LevelGeneric, the reference) and, where it pays, an
// assembly kernel per level; the best level this CPU supports is chosen at
// start, from github.com/klauspost/cpuid/v2, unless ATS_CPU names another.
type Level uint8

const (
	LevelGeneric    Level = iota // pure Go, every platform (and -tags noasm)
	LevelAVX2                    // amd64: AVX2, FMA, F16C
	LevelAVXVNNI                 // amd64: AVX2 with AVX-VNNI (VEX VPDPBUSD on YMM) for the integer dots
	LevelAVX512                  // amd64: AVX-512 F, BW, VL, DQ (plus AVX2's)
	LevelAVX512VNNI              // amd64: AVX-512 with VNNI (VPDPBUSD)
	LevelNEON                    // arm64: Advanced SIMD (Q8_0, Q4_0, Q4_K, Q6_K dots; SDOT where present)
)

var levelNames = [...]string{"generic", "avx2", "avxvnni", "avx512", "avx512vnni", "neon"}

func (l Level) String() string {
	if int(l) < len(levelNames) {
		return levelNames[l]
	}
	return fmt.Sprintf("Level(%d)", l)
}

// ParseLevel reads a level name as ATS_CPU takes it.
func ParseLevel(s string) (Level, error) {
	for i, n := range levelNames {
		if strings.EqualFold(s, n) {
			return Level(i), nil
		}
	}
	return 0, fmt.Errorf("unknown CPU level %q (want one of %s)", s, strings.Join(levelNames[:], ", "))
}

// EnvCPU is the environment variable that forces a CPU level, for tests and
// for working around a kernel bug: ATS_CPU=generic|avx2|avxvnni|avx512|avx512vnni|neon.
const EnvCPU = "ATS_CPU"

// SupportedLevels lists the levels this build can run on this CPU, from
// generic up to the best.
func SupportedLevels() []Level { return append([]Level(nil), archLevels...) }

func levelSupported(l Level) bool {
	for _, s := range archLevels {
		if s == l {
			return true
		}
	}
	return false
}

var (
	levelMu     sync.Mutex
	activeLevel = LevelGeneric
	envNote     string // why ATS_CPU was not honoured, if it was not
)

// CPUKernels names the kernels in use: the level, and "+amx" where the
// products over repacked Q4_K and Q6_K weights of many tokens use AMX
// tiles.
func CPUKernels() string {
	if CPULevel() == LevelAVX512VNNI && amxTiles() {
		return CPULevel().String() + "+amx"
	}
	return CPULevel().String()
}

// CPULevel is the level whose kernels are in use.
func CPULevel() Level {
	levelMu.Lock()
	defer levelMu.Unlock()
	return activeLevel
}

// CPUNote explains, when ATS_CPU was set to a level this CPU or build cannot
// run, what was used instead; it is empty otherwise.
func CPUNote() string { return envNote }

// SetCPULevel switches every Kernel to the kernels of level l. It changes
// the shared Kernel values, so call it before computing starts (start-up,
// tests, benchmarks), never while kernels run.
func SetCPULevel(l Level) error {
	if !levelSupported(l) {
		return fmt.Errorf("ops: CPU level %s is not available here (have %v)", l, archLevels)
	}
	levelMu.Lock()
	defer levelMu.Unlock()
	for _, k := range kernels {
		im := implFor(l, k.Type)
		k.Dot, k.QuantizeAct, k.mul = im.dot, im.quantAct, im.mul
	}
	setPackedLevel(l)
	f16Rows, f16Axpy = rowsF16Generic, axpyF16Generic
	attnKernelsActive = attnKernelsGeneric
	swigluKernel, expShiftKernel = swigluGeneric, nil
	cvtF16Kernel, scaleRoundF16Kernel = F32ToF16Slice, nil
	maxF32Kernel = maxF32Generic
	sanitizeKernel, firstAboveKernel = sanitizeGeneric, firstAboveGeneric
	if l != LevelGeneric {
		if sa, fa := archLogits(l); sa != nil {
			sanitizeKernel, firstAboveKernel = sa, fa
		}
		if mx := archMaxF32(l); mx != nil {
			maxF32Kernel = mx
		}
		if cv, sr := archCvtF16(l); cv != nil {
			cvtF16Kernel, scaleRoundF16Kernel = cv, sr
		}
		if d, a := archFloat(l); d != nil {
			f16Rows, f16Axpy = d, a
		}
		if k := archAttn(l); k != nil {
			attnKernelsActive = *k
		}
		if sw, ex := archVMath(l); sw != nil {
			swigluKernel, expShiftKernel = sw, ex
		}
	}
	activeLevel = l
	return nil
}

// rowsFunc computes out[t*ldOut+r] = Σ_i w_r[i]·x_t[i] over n elements,
// rows w_r ws bytes apart and tokens x_t xs bytes apart (F16 here).
type rowsFunc func(n int, w []byte, ws, rows int, x []byte, xs, nTok int, out []float32, ldOut int)

// axpyFunc adds Σ_j p[j]·v_j to out[:cols] for the f16 rows v_j = v[j*vs:],
// each term added in row order.
type axpyFunc func(p []float32, v []byte, vs int, cols int, out []float32)

// The attention's kernels at the active level (set by SetCPULevel).
var (
	// cvtF16Kernel converts float32 to f16 for the KV cache and the query:
	// F32ToF16Slice, or the hardware conversion, which differs only in the
	// payload of NaNs.
	cvtF16Kernel = F32ToF16Slice

	f16Rows rowsFunc = rowsF16Generic
	f16Axpy axpyFunc = axpyF16Generic
)

// rowsF16Generic is the reference of the strided F16 row products: dotF16
// on each pair.
func rowsF16Generic(n int, w []byte, ws, rows int, x []byte, xs, nTok int, out []float32, ldOut int) {
	for t := 0; t < nTok; t++ {
		xt := x[t*xs : t*xs+2*n]
		for r := 0; r < rows; r++ {
			out[t*ldOut+r] = dotF16(n, w[r*ws:r*ws+2*n], xt)
		}
	}
}

// axpyF16Generic is the reference of the value accumulation: for each row
// in order, out[i] += p[j]·v_j[i], the product rounded before the sum.
func axpyF16Generic(p []float32, v []byte, vs int, cols int, out []float32) {
	out = out[:cols]
	for j, pj := range p {
		row := v[j*vs : j*vs+2*cols]
		for i := range out {
			out[i] += float32(pj * f16Table[uint16(row[2*i])|uint16(row[2*i+1])<<8])
		}
	}
}

func init() {
	best := archLevels[len(archLevels)-1]
	l := best
	if env := os.Getenv(EnvCPU); env != "" {
		switch want, err := ParseLevel(env); {
		case err != nil:
			envNote = fmt.Sprintf("%s=%s: %v; using %s", EnvCPU, env, err, best)
		case !levelSupported(want):
			envNote = fmt.Sprintf("%s=%s: not available on this CPU or build (have %v); using %s", EnvCPU, env, archLevels, best)
		default:
			l = want
		}
	}
	if err := SetCPULevel(l); err != nil {
		panic(err)
	}
}

// impl is one level's implementation of a weight type: the dot product of
// one row, the row×token product, and the activation quantizer.
type impl struct {
	dot      func(n int, w, x []byte) float32
	mul      mulFunc
	quantAct func(dst []byte, src []float32)
}

// mulFunc computes out[t*ldOut+r] = row r of w · token t of x for r < rows
// and t < nTok: rows of n weights, rb bytes each, back to back in w;
// tokens of quantized activations ab bytes apart in x.
type mulFunc func(n int, w []byte, rb, rows int, x []byte, ab, nTok int, out []float32, ldOut int)

// implFor returns level l's implementation of weight type t, falling back
// to the generic one for anything l does not accelerate.
func implFor(l Level, t gguf.Type) impl {
	g := genericImpl(t)
	if l == LevelGeneric {
		return g
	}
	a := archImpl(l, t)
	if a.dot == nil {
		a.dot = g.dot
	}
	if a.mul == nil {
		a.mul = g.mul
	}
	if a.quantAct == nil {
		a.quantAct = g.quantAct
	}
	return a
}

// genericImpl is the pure-Go reference of weight type t.
func genericImpl(t gguf.Type) impl {
	for _, s := range kernelSpecs {
		if s.t == t {
			dot := s.dot
			return impl{
				dot:      dot,
				quantAct: actQuantizers[s.act],
				mul: func(n int, w []byte, rb, rows int, x []byte, ab, nTok int, out []float32, ldOut int) {
					for r := 0; r < rows; r++ {
						wr := w[r*rb : (r+1)*rb]
						for t := 0; t < nTok; t++ {
							out[t*ldOut+r] = dot(n, wr, x[t*ab:(t+1)*ab])
						}
					}
				},
			}
		}
	}
	panic("ops: no generic kernel for " + t.String())
}
