package ops

import "encoding/binary"

// The legacy 32-element block formats (ggml-common.h):
//
//	Q4_0 {f16 d; u8 qs[16]}              x = d*(q-8)
//	Q4_1 {f16 d; f16 m; u8 qs[16]}       x = d*q + m
//	Q5_0 {f16 d; u8 qh[4]; u8 qs[16]}    x = d*(q-16)
//	Q5_1 {f16 d; f16 m; u8 qh[4]; qs[16]} x = d*q + m
//	Q8_0 {f16 d; i8 qs[32]}              x = d*q
//	Q8_1 {f16 d; f16 s; i8 qs[32]}       x = d*q, s = d*sum(q) (activations)
//
// In the 4-bit formats byte j holds element j in its low nibble and element
// j+16 in its high nibble. The 5-bit formats keep the fifth bit of element i
// in bit i of the little-endian uint32 qh.

const (
	qk        = 32 // elements per legacy block
	blockQ4_0 = 2 + qk/2
	blockQ4_1 = 4 + qk/2
	blockQ5_0 = 2 + 4 + qk/2
	blockQ5_1 = 4 + 4 + qk/2
	blockQ8_0 = 2 + qk
	blockQ8_1 = 4 + qk
)

// ---- Q4_0

func dequantQ4_0(dst []float32, src []byte) {
	for i := range len(dst) / qk {
		b := src[i*blockQ4_0:][:blockQ4_0]
		y := dst[i*qk:][:qk]
		d := getF16(b)
		qs := b[2:][:16]
		for j, q := range qs {
			y[j] = float32(int(q&0xf)-8) * d
			y[j+16] = float32(int(q>>4)-8) * d
		}
	}
}

// quantQ4_0 is quantize_row_q4_0_ref: the value of largest magnitude maps
// to -8 exactly, the rest round (by +8.5 and truncation) into 0..15.
func quantQ4_0(dst []byte, src []float32) {
	for i := range len(src) / qk {
		x := src[i*qk:][:qk]
		b := dst[i*blockQ4_0:][:blockQ4_0]
		var amax, vmax float32
		for _, v := range x {
			if a := abs32(v); a > amax {
				amax, vmax = a, v
			}
		}
		d := vmax / -8
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putScaleF16(b, d)
		for j := range 16 {
			lo := truncClamp(float32(x[j]*id)+8.5, 15)
			hi := truncClamp(float32(x[j+16]*id)+8.5, 15)
			b[2+j] = lo | hi<<4
		}
	}
}

func dotQ4_0(n int, w, x []byte) float32 {
	var sumf float32
	for i := range n / qk {
		b := w[i*blockQ4_0:][:blockQ4_0]
		a := x[i*blockQ8_0:][:blockQ8_0]
		qs, q8 := b[2:][:16], a[2:][:32]
		var s0, s1 int32
		for j, q := range qs {
			s0 += (int32(q&0xf) - 8) * int32(int8(q8[j]))
			s1 += (int32(q>>4) - 8) * int32(int8(q8[j+16]))
		}
		sumf += float32(float32(s0+s1) * getF16(b) * getF16(a))
	}
	return sumf
}

// ---- Q4_1

func dequantQ4_1(dst []float32, src []byte) {
	for i := range len(dst) / qk {
		b := src[i*blockQ4_1:][:blockQ4_1]
		y := dst[i*qk:][:qk]
		d, m := getF16(b), getF16(b[2:])
		for j, q := range b[4:][:16] {
			y[j] = float32(float32(q&0xf)*d) + m
			y[j+16] = float32(float32(q>>4)*d) + m
		}
	}
}

// quantQ4_1 is quantize_row_q4_1_ref: min and max span 0..15.
func quantQ4_1(dst []byte, src []float32) {
	for i := range len(src) / qk {
		x := src[i*qk:][:qk]
		b := dst[i*blockQ4_1:][:blockQ4_1]
		vmin, vmax := minMax(x)
		d := (vmax - vmin) / 15
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putScaleF16(b, d)
		putScaleF16(b[2:], vmin)
		for j := range 16 {
			lo := truncClamp(float32((x[j]-vmin)*id)+0.5, 15)
			hi := truncClamp(float32((x[j+16]-vmin)*id)+0.5, 15)
			b[4+j] = lo | hi<<4
		}
	}
}

