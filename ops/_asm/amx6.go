package main

import (
	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The AMX product over repacked Q6_K weights (ops/amx_amd64.go), beside
// amxQ4K (amx.go), whose passes, table and tile placement it shares.
//
// A Q6_K element is q = 32·b5 + 16·b4 + l4 (q 0..63: the two high bits
// from qh, the low nibble from ql), its 16-element group's scale sc a
// signed byte. sc·q does not fit a byte, and neither does any product of
// sc with more than one bit of q. With sc = 16h + l (h = sc>>4, -8..7;
// l = sc&15, 0..15):
//
//	sc·q = 16·(2·(sc·b5) + sc·b4 + h·l4) + l·l4
//
// where sc·b5, sc·b4 (a bit selects sc) and h·l4 (-120..105) are signed
// bytes and l·l4 (0..225) an unsigned one. So each 64-element piece has
// four B tiles, and each token tile two C tiles: C16 takes TDPBSSD of the
// sc·b5 tile twice, of sc·b4 and of h·l4; C1 takes TDPBSUD of l·l4. Then
//
//	iacc = 16·C16 + C1 − 32·Σ_j sc_j·bsum_j
//
// exactly: the integer the twin (mulPackedQ6K) defines; the last term by
// VPDPWSSD of the scale pairs (as packed: two groups' scales a row) with
// Q8_K's bsum pairs, and the float steps are the VNNI kernel's
// (finishBlock without mins), so the results are its bits.
//
// h·l4 comes from VPMULLW on word pairs with h+8 (0..15, so that the low
// byte's product cannot carry) less 8·l4 (VPSUBB); sc·b4 and sc·b5 from
// VPTESTMB of the qh bit and a zeroing byte move of sc.
//
// Tiles: tmm0, tmm1 = A (the pass's two token tiles), tmm2 = B, tmm3-4 =
// C16 of tiles 0 and 1, tmm5-6 = C1 of tiles 0 and 1 (amxConfig, as
// amxQ4K's).

// amxQ6K's 64-byte aligned stack scratch: the four expanded B tiles of
// each piece (sc·b5, sc·b4, h·l4, l·l4), the C tiles, the block's scale
// pairs (one zmm a pair p of groups 2p, 2p+1) and d, out.
const (
	amx6B    = 0
	amx6C    = 16384
	amx6SCP  = amx6C + 4096
	amx6D    = amx6SCP + 512
	amx6Save = amx6D + 64
	amx6Fr   = amx6Save + 16 + 64 // + the alignment slack
)

// Byte offsets in a repacked Q6_K group-block (ops/repack.go).
const (
	p6QH    = 2048
	p6SC    = 3072
	p6D     = 3328
	p6Bytes = 3360
)

func genAMXQ6K() {
	scr := amxPrologue("amxQ6K", "Q6_K", "amx6.go", amx6Fr, amx6Save)
	bcast(0x0F0F0F0F, Z31)
	bcast(8, Z29)
	bcast(15, Z28)
	// Z30: VPSHUFB pattern repeating each dword's low byte over the dword.
	VMOVDQU64(constOnce("amx6_rep", 0x0404040400000000, 0x0C0C0C0C08080808, 0x0404040400000000, 0x0C0C0C0C08080808,
		0x0404040400000000, 0x0C0C0C0C08080808, 0x0404040400000000, 0x0C0C0C0C08080808), Z30)
	// Bit b of every byte, b = 0..7, a zmm each (VPTESTMB's operand).
	var bits [8]uint64
	for b := range bits {
		bits[b] = splat(byte(1 << b))
	}
	bitTab := constOnce("amx6_bits", func() []uint64 {
		var ws []uint64
		for _, w := range bits {
			for range 8 {
				ws = append(ws, w)
			}
		}
		return ws
	}()...)
	bitMem := func(b int) Mem { return bitTab.Offset(64 * b) }

	Label("amxQ6K_block")
	for pc := 0; pc < 4; pc++ {
		// The scales of the piece's groups 4pc..4pc+3 (pairs 2pc, 2pc+1):
		// sc a byte over each row's dword (Z16+jl), h+8 (Z20+jl) and l
		// (Z24+jl) in both words of it.
		for half := 0; half < 2; half++ {
			p := 2*pc + half
			VMOVDQU(Mem{Base: RDI, Disp: p6SC + 32*p}, Y0)
			VPMOVSXBW(Y0, Z1)
			VMOVDQU64(Z1, Mem{Base: scr, Disp: amx6SCP + 64*p})
			VPSLLW(U8(8), Y0, Y2)
			VPSRAW(U8(8), Y2, Y2) // groups 2p: sc as words
			VPSRAW(U8(8), Y0, Y3) // groups 2p+1
			for odd, yw := range []VecPhysical{Y2, Y3} {
				jl := 2*half + odd
				VPMOVSXWD(yw, Z4)
				VPSHUFB(Z30, Z4, zreg32(16+jl))
				VPSRAD(U8(4), Z4, Z5)
				VPADDD(Z29, Z5, Z5)
				VPSLLD(U8(16), Z5, Z6)
				VPORD(Z6, Z5, zreg32(20+jl))
				VPANDD(Z28, Z4, Z5)
				VPSLLD(U8(16), Z5, Z6)
				VPORD(Z6, Z5, zreg32(24+jl))
			}
		}
		for jl := 0; jl < 4; jl++ {
			VMOVDQU64(Mem{Base: RDI, Disp: p6QH + 64*(4*pc+jl)}, zreg32(12+jl))
		}
		// Tile row R (elements 64pc+4R..+3 of each row): quad R%8's low
		// (R < 8) or high nibbles, group 4pc+R/4, its qh bits 2(R%4) and
		// 2(R%4)+1.
		for k := 0; k < 8; k++ {
			amxPrefetch(p6Bytes, 8*pc+k, 32)
			VMOVDQU64(Mem{Base: RDI, Disp: 512*pc + 64*k}, Z0)
			VPANDD(Z31, Z0, Z1)
			VPSRLW(U8(4), Z0, Z2)
			VPANDD(Z31, Z2, Z2)
			for _, rq := range []struct {
				r  int
				l4 VecPhysical
			}{{k, Z1}, {8 + k, Z2}} {
				jl, a := rq.r/4, rq.r%4
				qh, sc, h, l := zreg32(12+jl), zreg32(16+jl), zreg32(20+jl), zreg32(24+jl)
				row := amx6B + 4096*pc + 64*rq.r
				VPTESTMB(bitMem(2*a+1), qh, K1)
				VMOVDQU8_Z(sc, K1, Z3)
				VMOVDQU64(Z3, Mem{Base: scr, Disp: row}) // sc·b5
				VPTESTMB(bitMem(2*a), qh, K2)
				VMOVDQU8_Z(sc, K2, Z4)
				VMOVDQU64(Z4, Mem{Base: scr, Disp: row + 1024}) // sc·b4
				VPMULLW(h, rq.l4, Z5)
				VPSLLW(U8(3), rq.l4, Z6)
				VPSUBB(Z6, Z5, Z5)
				VMOVDQU64(Z5, Mem{Base: scr, Disp: row + 2048}) // h·l4
				VPMULLW(l, rq.l4, Z7)
				VMOVDQU64(Z7, Mem{Base: scr, Disp: row + 3072}) // l·l4
			}
		}
	}
	VCVTPH2PS(Mem{Base: RDI, Disp: p6D}, Z8) // d of the 16 rows
	VMOVUPS(Z8, Mem{Base: scr, Disp: amx6D})

	ldoArg, _ := Param("ldo").Resolve()
	Load(Param("passes"), R9)
	Load(Param("table"), R10)
	Label("amxQ6K_pass")
	for p := 0; p < 8; p++ {
		VMOVDQU64(Mem{Base: scr, Disp: amx6SCP + 64*p}, zreg32(16+p))
	}
	VMOVUPS(Mem{Base: scr, Disp: amx6D}, Z10)
	for tile, disp := range []int{0, 8} {
		MOVQ(Mem{Base: R10, Disp: disp}, RAX)
		IMULQ(RBX, RAX)
		ADDQ(R12, RAX)
		MOVQ(RAX, []GPPhysical{R11, R13}[tile]) // the tile's first row
	}
	amxProducts(func(pc int) {
		for bt := 0; bt < 4; bt++ {
			LEAQ(Mem{Base: scr, Disp: amx6B + 4096*pc + 1024*bt}, RAX)
			tileloadd(2, RAX, RDX)
			switch bt {
			case 0: // sc·b5, twice: its weight is 32
				tdpbssd(3, 0, 2)
				tdpbssd(4, 1, 2)
				tdpbssd(3, 0, 2)
				tdpbssd(4, 1, 2)
			case 1, 2:
				tdpbssd(3, 0, 2)
				tdpbssd(4, 1, 2)
			case 3:
				tdpbsud(5, 0, 2)
				tdpbsud(6, 1, 2)
			}
		}
	})
	amxEpilogue("amxQ6K", amx6C, p6Bytes, func(first bool) { amx6Finish(first, ldoArg.Addr) })
}

// amx6Finish finishes tokens from to to of the pass (amxTokenLoop): a
// tile's C16 rows are at C + 1024·tile + 64·row, its C1 rows 2048 on; the
// scale pairs are in Z16-Z23, d in Z10.
func amx6Finish(first bool, ldo Mem) {
	amxTokenLoop("amxQ6K", first, ldo, amx6C, -1, amx6Save, func() {
		VMOVDQU32(Mem{Base: RAX}, Z0)
		VPSLLD(U8(4), Z0, Z0)
		VPADDD(Mem{Base: RAX, Disp: 2048}, Z0, Z0)
		VPXORD(Z1, Z1, Z1)
		for p := 0; p < 8; p++ {
			vpdpwssdBcst(Mem{Base: R11, Disp: 260 + 4*p}, zreg32(16+p), Z1)
		}
		VPSLLD(U8(5), Z1, Z1)
		VPSUBD(Z1, Z0, Z0) // iacc
		// finishBlock's float steps (no mins).
		VCVTDQ2PS(Z0, Z0)
		VMULPS(Z10, Z0, Z0)
	})
}

func zreg32(i int) VecPhysical {
	return []VecPhysical{Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7, Z8, Z9, Z10, Z11, Z12, Z13, Z14, Z15,
		Z16, Z17, Z18, Z19, Z20, Z21, Z22, Z23, Z24, Z25, Z26, Z27, Z28, Z29, Z30, Z31}[i]
}
