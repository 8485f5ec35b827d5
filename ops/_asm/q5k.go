package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Q5_K × Q8_K (twin: dotQ5_K in quant_k.go).
//
//	Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}   176 bytes
//
// As Q4_K, plus a fifth bit: bit 2g (sub-block 2g) or 2g+1 (sub-block
// 2g+1) of qh[i%32] is bit 4 of element i of 64-element group g. In the
// 512-bit kernel piece g's fifth bits come from qh broadcast to both halves
// and rotated per qword so that bit 2g (low half) or 2g+1 (high half) of
// each byte lands on bit 4: rotate left by 4-2g and 3-2g (mod 64; a bit that
// lands on bit 4 of a byte came from the same byte), then the next piece is
// two more to the right. |Σ4 q·x| ≤ 4·31·128 fits the int16 of VPDPWSSD.
func genQ5K(s isa, T int) {
	if !s.w512 {
		genKQuantAVX2(s, "Q5K", T, kquantQ5K)
		return
	}
	var c0F, c10, shv, rot0 VecVirtual
	var idx [4]VecVirtual
	setup := func(k *mulKernel) {
		c0F, c10, shv, rot0 = ZMM(), ZMM(), ZMM(), ZMM()
		VPBROADCASTD(constOnce("c0f", splat(0x0f)), c0F)
		VPBROADCASTD(constOnce("c10", splat(0x10)), c10)
		VMOVDQU64(constOnce("shr04", 0, 0, 0, 0, 4, 4, 4, 4), shv)
		VMOVDQU64(constOnce("rol43", 4, 4, 4, 4, 3, 3, 3, 3), rot0)
		for g := range idx {
			idx[g] = ZMM()
			VMOVDQU64(pairIndex(g), idx[g])
		}
	}
	orLow := ternlog(func(a, b, c bool) bool { return a || b && c }) // A | (B & C)
	block := func(k *mulKernel) {
		zd, zm := halfToZ(k.w(0)), halfToZ(k.w(2))
		xs := unpackScalesK4(k, 4)
		ymd := minsDup(xs)
		S := scaleVecs(s, xs, idx)
		qh := ZMM()
		VBROADCASTI64X4(k.w(16), qh)
		VPROLVQ(rot0, qh, qh)
		var W [4]VecVirtual
		for g := range W {
			if g > 0 {
				VPRORQ(U8(2), qh, qh)
			}
			hb := ZMM()
			VPANDD(c10, qh, hb)
			W[g] = ZMM()
			VBROADCASTI64X4(k.w(48+32*g), W[g])
			VPSRLVQ(shv, W[g], W[g])
			VPTERNLOGD(orLow, c0F, W[g], hb) // (nibble & 0x0f) | fifth bit
			W[g] = hb
		}
		for t := 0; t < k.T; t++ {
			iacc := dot4Pieces(s, k, t, W[:], S[:])
			finishK(k, t, iacc, zd, zm, ymd)
		}
	}
	genMul("Q5K", s, T, 176, 292, setup, block)
}
