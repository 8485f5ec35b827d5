package main

import (
	"fmt"
	"math"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The tile kernels of the tiled attention (twins: gemmGeneric,
// softmaxColsGeneric and loadTileGeneric in ops/attention_kernels.go).

// attnGemmShapes are the register blocks of the product kernel: mr rows
// of C times nv vectors, mr·nv accumulators plus nv vectors of B and one
// broadcast of A in registers (29 of AVX-512's 32 at 6×4, 15 of AVX2's 16
// at 6×2).
func attnGemmShapes(s isa) (mrs, nvs []int) {
	if s.w512 {
		return []int{1, 2, 3, 4, 5, 6}, []int{1, 2, 3, 4}
	}
	return []int{1, 2, 3, 4, 5, 6}, []int{1, 2}
}

func genAttn(s isa) {
	mrs, nvs := attnGemmShapes(s)
	for _, mr := range mrs {
		for _, nv := range nvs {
			genAttnGemm(s, mr, nv)
		}
	}
	genAttnSoftmax(s)
	if s == isaAVX2 {
		genAttnPrefetch()
	}
	genAttnLoadF16(s)
	genAttnLoadQ8_0(s)
	genAttnLoadQ4_0(s)
}

// genAttnGemm emits a block of C = C·rs + A·B: mr rows and nv vectors of
// columns of C (ldc bytes between rows) with k terms, A's element (i, p)
// at a + i·sai + p·sap bytes, B's row p at b + p·ldb. rs, when not nil,
// holds the mr row scales applied to C first. Each lane's sum is formed
// in p order by fused multiply-adds, as the twin does.
func genAttnGemm(s isa, mr, nv int) {
	name := fmt.Sprintf("attnGemm%s_%dx%d", s.name, mr, nv)
	TEXT(name, NOSPLIT, "func(a *float32, sai, sap uintptr, b *float32, ldb uintptr, c *float32, ldc uintptr, k int, rs *float32)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s adds a %d-row, %d-vector block of A·B to C (%s).", name, mr, nv, s.name))
	pa := Load(Param("a"), GP64())
	pb := Load(Param("b"), GP64())
	k := Load(Param("k"), GP64())
	sap := Load(Param("sap"), GP64())
	ldb := Load(Param("ldb"), GP64())
	// Row i of A is at pa + off[i]; off[0] is 0.
	off := make([]GPVirtual, mr)
	if mr > 1 {
		sai := Load(Param("sai"), GP64()).(GPVirtual)
		off[1] = sai
		for i := 2; i < mr; i++ {
			off[i] = GP64().(GPVirtual)
			if i == 2 {
				LEAQ(Mem{Base: sai, Index: sai, Scale: 1}, off[i])
			} else {
				LEAQ(Mem{Base: off[i-1], Index: sai, Scale: 1}, off[i])
			}
		}
	}
	amem := func(i int) Mem {
		if i == 0 {
			return Mem{Base: pa}
		}
		return Mem{Base: pa, Index: off[i], Scale: 1}
	}
	vb := s.bytes()
	acc := make([][]VecVirtual, mr)
	cp := Load(Param("c"), GP64())
	ldc := Load(Param("ldc"), GP64())
	crow := GP64()
	MOVQ(cp, crow)
	for i := range acc {
		acc[i] = make([]VecVirtual, nv)
		for v := range acc[i] {
			acc[i][v] = s.vec()
			VMOVUPS(Mem{Base: crow, Disp: v * vb}, acc[i][v])
		}
		if i < mr-1 {
			ADDQ(ldc, crow)
		}
	}
	rs := Load(Param("rs"), GP64())
	TESTQ(rs, rs)
	JZ(LabelRef(name + "_noscale"))
	for i := range acc {
		t := s.vec()
		VBROADCASTSS(Mem{Base: rs, Disp: 4 * i}, t)
		for v := range acc[i] {
			VMULPS(t, acc[i][v], acc[i][v])
		}
	}
	Label(name + "_noscale")
	TESTQ(k, k)
	JZ(LabelRef(name + "_store"))
	Label(name + "_loop")
	bv := make([]VecVirtual, nv)
	for v := range bv {
		bv[v] = s.vec()
		VMOVUPS(Mem{Base: pb, Disp: v * vb}, bv[v])
	}
	for i := range acc {
		t := s.vec()
		VBROADCASTSS(amem(i), t)
		for v := range bv {
			VFMADD231PS(t, bv[v], acc[i][v])
		}
	}
	ADDQ(sap, pa)
	ADDQ(ldb, pb)
	DECQ(k)
	JNZ(LabelRef(name + "_loop"))
	Label(name + "_store")
	MOVQ(cp, crow)
	for i := range acc {
		for v := range acc[i] {
			VMOVUPS(acc[i][v], Mem{Base: crow, Disp: v * vb})
		}
		if i < mr-1 {
			ADDQ(ldc, crow)
		}
	}
	VZEROUPPER()
	RET()
}

// genAttnSoftmax emits the online softmax step over the columns of a
// score tile, nv vectors of columns at a time (see softmaxColsGeneric):
// s is kt rows of ld bytes; lim, mx, l and ms are the columns' positions,
// running maxima, sums and (out) rescale factors; round (0 or 1) rounds
// the weights to f16. A key past a column's position is masked by the
// sign of lim − position, as an all-ones lane mask.
func genAttnSoftmax(s isa) {
	name := "attnSoftmax" + s.name
	TEXT(name, NOSPLIT, "func(s *float32, kt int, nv int, ld uintptr, lim *int32, k0 int32, scale float32, mx, l, ms *float32, round int)")
	Pragma("noescape")
	Doc(name + " advances the online softmax of nv vectors of columns of a score tile (" + s.name + ").")
	sp := Load(Param("s"), GP64())
	nvr := Load(Param("nv"), GP64())
	ld := Load(Param("ld"), GP64())
	limp := Load(Param("lim"), GP64())
	mxp := Load(Param("mx"), GP64())
	lp := Load(Param("l"), GP64())
	msp := Load(Param("ms"), GP64())
	ktArg, _ := Param("kt").Resolve()
	k0Arg, _ := Param("k0").Resolve()
	scaleArg, _ := Param("scale").Resolve()
	roundArg, _ := Param("round").Resolve()
	c := loadExpConsts(s)
	ninf := f32vec("ninf", float32(math.Inf(-1)))
	ones := constOnce("i32_ones", 0x0000000100000001, 0x0000000100000001, 0x0000000100000001, 0x0000000100000001,
		0x0000000100000001, 0x0000000100000001, 0x0000000100000001, 0x0000000100000001)
	vb := s.bytes()

	Label(name + "_col")
	limv := s.vec()
	VMOVDQU32orU(s, Mem{Base: limp}, limv)
	// The key positions, k0 in every lane (through a register: vet takes
	// a broadcast from the frame for a 16-byte load).
	k0x := XMM()
	k0r := GP32()
	MOVL(k0Arg.Addr, k0r)
	VMOVD(k0r, k0x)
	kp := s.vec()
	VPBROADCASTD(k0x, kp)
	tmax := s.vec()
	VMOVUPS(ninf, tmax)
	scale := s.vec()
	VBROADCASTSS(scaleArg.Addr, scale)
	row := GP64()
	MOVQ(sp, row)
	j := GP64()
	MOVQ(ktArg.Addr, j)
	// Pass 1: scale, mask, the tile's maximum.
	Label(name + "_max")
	v := s.vec()
	VMULPS(Mem{Base: row}, scale, v)
	bad := s.vec()
	VPSUBD(kp, limv, bad) // lim − position: negative where masked
	VPSRAD(U8(31), bad, bad)
	VANDNPS(v, bad, v)
	t := s.vec()
	VANDPS(ninf, bad, t)
	VORPS(t, v, v)
	VMOVUPS(v, Mem{Base: row})
	VMAXPS(v, tmax, tmax)
	VPADDD(ones, kp, kp)
	ADDQ(ld, row)
	DECQ(j)
	JNZ(LabelRef(name + "_max"))
	// The new maximum, the rescale factor and the rescaled sum.
	mnew := s.vec()
	VMAXPS(Mem{Base: mxp}, tmax, mnew)
	e := s.vec()
	VMOVUPS(Mem{Base: mxp}, e)
	VSUBPS(mnew, e, e)
	expVec(s, e, c)
	VMOVUPS(e, Mem{Base: msp})
	VMOVUPS(mnew, Mem{Base: mxp})
	lsum := s.vec()
	VMULPS(Mem{Base: lp}, e, lsum)
	// Pass 2: the weights.
	VPBROADCASTD(k0x, kp)
	MOVQ(sp, row)
	MOVQ(ktArg.Addr, j)
	Label(name + "_exp")
	w := s.vec()
	VMOVUPS(Mem{Base: row}, w)
	VSUBPS(mnew, w, w)
	expVec(s, w, c)
	bad2 := s.vec()
	VPSUBD(kp, limv, bad2)
	VPSRAD(U8(31), bad2, bad2)
	VANDNPS(w, bad2, w)
	VADDPS(w, lsum, lsum)
	CMPQ(roundArg.Addr, U8(0))
	JEQ(LabelRef(name + "_noround"))
	if s.w512 {
		h := YMM()
		VCVTPS2PH(U8(0), w, h)
		VCVTPH2PS(h, w)
	} else {
		h := XMM()
		VCVTPS2PH(U8(0), w, h)
		VCVTPH2PS(h, w)
	}
	Label(name + "_noround")
	VMOVUPS(w, Mem{Base: row})
	VPADDD(ones, kp, kp)
	ADDQ(ld, row)
	DECQ(j)
	JNZ(LabelRef(name + "_exp"))
	VMOVUPS(lsum, Mem{Base: lp})

	ADDQ(U8(vb), sp)
	ADDQ(U8(vb), limp)
	ADDQ(U8(vb), mxp)
	ADDQ(U8(vb), lp)
	ADDQ(U8(vb), msp)
	DECQ(nvr)
	JNZ(LabelRef(name + "_col"))
	VZEROUPPER()
	RET()
}

// VMOVDQU32orU loads integer lanes: VMOVDQU32 at 512 bits, VMOVDQU at 256.
func VMOVDQU32orU(s isa, m Mem, r VecVirtual) {
	if s.w512 {
		VMOVDQU32(m, r)
	} else {
		VMOVDQU(m, r)
	}
}

// genAttnLoadF16 emits the conversion of rows of nv vectors of f16 values
// (stride bytes apart) to float32 rows, back to back in dst.
func genAttnLoadF16(s isa) {
	name := "attnLoadF16" + s.name
	TEXT(name, NOSPLIT, "func(dst *float32, src *byte, stride uintptr, rows, nv int)")
	Pragma("noescape")
	Doc(name + " converts rows of f16 values to float32 (" + s.name + ").")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	stride := Load(Param("stride"), GP64())
	rows := Load(Param("rows"), GP64())
	nvArg, _ := Param("nv").Resolve()
	lanes := s.bytes() / 4
	Label(name + "_row")
	p := GP64()
	MOVQ(src, p)
	n := GP64()
	MOVQ(nvArg.Addr, n)
	Label(name + "_vec")
	v := s.vec()
	VCVTPH2PS(Mem{Base: p}, v)
	VMOVUPS(v, Mem{Base: dst})
	ADDQ(U8(2*lanes), p)
	ADDQ(U8(4*lanes), dst)
	DECQ(n)
	JNZ(LabelRef(name + "_vec"))
	ADDQ(stride, src)
	DECQ(rows)
	JNZ(LabelRef(name + "_row"))
	VZEROUPPER()
	RET()
}

// blockScale broadcasts the f16 scale at m to every lane as a float.
func blockScale(s isa, m Mem) VecVirtual {
	f := s.vec()
	if s.w512 {
		h := YMM()
		VPBROADCASTW(m, h)
		VCVTPH2PS(h, f)
	} else {
		h := XMM()
		VPBROADCASTW(m, h)
		VCVTPH2PS(h, f)
	}
	return f
}

// genAttnLoadQ8_0 emits the dequantization of rows of nb Q8_0 blocks
// (stride bytes apart) to float32 rows: d·q, exact in float32.
func genAttnLoadQ8_0(s isa) {
	name := "attnLoadQ80" + s.name
	TEXT(name, NOSPLIT, "func(dst *float32, src *byte, stride uintptr, rows, nb int)")
	Pragma("noescape")
	Doc(name + " dequantizes rows of Q8_0 blocks to float32 (" + s.name + ").")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	stride := Load(Param("stride"), GP64())
	rows := Load(Param("rows"), GP64())
	nbArg, _ := Param("nb").Resolve()
	lanes := s.bytes() / 4
	Label(name + "_row")
	p := GP64()
	MOVQ(src, p)
	n := GP64()
	MOVQ(nbArg.Addr, n)
	Label(name + "_block")
	d := blockScale(s, Mem{Base: p})
	for g := 0; g < 32/lanes; g++ {
		v := s.vec()
		VPMOVSXBD(Mem{Base: p, Disp: 2 + g*lanes}, v)
		VCVTDQ2PS(v, v)
		VMULPS(d, v, v)
		VMOVUPS(v, Mem{Base: dst, Disp: 4 * lanes * g})
	}
	ADDQ(U8(34), p)
	ADDQ(U8(128), dst)
	DECQ(n)
	JNZ(LabelRef(name + "_block"))
	ADDQ(stride, src)
	DECQ(rows)
	JNZ(LabelRef(name + "_row"))
	VZEROUPPER()
	RET()
}

// genAttnLoadQ4_0 emits the dequantization of rows of nb Q4_0 blocks
// (stride bytes apart) to float32 rows: d·(q−8), exact in float32. Byte
// j of a block holds element j in its low nibble, j+16 in its high one.
func genAttnLoadQ4_0(s isa) {
	name := "attnLoadQ40" + s.name
	TEXT(name, NOSPLIT, "func(dst *float32, src *byte, stride uintptr, rows, nb int)")
	Pragma("noescape")
	Doc(name + " dequantizes rows of Q4_0 blocks to float32 (" + s.name + ").")
	dst := Load(Param("dst"), GP64())
	src := Load(Param("src"), GP64())
	stride := Load(Param("stride"), GP64())
	rows := Load(Param("rows"), GP64())
	nbArg, _ := Param("nb").Resolve()
	lanes := s.bytes() / 4
	low := constOnce("i32_0f", 0x0000000f0000000f, 0x0000000f0000000f, 0x0000000f0000000f, 0x0000000f0000000f,
		0x0000000f0000000f, 0x0000000f0000000f, 0x0000000f0000000f, 0x0000000f0000000f)
	eight := constOnce("i32_8", 0x0000000800000008, 0x0000000800000008, 0x0000000800000008, 0x0000000800000008,
		0x0000000800000008, 0x0000000800000008, 0x0000000800000008, 0x0000000800000008)
	Label(name + "_row")
	p := GP64()
	MOVQ(src, p)
	n := GP64()
	MOVQ(nbArg.Addr, n)
	Label(name + "_block")
	d := blockScale(s, Mem{Base: p})
	for g := 0; g < 16/lanes; g++ {
		x := s.vec()
		VPMOVZXBD(Mem{Base: p, Disp: 2 + g*lanes}, x)
		lo, hi := s.vec(), s.vec()
		if s.w512 {
			VPANDD(low, x, lo)
		} else {
			VPAND(low, x, lo)
		}
		VPSRLD(U8(4), x, hi)
		for h, v := range []VecVirtual{lo, hi} {
			VPSUBD(eight, v, v)
			VCVTDQ2PS(v, v)
			VMULPS(d, v, v)
			VMOVUPS(v, Mem{Base: dst, Disp: 4 * (16*h + lanes*g)})
		}
	}
	ADDQ(U8(18), p)
	ADDQ(U8(128), dst)
	DECQ(n)
	JNZ(LabelRef(name + "_block"))
	ADDQ(stride, src)
	DECQ(rows)
	JNZ(LabelRef(name + "_row"))
	VZEROUPPER()
	RET()
}

// genAttnPrefetch emits prefetches (into L2) of rows of a cache tile:
// lines cache lines from each of rows rows stride bytes apart. The
// attention asks for the next tile's keys and values while it computes
// the current one: their rows are short pieces of long cache rows, which
// the hardware prefetchers follow poorly.
func genAttnPrefetch() {
	name := "attnPrefetchRows"
	TEXT(name, NOSPLIT, "func(src *byte, stride uintptr, rows, lines int)")
	Pragma("noescape")
	Doc(name + " prefetches lines cache lines of each of rows rows into L2.")
	src := Load(Param("src"), GP64())
	stride := Load(Param("stride"), GP64())
	rows := Load(Param("rows"), GP64())
	linesArg, _ := Param("lines").Resolve()
	Label(name + "_row")
	p := GP64()
	MOVQ(src, p)
	n := GP64()
	MOVQ(linesArg.Addr, n)
	Label(name + "_line")
	PREFETCHT1(Mem{Base: p})
	ADDQ(U8(64), p)
	DECQ(n)
	JNZ(LabelRef(name + "_line"))
	ADDQ(stride, src)
	DECQ(rows)
	JNZ(LabelRef(name + "_row"))
	RET()
}
