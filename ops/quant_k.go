package ops

import (
	"encoding/binary"
	"math"
)

// The k-quants: 256-element super-blocks with per-sub-block scales
// (ggml-common.h), and Q8_K, the activation format they are dotted with.
//
//	Q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}                  84 bytes
//	Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}             110 bytes
//	Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}                144 bytes
//	Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}     176 bytes
//	Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}               210 bytes
//	Q8_K {f32 d; i8 qs[256]; i16 bsums[16]}                          292 bytes
//
// Bit layout, for element i of a super-block:
//   - Q2_K/Q3_K: the 2 low bits are bits 2*((i%128)/32) of qs[32*(i/128) + i%32];
//     Q3_K's third bit is bit i/32 of hmask[i%32], and a clear bit means -4.
//   - Q4_K/Q5_K: 64-element groups; qs[32*(i/64) + i%32] holds the group's
//     first 32 in its low nibbles, the next 32 in the high nibbles. Q5_K's
//     fifth bit is bit i/32 of qh[i%32].
//   - Q6_K: 128-element halves; in each, ql[l] holds elements l and l+64,
//     ql[l+32] elements l+32 and l+96 (low, high nibble), and qh[l] holds the
//     2 high bits of elements l, l+32, l+64, l+96 in bits 0-1, 2-3, 4-5, 6-7.
//
// The dot products mirror ggml's generic C: integer products accumulated
// per sub-block scale into eight int32 lanes (element i goes to lane i%8),
// each lane scaled by d into its own float32 sum, the eight sums added at
// the end; the mins (Q2_K, Q4_K, Q5_K) are taken out with Q8_K's bsums.

const (
	qkK       = 256
	blockQ2_K = qkK/16 + qkK/4 + 2 + 2
	blockQ3_K = qkK/8 + qkK/4 + 12 + 2
	blockQ4_K = 2 + 2 + 12 + qkK/2
	blockQ5_K = 2 + 2 + 12 + qkK/8 + qkK/2
	blockQ6_K = qkK/2 + qkK/4 + qkK/16 + 2
	blockQ8_K = 4 + qkK + qkK/16*2
)

// q8K splits a Q8_K block into its scale, quants and per-16 sums.
func q8K(a []byte) (d float32, q8 []byte, bsums []byte) {
	a = a[:blockQ8_K]
	return getF32(a), a[4 : 4+qkK], a[4+qkK:]
}

func bsum(bsums []byte, j int) int32 { return int32(int16(binary.LittleEndian.Uint16(bsums[2*j:]))) }

// scaleMinK4 returns the 6-bit scale and min of sub-block j (0..7) of a
// Q4_K/Q5_K block (ggml's get_scale_min_k4). Bytes 0-3 hold scales 0-3 and
// bytes 4-7 mins 0-3 in their low 6 bits; bytes 8-11 hold the low 4 bits of
// scales (low nibble) and mins (high nibble) 4-7, whose top 2 bits sit in
// the top 2 bits of bytes 0-3 (scales) and 4-7 (mins).
func scaleMinK4(j int, s []byte) (sc, m uint8) {
	if j < 4 {
		return s[j] & 63, s[j+4] & 63
	}
	return s[j+4]&0xf | (s[j-4]>>6)<<4, s[j+4]>>4 | (s[j]>>6)<<4
}

// unpackScalesK4 unpacks all eight scales and mins of a Q4_K/Q5_K block.
func unpackScalesK4(s []byte) (sc, m [8]uint8) {
	for j := range 8 {
		sc[j], m[j] = scaleMinK4(j, s)
	}
	return sc, m
}

// unpackScalesQ3K unpacks the sixteen 6-bit Q3_K scales, minus their bias 32.
// Bytes 0-7 hold the low 4 bits (scales 0-7 in the low nibbles, 8-15 in the
// high nibbles); bytes 8-11 hold the top 2 bits, scale j in bits
// 2*(j/4)..2*(j/4)+1 of byte 8+j%4. (ggml does the same with kmask1/kmask2
// on three uint32 words.)
func unpackScalesQ3K(s []byte) (sc [16]int8) {
	s = s[:12]
	for j := range 16 {
		lo := s[j%8] >> (4 * (j / 8)) & 0xf
		hi := s[8+j%4] >> (2 * (j / 4)) & 3
		sc[j] = int8(lo|hi<<4) - 32
	}
	return sc
}

