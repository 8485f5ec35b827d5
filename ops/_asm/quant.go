package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Q8_K activation quantization, bit for bit as quantActQ8_K
// (quantize_row_q8_K_ref):
//
//	vmax = the first value of largest magnitude; if it is 0 the block is zero
//	iscale = −127/vmax (float32 division), q = min(127, round-half-even(iscale·x))
//	d = 1/iscale, bsums = Σ of each 16 quants
//
// The first value of largest magnitude: with mx = max(0, x…) and
// mn = min(0, x…), vmax is mx when mx > −mn, mn when −mn > mx; only when
// both signs reach the maximum is the block scanned for the first one.
// NaNs are skipped by the max and min (as by the reference's comparison)
// and quantize to 0 (VCVTPS2DQ gives 0x80000000, whose low byte is 0; the
// AVX2 pack saturates, so NaNs are zeroed first there).
func genQuantQ8K(s isa) {
	name := "quantQ8K" + s.name
	TEXT(name, NOSPLIT, "func(dst *byte, src *float32, nb int)")
	Pragma("noescape")
	Doc(name + " quantizes nb blocks of 256 float32 to Q8_K (" + s.name + ").")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	nb := Load(Param("nb"), GP64())
	lanes := s.bytes() / 4
	nv := 256 / lanes
	absMask := constOnce("absmask", 0x7fffffff7fffffff, 0x7fffffff7fffffff, 0x7fffffff7fffffff, 0x7fffffff7fffffff,
		0x7fffffff7fffffff, 0x7fffffff7fffffff, 0x7fffffff7fffffff, 0x7fffffff7fffffff)
	c127 := constOnce("i127", 127|127<<32, 127|127<<32, 127|127<<32, 127|127<<32, 127|127<<32, 127|127<<32, 127|127<<32, 127|127<<32)
	neg127 := f32vec("m127", -127)
	one := f32vec("one", 1)

	Label(name + "_block")
	mx, mn := s.vec(), s.vec()
	zero(s, mx)
	zero(s, mn)
	for i := 0; i < nv; i++ {
		v := s.vec()
		VMOVUPS(Mem{Base: src, Disp: 4 * lanes * i}, v)
		VMAXPS(mx, v, mx) // v > mx ? v : mx, so a NaN keeps mx
		VMINPS(mn, v, mn)
	}
	fmx, fmn := hreduce(s, mx, true), hreduce(s, mn, false)
	// amax = max(mx, −mn); vmax by sign, scan on a tie.
	negmn := XMM()
	VXORPS(negmn, negmn, negmn)
	VSUBSS(fmn, negmn, negmn)
	vmax := XMM()
	VUCOMISS(negmn, fmx)
	JA(LabelRef(name + "_pos")) // mx > −mn
	JB(LabelRef(name + "_neg"))
	// Equal: both zero (an all-zero block) or a tie.
	VXORPS(vmax, vmax, vmax)
	VUCOMISS(vmax, fmx)
	JE(LabelRef(name + "_zero"))
	// Tie: the first value whose magnitude is the maximum decides the sign.
	am := s.vec()
	VBROADCASTSS(fmx, am)
	i := GP64()
	XORQ(i, i)
	Label(name + "_scan")
	v := s.vec()
	VMOVUPS(Mem{Base: src, Index: i, Scale: 4}, v)
	VANDPS(absMask, v, v)
	bits := GP64()
	if s.w512 {
		k := K()
		VCMPPS(U8(0), am, v, k) // EQ_OQ
		KMOVW(k, bits.As32())
	} else {
		VCMPPS(U8(0), am, v, v)
		VMOVMSKPS(v, bits.As32())
	}
	TESTQ(bits, bits)
	JNZ(LabelRef(name + "_found"))
	ADDQ(U8(lanes), i)
	JMP(LabelRef(name + "_scan"))
	Label(name + "_found")
	TZCNTQ(bits, bits)
	ADDQ(bits, i)
	VMOVSS(Mem{Base: src, Index: i, Scale: 4}, vmax)
	JMP(LabelRef(name + "_scale"))
	Label(name + "_pos")
	VMOVAPS(fmx, vmax)
	JMP(LabelRef(name + "_scale"))
	Label(name + "_neg")
	VMOVAPS(fmn, vmax)

	Label(name + "_scale")
	// iscale = −127/vmax, d = 1/iscale, both rounded to float32.
	is := XMM()
	VMOVSS(neg127, is)
	VDIVSS(vmax, is, is)
	d := XMM()
	VMOVSS(one, d)
	VDIVSS(is, d, d)
	VMOVSS(d, Mem{Base: dst})
	isv := s.vec()
	VBROADCASTSS(is, isv)
	for g := 0; g < 16; g++ {
		q := quantGroup(s, src, g, isv, c127)
		// bsum: the sum of the group's 16 quants as int16.
		r := hreduceInt(s, q)
		w := GP32()
		VMOVD(r, w)
		MOVW(w.As16(), Mem{Base: dst, Disp: 4 + 256 + 2*g})
		storeGroup(s, q, Mem{Base: dst, Disp: 4 + 16*g})
	}
	JMP(LabelRef(name + "_next"))

	Label(name + "_zero")
	z := s.vec()
	zero(s, z)
	for off := 0; off+s.bytes() <= 292; off += s.bytes() {
		VMOVDQU(z.AsY(), Mem{Base: dst, Disp: off})
		if s.w512 {
			VMOVDQU(z.AsY(), Mem{Base: dst, Disp: off + 32})
		}
	}
	// 292 is not a multiple of 32: the last 4 bytes.
	MOVL(U32(0), Mem{Base: dst, Disp: 288})

	Label(name + "_next")
	ADDQ(U32(292), dst)
	ADDQ(U32(1024), src)
	DECQ(nb)
	JNZ(LabelRef(name + "_block"))
	VZEROUPPER()
	RET()
	_ = math.Pi
}

