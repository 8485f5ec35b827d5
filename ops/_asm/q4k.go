package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Q4_K × Q8_K (twin: dotQ4_K in quant_k.go).
//
//	Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}   144 bytes
//	Q8_K {f32 d; i8 qs[256]; i16 bsums[16]}             292 bytes
//
// row·x = Σ_blocks yd·(d·Σ_j sc_j·Σ_{i∈j} q_i·x_i − dmin·Σ_j m_j·Σ_{i∈j} x_i)
// over the eight 32-element sub-blocks j; Σ_{i∈j} x_i comes from bsums.
//
// 512-bit layout: piece g (g<4) is elements 64g..64g+63, the 32 bytes
// qs[32g:] broadcast to both halves and shifted right by 0 (low half: low
// nibbles, sub-block 2g) and 4 (high half: high nibbles, sub-block 2g+1),
// then masked to 4 bits; that is the order of the activations, which are
// then read straight from memory. Per piece and token:
//
//	VNNI:   tmp = Σ4 q·x per dword (VPDPBUSD), acc += tmp·scale (VPDPWSSD;
//	        |tmp| ≤ 4·15·128 fits the low int16 half, the scale's high half is 0)
//	AVX512: p = Σ2 q·x per word (VPMADDUBSW; ≤ 2·15·128, no saturation),
//	        acc += Σ2 p·scale per dword (VPMADDWD, scale in both halves)
//
// The sixteen int32 lanes are converted to float once per block:
// f = float(acc)·d − float(Σ m·bsum)·dmin, facc += f·yd (fused).
func genQ4K(s isa, T int) {
	if !s.w512 {
		genKQuantAVX2(s, "Q4K", T, kquantQ4K)
		return
	}
	var c0F, shv VecVirtual
	var idx [4]VecVirtual
	setup := func(k *mulKernel) {
		c0F, shv = ZMM(), ZMM()
		VPBROADCASTD(constOnce("c0f", splat(0x0f)), c0F)
		VMOVDQU64(constOnce("shr04", 0, 0, 0, 0, 4, 4, 4, 4), shv)
		for g := range idx {
			idx[g] = ZMM()
			VMOVDQU64(pairIndex(g), idx[g])
		}
	}
	block := func(k *mulKernel) {
		zd, zm := halfToZ(k.w(0)), halfToZ(k.w(2))
		xs := unpackScalesK4(k, 4)
		ymd := minsDup(xs)
		S := scaleVecs(s, xs, idx)
		var W [4]VecVirtual
		for g := range W {
			W[g] = ZMM()
			VBROADCASTI64X4(k.w(16+32*g), W[g])
			VPSRLVQ(shv, W[g], W[g])
			VPANDD(c0F, W[g], W[g])
		}
		for t := 0; t < k.T; t++ {
			iacc := dot4Pieces(s, k, t, W[:], S[:])
			finishK(k, t, iacc, zd, zm, ymd)
		}
	}
	genMul("Q4K", s, T, 144, 292, setup, block)
}

// pairIndex is the VPERMD index that puts dword 2g in lanes 0-7 and dword
// 2g+1 in lanes 8-15: the scale of sub-blocks 2g and 2g+1 over piece g.
func pairIndex(g int) Mem {
	a, b := uint64(2*g), uint64(2*g+1)
	return constOnce(fmt.Sprintf("pairidx%d", g), a|a<<32, a|a<<32, a|a<<32, a|a<<32, b|b<<32, b|b<<32, b|b<<32, b|b<<32)
}

// halfToZ broadcasts the f16 at m to all 16 float lanes of a ZMM register.
func halfToZ(m Mem) VecVirtual {
	h, z := YMM(), ZMM()
	VPBROADCASTW(m, h)
	VCVTPH2PS(h, z)
	return z
}

// unpackScalesK4 reads the 12 packed scale bytes of a Q4_K/Q5_K block at
// w(off) and returns an XMM register holding the 6-bit scales sc0..sc7 in
// bytes 0-7 and the mins m0..m7 in bytes 8-15 (scaleMinK4 for all j at
// once, llama.cpp's kmask trick on two 64-bit words):
//
//	q = bytes 0-7, u = bytes 8-11
//	lo = q & 0x3f..3f                                 = sc0-3 | m0-3
//	hi = ((u | (u>>4)<<32) & 0x0f..0f) | ((q>>6) & 0x03..03)<<4 = sc4-7 | m4-7
//
// then VPSHUFD orders the four dwords sc0-3, sc4-7, m0-3, m4-7.
func unpackScalesK4(k *mulKernel, off int) VecVirtual {
	q, u, t, lo := GP64(), GP64(), GP64(), GP64()
	MOVQ(k.w(off), q)
	MOVL(k.w(off+8), u.As32())
	MOVQ(q, lo)
	ANDQ(constOnce("k3f", splat(0x3f)), lo)
	MOVL(u.As32(), t.As32())
	SHRL(U8(4), t.As32())
	SHLQ(U8(32), t)
	ORQ(t, u)
	ANDQ(constOnce("k0f", splat(0x0f)), u)
	SHRQ(U8(6), q)
	ANDQ(constOnce("k03", splat(0x03)), q)
	SHLQ(U8(4), q)
	ORQ(q, u)
	x := XMM()
	VMOVQ(lo, x)
	VPINSRQ(U8(1), u, x, x)
	VPSHUFD(U8(0xd8), x, x)
	return x
}