// ---- Q2_K

func dequantQ2_K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*blockQ2_K:][:blockQ2_K]
		y := dst[i*qkK:][:qkK]
		sc, qs := b[:16], b[16:80]
		d, dmin := getF16(b[80:]), getF16(b[82:])
		for p := 0; p < qkK; p += 16 { // one scale per 16 elements
			s := sc[p/16]
			dl, ml := d*float32(s&0xf), dmin*float32(s>>4)
			q := qs[32*(p/128)+p%32:][:16]
			shift := 2 * (p % 128 / 32)
			for l := range 16 {
				y[p+l] = float32(dl*float32(q[l]>>shift&3)) - ml
			}
		}
	}
}

func dotQ2_K(n int, w, x []byte) float32 {
	var sumf float32
	for i := range n / qkK {
		b := w[i*blockQ2_K:][:blockQ2_K]
		yd, q8, bsums := q8K(x[i*blockQ8_K:])
		sc, qs := b[:16], b[16:80]

		var summs int32
		for j := range 16 {
			summs += bsum(bsums, j) * int32(sc[j]>>4)
		}
		var isum int32
		for p := 0; p < qkK; p += 16 {
			q := qs[32*(p/128)+p%32:][:16]
			shift := 2 * (p % 128 / 32)
			var s int32
			for l := range 16 {
				s += int32(int8(q8[p+l])) * int32(q[l]>>shift&3)
			}
			isum += int32(sc[p/16]&0xf) * s
		}
		dall := yd * getF16(b[80:])
		dmin := yd * getF16(b[82:])
		sumf += float32(dall*float32(isum)) - float32(dmin*float32(summs))
	}
	return sumf
}

// ---- Q3_K

func dequantQ3_K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*blockQ3_K:][:blockQ3_K]
		y := dst[i*qkK:][:qkK]
		hm, qs := b[:32], b[32:96]
		sc := unpackScalesQ3K(b[96:108])
		d := getF16(b[108:])
		for p := 0; p < qkK; p += 16 {
			dl := d * float32(sc[p/16])
			q := qs[32*(p/128)+p%32:][:16]
			h := hm[p%32:][:16]
			shift := 2 * (p % 128 / 32)
			bit := uint(p / 32)
			for l := range 16 {
				v := int8(q[l]>>shift&3) - 4 + 4*int8(h[l]>>bit&1)
				y[p+l] = dl * float32(v)
			}
		}
	}
}

func dotQ3_K(n int, w, x []byte) float32 {
	var sums [8]float32
	for i := range n / qkK {
		b := w[i*blockQ3_K:][:blockQ3_K]
		yd, q8, _ := q8K(x[i*blockQ8_K:])
		hm, qs := b[:32], b[32:96]
		sc := unpackScalesQ3K(b[96:108])

		var aux [8]int32
		for p := 0; p < qkK; p += 16 {
			q := qs[32*(p/128)+p%32:][:16]
			h := hm[p%32:][:16]
			shift := 2 * (p % 128 / 32)
			bit := uint(p / 32)
			s := int32(sc[p/16])
			for l := range 16 {
				v := int32(q[l]>>shift&3) - 4 + 4*int32(h[l]>>bit&1)
				aux[l&7] += s * (v * int32(int8(q8[p+l])))
			}
		}
		d := getF16(b[108:]) * yd
		for l := range aux {
			sums[l] += float32(d * float32(aux[l]))
		}
	}
	var sumf float32
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// ---- Q4_K

func dequantQ4_K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*blockQ4_K:][:blockQ4_K]
		y := dst[i*qkK:][:qkK]
		d, dmin := getF16(b), getF16(b[2:])
		sc, m := unpackScalesK4(b[4:16])
		qs := b[16:][:128]
		for g := range 4 { // 64-element groups: low nibbles, then high nibbles
			q := qs[32*g:][:32]
			d1, m1 := d*float32(sc[2*g]), dmin*float32(m[2*g])
			d2, m2 := d*float32(sc[2*g+1]), dmin*float32(m[2*g+1])
			y1, y2 := y[64*g:][:32], y[64*g+32:][:32]
			for l, v := range q {
				y1[l] = float32(d1*float32(v&0xf)) - m1
				y2[l] = float32(d2*float32(v>>4)) - m2
			}
		}
	}
}

