package ops

// The CPU quantization formats: one Kernel per weight type. The functions in
// quant*.go are the pure-Go reference (LevelGeneric, and the fallback) of
// the assembly kernels, computing the way llama.cpp's generic CPU code does;
// cpu.go switches the Kernel values to the assembly of the CPU's level.
//
// Floating-point note: Go may fuse x*y+z into one FMA on some architectures
// (arm64, ppc64, s390x, riscv64) but not on amd64. ggml's scalar C code
// rounds the product first, and a reference must give the same bits on every
// machine, so a product that feeds an addition is wrapped in an explicit
// float32(...) conversion, which the Go spec defines as a rounding point that
// prevents fusion.

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/atsinfer/ats/gguf"
)

// Kernel is how ops computes with one weight type.
//
// The functions neither allocate nor check sizes beyond Go's bounds checks:
// slices shorter than RowBytes(n) / ActRowBytes(n) make them panic.
// A *Kernel returned by KernelFor is shared; do not modify it.
type Kernel struct {
	Type    gguf.Type // weight type
	ActType gguf.Type // activation format llama.cpp pairs with it (its vec_dot_type)

	BlockSize, BlockBytes int // of Type

	// Dequantize writes len(dst) values decoded from src (len(dst) is a
	// multiple of BlockSize).
	Dequantize func(dst []float32, src []byte)

	// QuantizeAct converts n=len(src) activations into ActType format in dst
	// (ActRowBytes(n) bytes).
	QuantizeAct func(dst []byte, src []float32)

	// Dot is the dot product of one weight row (n elements, Type) with
	// activations already in ActType format, computed the way llama.cpp's
	// generic ggml_vec_dot_<type>_<acttype> does it.
	Dot func(n int, w []byte, x []byte) float32

	// mul is Dot over rows × tokens (see mulFunc); assembly levels compute
	// several tokens per pass over a weight row.
	mul mulFunc

	actBlockSize, actBlockBytes int
}

// RowBytes is the size in bytes of n weights; n must be a multiple of
// BlockSize.
func (k *Kernel) RowBytes(n int) int {
	if n%k.BlockSize != 0 {
		panic(fmt.Sprintf("ops: %d elements of %s: not a multiple of the block size %d", n, k.Type, k.BlockSize))
	}
	return n / k.BlockSize * k.BlockBytes
}

// ActRowBytes is the size in bytes of n activations in ActType; n must be a
// multiple of BlockSize (which is also a multiple of the activation block).
func (k *Kernel) ActRowBytes(n int) int {
	if n%k.actBlockSize != 0 {
		panic(fmt.Sprintf("ops: %d activations in %s: not a multiple of the block size %d", n, k.ActType, k.actBlockSize))
	}
	return n / k.actBlockSize * k.actBlockBytes
}

// codec is the encoder and decoder of one storage format. Weight formats and
// the activation-only formats Q8_1 and Q8_K all have one.
type codec struct {
	dequant func(dst []float32, src []byte)
	quant   func(dst []byte, src []float32)
}

var codecs = map[gguf.Type]codec{
	gguf.TypeF32:  {dequantF32, quantF32},
	gguf.TypeF16:  {dequantF16, quantF16},
	gguf.TypeBF16: {dequantBF16, quantBF16},
	gguf.TypeQ4_0: {dequantQ4_0, quantQ4_0},
	gguf.TypeQ4_1: {dequantQ4_1, quantQ4_1},
	gguf.TypeQ5_0: {dequantQ5_0, quantQ5_0},
	gguf.TypeQ5_1: {dequantQ5_1, quantQ5_1},
	gguf.TypeQ8_0: {dequantQ8_0, quantQ8_0},
	gguf.TypeQ8_1: {dequantQ8_1, quantActQ8_1},
	gguf.TypeQ2_K: {dequantQ2_K, quantQ2_K},
	gguf.TypeQ3_K: {dequantQ3_K, quantQ3_K},
	gguf.TypeQ4_K: {dequantQ4_K, quantQ4_K},
	gguf.TypeQ5_K: {dequantQ5_K, quantQ5_K},
	gguf.TypeQ6_K: {dequantQ6_K, quantQ6_K},
	gguf.TypeQ8_K: {dequantQ8_K, quantActQ8_K},
}