// quantGroup quantizes elements 16g..16g+15 and returns them as int32
// lanes: one ZMM, or two YMM (AVX2) in q and the register after it.
type quantVec struct{ a, b VecVirtual }

func quantGroup(s isa, src Register, g int, isv VecVirtual, c127 Mem) quantVec {
	one := func(off int) VecVirtual {
		v := s.vec()
		VMOVUPS(Mem{Base: src, Disp: off}, v)
		VMULPS(isv, v, v)
		if !s.w512 {
			// NaN → 0 (the pack below would saturate NaN's 0x80000000); an
			// infinite input makes one too, times the zero scale.
			m := s.vec()
			VCMPPS(U8(7), v, v, m) // ORD
			VANDPS(m, v, v)
		}
		VCVTPS2DQ(v, v)
		VPMINSD(c127, v, v)
		return v
	}
	if s.w512 {
		return quantVec{a: one(64 * g)}
	}
	return quantVec{a: one(64 * g), b: one(64*g + 32)}
}

// storeGroup writes the group's 16 quants as bytes.
func storeGroup(s isa, q quantVec, m Mem) {
	if s.w512 {
		VPMOVDB(q.a, m) // truncation: the values are in −127..127 or NaN's 0x80000000
		return
	}
	// Pack with saturation; VPACKSSDW works per 128-bit lane, so put the
	// words back in order before the byte pack.
	w := YMM()
	VPACKSSDW(q.b, q.a, w) // a0-3 b0-3 | a4-7 b4-7
	VPERMQ(U8(0xd8), w, w) // a0-3 a4-7 | b0-3 b4-7
	hi := XMM()
	VEXTRACTI128(U8(1), w, hi)
	VPACKSSWB(hi, w.AsX(), hi)
	VMOVDQU(hi, m)
}

// hreduce returns the max (or min) of v's lanes in an XMM register.
func hreduce(s isa, v VecVirtual, isMax bool) VecVirtual {
	op := VMAXPS
	if !isMax {
		op = VMINPS
	}
	y := v.AsY().(VecVirtual)
	if s.w512 {
		hi := YMM()
		VEXTRACTF64X4(U8(1), v, hi)
		op(hi, v.AsY(), hi)
		y = hi
	}
	x := XMM()
	if s.w512 {
		VEXTRACTF32X4(U8(1), y, x)
	} else {
		VEXTRACTF128(U8(1), y, x)
	}
	op(x, y.AsX(), x)
	t := XMM()
	VMOVHLPS(x, x, t)
	op(t, x, x)
	VMOVSHDUP(x, t)
	op(t, x, x)
	return x
}

// hreduceInt returns the sum of the group's int32 lanes in an XMM register.
func hreduceInt(s isa, q quantVec) VecVirtual {
	var y VecVirtual
	if s.w512 {
		y = YMM()
		VEXTRACTI64X4(U8(1), q.a, y)
		VPADDD(q.a.AsY(), y, y)
	} else {
		y = YMM()
		VPADDD(q.a, q.b, y)
	}
	x := XMM()
	if s.w512 {
		VEXTRACTI32X4(U8(1), y, x)
	} else {
		VEXTRACTI128(U8(1), y, x)
	}
	VPADDD(y.AsX(), x, x)
	t := XMM()
	VPSHUFD(U8(0x4e), x, t)
	VPADDD(t, x, x)
	VPSHUFD(U8(0xb1), x, t)
	VPADDD(t, x, x)
	return x
}

