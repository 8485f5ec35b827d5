package main

import (
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Vector exp for SwiGLU and the attention's softmax (twin: expApprox in
// vmath.go of package ops). It is ggml's ggml_v_expf (the AVX2 form, used
// here at both widths), which llama.cpp's SIMD SiLU and softmax use:
//
//	z = x·log2(e) + 1.5·2^23        (rounds x·log2(e) to an integer n)
//	n = z − 1.5·2^23
//	b = x − n·ln2hi − n·ln2lo       (the reduced argument)
//	j = ((c5·b + c4)·b² + (c3·b + c2))·b² + c1·b
//	k = 2^n                         (n shifted into the exponent bits of 1.0)
//	exp(x) ≈ k·j + k
//
// ggml falls back to a slower path when |n| > 126; the inputs are clamped
// to [-87.3, 88] instead, where the fast path is exact to ggml's bound and
// beyond which exp under- or overflows anyway (the result there is 2^-126
// or 2^127 rather than 0 or +Inf, which SiLU and softmax do not notice).
var expConsts = []struct {
	name string
	v    float32
}{
	{"exp_lo", -87.3}, {"exp_hi", 88.0},
	{"exp_log2e", 0x1.715476p+0}, {"exp_round", 0x1.8p23},
	{"exp_ln2hi", 0x1.62e4p-1}, {"exp_ln2lo", 0x1.7f7d1cp-20},
	{"exp_c5", 0x1.0e4020p-7}, {"exp_c4", 0x1.573e2ep-5},
	{"exp_c3", 0x1.555e66p-3}, {"exp_c2", 0x1.fffdb6p-2},
	{"exp_c1", 0x1.ffffecp-1}, {"one", 1},
}

// f32vec is a 64-byte table of v: a full-width memory operand at either
// vector width (constants stay in memory: AVX2 has 16 registers).
func f32vec(name string, v float32) Mem {
	b := uint64(math.Float32bits(v))
	w := b | b<<32
	return constOnce("f_"+name, w, w, w, w, w, w, w, w)
}

// expVec replaces x by exp(x); c holds the constants.
func expVec(s isa, x VecVirtual, c map[string]Mem) {
	VMAXPS(c["exp_lo"], x, x)
	VMINPS(c["exp_hi"], x, x)
	z := s.vec()
	VMOVUPS(c["exp_round"], z)
	VFMADD231PS(c["exp_log2e"], x, z)
	n := s.vec()
	VSUBPS(c["exp_round"], z, n)
	VFNMADD231PS(c["exp_ln2hi"], n, x)
	VFNMADD231PS(c["exp_ln2lo"], n, x) // x is now b
	u := s.vec()
	VMULPS(x, x, u)
	j := s.vec()
	VMOVUPS(c["exp_c4"], j)
	VFMADD231PS(c["exp_c5"], x, j) // c5·b + c4
	t := s.vec()
	VMOVUPS(c["exp_c2"], t)
	VFMADD231PS(c["exp_c3"], x, t) // c3·b + c2
	VFMADD213PS(t, u, j)           // j = j·u + t
	VMULPS(c["exp_c1"], x, t)      // c1·b
	VFMADD213PS(t, u, j)           // j = j·u + c1·b
	VPSLLD(U8(23), z, z)           // n in the exponent field
	VPADDD(c["one"], z, z)         // k = 2^n
	VFMADD213PS(z, z, j)           // j = k·j + k
	VMOVAPS(j, x)
}

func loadExpConsts(s isa) map[string]Mem {
	c := map[string]Mem{}
	for _, k := range expConsts {
		c[k.name] = f32vec(k.name, k.v)
	}
	return c
}

// genSwiGLU: out[i] = x/(1+exp(−x))·up[i] with x = gate[i], for the first
// n − n%lanes elements (the Go side does the rest).
func genSwiGLU(s isa) {
	name := "swiglu" + s.name
	TEXT(name, NOSPLIT, "func(out, gate, up *float32, n int)")
	Pragma("noescape")
	Doc(name + " computes silu(gate)·up over whole vectors (" + s.name + ").")
	out := Load(Param("out"), GP64())
	g := Load(Param("gate"), GP64())
	u := Load(Param("up"), GP64())
	n := Load(Param("n"), GP64())
	lanes := s.bytes() / 4
	SHRQ(U8(map[bool]uint8{true: 4, false: 3}[s.w512]), n)
	JZ(LabelRef(name + "_done"))
	c := loadExpConsts(s)
	Label(name + "_loop")
	x := s.vec()
	VMOVUPS(Mem{Base: g}, x)
	e := s.vec()
	VXORPS(e, e, e)
	VSUBPS(x, e, e) // −x
	expVec(s, e, c)
	VADDPS(c["one"], e, e)
	VDIVPS(e, x, x)
	VMULPS(Mem{Base: u}, x, x)
	VMOVUPS(x, Mem{Base: out})
	ADDQ(U8(4*lanes), g)
	ADDQ(U8(4*lanes), u)
	ADDQ(U8(4*lanes), out)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// genExpShift: x[i] = exp(x[i] − m) for the first n − n%lanes elements,
// returning their sum (lanes added in a fixed order).
func genExpShift(s isa) {
	name := "expShift" + s.name
	TEXT(name, NOSPLIT, "func(x *float32, n int, m float32) float32")
	Pragma("noescape")
	Doc(name + " exponentiates x − m in place over whole vectors and returns the sum (" + s.name + ").")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	mv := s.vec()
	mArg, _ := Param("m").Resolve()
	VBROADCASTSS(mArg.Addr, mv)
	acc := s.vec()
	VXORPS(acc, acc, acc)
	SHRQ(U8(map[bool]uint8{true: 4, false: 3}[s.w512]), n)
	JZ(LabelRef(name + "_done"))
	c := loadExpConsts(s)
	lanes := s.bytes() / 4
	Label(name + "_loop")
	v := s.vec()
	VMOVUPS(Mem{Base: x}, v)
	VSUBPS(mv, v, v)
	expVec(s, v, c)
	VMOVUPS(v, Mem{Base: x})
	VADDPS(v, acc, acc)
	ADDQ(U8(4*lanes), x)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	r := hsum(s, acc)
	Store(r, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// genCvtF16: dst[i] = f16(src[i]) rounding to nearest even (VCVTPS2PH with
// immediate 0, as F32ToF16) for the first n − n%lanes elements. NaNs keep
// their payload here where F32ToF16 makes them 0x7e00; the KV cache and the
// attention's query, the only users, never see NaN in a working model.
func genCvtF16(s isa) {
	name := "cvtF16" + s.name
	TEXT(name, NOSPLIT, "func(dst *byte, src *float32, n int)")
	Pragma("noescape")
	Doc(name + " converts whole vectors of float32 to f16 (" + s.name + ").")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	n := Load(Param("n"), GP64())
	lanes := s.bytes() / 4
	SHRQ(U8(map[bool]uint8{true: 4, false: 3}[s.w512]), n)
	JZ(LabelRef(name + "_done"))
	Label(name + "_loop")
	v := s.vec()
	VMOVUPS(Mem{Base: src}, v)
	if s.w512 {
		h := YMM()
		VCVTPS2PH(U8(0), v, h)
		VMOVDQU64(h, Mem{Base: dst})
	} else {
		h := XMM()
		VCVTPS2PH(U8(0), v, h)
		VMOVDQU(h, Mem{Base: dst})
	}
	ADDQ(U8(4*lanes), src)
	ADDQ(U8(2*lanes), dst)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// genScaleRoundF16: x[i] = f16(x[i]·scale) as float32 (the product rounded
// to float32, then to the nearest f16, as the attention's weights are
// before they meet the f16 values), for the first n − n%lanes elements.
func genScaleRoundF16(s isa) {
	name := "scaleRoundF16" + s.name
	TEXT(name, NOSPLIT, "func(x *float32, n int, scale float32)")
	Pragma("noescape")
	Doc(name + " scales x and rounds it to f16 precision over whole vectors (" + s.name + ").")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	sv := s.vec()
	sArg, _ := Param("scale").Resolve()
	VBROADCASTSS(sArg.Addr, sv)
	lanes := s.bytes() / 4
	SHRQ(U8(map[bool]uint8{true: 4, false: 3}[s.w512]), n)
	JZ(LabelRef(name + "_done"))
	Label(name + "_loop")
	v := s.vec()
	VMULPS(Mem{Base: x}, sv, v)
	if s.w512 {
		h := YMM()
		VCVTPS2PH(U8(0), v, h)
		VCVTPH2PS(h, v)
	} else {
		h := XMM()
		VCVTPS2PH(U8(0), v, h)
		VCVTPH2PS(h, v)
	}
	VMOVUPS(v, Mem{Base: x})
	ADDQ(U8(4*lanes), x)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// genMaxF32: the largest of the first n − n%(4·lanes) elements of x, NaN
// ignored (each element is VMAXPS's first source and the running maximum
// its second, which it returns when either is NaN); −Inf when none. Four
// accumulators hide VMAXPS's latency.
func genMaxF32(s isa) {
	name := "maxF32" + s.name
	TEXT(name, NOSPLIT, "func(x *float32, n int) float32")
	Pragma("noescape")
	Doc(name + " returns the largest non-NaN element of x over whole chunks of four vectors (" + s.name + ").")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	lanes := s.bytes() / 4
	var acc [4]VecVirtual
	for c := range acc {
		acc[c] = s.vec()
		VMOVUPS(f32vec("ninf", float32(math.Inf(-1))), acc[c])
	}
	shift := map[bool]uint8{true: 6, false: 5}[s.w512] // log2(4·lanes)
	SHRQ(U8(shift), n)
	JZ(LabelRef(name + "_done"))
	Label(name + "_loop")
	for c := range acc {
		v := s.vec()
		VMOVUPS(Mem{Base: x, Disp: 4 * lanes * c}, v)
		VMAXPS(acc[c], v, acc[c])
	}
	ADDQ(U32(16*lanes), x)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VMAXPS(acc[1], acc[0], acc[0])
	VMAXPS(acc[3], acc[2], acc[2])
	VMAXPS(acc[2], acc[0], acc[0])
	h := hmax(s, acc[0])
	Store(h, ReturnIndex(0))
	VZEROUPPER()
	RET()
}

// genSanitizeF32: dst[i] = src[i] with NaN made −Inf and values above the
// largest float (+Inf) made the largest float, for the first n − n%8
// elements: a sampler's working copy of the logits. 256-bit code only (a
// copy is bound by memory; the AVX-512 levels run it too).
func genSanitizeF32() {
	s := isaAVX2
	name := "sanitizeF32AVX2"
	TEXT(name, NOSPLIT, "func(dst, src *float32, n int)")
	Pragma("noescape")
	Doc(name + " copies whole vectors of src to dst with NaN as −Inf and +Inf as the largest float.")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	n := Load(Param("n"), GP64())
	SHRQ(U8(3), n)
	JZ(LabelRef(name + "_done"))
	Label(name + "_loop")
	v, nan, c := s.vec(), s.vec(), s.vec()
	VMOVUPS(Mem{Base: src}, v)
	VCMPPS(U8(3), v, v, nan)                        // unordered: NaN lanes
	VMINPS(f32vec("maxf32", math.MaxFloat32), v, c) // v < max ? v : max (NaN lanes: max, replaced below)
	VBLENDVPS(nan, f32vec("ninf", float32(math.Inf(-1))), c, c)
	VMOVUPS(c, Mem{Base: dst})
	ADDQ(U8(32), src)
	ADDQ(U8(32), dst)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_done")
	VZEROUPPER()
	RET()
}

// genFirstAboveF32: the index of the first of the first n − n%8 elements of
// x above t (an ordered comparison: NaN is never above), or n − n%8 when
// none is: a top-k scan skips the logits that cannot enter its heap eight
// at a time. 256-bit code only, as genSanitizeF32.
func genFirstAboveF32() {
	s := isaAVX2
	name := "firstAboveF32AVX2"
	TEXT(name, NOSPLIT, "func(x *float32, n int, t float32) int")
	Pragma("noescape")
	Doc(name + " returns the index of the first element above t over whole vectors, or their count.")
	x := Load(Param("x"), GP64())
	n := Load(Param("n"), GP64())
	tv := s.vec()
	tArg, _ := Param("t").Resolve()
	VBROADCASTSS(tArg.Addr, tv)
	SHRQ(U8(3), n)
	i := GP64()
	XORQ(i, i)
	m := GP32()
	TESTQ(n, n)
	JZ(LabelRef(name + "_none"))
	Label(name + "_loop")
	v := s.vec()
	VMOVUPS(Mem{Base: x, Index: i, Scale: 4}, v)
	VCMPPS(U8(0x1e), tv, v, v) // v > t, ordered
	VMOVMSKPS(v, m)
	TESTL(m, m)
	JNZ(LabelRef(name + "_found"))
	ADDQ(U8(8), i)
	DECQ(n)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_none")
	Store(i, ReturnIndex(0))
	VZEROUPPER()
	RET()
	Label(name + "_found")
	b := GP32()
	BSFL(m, b)
	ADDQ(b.As64(), i)
	Store(i, ReturnIndex(0))
	VZEROUPPER()
	RET()
}
