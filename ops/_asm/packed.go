package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Kernels over repacked weights (twins: mulPackedQ4K, mulPackedQ6K in
// ops/repack.go, which also documents the layouts). 16 rows are
// interleaved per group: a 64-byte piece holds four consecutive weights of
// each of the 16 rows, so a vector lane is a row. One activation dword,
// broadcast, is dotted with the 16 rows' quads by one VPDPBUSD (512-bit) or
// VPMADDUBSW (eight rows per 256-bit half-pass); the integer sums of a
// sub-block are scaled per row (VPDPWSSD, VPMADDWD or VPMULLD with the
// row's scales in the lanes), and at the end of a block the float step is
// one vector operation for all rows. No horizontal sums: a group's 16
// results per token are stored as one vector.
//
// Per group of 16 rows and T tokens, per block (Q4_K first unpacks the 16
// rows' 6-bit scales and mins to the stack, unpackScalesQ4K):
//
//	Q4_K VNNI:   per 16-element half sub-block and token: tmp = Σ4 VPDPBUSD
//	             (|tmp| ≤ 16·15·128 fits an int16), iacc += VPDPWSSD(tmp,
//	             (sc, 0)); per sub-block: macc += VPDPWSSD(bsum pair, (m, m))
//	Q4_K others: the same with VPMADDUBSW (Σ2 per word) and VPMADDWD
//	Q6_K VNNI:   per 16-element group: tmp = Σ4 VPDPBUSD (up to 16·63·128:
//	             no int16), iacc += VPMULLD(tmp, sc); the bias −32·Σ sc·bsum
//	             by VPDPWSSD of the bsum pairs with −32·(sc pair)
//	Q6_K others: VPMADDUBSW of two quads summed (≤ 2·2·63·128 fits an
//	             int16), VPMADDWD by (sc, sc)
//
// then f = float(iacc)·d (− float(macc)·dmin, fused), acc += f·yd (fused),
// acc kept on the stack (one load and store per token and block). Where
// the registers do not hold T min accumulators (256-bit, or 16 tokens),
// Q4_K's (m, m) vectors go to the stack and macc is summed at the end of
// the block. The next weight block is prefetched a piece at a time.

// packedRows is the rows of a group. The kernels have mulSig's signature,
// with groups of 16 rows for rows: out[t*os/4 + 16g + r].
const packedRows = 16

// vpdpbusdBcst appends acc += Σ4 u8(u)·s8(dword at m) per dword lane, the
// dword broadcast from memory (EVEX embedded broadcast).
func vpdpbusdBcst(m Mem, u, acc Op) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPBUSD",
		Suffixes: []string{"BCST"},
		Operands: []Op{m, u, acc},
		Inputs:   []Op{m, u, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512_VNNI"},
	})
}

// vpdpwssdBcst appends acc += a.lo·m.lo + a.hi·m.hi per dword lane, the
// dword (two int16) broadcast from memory.
func vpdpwssdBcst(m Mem, a, acc Op) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPWSSD",
		Suffixes: []string{"BCST"},
		Operands: []Op{m, a, acc},
		Inputs:   []Op{m, a, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512_VNNI"},
	})
}

// packedKernel is the state of one packed kernel while its block is
// generated.
type packedKernel struct {
	*mulKernel
	half int // 256-bit: which 8 rows of the group (0 or 1); 512-bit: 0
	st   Mem // T float accumulators of the vector width
}

// lanes is the rows per vector: 16 (512-bit) or 8 (256-bit).
func (k *packedKernel) lanes() int { return k.s.bytes() / 4 }

// u8 is byte disp of a [16]u8 per-row table at base (this half's rows).
func (k *packedKernel) u8(base Mem, disp int) Mem { return base.Offset(disp + k.half*8) }

// f16 is byte disp of a [16]f16 per-row table.
func (k *packedKernel) f16(disp int) Mem { return k.w(disp + k.half*16) }

// quads is byte disp of a 64-byte piece of 16 rows' quads.
func (k *packedKernel) quads(disp int) Mem { return k.w(disp + k.half*32) }