func dotQ4_K(n int, w, x []byte) float32 {
	var sums [8]float32
	var sumf float32
	for i := range n / qkK {
		b := w[i*blockQ4_K:][:blockQ4_K]
		yd, q8, bsums := q8K(x[i*blockQ8_K:])
		sc, m := unpackScalesK4(b[4:16])
		qs := b[16:][:128]

		var summ int32
		for j := range 16 {
			summ += bsum(bsums, j) * int32(m[j/2])
		}
		var aux [8]int32
		for g := range 4 {
			q := qs[32*g:][:32]
			s1, s2 := int32(sc[2*g]), int32(sc[2*g+1])
			a1, a2 := q8[64*g:][:32], q8[64*g+32:][:32]
			for l, v := range q {
				aux[l&7] += s1 * (int32(v&0xf) * int32(int8(a1[l])))
				aux[l&7] += s2 * (int32(v>>4) * int32(int8(a2[l])))
			}
		}
		d := getF16(b) * yd
		for l := range aux {
			sums[l] += float32(d * float32(aux[l]))
		}
		dmin := getF16(b[2:]) * yd
		sumf -= float32(dmin * float32(summ))
	}
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// ---- Q5_K

func dequantQ5_K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*blockQ5_K:][:blockQ5_K]
		y := dst[i*qkK:][:qkK]
		d, dmin := getF16(b), getF16(b[2:])
		sc, m := unpackScalesK4(b[4:16])
		qh, qs := b[16:48], b[48:][:128]
		for g := range 4 {
			q := qs[32*g:][:32]
			d1, m1 := d*float32(sc[2*g]), dmin*float32(m[2*g])
			d2, m2 := d*float32(sc[2*g+1]), dmin*float32(m[2*g+1])
			y1, y2 := y[64*g:][:32], y[64*g+32:][:32]
			for l, v := range q {
				h1 := qh[l] >> (2 * g) & 1
				h2 := qh[l] >> (2*g + 1) & 1
				y1[l] = float32(d1*float32(v&0xf|h1<<4)) - m1
				y2[l] = float32(d2*float32(v>>4|h2<<4)) - m2
			}
		}
	}
}

func dotQ5_K(n int, w, x []byte) float32 {
	var sums [8]float32
	var sumf float32
	for i := range n / qkK {
		b := w[i*blockQ5_K:][:blockQ5_K]
		yd, q8, bsums := q8K(x[i*blockQ8_K:])
		sc, m := unpackScalesK4(b[4:16])
		qh, qs := b[16:48], b[48:][:128]

		var summ int32
		for j := range 16 {
			summ += bsum(bsums, j) * int32(m[j/2])
		}
		var aux [8]int32
		for g := range 4 {
			q := qs[32*g:][:32]
			s1, s2 := int32(sc[2*g]), int32(sc[2*g+1])
			a1, a2 := q8[64*g:][:32], q8[64*g+32:][:32]
			for l, v := range q {
				h1 := qh[l] >> (2 * g) & 1
				h2 := qh[l] >> (2*g + 1) & 1
				aux[l&7] += s1 * (int32(v&0xf|h1<<4) * int32(int8(a1[l])))
				aux[l&7] += s2 * (int32(v>>4|h2<<4) * int32(int8(a2[l])))
			}
		}
		d := getF16(b) * yd
		for l := range aux {
			sums[l] += float32(d * float32(aux[l]))
		}
		dmin := getF16(b[2:]) * yd
		sumf -= float32(dmin * float32(summ))
	}
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// ---- Q6_K

// q6K decodes the four 6-bit quants (minus their bias 32) that share
// ql[l], ql[l+32] and qh[l] in one 128-element half: elements l, l+32, l+64
// and l+96 of that half.
func q6K(ql, qh []byte, l int) (v0, v1, v2, v3 int32) {
	lo0, lo1, hi := ql[l], ql[l+32], qh[l]
	v0 = int32(lo0&0xf|(hi&3)<<4) - 32
	v1 = int32(lo1&0xf|(hi>>2&3)<<4) - 32
	v2 = int32(lo0>>4|(hi>>4&3)<<4) - 32
	v3 = int32(lo1>>4|(hi>>6)<<4) - 32
	return
}

func dequantQ6_K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		b := src[i*blockQ6_K:][:blockQ6_K]
		d := getF16(b[208:])
		for h := range 2 {
			ql, qh, sc := b[64*h:][:64], b[128+32*h:][:32], b[192+8*h:][:8]
			y := dst[i*qkK+128*h:][:128]
			for l := range 32 {
				v0, v1, v2, v3 := q6K(ql, qh, l)
				is := l / 16 // scales go by 16 elements: l/16, +2, +4, +6
				y[l] = d * float32(int8(sc[is])) * float32(v0)
				y[l+32] = d * float32(int8(sc[is+2])) * float32(v1)
				y[l+64] = d * float32(int8(sc[is+4])) * float32(v2)
				y[l+96] = d * float32(int8(sc[is+6])) * float32(v3)
			}
		}
	}
}

