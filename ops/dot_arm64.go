//go:build !noasm

package ops

import (
	"encoding/binary"
	"math"
)

// arm64 NEON kernels. The assembly (dot_arm64.s, hand-written) computes the
// exact integer dot product of each block; the float scaling below repeats
// the generic Go code (quant_legacy.go, quant_k.go) expression for expression, so the
// results are bit-identical to LevelGeneric. The F32 and F16 dots form the
// same float32 products as the generic ones but sum them in float64 lanes, in
// another order (so they agree to float64 rounding, not bit for bit).

// The blockSums functions compute sums[i] = the int32 dot product of the
// quants of block i of w and x, for i < nb; NEON uses SMULL/SADALP, SDOT the
// dot-product extension. The caller guarantees the sizes. They are called
// directly, never through a func value, so that sums stays on the stack.

//go:noescape
func blockSumsQ80NEON(w, x *byte, nb int, sums *int32)

//go:noescape
func blockSumsQ80SDOT(w, x *byte, nb int, sums *int32)

//go:noescape
func blockSumsQ40NEON(w, x *byte, nb int, sums *int32)

//go:noescape
func blockSumsQ40SDOT(w, x *byte, nb int, sums *int32)

// neonChunk is how many blocks' sums are computed per assembly call (on the
// stack: the kernels do not allocate).
const neonChunk = 64

// dotQ8_0With is dotQ8_0 with the block sums from the assembly (SDOT if sdot).
func dotQ8_0With(sdot bool, n int, w, x []byte) float32 {
	nb := n / qk
	checkLen(w, nb*blockQ8_0)
	checkLen(x, nb*blockQ8_0)
	var sums [neonChunk]int32
	var sumf float32
	for i := 0; i < nb; i += neonChunk {
		c := min(neonChunk, nb-i)
		if sdot {
			blockSumsQ80SDOT(&w[i*blockQ8_0], &x[i*blockQ8_0], c, &sums[0])
		} else {
			blockSumsQ80NEON(&w[i*blockQ8_0], &x[i*blockQ8_0], c, &sums[0])
		}
		for j, s := range sums[:c] {
			b := w[(i+j)*blockQ8_0:]
			a := x[(i+j)*blockQ8_0:]
			sumf += float32(float32(s) * (getF16(b) * getF16(a)))
		}
	}
	return sumf
}

// dotQ4_0With is dotQ4_0 with the block sums (s0+s1) from the assembly.
func dotQ4_0With(sdot bool, n int, w, x []byte) float32 {
	nb := n / qk
	checkLen(w, nb*blockQ4_0)
	checkLen(x, nb*blockQ8_0)
	var sums [neonChunk]int32
	var sumf float32
	for i := 0; i < nb; i += neonChunk {
		c := min(neonChunk, nb-i)
		if sdot {
			blockSumsQ40SDOT(&w[i*blockQ4_0], &x[i*blockQ8_0], c, &sums[0])
		} else {
			blockSumsQ40NEON(&w[i*blockQ4_0], &x[i*blockQ8_0], c, &sums[0])
		}
		for j, s := range sums[:c] {
			b := w[(i+j)*blockQ4_0:]
			a := x[(i+j)*blockQ8_0:]
			sumf += float32(float32(s) * getF16(b) * getF16(a))
		}
	}
	return sumf
}

func dotQ8_0NEON(n int, w, x []byte) float32 { return dotQ8_0With(false, n, w, x) }
func dotQ8_0SDOT(n int, w, x []byte) float32 { return dotQ8_0With(true, n, w, x) }
func dotQ4_0NEON(n int, w, x []byte) float32 { return dotQ4_0With(false, n, w, x) }
func dotQ4_0SDOT(n int, w, x []byte) float32 { return dotQ4_0With(true, n, w, x) }

// checkLen panics, like an index out of range, if b is shorter than n
// bytes: the assembly reads n bytes, and reslicing would only check the
// capacity.
func checkLen(b []byte, n int) {
	if n > 0 {
		_ = b[n-1]
	}
}