// minsDup turns the mins in bytes 8-15 of xs into 16 words m0,m0,m1,m1,..,
// m7,m7: one per 16-element bsum, for VPMADDWD against bsums.
func minsDup(xs VecVirtual) VecVirtual {
	xm, ymd := XMM(), YMM()
	VPUNPCKHBW(xs, xs, xm)
	VPMOVZXBW(xm, ymd)
	return ymd
}

// scaleVecs expands the scales in bytes 0-7 of xs into the four per-piece
// multiplier vectors: dwords with the scale in the low half (VNNI) or in
// both halves (VPMADDWD).
func scaleVecs(s isa, xs VecVirtual, idx [4]VecVirtual) [4]VecVirtual {
	tab := ZMM()
	if s.vnni {
		VPMOVZXBD(xs, tab)
	} else {
		xl := XMM()
		VPUNPCKLBW(xs, xs, xl)
		VPMOVZXBW(xl, tab.AsY())
	}
	var S [4]VecVirtual
	for g := range S {
		S[g] = ZMM()
		VPERMD(tab, idx[g], S[g])
	}
	return S
}

// dot4Pieces returns Σ_pieces scale·(Σ q·x) per dword lane for token t over
// four 64-byte pieces of unsigned weights W against the activations at
// disp 4+64g of the token's Q8_K block.
func dot4Pieces(s isa, k *mulKernel, t int, W, S []VecVirtual) VecVirtual {
	var iacc VecVirtual
	for g := range W {
		x := k.xmem(t, 4+64*g)
		if s.vnni {
			tmp := ZMM()
			zero(s, tmp)
			vpdpbusd(x, W[g], tmp)
			if g == 0 {
				iacc = ZMM()
				VPMADDWD(S[g], tmp, iacc)
			} else {
				vpdpwssd(S[g], tmp, iacc)
			}
			continue
		}
		p := ZMM()
		VPMADDUBSW(x, W[g], p)
		VPMADDWD(S[g], p, p)
		if g == 0 {
			iacc = p
		} else {
			VPADDD(p, iacc, iacc)
		}
	}
	return iacc
}

// finishK adds one Q4_K/Q5_K block of token t into its accumulator:
// facc += (float(iacc)·d − float(Σ m·bsums)·dmin)·yd.
func finishK(k *mulKernel, t int, iacc, zd, zm, ymd VecVirtual) {
	mi := YMM()
	VPMADDWD(k.xmem(t, 4+256), ymd, mi)
	fi, fm := ZMM(), ZMM()
	VCVTDQ2PS(iacc, fi)
	VCVTDQ2PS(mi.AsZ(), fm) // the upper half of mi is zero (VEX write)
	VMULPS(zd, fi, fi)
	VFNMADD231PS(fm, zm, fi)
	VFMADD231PS_BCST(k.xmem(t, 0), fi, k.facc[t])
}

// kquant tells the AVX2 k-quant kernel which of the two 6-bit-scale
// formats it reads.
type kquant int

const (
	kquantQ4K kquant = iota
	kquantQ5K
)