func dotQ6_K(n int, w, x []byte) float32 {
	var sums [8]float32
	for i := range n / qkK {
		b := w[i*blockQ6_K:][:blockQ6_K]
		yd, q8, _ := q8K(x[i*blockQ8_K:])

		var aux [8]int32
		for h := range 2 {
			ql, qh, sc := b[64*h:][:64], b[128+32*h:][:32], b[192+8*h:][:8]
			a := q8[128*h:][:128]
			for l := range 32 {
				v0, v1, v2, v3 := q6K(ql, qh, l)
				is := l / 16
				aux[l&7] += int32(int8(sc[is]))*(v0*int32(int8(a[l]))) +
					int32(int8(sc[is+2]))*(v1*int32(int8(a[l+32]))) +
					int32(int8(sc[is+4]))*(v2*int32(int8(a[l+64]))) +
					int32(int8(sc[is+6]))*(v3*int32(int8(a[l+96])))
			}
		}
		d := getF16(b[208:]) * yd
		for l := range aux {
			sums[l] += float32(d * float32(aux[l]))
		}
	}
	var sumf float32
	for _, s := range sums {
		sumf += s
	}
	return sumf
}

// ---- Q8_K (activations)

func dequantQ8_K(dst []float32, src []byte) {
	for i := range len(dst) / qkK {
		d, q8, _ := q8K(src[i*blockQ8_K:])
		y := dst[i*qkK:][:qkK]
		for j, q := range q8 {
			y[j] = d * float32(int8(q))
		}
	}
}

// quantActQ8_K is quantize_row_q8_K_ref: the value of largest magnitude maps
// to -127 (llama.cpp changed this from -128 so IQ2_XXS could be vectorised),
// rounding is nearest_int's half-to-even, d = 1/iscale stays float32, and
// bsums holds the sum of each 16 quants for the k-quants' min terms.
func quantActQ8_K(dst []byte, src []float32) {
	for i := range len(src) / qkK {
		x := src[i*qkK:][:qkK]
		b := dst[i*blockQ8_K:][:blockQ8_K]
		var amax, vmax float32
		for _, v := range x {
			if a := abs32(v); a > amax {
				amax, vmax = a, v
			}
		}
		if amax == 0 {
			clear(b)
			continue
		}
		iscale := -127 / vmax
		q8 := b[4 : 4+qkK]
		for j, v := range x {
			q8[j] = byte(int8(min(127, nearestInt(iscale*v))))
		}
		for j := range 16 {
			var s int16
			for _, q := range q8[16*j:][:16] {
				s += int16(int8(q))
			}
			binary.LittleEndian.PutUint16(b[4+qkK+2*j:], uint16(s))
		}
		putF32(b, 1/iscale)
	}
}