// Q8_0 activation quantization, as quantActQ8_0 for finite inputs
// (quantize_row_q8_0_ref): per 32-element block amax = max|x|, d = amax/127
// stored as f16 (round to nearest even, infinity past the range),
// id = 1/d (0 when d is 0), q = x·id rounded half away from zero, clamped
// to −128..127. The rounding is exact: t = trunc(p), and t moves one away
// from zero when |p − t| ≥ 0.5 (p − t is exact in float32).
func genQuantQ8_0(s isa) {
	name := "quantQ80" + s.name
	TEXT(name, NOSPLIT, "func(dst *byte, src *float32, nb int)")
	Pragma("noescape")
	Doc(name + " quantizes nb blocks of 32 float32 to Q8_0 (" + s.name + ").")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	nb := Load(Param("nb"), GP64())
	lanes := s.bytes() / 4
	nv := 32 / lanes
	absMask := constOnce("absmask", 0x7fffffff7fffffff, 0x7fffffff7fffffff, 0x7fffffff7fffffff, 0x7fffffff7fffffff,
		0x7fffffff7fffffff, 0x7fffffff7fffffff, 0x7fffffff7fffffff, 0x7fffffff7fffffff)
	signMask := constOnce("signmask", 0x8000000080000000, 0x8000000080000000, 0x8000000080000000, 0x8000000080000000,
		0x8000000080000000, 0x8000000080000000, 0x8000000080000000, 0x8000000080000000)
	half := f32vec("half", 0.5)
	one := f32vec("one", 1)
	c127 := f32vec("f127", 127)

	Label(name + "_block")
	v := make([]VecVirtual, nv)
	mx := s.vec()
	for i := range v {
		v[i] = s.vec()
		VMOVUPS(Mem{Base: src, Disp: 4 * lanes * i}, v[i])
		a := s.vec()
		VANDPS(absMask, v[i], a)
		if i == 0 {
			VMOVAPS(a, mx)
		} else {
			VMAXPS(a, mx, mx)
		}
	}
	amax := hreduce(s, mx, true)
	d := XMM()
	VDIVSS(c127, amax, d) // amax/127
	h := XMM()
	VCVTPS2PH(U8(0), d, h)
	w := GP32()
	VMOVD(h, w)
	MOVW(w.As16(), Mem{Base: dst})
	// id = 1/d, or 0 for an all-zero block.
	id := XMM()
	VXORPS(id, id, id)
	VUCOMISS(id, d)
	JE(LabelRef(name + "_zeroscale"))
	VMOVSS(one, id)
	VDIVSS(d, id, id)
	Label(name + "_zeroscale")
	idv := s.vec()
	VBROADCASTSS(id, idv)
	q := make([]VecVirtual, nv)
	for i := range v {
		p := v[i]
		VMULPS(idv, p, p)
		// NaN (an infinite input times the zero id) quantizes to 0.
		if s.w512 {
			k := K()
			VCMPPS(U8(7), p, p, k) // ORD
			VMOVAPS_Z(p, k, p)
		} else {
			m := s.vec()
			VCMPPS(U8(7), p, p, m)
			VANDPS(m, p, p)
		}
		t := s.vec()
		if s.w512 {
			VRNDSCALEPS(U8(0x0b), p, t) // truncate, no precision exception
		} else {
			VROUNDPS(U8(0x0b), p, t)
		}
		f := s.vec()
		VSUBPS(t, p, f)
		VANDPS(absMask, f, f)
		// step = ±1 with the sign of p where |p − t| ≥ 0.5, else 0.
		sg := s.vec()
		VANDPS(signMask, p, sg)
		VORPS(one, sg, sg)
		if s.w512 {
			k := K()
			VCMPPS(U8(13), half, f, k) // GE_OS
			VADDPS_Z(sg, t, k, sg)     // t + step where set, 0 elsewhere
			VBLENDMPS(sg, t, k, t)
		} else {
			VCMPPS(U8(13), half, f, f)
			VANDPS(f, sg, sg)
			VADDPS(sg, t, t)
		}
		VCVTTPS2DQ(t, t)
		q[i] = t
	}
	if s.w512 {
		for i := range q {
			VPMOVSDB(q[i], Mem{Base: dst, Disp: 2 + 16*i})
		}
	} else {
		// Four YMM of dwords → 32 bytes; the packs work per 128-bit lane.
		w1, w2 := YMM(), YMM()
		VPACKSSDW(q[1], q[0], w1) // 0-3 8-11 | 4-7 12-15
		VPACKSSDW(q[3], q[2], w2)
		VPACKSSWB(w2, w1, w1) // 0-3 8-11 16-19 24-27 | 4-7 12-15 20-23 28-31
		perm := YMM()
		VMOVDQU(constOnce("q80perm", 0|4<<32, 1|5<<32, 2|6<<32, 3|7<<32), perm)
		VPERMD(w1, perm, w1)
		VMOVDQU(w1, Mem{Base: dst, Disp: 2})
	}
	ADDQ(U32(34), dst)
	ADDQ(U32(128), src)
	DECQ(nb)
	JNZ(LabelRef(name + "_block"))
	VZEROUPPER()
	RET()
}