// actQuantizers are llama.cpp's from_float for each vec_dot_type. They
// differ from the weight encoders only in that they write half-precision
// scales without saturating (see putScaleF16), as llama.cpp does.
var actQuantizers = map[gguf.Type]func(dst []byte, src []float32){
	gguf.TypeF32:  quantF32,
	gguf.TypeF16:  quantF16,
	gguf.TypeBF16: quantBF16,
	gguf.TypeQ8_0: quantActQ8_0,
	gguf.TypeQ8_1: quantActQ8_1,
	gguf.TypeQ8_K: quantActQ8_K,
}

// kernelSpecs pairs each weight type with its vec_dot_type and dot product,
// in type-id order (the order SupportedTypes reports).
var kernelSpecs = []struct {
	t, act gguf.Type
	dot    func(n int, w, x []byte) float32
}{
	{gguf.TypeF32, gguf.TypeF32, dotF32},
	{gguf.TypeF16, gguf.TypeF16, dotF16},
	{gguf.TypeQ4_0, gguf.TypeQ8_0, dotQ4_0},
	{gguf.TypeQ4_1, gguf.TypeQ8_1, dotQ4_1},
	{gguf.TypeQ5_0, gguf.TypeQ8_0, dotQ5_0},
	{gguf.TypeQ5_1, gguf.TypeQ8_1, dotQ5_1},
	{gguf.TypeQ8_0, gguf.TypeQ8_0, dotQ8_0},
	{gguf.TypeQ2_K, gguf.TypeQ8_K, dotQ2_K},
	{gguf.TypeQ3_K, gguf.TypeQ8_K, dotQ3_K},
	{gguf.TypeQ4_K, gguf.TypeQ8_K, dotQ4_K},
	{gguf.TypeQ5_K, gguf.TypeQ8_K, dotQ5_K},
	{gguf.TypeQ6_K, gguf.TypeQ8_K, dotQ6_K},
	{gguf.TypeBF16, gguf.TypeBF16, dotBF16},
}

var kernels = buildKernels()

func buildKernels() map[gguf.Type]*Kernel {
	m := make(map[gguf.Type]*Kernel, len(kernelSpecs))
	for _, s := range kernelSpecs {
		info, ok := s.t.Info()
		actInfo, ok2 := s.act.Info()
		if !ok || !ok2 {
			panic("ops: kernel for a type missing from the gguf type table: " + s.t.String())
		}
		m[s.t] = &Kernel{
			Type:          s.t,
			ActType:       s.act,
			BlockSize:     info.BlockSize,
			BlockBytes:    info.BlockBytes,
			Dequantize:    codecs[s.t].dequant,
			QuantizeAct:   actQuantizers[s.act],
			Dot:           s.dot,
			mul:           genericImpl(s.t).mul,
			actBlockSize:  actInfo.BlockSize,
			actBlockBytes: actInfo.BlockBytes,
		}
	}
	return m
}

// KernelFor returns the kernel for weight type t.
func KernelFor(t gguf.Type) (*Kernel, error) {
	if k, ok := kernels[t]; ok {
		return k, nil
	}
	return nil, fmt.Errorf("ops: no CPU kernel for ggml type %s; supported: %s", t, supportedList())
}

// SupportedTypes lists the weight types that have a kernel, in type-id order.
func SupportedTypes() []gguf.Type {
	out := make([]gguf.Type, len(kernelSpecs))
	for i, s := range kernelSpecs {
		out[i] = s.t
	}
	return out
}

func supportedList() string {
	names := make([]string, len(kernelSpecs))
	for i, s := range kernelSpecs {
		names[i] = s.t.String()
	}
	return strings.Join(names, ", ")
}