// ---- k-quant weight encoders (quantize_row_<type>_ref), with their helpers
// make_qkx2_quants, make_q3_quants and make_qx_quants ported from
// ggml-quants.c. They search for a good scale (and min) per sub-block,
// quantize the sub-block scales to 4, 6 or 8 bits against a super-block
// scale, then requantize every element against its final decoded scale.

// groupMaxEps is ggml's GROUP_MAX_EPS: sub-blocks with a smaller maximum are
// treated as all zero.
const groupMaxEps = 1e-15

// makeQKX2Quants fits x ≈ scale*L - min with L in 0..nmax, minimising the
// weighted error (absolute if useMAD, else squared) over nstep+1 trial
// scales; it returns scale and min (min >= 0, stored negated).
func makeQKX2Quants(nmax int, x, weights []float32, L, Laux []uint8, rmin, rdelta float32, nstep int, useMAD bool) (scale, negMin float32) {
	n := len(x)
	lo, hi := x[0], x[0]
	sumW := weights[0]
	sumX := sumW * x[0]
	for i := 1; i < n; i++ {
		lo = min(lo, x[i])
		hi = max(hi, x[i])
		sumW += weights[i]
		sumX += float32(weights[i] * x[i])
	}
	lo = min(lo, 0)
	if hi == lo {
		clear(L[:n])
		return 0, -lo
	}
	fmax := float32(nmax)
	errOf := func(diff float32) float32 {
		if useMAD {
			return abs32(diff)
		}
		return diff * diff
	}
	iscale := fmax / (hi - lo)
	scale = 1 / iscale
	var bestErr float32
	for i := range n {
		l := min(max(nearestInt(iscale*(x[i]-lo)), 0), nmax)
		L[i] = uint8(l)
		diff := float32(scale*float32(l)) + lo - x[i]
		bestErr += float32(weights[i] * errOf(diff))
	}
	if nstep < 1 {
		return scale, -lo
	}
	for is := 0; is <= nstep; is++ {
		r := rmin + float32(rdelta*float32(is))
		iscale = (r + fmax) / (hi - lo)
		var sumL, sumL2, sumXL float32
		for i := range n {
			l := min(max(nearestInt(iscale*(x[i]-lo)), 0), nmax)
			Laux[i] = uint8(l)
			w := weights[i]
			fl := float32(l)
			sumL += float32(w * fl)
			sumL2 += float32(w * fl * fl)
			sumXL += float32(w * fl * x[i])
		}
		D := float32(sumW*sumL2) - float32(sumL*sumL)
		if D > 0 {
			thisScale := (float32(sumW*sumXL) - float32(sumX*sumL)) / D
			thisMin := (float32(sumL2*sumX) - float32(sumL*sumXL)) / D
			if thisMin > 0 {
				thisMin = 0
				thisScale = sumXL / sumL2
			}
			var curErr float32
			for i := range n {
				diff := float32(thisScale*float32(Laux[i])) + thisMin - x[i]
				curErr += float32(weights[i] * errOf(diff))
			}
			if curErr < bestErr {
				copy(L[:n], Laux[:n])
				bestErr = curErr
				scale, lo = thisScale, thisMin
			}
		}
	}
	return scale, -lo
}

// maxAbsSigned returns the value of largest magnitude in x (first wins ties)
// and that magnitude.
func maxAbsSigned(x []float32) (vmax, amax float32) {
	for _, v := range x {
		if a := abs32(v); a > amax {
			amax, vmax = a, v
		}
	}
	return vmax, amax
}

