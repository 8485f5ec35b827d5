package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
)

// Q8_1Host is the pure-Go twin of quantize_q8_1 (matvec.cu) and of every
// kernel that writes its layout (q8_1_quant in norm.cu, glu.cu and
// attention.cu): x's nTok rows of cols values (cols % 32 == 0) in planes
// planes (1 or 2), laid out as Q8_1PlanesBytes says, bit for bit as the
// device writes them. The tests hold the kernels to it.
func Q8_1Host(x []float32, nTok, cols, planes int) ([]byte, error) {
	if cols%32 != 0 || len(x) < nTok*cols || planes < 1 || planes > 2 {
		return nil, fmt.Errorf("kernels: Q8_1 of %d rows of %d values (%d given) in %d planes", nTok, cols, len(x), planes)
	}
	n := nTok * cols
	out := make([]byte, Q8_1PlanesBytes(planes, nTok, cols))
	ds := out[align16(planes*n):]
	res := make([]float32, 32)
	for b := 0; b < n/32; b++ {
		blk := x[32*b : 32*b+32]
		d := q8_1Block(out[32*b:], ds[8*b:], blk)
		if planes == 2 {
			for i, v := range blk {
				// The kernels' __fmaf_rn(-d, q, v): d*q is exact in
				// float64 and so is v - d*q, so one rounding remains.
				res[i] = float32(float64(v) - float64(d)*float64(int8(out[32*b+i])))
			}
			q8_1Residual(out[n+32*b:], ds[8*(n/32+b):], res, d)
		}
	}
	return out, nil
}

// q8_1Block writes one block as q8_1_quant does, in float32 arithmetic:
// d = amax/127, q = round(x*(1/d)) half away from zero, {d, d*sum(q)}.
func q8_1Block(q, ds []byte, x []float32) (d float32) {
	var amax float32
	for _, v := range x {
		amax = max(amax, float32(math.Abs(float64(v))))
	}
	d = amax / 127
	var id float32
	if d != 0 {
		id = 1 / d
	}
	sum := 0
	for i, v := range x {
		p := v * id
		r := max(-128, min(127, int(math.Round(float64(p)))))
		q[i], sum = byte(int8(r)), sum+r
	}
	binary.LittleEndian.PutUint32(ds, math.Float32bits(d))
	binary.LittleEndian.PutUint32(ds[4:], math.Float32bits(float32(sum)*d))
	return d
}

// q8_1Residual writes a block's second plane as q8_1_residual does from
// its residual res = v - d*q: d2 = d/254, q2 = round(res*(1/d2)),
// {d2, d2*sum(q2)}.
func q8_1Residual(q, ds []byte, res []float32, d float32) {
	d2 := d / 254
	var id2 float32
	if d2 != 0 {
		id2 = 1 / d2
	}
	sum := 0
	for i, v := range res {
		p := v * id2
		r := max(-128, min(127, int(math.Round(float64(p)))))
		q[i], sum = byte(int8(r)), sum+r
	}
	binary.LittleEndian.PutUint32(ds, math.Float32bits(d2))
	binary.LittleEndian.PutUint32(ds[4:], math.Float32bits(float32(sum)*d2))
}

// Q8_1Compare reports the first difference between Q8_1 activations got
// (as the device wrote them) and want (Q8_1Host's) of nTok rows of cols
// values in planes planes, ignoring the padding between values and
// scales; "" when they agree.
func Q8_1Compare(got, want []byte, nTok, cols, planes int) string {
	n := planes * nTok * cols
	if len(got) < Q8_1PlanesBytes(planes, nTok, cols) || len(want) < Q8_1PlanesBytes(planes, nTok, cols) {
		return fmt.Sprintf("%d and %d bytes for %d", len(got), len(want), Q8_1PlanesBytes(planes, nTok, cols))
	}
	for i := 0; i < n; i++ {
		if got[i] != want[i] {
			return fmt.Sprintf("plane %d, value %d of %d: q %d, want %d", i/(nTok*cols)+1, i%(nTok*cols), nTok*cols, int8(got[i]), int8(want[i]))
		}
	}
	gd, wd := got[align16(n):], want[align16(n):]
	for b := 0; b < n/32; b++ {
		g0, g1 := math.Float32frombits(binary.LittleEndian.Uint32(gd[8*b:])), math.Float32frombits(binary.LittleEndian.Uint32(gd[8*b+4:]))
		w0, w1 := math.Float32frombits(binary.LittleEndian.Uint32(wd[8*b:])), math.Float32frombits(binary.LittleEndian.Uint32(wd[8*b+4:]))
		if g0 != w0 || g1 != w1 {
			return fmt.Sprintf("plane %d, block %d: {d, d*sum} {%v, %v}, want {%v, %v}", b/(nTok*cols/32)+1, b%(nTok*cols/32), g0, g1, w0, w1)
		}
	}
	return ""
}