// genKQuantAVX2 is Q4_K/Q5_K × Q8_K with 256-bit vectors (twin: dotQ4_K,
// dotQ5_K). Each YMM holds one 32-element sub-block: the low (sub-block
// 2g) or high (2g+1) nibbles of qs[32g:], plus for Q5_K bit 2g or 2g+1 of
// qh moved to bit 4. Per sub-block and token: p = VPMADDUBSW(q, x),
// acc += VPMADDWD(p, scale). AVX2 has 16 vector registers, so d, dmin, the
// scale words and the doubled mins live in a small stack frame and are
// broadcast from there.
//
// AVX-VNNI (s.vex): tmp = Σ4 q·x per dword (VEX VPDPBUSD), acc +=
// tmp·scale (VEX VPDPWSSD) with the scale in the low half of each dword only
// (|tmp| ≤ 4·31·128 fits the low int16 half), stored as dwords at st+64.
func genKQuantAVX2(s isa, family string, T int, kind kquant) {
	wBlock, qsOff := 144, 16
	if kind == kquantQ5K {
		wBlock, qsOff = 176, 48
	}
	var c0F, c10 VecVirtual
	var st Mem
	setup := func(k *mulKernel) {
		if s.vex {
			st = AllocLocal(96)
		} else {
			st = AllocLocal(64)
		}
		c0F = YMM()
		VPBROADCASTD(constOnce("c0f", splat(0x0f)), c0F)
		if kind == kquantQ5K {
			c10 = YMM()
			VPBROADCASTD(constOnce("c10", splat(0x10)), c10)
		}
	}
	block := func(k *mulKernel) {
		// st+0: d, dmin (float32); st+16: scale words; st+32: doubled mins.
		xh := XMM()
		VCVTPH2PS(k.w(0), xh)
		VMOVUPS(xh, st)
		xs := unpackScalesK4(k, 4)
		VMOVDQU(minsDup(xs), st.Offset(32))
		xw := YMM()
		VPMOVZXBW(xs, xw)
		VMOVDQU(xw.AsX(), st.Offset(16))
		if s.vex {
			xd := YMM()
			VPMOVZXBD(xs, xd)
			VMOVDQU(xd, st.Offset(64))
		}
		iacc := make([]VecVirtual, T)
		for g := 0; g < 4; g++ {
			wl, wh := YMM(), YMM()
			VMOVDQU(k.w(qsOff+32*g), wh)
			VPAND(c0F, wh, wl)
			VPSRLW(U8(4), wh, wh)
			VPAND(c0F, wh, wh)
			if kind == kquantQ5K {
				fifthBitAVX2(k.w(16), 2*g, c10, wl)
				fifthBitAVX2(k.w(16), 2*g+1, c10, wh)
			}
			s0, s1 := YMM(), YMM()
			if s.vex {
				VPBROADCASTD(st.Offset(64+4*(2*g)), s0)
				VPBROADCASTD(st.Offset(64+4*(2*g+1)), s1)
			} else {
				VPBROADCASTW(st.Offset(16+2*(2*g)), s0)
				VPBROADCASTW(st.Offset(16+2*(2*g+1)), s1)
			}
			for t := 0; t < T; t++ {
				if s.vex {
					p := dotU8S8(s, k.xmem(t, 4+64*g), wl, nil)
					if g == 0 {
						VPMADDWD(s0, p, p)
						iacc[t] = p
					} else {
						vpdpwssdVEX(s0, p, iacc[t])
					}
					p2 := dotU8S8(s, k.xmem(t, 4+64*g+32), wh, nil)
					vpdpwssdVEX(s1, p2, iacc[t])
					continue
				}
				p := YMM()
				VPMADDUBSW(k.xmem(t, 4+64*g), wl, p)
				VPMADDWD(s0, p, p)
				if g == 0 {
					iacc[t] = p
				} else {
					VPADDD(p, iacc[t], iacc[t])
				}
				p2 := YMM()
				VPMADDUBSW(k.xmem(t, 4+64*g+32), wh, p2)
				VPMADDWD(s1, p2, p2)
				VPADDD(p2, iacc[t], iacc[t])
			}
		}
		for t := 0; t < T; t++ {
			mi := YMM()
			VMOVDQU(k.xmem(t, 4+256), mi)
			VPMADDWD(st.Offset(32), mi, mi)
			fi, fm := YMM(), YMM()
			VCVTDQ2PS(iacc[t], fi)
			VCVTDQ2PS(mi, fm)
			dv := YMM()
			VBROADCASTSS(st, dv)
			VMULPS(dv, fi, fi)
			mv := YMM()
			VBROADCASTSS(st.Offset(4), mv)
			VFNMADD231PS(fm, mv, fi)
			yv := YMM()
			VBROADCASTSS(k.xmem(t, 0), yv)
			VFMADD231PS(fi, yv, k.facc[t])
		}
	}
	genMul(family, s, T, wBlock, 292, setup, block)
}

// fifthBitAVX2 ORs bit b of each qh byte (the fifth bit of the elements of
// sub-block b) into bit 4 of w. Word shifts are fine: the bit that lands
// on bit 4 of a byte comes from the same byte, and the mask drops the rest.
func fifthBitAVX2(qh Mem, b int, c10, w VecVirtual) {
	h := YMM()
	VMOVDQU(qh, h)
	switch {
	case b < 4:
		VPSLLW(U8(4-b), h, h)
	case b > 4:
		VPSRLW(U8(b-4), h, h)
	}
	VPAND(c10, h, h)
	VPOR(h, w, w)
}