// makeQ3Quants is make_q3_quants with do_rmse: symmetric quants in
// -nmax..nmax-1 (returned biased by nmax), refined a few rounds by moving
// single elements when that improves the x²-weighted fit.
func makeQ3Quants(nmax int, x []float32, L []int8) float32 {
	n := len(x)
	vmax, amax := maxAbsSigned(x)
	if amax < groupMaxEps {
		clear(L[:n])
		return 0
	}
	iscale := -float32(nmax) / vmax
	var sumLX, sumL2 float32
	for i := range n {
		l := min(max(nearestInt(iscale*x[i]), -nmax), nmax-1)
		L[i] = int8(l)
		w := x[i] * x[i]
		sumLX += float32(w * x[i] * float32(l))
		sumL2 += float32(w * float32(l) * float32(l))
	}
	for range 5 {
		changed := 0
		for i := range n {
			w := x[i] * x[i]
			li := float32(L[i])
			slx := sumLX - float32(w*x[i]*li)
			if slx > 0 {
				sl2 := sumL2 - float32(w*li*li)
				newL := min(max(nearestInt(x[i]*sl2/slx), -nmax), nmax-1)
				if newL != int(L[i]) {
					fl := float32(newL)
					slx += float32(w * x[i] * fl)
					sl2 += float32(w * fl * fl)
					if sl2 > 0 && slx*slx*sumL2 > sumLX*sumLX*sl2 {
						L[i] = int8(newL)
						sumLX, sumL2 = slx, sl2
						changed++
					}
				}
			}
		}
		if changed == 0 {
			break
		}
	}
	for i := range n {
		L[i] += int8(nmax)
	}
	if sumL2 > 0 {
		return sumLX / sumL2
	}
	return 0
}

// makeQXQuants is make_qx_quants with rmse_type 1 and no importance weights
// (what quantize_row_q6_K_ref uses): symmetric quants in -nmax..nmax-1
// (returned biased by nmax), the best of 19 trial scales under x²-weighted
// least squares.
func makeQXQuants(nmax int, x []float32, L []int8) float32 {
	n := len(x)
	vmax, amax := maxAbsSigned(x)
	if amax < groupMaxEps {
		clear(L[:n])
		return 0
	}
	fit := func(iscale float32, store bool) (sumLX, sumL2 float32) {
		for i := range n {
			l := min(max(nearestInt(iscale*x[i]), -nmax), nmax-1)
			if store {
				L[i] = int8(l + nmax)
			}
			w := x[i] * x[i]
			fl := float32(l)
			sumLX += float32(w * x[i] * fl)
			sumL2 += float32(w * fl * fl)
		}
		return sumLX, sumL2
	}
	sumLX, sumL2 := fit(-float32(nmax)/vmax, true)
	var scale float32
	if sumL2 != 0 {
		scale = sumLX / sumL2
	}
	best := scale * sumLX
	for is := -9; is <= 9; is++ {
		if is == 0 {
			continue
		}
		iscale := -(float32(nmax) + float32(0.1*float32(is))) / vmax
		slx, sl2 := fit(iscale, false)
		if sl2 > 0 && slx*slx > best*sl2 {
			fit(iscale, true)
			scale = slx / sl2
			best = scale * slx
		}
	}
	return scale
}

// packQ2Bits packs 256 two-bit values L into the 64 qs bytes of Q2_K/Q3_K.
func packQ2Bits(qs []byte, L []uint8) {
	for h := range 2 {
		for l := range 32 {
			j := 128*h + l
			qs[32*h+l] = L[j] | L[j+32]<<2 | L[j+64]<<4 | L[j+96]<<6
		}
	}
}

func quantQ2_K(dst []byte, src []float32) {
	var L [qkK]uint8
	var weights [16]float32
	var lAux [16]uint8
	var scales, mins [16]float32
	for i := range len(src) / qkK {
		x := src[i*qkK:][:qkK]
		b := dst[i*blockQ2_K:][:blockQ2_K]
		var maxScale, maxMin float32
		for j := range 16 {
			xs := x[16*j:][:16]
			for l, v := range xs {
				weights[l] = abs32(v)
			}
			scales[j], mins[j] = makeQKX2Quants(3, xs, weights[:], L[16*j:][:16], lAux[:], -0.5, 0.1, 15, true)
			maxScale = max(maxScale, scales[j])
			maxMin = max(maxMin, mins[j])
		}
		sc := b[:16]
		clear(sc)
		// Sub-block scales and mins are 4-bit multiples of d and dmin.
		if maxScale > 0 {
			iscale := 15 / maxScale
			for j := range 16 {
				sc[j] = uint8(min(max(nearestInt(iscale*scales[j]), 0), 15))
			}
			putScaleF16(b[80:], maxScale/15)
		} else {
			putScaleF16(b[80:], 0)
		}
		if maxMin > 0 {
			iscale := 15 / maxMin
			for j := range 16 {
				sc[j] |= uint8(min(max(nearestInt(iscale*mins[j]), 0), 15)) << 4
			}
			putScaleF16(b[82:], maxMin/15)
		} else {
			putScaleF16(b[82:], 0)
		}
		d, dmin := getF16(b[80:]), getF16(b[82:])
		for j := range 16 {
			dl := d * float32(sc[j]&0xf)
			if dl == 0 {
				continue
			}
			ml := dmin * float32(sc[j]>>4)
			for l := range 16 {
				q := nearestInt((x[16*j+l] + ml) / dl)
				L[16*j+l] = uint8(min(max(q, 0), 3))
			}
		}
		packQ2Bits(b[16:80], L[:])
	}
}

