package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Q8_0 × Q8_0 and Q4_0 × Q8_0 (twins: dotQ8_0, dotQ4_0 in quant_legacy.go).
//
//	Q8_0 {f16 d; i8 qs[32]}   34 bytes   w = d·q
//	Q4_0 {f16 d; u8 qs[16]}   18 bytes   w = d·(q−8), element j<16 the low
//	                                     nibble of qs[j], j≥16 the high one of qs[j−16]
//
// Both are signed weights against signed activations, which VPDPBUSD /
// VPMADDUBSW (unsigned × signed) take through the sign trick: |w| × (x with
// the sign of w). Activations from the quantizer are in −127..127, so the
// negation never overflows; VPMADDUBSW pairs stay within int16 (2·128·127).
// Every 32-element block has its own scale, applied per block in float:
// facc += float(Σ q·x)·(dw·dx) over the block's lanes.
//
// The 512-bit kernels take two blocks per register and a 256-bit tail for
// an odd block count.
type legacy int

const (
	legacyQ8_0 legacy = iota
	legacyQ4_0
)

// The legacy kernels stop at 4 tokens: at 8 the allocator runs out of
// general registers (the pair loop keeps more pointers live).
func genQ8_0(s isa, T int) {
	if T <= 4 {
		genLegacy(s, T, legacyQ8_0)
	}
}

func genQ4_0(s isa, T int) {
	if T <= 4 {
		genLegacy(s, T, legacyQ4_0)
	}
}

func genLegacy(s isa, T int, kind legacy) {
	family, wBlock := "Q80", 34
	if kind == legacyQ4_0 {
		family, wBlock = "Q40", 18
	}
	const xBlock = 34
	var c0F, c8, shv, ones, zer VecVirtual
	setup := func(k *mulKernel) {
		if kind == legacyQ4_0 {
			c0F, c8, shv = s.vec(), s.vec(), s.vec()
			VPBROADCASTD(constOnce("c0f", splat(0x0f)), c0F)
			VPBROADCASTD(constOnce("c08", splat(0x08)), c8)
			if s.w512 {
				VMOVDQU64(constOnce("shr0044", 0, 0, 4, 4, 0, 0, 4, 4), shv)
			} else {
				VMOVDQU(constOnce("shr0044", 0, 0, 4, 4, 0, 0, 4, 4), shv)
			}
		}
		if !s.vnni && !s.vex {
			ones = s.vec()
			VPBROADCASTD(constOnce("ones16", 0x0001000100010001), ones)
		}
		if s.w512 {
			zer = ZMM()
			zero(s, zer)
		}
	}
	// weights returns the block's (or pair's) signed weights in a register.
	// 512-bit kernels may get registers 16-31, which only EVEX
	// instructions reach: use the EVEX forms of the 128/256-bit moves there.
	movdqu := func(m Op, r Op) {
		if s.w512 {
			VMOVDQU64(m, r)
		} else {
			VMOVDQU(m, r)
		}
	}
	bcast128 := func(m Op, r Op) {
		if s.w512 {
			VBROADCASTI32X4(m, r)
		} else {
			VBROADCASTI128(m, r)
		}
	}
	weights := func(k *mulKernel, pair bool) VecVirtual {
		w := YMM()
		if kind == legacyQ8_0 {
			movdqu(k.w(2), w)
		} else {
			bcast128(k.w(2), w)
		}
		if pair {
			w = w.AsZ().(VecVirtual)
			if kind == legacyQ8_0 {
				VINSERTI64X4(U8(1), k.w(wBlock+2), w, w)
			} else {
				w2 := YMM()
				bcast128(k.w(wBlock+2), w2)
				VINSERTI64X4(U8(1), w2, w, w)
			}
		}
		if kind == legacyQ4_0 {
			// [qs, qs] per block, shifted by 0 and 4: elements 0-15, 16-31.
			sh, c0, c8v := shv, c0F, c8
			if !pair {
				sh, c0, c8v = shv.AsY().(VecVirtual), c0F.AsY().(VecVirtual), c8.AsY().(VecVirtual)
			}
			VPSRLVQ(sh, w, w)
			if s.w512 {
				VPANDD(c0, w, w)
			} else {
				VPAND(c0, w, w)
			}
			VPSUBB(c8v, w, w)
		}
		return w
	}
	// scales returns dw (or dw0 ×8, dw1 ×8) as floats for the block(s) at m.
	scales := func(m Mem, stride int, pair bool) VecVirtual {
		h := XMM()
		VPBROADCASTW(m, h)
		if !pair {
			f := YMM()
			VCVTPH2PS(h, f)
			return f
		}
		h2 := XMM()
		VPBROADCASTW(m.Offset(stride), h2)
		VINSERTI32X4(U8(1), h2, h.AsY(), h.AsY())
		f := ZMM()
		VCVTPH2PS(h.AsY(), f)
		return f
	}
	body := func(k *mulKernel, pair bool) {
		w := weights(k, pair)
		abs := w
		if pair {
			abs = ZMM()
		} else {
			abs = YMM()
		}
		VPABSB(w, abs)
		var km Register
		if s.w512 {
			km = K()
			VPMOVB2M(w, km)
		}
		dw := scales(k.w(0), wBlock, pair)
		for t := 0; t < k.T; t++ {
			x := YMM()
			movdqu(k.xmem(t, 2), x)
			var xv VecVirtual = x
			if pair {
				xv = x.AsZ().(VecVirtual)
				VINSERTI64X4(U8(1), k.xmem(t, xBlock+2), xv, xv)
			}
			if s.w512 {
				z := zer
				if !pair {
					z = zer.AsY().(VecVirtual)
				}
				VPSUBB(xv, z, km, xv) // x = −x where w < 0
			} else {
				VPSIGNB(w, xv, xv)
			}
			var p VecVirtual
			if s.vex {
				p = dotU8S8(s, xv, abs, nil)
			} else if s.vnni {
				if pair {
					p = ZMM()
				} else {
					p = YMM()
				}
				zero(s, p)
				vpdpbusd(xv, abs, p)
			} else {
				if pair {
					p = ZMM()
				} else {
					p = YMM()
				}
				o := ones
				if !pair {
					o = ones.AsY().(VecVirtual)
				}
				VPMADDUBSW(xv, abs, p)
				VPMADDWD(o, p, p)
			}
			dx := scales(k.xmem(t, 0), xBlock, pair)
			VMULPS(dw, dx, dx)
			VCVTDQ2PS(p, p)
			if s.w512 {
				// A 256-bit tail leaves the upper lanes zero: they add 0.
				VFMADD231PS(p.AsZ(), dx.AsZ(), k.facc[t])
			} else {
				VFMADD231PS(p, dx, k.facc[t])
			}
		}
	}
	if !s.w512 {
		genMul(family, s, T, wBlock, xBlock, setup, func(k *mulKernel) { body(k, false) })
		return
	}
	genMulTail(family, s, T, wBlock, xBlock, 2, setup,
		func(k *mulKernel) { body(k, true) },
		func(k *mulKernel) { body(k, false) })
}