// pairs is byte disp of a [16][2]i8 per-row table.
func (k *packedKernel) pairs(disp int) Mem { return k.w(disp + k.half*16) }

// acc is token t's float accumulator on the stack.
func (k *packedKernel) acc(t int) Mem { return k.st.Offset(t * k.s.bytes()) }

// prefetchNext prefetches part step of steps of the next weight block
// (wBlock bytes on): the block's first loads otherwise wait for the L2 or
// memory, which the hardware prefetchers do not run far enough ahead of.
func (k *packedKernel) prefetchNext(wBlock, step, steps int) {
	lines := (wBlock + 63) / 64
	for l := step * lines / steps; l < (step+1)*lines/steps; l++ {
		PREFETCHT0(k.w(wBlock + 64*l))
	}
}

// bcastX returns a register with the activation dword at disp of token t
// in every lane.
func (k *packedKernel) bcastX(t, disp int) VecVirtual {
	b := k.s.vec()
	VPBROADCASTD(k.xmem(t, disp), b)
	return b
}

// genPacked emits one packed kernel: per group, per half-pass (two for
// 256-bit vectors), the accumulators are zeroed, block runs once per
// weight block, and the T result vectors are stored.
func genPacked(family string, s isa, T, wBlock int, setup func(k *packedKernel), block func(k *packedKernel)) {
	name := fmt.Sprintf("mul%s%s%d", family, s.name, T)
	register(family, s, T, name)
	// Not NOSPLIT: with 16 tokens the frame (accumulators, unpacked
	// scales) exceeds what a NOSPLIT function may use; the stack check
	// costs a few instructions per call.
	TEXT(name, 0, mulSig)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s multiplies groups of 16 repacked rows by %d activation row(s) (%s).", name, T, s.name))
	k := &packedKernel{mulKernel: &mulKernel{s: s, T: T}}
	k.wp = Load(Param("w"), GP64()).(GPVirtual)
	k.xs = Load(Param("xs"), GP64()).(GPVirtual)
	outp := Load(Param("out"), GP64()).(GPVirtual)
	groups, _ := Param("rows").Resolve()
	xArg, _ := Param("x").Resolve()
	nbArg, _ := Param("nb").Resolve()
	osArg, _ := Param("os").Resolve()
	k.st = AllocLocal(T * s.bytes())
	setup(k)

	halves := 1
	if !s.w512 {
		halves = 2
	}
	gstart := GP64()
	Label(name + "_group")
	MOVQ(k.wp, gstart)
	for h := 0; h < halves; h++ {
		k.half = h
		if h > 0 {
			MOVQ(gstart, k.wp)
		}
		z := s.vec()
		zero(s, z)
		for t := 0; t < T; t++ {
			if s.w512 {
				VMOVDQU64(z, k.acc(t))
			} else {
				VMOVDQU(z, k.acc(t))
			}
		}
		k.xb = GP64().(GPVirtual)
		MOVQ(xArg.Addr, k.xb)
		if T > 1 {
			k.xb1 = GP64().(GPVirtual)
			LEAQ(Mem{Base: k.xb, Index: k.xs, Scale: 1}, k.xb1)
		}
		if T > 4 {
			k.xb4, k.xb5 = GP64().(GPVirtual), GP64().(GPVirtual)
			LEAQ(Mem{Base: k.xb, Index: k.xs, Scale: 4}, k.xb4)
			LEAQ(Mem{Base: k.xb1, Index: k.xs, Scale: 4}, k.xb5)
		}
		if T > 8 {
			for i := range k.xb8 {
				k.xb8[i] = GP64().(GPVirtual)
			}
			LEAQ(Mem{Base: k.xb, Index: k.xs, Scale: 8}, k.xb8[0])
			LEAQ(Mem{Base: k.xb1, Index: k.xs, Scale: 8}, k.xb8[1])
			LEAQ(Mem{Base: k.xb4, Index: k.xs, Scale: 8}, k.xb8[2])
			LEAQ(Mem{Base: k.xb5, Index: k.xs, Scale: 8}, k.xb8[3])
		}
		n := GP64()
		MOVQ(nbArg.Addr, n)
		lbl := fmt.Sprintf("%s_block%d", name, h)
		Label(lbl)
		block(k)
		ADDQ(U32(wBlock), k.wp)
		ADDQ(U32(292), k.xb)
		if T > 1 {
			ADDQ(U32(292), k.xb1)
		}
		if T > 4 {
			ADDQ(U32(292), k.xb4)
			ADDQ(U32(292), k.xb5)
		}
		if T > 8 {
			for _, r := range k.xb8 {
				ADDQ(U32(292), r)
			}
		}
		DECQ(n)
		JNZ(LabelRef(lbl))

		os := GP64()
		MOVQ(osArg.Addr, os)
		storeVecs(k, outp, os, 4*k.lanes()*h)
	}
	ADDQ(U8(4*packedRows), outp)
	DECQ(groups.Addr)
	JNZ(LabelRef(name + "_group"))
	VZEROUPPER()
	RET()
}