// mulFromDot is the row×token product by one dot per pair (Q8_0 has a
// two-token product, mulQ8_0With; the other types none yet).
func mulFromDot(dot func(n int, w, x []byte) float32) mulFunc {
	return func(n int, w []byte, rb, rows int, x []byte, ab, nTok int, out []float32, ldOut int) {
		checkLen(w, rows*rb)
		checkLen(x, nTok*ab)
		for r := 0; r < rows; r++ {
			wr := w[r*rb : (r+1)*rb]
			for t := 0; t < nTok; t++ {
				out[t*ldOut+r] = dot(n, wr, x[t*ab:(t+1)*ab])
			}
		}
	}
}

// q4KAux computes dotQ4_K's eight aux lanes of one block: qs its 128 bytes
// of quants, q8 the 256 activation quants, sc the eight unpacked scales.
//
//go:noescape
func q4KAux(qs, q8 *byte, sc *int16, aux *int32)

// q6KAux computes dotQ6_K's eight aux lanes of one block: b the block, q8
// the 256 activation quants, sc the block's sixteen scales, sign-extended.
//
//go:noescape
func q6KAux(b, q8 *byte, sc *int16, aux *int32)

// dotQ4_KNEON is dotQ4_K with the integer lanes from q4KAux.
func dotQ4_KNEON(n int, w, x []byte) float32 {
	nb := n / qkK
	checkLen(w, nb*blockQ4_K)
	checkLen(x, nb*blockQ8_K)
	var sums [8]float32
	var sumf float32
	for i := range nb {
		b := w[i*blockQ4_K:][:blockQ4_K]
		yd, q8, bsums := q8K(x[i*blockQ8_K:])
		sc, m := unpackScalesK4(b[4:16])

		var summ int32
		for j := range 16 {
			summ += bsum(bsums, j) * int32(m[j/2])
		}
		var sc16 [8]int16
		for j, s := range sc {
			sc16[j] = int16(s)
		}
		var aux [8]int32
		q4KAux(&b[16], &q8[0], &sc16[0], &aux[0])
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

// dotQ6_KNEON is dotQ6_K with the integer lanes from q6KAux.
func dotQ6_KNEON(n int, w, x []byte) float32 {
	nb := n / qkK
	checkLen(w, nb*blockQ6_K)
	checkLen(x, nb*blockQ8_K)
	var sums [8]float32
	for i := range nb {
		b := w[i*blockQ6_K:][:blockQ6_K]
		yd, q8, _ := q8K(x[i*blockQ8_K:])
		var sc16 [16]int16
		for j, s := range b[192:208] {
			sc16[j] = int16(int8(s))
		}
		var aux [8]int32
		q6KAux(&b[0], &q8[0], &sc16[0], &aux[0])
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

// q5KAux computes dotQ5_K's eight aux lanes of one block: qs its 128 bytes
// of low quant bits, qh its 32 bytes of fifth bits, q8 the 256 activation
// quants, sc the eight unpacked scales.
//
//go:noescape
func q5KAux(qs, qh, q8 *byte, sc *int16, aux *int32)

// dotQ5_KNEON is dotQ5_K with the integer lanes from q5KAux.
func dotQ5_KNEON(n int, w, x []byte) float32 {
	nb := n / qkK
	checkLen(w, nb*blockQ5_K)
	checkLen(x, nb*blockQ8_K)
	var sums [8]float32
	var sumf float32
	for i := range nb {
		b := w[i*blockQ5_K:][:blockQ5_K]
		yd, q8, bsums := q8K(x[i*blockQ8_K:])
		sc, m := unpackScalesK4(b[4:16])

		var summ int32
		for j := range 16 {
			summ += bsum(bsums, j) * int32(m[j/2])
		}
		var sc16 [8]int16
		for j, s := range sc {
			sc16[j] = int16(s)
		}
		var aux [8]int32
		q5KAux(&b[48], &b[16], &q8[0], &sc16[0], &aux[0])
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

// dotF32Body and dotF16Body return the float64 sum of the float32 products
// of the first n elements of w and x (n a positive multiple of 8), summed
// in float64 lanes: the generic dotF32/dotF16 sum, in another order.
//
//go:noescape
func dotF32Body(w, x *byte, n int) float64

//go:noescape
func dotF16Body(w, x *byte, n int) float64

// dotF32NEON is dotF32 with the products summed by dotF32Body.
func dotF32NEON(n int, w, x []byte) float32 {
	checkLen(w, 4*n)
	checkLen(x, 4*n)
	var sum float64
	m := n &^ 7
	if m > 0 {
		sum = dotF32Body(&w[0], &x[0], m)
	}
	for i := 4 * m; i < 4*n; i += 4 {
		a := math.Float32frombits(binary.LittleEndian.Uint32(w[i:]))
		b := math.Float32frombits(binary.LittleEndian.Uint32(x[i:]))
		sum += float64(a * b)
	}
	return float32(sum)
}

// dotF16NEON is dotF16 with the products summed by dotF16Body.
func dotF16NEON(n int, w, x []byte) float32 {
	checkLen(w, 2*n)
	checkLen(x, 2*n)
	var sum float64
	m := n &^ 7
	if m > 0 {
		sum = dotF16Body(&w[0], &x[0], m)
	}
	for i := 2 * m; i < 2*n; i += 2 {
		a := f16Table[binary.LittleEndian.Uint16(w[i:])]
		b := f16Table[binary.LittleEndian.Uint16(x[i:])]
		sum += float64(a * b)
	}
	return float32(sum)
}

// blockSumsQ80x2NEON and blockSumsQ80x2SDOT are the block sums of one Q8_0
// row w against two activation rows x0 and x1: x0's in sums[0:nb], x1's in
// sums[neonChunk:neonChunk+nb] (nb ≤ neonChunk).
//
//go:noescape
func blockSumsQ80x2NEON(w, x0, x1 *byte, nb int, sums *int32)

//go:noescape
func blockSumsQ80x2SDOT(w, x0, x1 *byte, nb int, sums *int32)

// dotQ8_0x2 is dotQ8_0 of w with x0 and with x1, each weight block read
// once; each result is bit-identical to dotQ8_0With's.
func dotQ8_0x2(sdot bool, n int, w, x0, x1 []byte) (float32, float32) {
	nb := n / qk
	checkLen(w, nb*blockQ8_0)
	checkLen(x0, nb*blockQ8_0)
	checkLen(x1, nb*blockQ8_0)
	var sums [2 * neonChunk]int32
	var s0, s1 float32
	for i := 0; i < nb; i += neonChunk {
		c := min(neonChunk, nb-i)
		o := i * blockQ8_0
		if sdot {
			blockSumsQ80x2SDOT(&w[o], &x0[o], &x1[o], c, &sums[0])
		} else {
			blockSumsQ80x2NEON(&w[o], &x0[o], &x1[o], c, &sums[0])
		}
		for j := range c {
			o := (i + j) * blockQ8_0
			d := getF16(w[o:])
			s0 += float32(float32(sums[j]) * (d * getF16(x0[o:])))
			s1 += float32(float32(sums[neonChunk+j]) * (d * getF16(x1[o:])))
		}
	}
	return s0, s1
}

// mulQ8_0With is the Q8_0 row×token product, tokens taken two at a time
// (dotQ8_0x2), a last odd token by dotQ8_0With.
func mulQ8_0With(sdot bool) mulFunc {
	return func(n int, w []byte, rb, rows int, x []byte, ab, nTok int, out []float32, ldOut int) {
		checkLen(w, rows*rb)
		checkLen(x, nTok*ab)
		for r := 0; r < rows; r++ {
			wr := w[r*rb : (r+1)*rb]
			t := 0
			for ; t+2 <= nTok; t += 2 {
				out[t*ldOut+r], out[(t+1)*ldOut+r] = dotQ8_0x2(sdot, n, wr, x[t*ab:(t+1)*ab], x[(t+1)*ab:(t+2)*ab])
			}
			if t < nTok {
				out[t*ldOut+r] = dotQ8_0With(sdot, n, wr, x[t*ab:(t+1)*ab])
			}
		}
	}
}