func quantQ3_K(dst []byte, src []float32) {
	var L [qkK]int8
	var scales [16]float32
	var U [qkK]uint8
	for i := range len(src) / qkK {
		x := src[i*qkK:][:qkK]
		b := dst[i*blockQ3_K:][:blockQ3_K]
		var maxScale, amax float32
		for j := range 16 {
			scales[j] = makeQ3Quants(4, x[16*j:][:16], L[16*j:][:16])
			if a := abs32(scales[j]); a > amax {
				amax, maxScale = a, scales[j]
			}
		}
		sb := b[96:108]
		clear(sb)
		if maxScale != 0 {
			// The largest scale becomes -32: 6-bit signed scales, bias 32.
			iscale := -32 / maxScale
			for j := range 16 {
				l := uint8(min(max(nearestInt(iscale*scales[j]), -32), 31) + 32)
				sb[j%8] |= (l & 0xf) << (4 * (j / 8))
				sb[8+j%4] |= (l >> 4) << (2 * (j / 4))
			}
			putScaleF16(b[108:], 1/iscale)
		} else {
			putScaleF16(b[108:], 0)
		}
		d := getF16(b[108:])
		sc := unpackScalesQ3K(sb)
		for j := range 16 {
			dl := d * float32(sc[j])
			if dl == 0 {
				continue
			}
			for l := range 16 {
				q := nearestInt(x[16*j+l] / dl)
				L[16*j+l] = int8(min(max(q, -4), 3) + 4)
			}
		}
		// Bit 2 of each quant goes to hmask (bit i/32 of hmask[i%32]).
		hm := b[:32]
		clear(hm)
		for j := range qkK {
			v := uint8(L[j])
			if v > 3 {
				hm[j%32] |= 1 << (j / 32)
				v -= 4
			}
			U[j] = v
		}
		packQ2Bits(b[32:96], U[:])
	}
}

// putScalesK4 packs eight 6-bit scales and mins the way scaleMinK4 reads them.
func putScalesK4(s []byte, ls, lm *[8]uint8) {
	s = s[:12]
	for j := range 8 {
		if j < 4 {
			s[j] = ls[j]
			s[j+4] = lm[j]
		} else {
			s[j+4] = ls[j]&0xf | (lm[j]&0xf)<<4
			s[j-4] |= (ls[j] >> 4) << 6
			s[j] |= (lm[j] >> 4) << 6
		}
	}
}