func dotQ4_1(n int, w, x []byte) float32 {
	var sumf float32
	for i := range n / qk {
		b := w[i*blockQ4_1:][:blockQ4_1]
		a := x[i*blockQ8_1:][:blockQ8_1]
		qs, q8 := b[4:][:16], a[4:][:32]
		var s0, s1 int32
		for j, q := range qs {
			s0 += int32(q&0xf) * int32(int8(q8[j]))
			s1 += int32(q>>4) * int32(int8(q8[j+16]))
		}
		dd := getF16(b) * getF16(a)
		sumf += float32(dd*float32(s0+s1)) + float32(getF16(b[2:])*getF16(a[2:]))
	}
	return sumf
}

// ---- Q5_0

func dequantQ5_0(dst []float32, src []byte) {
	for i := range len(dst) / qk {
		b := src[i*blockQ5_0:][:blockQ5_0]
		y := dst[i*qk:][:qk]
		d := getF16(b)
		qh := binary.LittleEndian.Uint32(b[2:])
		for j, q := range b[6:][:16] {
			x0 := int32(q&0xf) | int32(qh>>j&1)<<4
			x1 := int32(q>>4) | int32(qh>>(j+16)&1)<<4
			y[j] = float32(x0-16) * d
			y[j+16] = float32(x1-16) * d
		}
	}
}

// quantQ5_0 is quantize_row_q5_0_ref: like Q4_0 with -16..15.
func quantQ5_0(dst []byte, src []float32) {
	for i := range len(src) / qk {
		x := src[i*qk:][:qk]
		b := dst[i*blockQ5_0:][:blockQ5_0]
		var amax, vmax float32
		for _, v := range x {
			if a := abs32(v); a > amax {
				amax, vmax = a, v
			}
		}
		d := vmax / -16
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putScaleF16(b, d)
		var qh uint32
		for j := range 16 {
			lo := truncClamp(float32(x[j]*id)+16.5, 31)
			hi := truncClamp(float32(x[j+16]*id)+16.5, 31)
			b[6+j] = lo&0xf | (hi&0xf)<<4
			qh |= uint32(lo>>4) << j
			qh |= uint32(hi>>4) << (j + 16)
		}
		binary.LittleEndian.PutUint32(b[2:], qh)
	}
}

func dotQ5_0(n int, w, x []byte) float32 {
	var sumf float32
	for i := range n / qk {
		b := w[i*blockQ5_0:][:blockQ5_0]
		a := x[i*blockQ8_0:][:blockQ8_0]
		qh := binary.LittleEndian.Uint32(b[2:])
		qs, q8 := b[6:][:16], a[2:][:32]
		var s0, s1 int32
		for j, q := range qs {
			x0 := int32(q&0xf) | int32(qh>>j&1)<<4 - 16
			x1 := int32(q>>4) | int32(qh>>(j+16)&1)<<4 - 16
			s0 += x0 * int32(int8(q8[j]))
			s1 += x1 * int32(int8(q8[j+16]))
		}
		sumf += float32(getF16(b) * getF16(a) * float32(s0+s1))
	}
	return sumf
}

// ---- Q5_1

func dequantQ5_1(dst []float32, src []byte) {
	for i := range len(dst) / qk {
		b := src[i*blockQ5_1:][:blockQ5_1]
		y := dst[i*qk:][:qk]
		d, m := getF16(b), getF16(b[2:])
		qh := binary.LittleEndian.Uint32(b[4:])
		for j, q := range b[8:][:16] {
			x0 := int32(q&0xf) | int32(qh>>j&1)<<4
			x1 := int32(q>>4) | int32(qh>>(j+16)&1)<<4
			y[j] = float32(float32(x0)*d) + m
			y[j+16] = float32(float32(x1)*d) + m
		}
	}
}

// quantQ5_1 is quantize_row_q5_1_ref: min and max span 0..31.
func quantQ5_1(dst []byte, src []float32) {
	for i := range len(src) / qk {
		x := src[i*qk:][:qk]
		b := dst[i*blockQ5_1:][:blockQ5_1]
		vmin, vmax := minMax(x)
		d := (vmax - vmin) / 31
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putScaleF16(b, d)
		putScaleF16(b[2:], vmin)
		var qh uint32
		for j := range 16 {
			lo := truncClamp(float32((x[j]-vmin)*id)+0.5, 31)
			hi := truncClamp(float32((x[j+16]-vmin)*id)+0.5, 31)
			b[8+j] = lo&0xf | (hi&0xf)<<4
			qh |= uint32(lo>>4) << j
			qh |= uint32(hi>>4) << (j + 16)
		}
		binary.LittleEndian.PutUint32(b[4:], qh)
	}
}

