package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Q6_K × Q8_K (twin: dotQ6_K in quant_k.go).
//
//	Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}   210 bytes
//
// Element e of 128-element half h: low 4 bits from ql[64h + e%64] (low
// nibble for e<64, high for e≥64), high 2 bits from qh[32h + e%32] bits
// 2·(e/32); value q−32 with q in 0..63; scale scales[e/16 of the block].
//
// The kernels use the unsigned q (so VPDPBUSD/VPMADDUBSW apply: |Σ4 q·x| ≤
// 4·63·128 still fits an int16 for the VPDPWSSD scaling) and take the bias
// out afterwards with bsums: Σ sc_j·Σ (q−32)·x = Σ sc_j·Σ q·x − 32·Σ sc_j·bsum_j.
//
// 512-bit pieces: piece 2h (elements 0-63 of half h) is the low nibbles of
// ql[64h:64h+64] with qh bits 0-1 (lanes 0-31) and 2-3 (lanes 32-63) as
// bits 4-5; piece 2h+1 the high nibbles with qh bits 4-5 and 6-7. Each
// piece spans four 16-element scales, four dword lanes each.
func genQ6K(s isa, T int) {
	if !s.w512 {
		genQ6KAVX2(s, T)
		return
	}
	var c0F, c30, shA, shB VecVirtual
	var idx [4]VecVirtual
	setup := func(k *mulKernel) {
		c0F, c30, shA, shB = ZMM(), ZMM(), ZMM(), ZMM()
		VPBROADCASTD(constOnce("c0f", splat(0x0f)), c0F)
		VPBROADCASTD(constOnce("c30", splat(0x30)), c30)
		VMOVDQU64(constOnce("shl42", 4, 4, 4, 4, 2, 2, 2, 2), shA)
		VMOVDQU64(constOnce("shr02", 0, 0, 0, 0, 2, 2, 2, 2), shB)
		for p := range idx {
			idx[p] = ZMM()
			VMOVDQU64(quadIndex(p), idx[p])
		}
	}
	orLow := ternlog(func(a, b, c bool) bool { return a || b && c }) // A | (B & C)
	block := func(k *mulKernel) {
		zd := halfToZ(k.w(208))
		y16 := YMM()
		VPMOVSXBW(k.w(192), y16) // the 16 scales as int16
		tab := ZMM()
		VPMOVZXWD(y16, tab) // dwords: low half the scale, high half 0 (VNNI)
		if !s.vnni {
			t2 := ZMM()
			VPSLLD(U8(16), tab, t2)
			VPORD(t2, tab, tab) // the scale in both halves (VPMADDWD)
		}
		var S [4]VecVirtual
		for p := range S {
			S[p] = ZMM()
			VPERMD(tab, idx[p], S[p])
		}
		ysc32 := YMM()
		VPSLLW(U8(5), y16, ysc32) // 32·scale, for the bias

		var P [4]VecVirtual
		for h := 0; h < 2; h++ {
			ql, qh := ZMM(), ZMM()
			VMOVDQU64(k.w(64*h), ql)
			VBROADCASTI64X4(k.w(128+32*h), qh)
			a := ZMM()
			VPSLLVQ(shA, qh, a)
			VPANDD(c30, a, a)
			VPTERNLOGD(orLow, c0F, ql, a) // (ql & 0x0f) | qh bits
			b := ZMM()
			VPSRLVQ(shB, qh, b)
			VPANDD(c30, b, b)
			VPSRLQ(U8(4), ql, ql)
			VPTERNLOGD(orLow, c0F, ql, b)
			P[2*h], P[2*h+1] = a, b
		}
		for t := 0; t < k.T; t++ {
			iacc := dot4Pieces(s, k, t, P[:], S[:])
			corr := YMM()
			VPMADDWD(k.xmem(t, 4+256), ysc32, corr)
			VPSUBD(corr.AsZ(), iacc, iacc)
			fi := ZMM()
			VCVTDQ2PS(iacc, fi)
			VMULPS(zd, fi, fi)
			VFMADD231PS_BCST(k.xmem(t, 0), fi, k.facc[t])
		}
	}
	genMul("Q6K", s, T, 210, 292, setup, block)
}

// quadIndex is the VPERMD index of piece p of a Q6_K block: dword lanes
// 4i..4i+3 take scale 4p+i.
func quadIndex(p int) Mem {
	var w [8]uint64
	for i := range w {
		lo, hi := uint64(4*p+(2*i)/4), uint64(4*p+(2*i+1)/4)
		w[i] = lo | hi<<32
	}
	return constOnce(fmt.Sprintf("quadidx%d", p), w[:]...)
}