// codecFor finds the codec of t and checks that n values of it are whole
// blocks; it returns the byte size of those n values.
func codecFor(op string, t gguf.Type, n int) (codec, int, error) {
	c, ok := codecs[t]
	if !ok {
		return codec{}, 0, fmt.Errorf("ops: %s: unsupported type %s; supported: %s, and the activation formats Q8_1, Q8_K", op, t, supportedList())
	}
	info, _ := t.Info()
	if n%info.BlockSize != 0 {
		return codec{}, 0, fmt.Errorf("ops: %s %s: %d values is not a multiple of the block size %d", op, t, n, info.BlockSize)
	}
	return c, n / info.BlockSize * info.BlockBytes, nil
}

// Quantize encodes src as type t into dst (at least the row size of
// len(src) values), like llama.cpp's quantize_row_<type>_ref. It accepts
// every supported weight type and the activation formats Q8_1 and Q8_K.
//
// Half-precision block scales that would overflow are stored as ±65504
// instead of infinity, so rows with values beyond the range a format can
// scale still decode to finite numbers; within range the output matches
// llama.cpp's reference quantizers.
func Quantize(t gguf.Type, dst []byte, src []float32) error {
	c, size, err := codecFor("quantize", t, len(src))
	if err != nil {
		return err
	}
	if len(dst) < size {
		return fmt.Errorf("ops: quantize %s: %d values need %d bytes, dst has %d", t, len(src), size, len(dst))
	}
	c.quant(dst[:size], src)
	return nil
}

// DequantizeRow decodes len(dst) values of type t from src.
func DequantizeRow(t gguf.Type, dst []float32, src []byte) error {
	c, size, err := codecFor("dequantize", t, len(dst))
	if err != nil {
		return err
	}
	if len(src) < size {
		return fmt.Errorf("ops: dequantize %s: %d values need %d bytes, src has %d", t, len(dst), size, len(src))
	}
	c.dequant(dst, src[:size])
	return nil
}

// Little-endian field access shared by the formats.

func getF16(b []byte) float32 { return f16Table[binary.LittleEndian.Uint16(b)] }

func getF32(b []byte) float32 { return math.Float32frombits(binary.LittleEndian.Uint32(b)) }

func putF32(b []byte, f float32) { binary.LittleEndian.PutUint32(b, math.Float32bits(f)) }

// putF16 stores f as a half exactly as GGML_FP32_TO_FP16 would.
func putF16(b []byte, f float32) { binary.LittleEndian.PutUint16(b, F32ToF16(f)) }

// putScaleF16 stores a weight block's scale, saturating at ±65504 where
// GGML_FP32_TO_FP16 would give infinity (see Quantize).
func putScaleF16(b []byte, f float32) {
	h := F32ToF16(f)
	if h&0x7fff == 0x7c00 {
		h = h&0x8000 | 0x7bff
	}
	binary.LittleEndian.PutUint16(b, h)
}

// nearestInt rounds half to even, as ggml's nearest_int does (it adds
// 1.5*2^23 in float32, valid for |f| < 2^22). Out-of-range and NaN inputs,
// undefined in C, are clamped so that callers' own clamps then apply.
func nearestInt(f float32) int {
	switch {
	case f != f:
		return 0
	case f > 1<<30:
		return 1 << 30
	case f < -(1 << 30):
		return -(1 << 30)
	}
	return int(math.RoundToEven(float64(f)))
}

// roundAwayInt8 rounds half away from zero, like C's roundf, clamped to
// int8. In float64, |f| + 0.5 is exact wherever it matters, so truncation
// then rounds correctly.
func roundAwayInt8(f float32) int8 {
	v := float64(f)
	switch {
	case v >= 127:
		return 127
	case v <= -128:
		return -128
	case v >= 0:
		return int8(v + 0.5)
	case v < 0:
		return -int8(-v + 0.5)
	}
	return 0 // NaN
}

// truncClamp converts like C's (int)(f) (truncation toward zero) and then
// clamps to [0, hi]; the legacy quantizers add 0.5 or 8.5 first to round.
func truncClamp(f float32, hi int) uint8 {
	if !(f > 0) { // also NaN
		return 0
	}
	if f >= float32(hi) {
		return uint8(hi)
	}
	return uint8(int(f))
}

func abs32(f float32) float32 { return math.Float32frombits(math.Float32bits(f) &^ (1 << 31)) }