// storeVecs copies each token's accumulator to outp + t·os + disp.
func storeVecs(k *packedKernel, outp, os GPVirtual, disp int) {
	var o3 GPVirtual
	for t := 0; t < k.T; t++ {
		v := k.s.vec()
		var dst Mem
		switch t {
		case 0:
			dst = Mem{Base: outp, Disp: disp}
		case 1, 2, 4, 8:
			dst = Mem{Base: outp, Index: os, Scale: uint8(t), Disp: disp}
		default:
			if o3 == nil {
				o3 = GP64().(GPVirtual)
			}
			IMUL3Q(U32(t), os, o3) // o3 = t·os
			dst = Mem{Base: outp, Index: o3, Scale: 1, Disp: disp}
		}
		if k.s.w512 {
			VMOVUPS(k.acc(t), v)
			VMOVUPS(v, dst)
		} else {
			VMOVUPS(k.acc(t), v)
			VMOVUPS(v, dst)
		}
	}
}

// finishBlock adds one block into token t's accumulator:
// acc += (float(iacc)·d [− float(macc)·dmin])·yd.
func finishBlock(k *packedKernel, t int, iacc, macc, dv, dmv VecVirtual) {
	fi := k.s.vec()
	VCVTDQ2PS(iacc, fi)
	VMULPS(dv, fi, fi)
	if macc != nil {
		fm := k.s.vec()
		VCVTDQ2PS(macc, fm)
		VFNMADD231PS(fm, dmv, fi)
	}
	a := k.s.vec()
	VMOVUPS(k.acc(t), a)
	if k.s.w512 {
		VFMADD231PS_BCST(k.xmem(t, 0), fi, a)
	} else {
		y := YMM()
		VBROADCASTSS(k.xmem(t, 0), y)
		VFMADD231PS(fi, y, a)
	}
	VMOVUPS(a, k.acc(t))
}

// halfToF32 converts the row table of f16 at m to floats (one per lane).
func halfToF32(k *packedKernel, m Mem) VecVirtual {
	v := k.s.vec()
	VCVTPH2PS(m, v)
	return v
}

// dupWords returns the bytes at m (one per lane) as dwords holding the
// value in both int16 halves (for VPMADDWD / VPDPWSSD against a pair), or
// in the low half only when low is set.
func dupWords(k *packedKernel, m Mem, low bool) VecVirtual {
	v := k.s.vec()
	VPMOVZXBD(m, v)
	if low {
		return v
	}
	t := k.s.vec()
	VPSLLD(U8(16), v, t)
	vor(k.s, t, v, v)
	return v
}

// vand is dst = a & b (a may be memory).
func vand(s isa, a, b, dst Op) {
	if s.w512 {
		VPANDD(a, b, dst)
	} else {
		VPAND(a, b, dst)
	}
}

// vor is dst = a | b.
func vor(s isa, a, b, dst Op) {
	if s.w512 {
		VPORD(a, b, dst)
	} else {
		VPOR(a, b, dst)
	}
}