// quantK4 is the common body of quantize_row_q4_K_ref and _q5_K_ref:
// per-32 scale and min from makeQKX2Quants, quantized to 6 bits against
// d = maxScale/63 and dmin = maxMin/63, then each element requantized.
func quantK4(x []float32, b []byte, L *[qkK]uint8, nmax int, rmin, rdelta float32, nstep int) {
	var weights [32]float32
	var lAux [32]uint8
	var scales, mins [8]float32
	var maxScale, maxMin float32
	for j := range 8 {
		xs := x[32*j:][:32]
		var sumX2 float32
		for _, v := range xs {
			sumX2 += float32(v * v)
		}
		avX := float32(math.Sqrt(float64(sumX2 / 32)))
		for l, v := range xs {
			weights[l] = avX + abs32(v)
		}
		scales[j], mins[j] = makeQKX2Quants(nmax, xs, weights[:], L[32*j:][:32], lAux[:], rmin, rdelta, nstep, false)
		maxScale = max(maxScale, scales[j])
		maxMin = max(maxMin, mins[j])
	}
	var invScale, invMin float32
	if maxScale > 0 {
		invScale = 63 / maxScale
	}
	if maxMin > 0 {
		invMin = 63 / maxMin
	}
	var ls, lm [8]uint8
	for j := range 8 {
		ls[j] = uint8(min(max(nearestInt(invScale*scales[j]), 0), 63))
		lm[j] = uint8(min(max(nearestInt(invMin*mins[j]), 0), 63))
	}
	putScalesK4(b[4:16], &ls, &lm)
	putScaleF16(b, maxScale/63)
	putScaleF16(b[2:], maxMin/63)

	d, dmin := getF16(b), getF16(b[2:])
	for j := range 8 {
		sc, m := scaleMinK4(j, b[4:16])
		dl := d * float32(sc)
		if dl == 0 {
			continue
		}
		ml := dmin * float32(m)
		for l := range 32 {
			q := nearestInt((x[32*j+l] + ml) / dl)
			L[32*j+l] = uint8(min(max(q, 0), nmax))
		}
	}
}

func quantQ4_K(dst []byte, src []float32) {
	var L [qkK]uint8
	for i := range len(src) / qkK {
		x := src[i*qkK:][:qkK]
		b := dst[i*blockQ4_K:][:blockQ4_K]
		quantK4(x, b, &L, 15, -1, 0.1, 20)
		qs := b[16:][:128]
		for g := range 4 {
			for l := range 32 {
				qs[32*g+l] = L[64*g+l] | L[64*g+32+l]<<4
			}
		}
	}
}

func quantQ5_K(dst []byte, src []float32) {
	var L [qkK]uint8
	for i := range len(src) / qkK {
		x := src[i*qkK:][:qkK]
		b := dst[i*blockQ5_K:][:blockQ5_K]
		quantK4(x, b, &L, 31, -0.5, 0.1, 15)
		qh, qs := b[16:48], b[48:][:128]
		clear(qh)
		for g := range 4 {
			for l := range 32 {
				l1, l2 := L[64*g+l], L[64*g+32+l]
				qh[l] |= (l1>>4)<<(2*g) | (l2>>4)<<(2*g+1)
				qs[32*g+l] = l1&0xf | (l2&0xf)<<4
			}
		}
	}
}

func quantQ6_K(dst []byte, src []float32) {
	var L [qkK]int8
	var scales [16]float32
	for i := range len(src) / qkK {
		x := src[i*qkK:][:qkK]
		b := dst[i*blockQ6_K:][:blockQ6_K]
		var maxScale, amax float32
		for j := range 16 {
			scales[j] = makeQXQuants(32, x[16*j:][:16], L[16*j:][:16])
			if a := abs32(scales[j]); a > amax {
				amax, maxScale = a, scales[j]
			}
		}
		if amax < groupMaxEps {
			clear(b)
			continue
		}
		// The largest scale becomes -128: 8-bit signed scales.
		iscale := -128 / maxScale
		putScaleF16(b[208:], 1/iscale)
		sc := b[192:208]
		for j := range 16 {
			sc[j] = byte(int8(min(max(nearestInt(iscale*scales[j]), -128), 127)))
		}
		d := getF16(b[208:])
		for j := range 16 {
			dl := d * float32(int8(sc[j]))
			if dl == 0 {
				continue
			}
			for l := range 16 {
				q := nearestInt(x[16*j+l] / dl)
				L[16*j+l] = int8(min(max(q, -32), 31) + 32)
			}
		}
		for h := range 2 {
			ql, qh := b[64*h:][:64], b[128+32*h:][:32]
			for l := range 32 {
				j := 128*h + l
				q1, q2, q3, q4 := uint8(L[j]), uint8(L[j+32]), uint8(L[j+64]), uint8(L[j+96])
				ql[l] = q1&0xf | (q3&0xf)<<4
				ql[l+32] = q2&0xf | (q4&0xf)<<4
				qh[l] = q1>>4 | (q2>>4)<<2 | (q3>>4)<<4 | (q4>>4)<<6
			}
		}
	}
}