// genQ6KAVX2 is Q6_K × Q8_K with 256-bit vectors: piece q (32 elements,
// q = 4h+r) is the low (r<2) or high (r≥2) nibbles of ql[64h+32(r%2):]
// with qh[32h:] bits 2r..2r+1 as bits 4-5, and spans scales 2q and 2q+1
// (one per 128-bit lane). The scales are doubled into word pairs and kept
// on the stack, with 32·scale for the bias and d. AVX-VNNI (s.vex) keeps
// each scale in the low half of its dword pair, the high half 0, for
// VPMADDWD / VEX VPDPWSSD after the VEX VPDPBUSD (|Σ4 q·x| ≤ 4·63·128
// fits an int16).
func genQ6KAVX2(s isa, T int) {
	var c0F, c30 VecVirtual
	var st Mem
	setup := func(k *mulKernel) {
		st = AllocLocal(128)
		c0F, c30 = YMM(), YMM()
		VPBROADCASTD(constOnce("c0f", splat(0x0f)), c0F)
		VPBROADCASTD(constOnce("c30", splat(0x30)), c30)
	}
	block := func(k *mulKernel) {
		// st+0: scales 0-3 | 8-11 doubled; st+32: 4-7 | 12-15; st+64: 32·scales; st+96: d.
		y16 := YMM()
		VPMOVSXBW(k.w(192), y16)
		tl := YMM()
		hi := y16 // the high half of each dword
		if s.vex {
			hi = YMM()
			VPXOR(hi, hi, hi)
		}
		VPUNPCKLWD(hi, y16, tl)
		VMOVDQU(tl, st)
		VPUNPCKHWD(hi, y16, tl)
		VMOVDQU(tl, st.Offset(32))
		VPSLLW(U8(5), y16, y16)
		VMOVDQU(y16, st.Offset(64))
		g := GP32()
		MOVWLZX(k.w(208), g)
		xd := XMM()
		VMOVD(g, xd)
		VCVTPH2PS(xd, xd)
		VMOVSS(xd, st.Offset(96))

		iacc := make([]VecVirtual, T)
		for q := 0; q < 8; q++ {
			h, r := q/4, q%4
			w := YMM()
			VMOVDQU(k.w(64*h+32*(r%2)), w)
			if r >= 2 {
				VPSRLW(U8(4), w, w)
			}
			VPAND(c0F, w, w)
			hb := YMM()
			VMOVDQU(k.w(128+32*h), hb)
			switch r {
			case 0:
				VPSLLW(U8(4), hb, hb)
			case 1:
				VPSLLW(U8(2), hb, hb)
			case 3:
				VPSRLW(U8(2), hb, hb)
			}
			VPAND(c30, hb, hb)
			VPOR(hb, w, w)
			sc := YMM()
			VMOVDQU(scaleIndexAVX2(q), sc)
			VPERMD(st.Offset(32*((2*q/4)%2)), sc, sc)
			for t := 0; t < T; t++ {
				if s.vex && q > 0 {
					p := dotU8S8(s, k.xmem(t, 4+32*q), w, nil)
					vpdpwssdVEX(sc, p, iacc[t]) // acc += tmp·scale
					continue
				}
				var p VecVirtual
				if s.vex {
					p = dotU8S8(s, k.xmem(t, 4+32*q), w, nil)
				} else {
					p = YMM()
					VPMADDUBSW(k.xmem(t, 4+32*q), w, p)
				}
				VPMADDWD(sc, p, p)
				if q == 0 {
					iacc[t] = p
				} else {
					VPADDD(p, iacc[t], iacc[t])
				}
			}
		}
		for t := 0; t < T; t++ {
			corr := YMM()
			VMOVDQU(k.xmem(t, 4+256), corr)
			VPMADDWD(st.Offset(64), corr, corr)
			VPSUBD(corr, iacc[t], iacc[t])
			fi := YMM()
			VCVTDQ2PS(iacc[t], fi)
			dv := YMM()
			VBROADCASTSS(st.Offset(96), dv)
			VMULPS(dv, fi, fi)
			yv := YMM()
			VBROADCASTSS(k.xmem(t, 0), yv)
			VFMADD231PS(fi, yv, k.facc[t])
		}
	}
	genMul("Q6K", s, T, 210, 292, setup, block)
}

// scaleIndexAVX2 is the VPERMD index for piece q into its table: scale j
// sits in table (j/4)%2 at dword j%4 + 4·(j/8); lanes 0-3 take scale 2q,
// lanes 4-7 scale 2q+1.
func scaleIndexAVX2(q int) Mem {
	pos := func(j int) uint64 { return uint64(j%4 + 4*(j/8)) }
	a, b := pos(2*q), pos(2*q+1)
	return constOnce(fmt.Sprintf("q6idx%d", q), a|a<<32, a|a<<32, b|b<<32, b|b<<32)
}