// vload loads a vector from m (unaligned) or copies a register.
func vload(s isa, m, dst Op) {
	if s.w512 {
		VMOVDQU64(m, dst)
	} else {
		VMOVDQU(m, dst)
	}
}

// highNibbles sets dst to the high nibbles of the bytes at m, each in its
// byte's low 4 bits.
func highNibbles(s isa, m Mem, c0F, dst VecVirtual) {
	if s.w512 {
		VPSRLW(U8(4), m, dst)
	} else {
		VMOVDQU(m, dst) // VEX shifts take no memory source
		VPSRLW(U8(4), dst, dst)
	}
	vand(s, c0F, dst, dst)
}

// unpackScalesQ4K unpacks the 6-bit scales and mins of the block's 16 rows
// (scaleMinK4 for every row and sub-block at once) into scm: the scales
// sc[8][16] at 0, the mins m[8][16] at 128. With B_b the 16 rows' byte b
// (the layout's scales[b]), for j < 4
//
//	sc_j = B_j & 63,  m_j = B_{j+4} & 63
//	sc_{j+4} = B_{j+8} & 15 | (B_j >> 6) << 4
//	m_{j+4}  = B_{j+8} >> 4 | (B_{j+4} >> 6) << 4
//
// computed on B_0-3, B_4-7, B_8-11 as three 64-byte vectors (two 32-byte
// halves each at 256 bits). Word shifts are fine: the mask keeps only bits
// from the byte's own word half.
func unpackScalesQ4K(k *packedKernel, c0F VecVirtual, scm Mem) {
	s := k.s
	c3F, c30 := s.vec(), s.vec()
	VPBROADCASTD(constOnce("c3f", splat(0x3f)), c3F)
	VPBROADCASTD(constOnce("c30", splat(0x30)), c30)
	for part := 0; part < 64; part += s.bytes() {
		b0, b4, b8 := s.vec(), s.vec(), s.vec()
		vload(s, k.w(2048+part), b0)
		vload(s, k.w(2048+64+part), b4)
		vload(s, k.w(2048+128+part), b8)
		// sc_{j+4}: (B_j >> 2) & 0x30 | B_{j+8} & 0x0f
		hi := s.vec()
		VPSRLW(U8(2), b0, hi)
		vand(s, c30, hi, hi)
		lo := s.vec()
		vand(s, c0F, b8, lo)
		vor(s, lo, hi, hi)
		vstore(s, hi, scm.Offset(64+part))
		// m_{j+4}: (B_{j+4} >> 2) & 0x30 | (B_{j+8} >> 4) & 0x0f
		VPSRLW(U8(2), b4, hi)
		vand(s, c30, hi, hi)
		VPSRLW(U8(4), b8, lo)
		vand(s, c0F, lo, lo)
		vor(s, lo, hi, hi)
		vstore(s, hi, scm.Offset(192+part))
		vand(s, c3F, b0, b0)
		vstore(s, b0, scm.Offset(part))
		vand(s, c3F, b4, b4)
		vstore(s, b4, scm.Offset(128+part))
	}
}

// vstore stores a vector to m (unaligned).
func vstore(s isa, v, m Op) {
	if s.w512 {
		VMOVDQU64(v, m)
	} else {
		VMOVDQU(v, m)
	}
}

