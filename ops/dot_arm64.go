//go:build !noasm

package ops

// arm64 NEON kernels. The assembly (dot_arm64.s, hand-written) computes the
// exact integer dot product of each block; the float scaling below repeats
// the generic Go code (quant_legacy.go, quant_k.go) expression for expression, so the
// results are bit-identical to LevelGeneric.

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

// mulFromDot is the row×token product by one dot per pair (the NEON level
// has no multi-token kernels yet).
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
