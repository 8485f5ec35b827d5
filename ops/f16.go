package ops

import "math"

// IEEE binary16 (F16) and bfloat16 (BF16) conversions, bit-exact with ggml's
// GGML_FP16_TO_FP32 / GGML_FP32_TO_FP16 / GGML_FP32_TO_BF16. Both formats are
// stored as raw uint16 bit patterns, the way ggml and GGUF store them.

// f16Table maps every binary16 bit pattern to its float32 value. 256 KiB,
// filled once at start (65536 cheap conversions): decoding a half is then one
// load, which matters because every quantized block starts with one.
var f16Table [1 << 16]float32

func init() {
	for i := range f16Table {
		f16Table[i] = f16ToF32Exact(uint16(i))
	}
}

// F16ToF32 converts a binary16 value to float32 (exact; every half is a float).
func F16ToF32(h uint16) float32 { return f16Table[h] }

// f16ToF32Exact decodes the bit fields directly; it fills f16Table.
func f16ToF32Exact(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch exp {
	case 0:
		// Zero or subnormal: mant * 2^-24, exact in float32.
		v := float32(mant) * 0x1p-24
		return math.Float32frombits(sign | math.Float32bits(v))
	case 0x1f:
		// Inf or NaN; the payload moves up unchanged, so a quiet NaN stays quiet.
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	default:
		// Rebias the exponent from 15 to 127.
		return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
	}
}

// F32ToF16 converts float32 to binary16 with IEEE round-to-nearest-even,
// producing subnormals and infinities the way the hardware (F16C) and ggml's
// portable C conversion do. Values at or above 65520 in magnitude become
// infinity; NaN becomes the quiet NaN 0x7e00 with the input's sign, as ggml's
// portable path makes it.
func F32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	abs := b & 0x7fffffff
	switch {
	case abs > 0x7f800000: // NaN
		return sign | 0x7e00
	case abs >= 0x477ff000: // >= 65520: halfway past the largest half (65504) or more
		return sign | 0x7c00
	case abs >= 0x38800000: // >= 2^-14: normal half
		m := abs - (127-15)<<23 // rebias; the float's low 13 mantissa bits are dropped below
		h := m >> 13
		rem := m & 0x1fff
		if rem > 0x1000 || (rem == 0x1000 && h&1 == 1) {
			h++ // a carry out of the mantissa correctly bumps the exponent
		}
		return sign | uint16(h)
	case abs < 0x33000000: // < 2^-25: below half the smallest subnormal, rounds to zero
		return sign
	default: // subnormal half: count units of 2^-24
		e := abs >> 23                // 102..112
		mf := abs&0x7fffff | 0x800000 // mantissa with its implicit bit
		shift := 126 - e              // value = mf >> shift units of 2^-24
		h := mf >> shift
		rem := mf & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rem > half || (rem == half && h&1 == 1) {
			h++ // may reach 0x400, the smallest normal, which is the right encoding
		}
		return sign | uint16(h)
	}
}

// BF16ToF32 converts a bfloat16 value to float32 (exact: BF16 is the top half
// of a float32).
func BF16ToF32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// F32ToBF16 converts float32 to bfloat16 like ggml_compute_fp32_to_bf16:
// round to nearest even (overflowing to infinity), subnormals kept, NaN made
// quiet by setting the top mantissa bit.
func F32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if b&0x7fffffff > 0x7f800000 {
		return uint16(b>>16) | 0x40
	}
	return uint16((b + 0x7fff + (b>>16)&1) >> 16)
}

// F16ToF32Slice converts src into dst[:len(src)].
func F16ToF32Slice(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = f16Table[h]
	}
}

// F32ToF16Slice converts src into dst[:len(src)].
func F32ToF16Slice(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = F32ToF16(f)
	}
}

// BF16ToF32Slice converts src into dst[:len(src)].
func BF16ToF32Slice(dst []float32, src []uint16) {
	dst = dst[:len(src)]
	for i, h := range src {
		dst[i] = BF16ToF32(h)
	}
}

// F32ToBF16Slice converts src into dst[:len(src)].
func F32ToBF16Slice(dst []uint16, src []float32) {
	dst = dst[:len(src)]
	for i, f := range src {
		dst[i] = F32ToBF16(f)
	}
}