// genPackedQ4K: see the top of this file; twin mulPackedQ4K.
func genPackedQ4K(s isa, T int) {
	// Where the registers do not hold T min accumulators as well (256-bit
	// vectors; 16 tokens), the (m, m) vectors of the block go to the stack
	// (mst) and each token's Σ m·bsum is computed at the end of the block.
	late := !s.w512 || T > 8
	var c0F VecVirtual
	var mst, scm Mem
	setup := func(k *packedKernel) {
		c0F = s.vec()
		VPBROADCASTD(constOnce("c0f", splat(0x0f)), c0F)
		if late {
			mst = AllocLocal(8 * s.bytes())
		}
		scm = AllocLocal(256)
	}
	block := func(k *packedKernel) {
		unpackScalesQ4K(k, c0F, scm)
		iacc := make([]VecVirtual, T)
		macc := make([]VecVirtual, T)
		if !late {
			for t := range macc {
				macc[t] = s.vec()
				zero(s, macc[t])
			}
		}
		for g := 0; g < 4; g++ {
			for nib := 0; nib < 2; nib++ {
				j := 2*g + nib
				k.prefetchNext(2304, j, 8)
				scv := dupWords(k, k.u8(scm, 16*j), s.vnni)
				for sh := 0; sh < 2; sh++ {
					var W [4]VecVirtual
					for a := range W {
						W[a] = s.vec()
						q := k.quads(512*g + 64*(4*sh+a))
						if nib == 0 {
							vand(s, q, c0F, W[a])
						} else {
							highNibbles(s, q, c0F, W[a])
						}
					}
					first := g == 0 && nib == 0 && sh == 0
					for t := 0; t < T; t++ {
						xd := 4 + 64*g + 32*nib + 16*sh
						var sum VecVirtual
						if s.vnni {
							sum = s.vec()
							zero(s, sum)
							for a := range W {
								vpdpbusdBcst(k.xmem(t, xd+4*a), W[a], sum)
							}
						} else {
							for a := range W {
								p := k.bcastX(t, xd+4*a)
								VPMADDUBSW(p, W[a], p)
								if a == 0 {
									sum = p
								} else {
									VPADDW(p, sum, sum)
								}
							}
						}
						if first {
							iacc[t] = s.vec()
							VPMADDWD(scv, sum, iacc[t])
						} else if s.vnni {
							vpdpwssd(scv, sum, iacc[t])
						} else {
							VPMADDWD(scv, sum, sum)
							VPADDD(sum, iacc[t], iacc[t])
						}
					}
				}
				mv := dupWords(k, k.u8(scm, 128+16*j), false)
				if late {
					vstore(s, mv, mst.Offset(s.bytes()*j))
					continue
				}
				for t := 0; t < T; t++ {
					if s.vnni {
						vpdpwssdBcst(k.xmem(t, 260+4*j), mv, macc[t])
					} else {
						b := k.bcastX(t, 260+4*j)
						VPMADDWD(mv, b, b)
						VPADDD(b, macc[t], macc[t])
					}
				}
			}
		}
		dv, dmv := halfToF32(k, k.f16(2240)), halfToF32(k, k.f16(2272))
		for t := 0; t < T; t++ {
			if late {
				for j := 0; j < 8; j++ {
					mv := mst.Offset(s.bytes() * j)
					switch {
					case s.vnni && j == 0:
						macc[t] = s.vec()
						zero(s, macc[t])
						fallthrough
					case s.vnni:
						m := s.vec()
						vload(s, mv, m)
						vpdpwssdBcst(k.xmem(t, 260+4*j), m, macc[t])
					default:
						b := k.bcastX(t, 260+4*j)
						VPMADDWD(mv, b, b)
						if j == 0 {
							macc[t] = b
						} else {
							VPADDD(b, macc[t], macc[t])
						}
					}
				}
			}
			finishBlock(k, t, iacc[t], macc[t], dv, dmv)
		}
	}
	genPacked("P4K", s, T, 2304, setup, block)
}