func dotQ5_1(n int, w, x []byte) float32 {
	var sumf float32
	for i := range n / qk {
		b := w[i*blockQ5_1:][:blockQ5_1]
		a := x[i*blockQ8_1:][:blockQ8_1]
		qh := binary.LittleEndian.Uint32(b[4:])
		qs, q8 := b[8:][:16], a[4:][:32]
		var s0, s1 int32
		for j, q := range qs {
			x0 := int32(q&0xf) | int32(qh>>j&1)<<4
			x1 := int32(q>>4) | int32(qh>>(j+16)&1)<<4
			s0 += x0 * int32(int8(q8[j]))
			s1 += x1 * int32(int8(q8[j+16]))
		}
		dd := getF16(b) * getF16(a)
		sumf += float32(dd*float32(s0+s1)) + float32(getF16(b[2:])*getF16(a[2:]))
	}
	return sumf
}

// ---- Q8_0 (weights and activations)

func dequantQ8_0(dst []float32, src []byte) {
	for i := range len(dst) / qk {
		b := src[i*blockQ8_0:][:blockQ8_0]
		y := dst[i*qk:][:qk]
		d := getF16(b)
		for j, q := range b[2:][:qk] {
			y[j] = float32(int8(q)) * d
		}
	}
}

// quantQ8_0 encodes Q8_0 weights (saturating scales, see Quantize).
func quantQ8_0(dst []byte, src []float32) { q8_0(dst, src, putScaleF16) }

// quantActQ8_0 is quantize_row_q8_0 for activations.
func quantActQ8_0(dst []byte, src []float32) { q8_0(dst, src, putF16) }

// q8_0 is quantize_row_q8_0_ref: d = amax/127 and q = roundf(x/d), where
// roundf rounds halves away from zero (unlike nearest_int in the k-quants).
func q8_0(dst []byte, src []float32, putScale func([]byte, float32)) {
	for i := range len(src) / qk {
		x := src[i*qk:][:qk]
		b := dst[i*blockQ8_0:][:blockQ8_0]
		amax := absMax(x)
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putScale(b, d)
		for j, v := range x {
			b[2+j] = byte(roundAwayInt8(v * id))
		}
	}
}

func dotQ8_0(n int, w, x []byte) float32 {
	var sumf float32
	for i := range n / qk {
		b := w[i*blockQ8_0:][:blockQ8_0]
		a := x[i*blockQ8_0:][:blockQ8_0]
		qs, q8 := b[2:][:qk], a[2:][:qk]
		var s int32
		for j, q := range qs {
			s += int32(int8(q)) * int32(int8(q8[j]))
		}
		sumf += float32(float32(s) * (getF16(b) * getF16(a)))
	}
	return sumf
}

// ---- Q8_1 (activations only)

func dequantQ8_1(dst []float32, src []byte) {
	for i := range len(dst) / qk {
		b := src[i*blockQ8_1:][:blockQ8_1]
		y := dst[i*qk:][:qk]
		d := getF16(b)
		for j, q := range b[4:][:qk] {
			y[j] = float32(int8(q)) * d
		}
	}
}

// quantActQ8_1 is quantize_row_q8_1_ref: Q8_0's rounding plus s = sum(q)*d,
// with d the float32 scale before it is rounded to half.
func quantActQ8_1(dst []byte, src []float32) {
	for i := range len(src) / qk {
		x := src[i*qk:][:qk]
		b := dst[i*blockQ8_1:][:blockQ8_1]
		amax := absMax(x)
		d := amax / 127
		var id float32
		if d != 0 {
			id = 1 / d
		}
		putF16(b, d)
		var sum int32
		for j, v := range x {
			q := roundAwayInt8(v * id)
			b[4+j] = byte(q)
			sum += int32(q)
		}
		putF16(b[2:], float32(sum)*d)
	}
}

// absMax is the largest |x[i]|, folded like ggml's MAX(amax, fabsf(v)).
func absMax(x []float32) float32 {
	var amax float32
	for _, v := range x {
		if a := abs32(v); !(amax > a) {
			amax = a
		}
	}
	return amax
}

func minMax(x []float32) (lo, hi float32) {
	lo, hi = x[0], x[0]
	for _, v := range x[1:] {
		lo = min(lo, v)
		hi = max(hi, v)
	}
	return lo, hi
}