// genPackedQ6K: see the top of this file; twin mulPackedQ6K.
func genPackedQ6K(s isa, T int) {
	var c0F, c30 VecVirtual
	setup := func(k *packedKernel) {
		c0F, c30 = s.vec(), s.vec()
		VPBROADCASTD(constOnce("c0f", splat(0x0f)), c0F)
		VPBROADCASTD(constOnce("c30", splat(0x30)), c30)
	}
	andOr := ternlog(func(a, b, c bool) bool { return a && b || c }) // A&B | C
	block := func(k *packedKernel) {
		iacc := make([]VecVirtual, T)
		for g := 0; g < 4; g++ {
			for nib := 0; nib < 2; nib++ {
				p := 2*g + nib // scale pair: groups 2p, 2p+1
				k.prefetchNext(3360, p, 8)
				pair := s.vec()
				VPMOVSXBW(k.pairs(3072+32*p), pair) // words (sc_2p, sc_2p+1) per row
				for sh := 0; sh < 2; sh++ {
					j := 2*p + sh
					// The scale of group j per lane: a sign-extended dword
					// (VPMULLD) or the int16 in both halves (VPMADDWD).
					sc := s.vec()
					if s.vnni {
						if sh == 0 {
							VPSLLD(U8(16), pair, sc)
							VPSRAD(U8(16), sc, sc)
						} else {
							VPSRAD(U8(16), pair, sc)
						}
					} else {
						imm := U8(0xa0) // words 0,0,2,2
						if sh == 1 {
							imm = U8(0xf5) // words 1,1,3,3
						}
						VPSHUFLW(imm, pair, sc)
						VPSHUFHW(imm, sc, sc)
					}
					qh := s.vec()
					vload(s, k.quads(2048+64*j), qh)
					var W [4]VecVirtual
					for a := range W {
						// Bits 2a, 2a+1 of qh to bits 4-5, then OR the low
						// 4 bits from the quads.
						h := s.vec()
						switch a {
						case 0:
							VPSLLW(U8(4), qh, h)
						case 1:
							VPSLLW(U8(2), qh, h)
						case 2:
							vload(s, qh, h)
						case 3:
							VPSRLW(U8(2), qh, h)
						}
						q := k.quads(512*g + 64*(4*sh+a))
						lo := s.vec()
						if nib == 0 {
							vand(s, q, c0F, lo)
						} else {
							highNibbles(s, q, c0F, lo)
						}
						if s.w512 {
							VPTERNLOGD(andOr, lo, c30, h) // h = h&0x30 | lo
						} else {
							vand(s, c30, h, h)
							vor(s, lo, h, h)
						}
						W[a] = h
					}
					first := g == 0 && nib == 0 && sh == 0
					for t := 0; t < T; t++ {
						xd := 4 + 16*j
						if s.vnni {
							sum := s.vec()
							zero(s, sum)
							for a := range W {
								vpdpbusdBcst(k.xmem(t, xd+4*a), W[a], sum)
							}
							if first {
								iacc[t] = s.vec()
								VPMULLD(sc, sum, iacc[t])
							} else {
								VPMULLD(sc, sum, sum)
								VPADDD(sum, iacc[t], iacc[t])
							}
							continue
						}
						for a := 0; a < 4; a += 2 {
							p0, p1 := k.bcastX(t, xd+4*a), k.bcastX(t, xd+4*a+4)
							VPMADDUBSW(p0, W[a], p0)
							VPMADDUBSW(p1, W[a+1], p1)
							VPADDW(p1, p0, p0) // ≤ 2·2·63·128: an int16
							if first && a == 0 {
								iacc[t] = s.vec()
								VPMADDWD(sc, p0, iacc[t])
							} else {
								VPMADDWD(sc, p0, p0)
								VPADDD(p0, iacc[t], iacc[t])
							}
						}
					}
				}
				// The bias: iacc += Σ (−32·sc_2p, −32·sc_2p+1)·(bsum_2p, bsum_2p+1).
				neg := s.vec()
				VPSLLW(U8(5), pair, pair)
				zero(s, neg)
				VPSUBW(pair, neg, neg)
				for t := 0; t < T; t++ {
					if s.vnni {
						vpdpwssdBcst(k.xmem(t, 260+4*p), neg, iacc[t])
					} else {
						b := k.bcastX(t, 260+4*p)
						VPMADDWD(neg, b, b)
						VPADDD(b, iacc[t], iacc[t])
					}
				}
			}
		}
		dv := halfToF32(k, k.f16(3328))
		for t := 0; t < T; t++ {
			finishBlock(k, t, iacc[t], nil, dv, nil)
		}
	}
	genPacked("P6K", s, T, 3360, setup, block)
}
