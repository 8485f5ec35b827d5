package main

import (
	"fmt"
	"os"
	"regexp"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// The AMX product over repacked Q4_K weights (ops/amx_amd64.go).
//
// TDPBSUD multiplies a tile of signed bytes A (16 rows × 64) by a tile of
// unsigned bytes B (16 rows of 16 dwords, each four consecutive K values
// of one column) into int32 C (16 × 16). A repacked Q4_K piece (64 K
// values: the low nibbles of its eight quads, then their high nibbles) is
// such a B already, 16 weight rows as the columns, but its sub-block
// scales s (6 bits) multiply the nibbles q before the sum, and s·q does
// not fit a byte. With s = 8h + l (h, l ≤ 7), q·h and q·l do (≤ 105), so
// per piece two B tiles, q·h and q·l (VPMULLW on word pairs: the low
// byte's product cannot carry into the high one), and
//
//	iacc = 8·Σ a·(q·h) + Σ a·(q·l) = Σ_j s_j Σ_{i in j} q_i·a_i
//
// exactly: the integer the twin (mulPackedQ4K) defines. The mins' term
// macc = Σ_j m_j·Σ_{i in j} a_i comes from the activations' sub-block
// sums (Q8_K's bsums added pairwise) by VPDPWSSD, and the float
// steps are the VNNI kernel's (finishBlock), so the results are the VNNI
// kernel's, bit for bit, whatever the token count.
//
// One call computes one group of 16 rows for tokens in passes of 32, two
// A tiles of 16 a pass, which the table (a0, a1, from, to a pass) places:
// the tiles start at tokens a0 and a1, and the pass adds tokens [from,
// to), those before a0+16 from tile 0. Every tile lies within the tokens
// (a pass of fewer than 32 moves its tiles back over tokens done, or
// overlaps them), so that no row past the last token is read. The A tiles
// load the tokens' Q8_K rows where they are; for each pass and block the
// kernel adds Q8_K's bsums pairwise into the sub-block sums, on its
// scratch. The first block stores the tokens' rows of out, the others add
// into them, as the twin's accumulator.
//
// Tiles: tmm0, tmm1 = A (the pass's two token tiles), tmm2 = B (q·h, then
// q·l), tmm3-6 = C (q·h of tiles 0 and 1, then q·l of tiles 0 and 1).
// Go's assembler knows no AMX instruction, so they are raw bytes (amxRaw),
// with fixed registers: base and index in AX-DI.

// The kernel's 64-byte aligned stack scratch: the expanded B tiles of the
// four pieces (q·h, q·l; a tile row split across cache lines loads several
// times slower), the C tiles, the pass's sub-block sums, out.
const (
	amxBHi   = 0
	amxBLo   = 4096
	amxC     = 8192
	amxS     = 12288
	amxSave  = 12288 + 512
	amxFrame = amxSave + 16 + 64 // + the alignment slack
)

// gp numbers for the tile instructions' ModRM/SIB bytes.
var amxGP = map[GPPhysical]int{RAX: 0, RCX: 1, RDX: 2, RBX: 3, RSI: 6, RDI: 7}

// amxRaw appends the bytes of one AMX instruction, its mnemonic as a
// comment.
func amxRaw(mnemonic string, bs ...byte) {
	Comment(mnemonic)
	for _, b := range bs {
		Instruction(&ir.Instruction{Opcode: "BYTE", Operands: []Op{U8(b)}})
	}
}

func ldtilecfg(base GPPhysical) {
	amxRaw(fmt.Sprintf("LDTILECFG (%s)", base.Asm()), 0xC4, 0xE2, 0x78, 0x49, byte(amxGP[base]))
}

func tilerelease() { amxRaw("TILERELEASE", 0xC4, 0xE2, 0x78, 0x49, 0xC0) }

func tilezero(t int) {
	amxRaw(fmt.Sprintf("TILEZERO tmm%d", t), 0xC4, 0xE2, 0x7B, 0x49, byte(0xC0|t<<3))
}

// tileloadd loads tile t from rows at base, index bytes apart.
func tileloadd(t int, base, index GPPhysical) {
	amxRaw(fmt.Sprintf("TILELOADD tmm%d, (%s)(%s*1)", t, base.Asm(), index.Asm()),
		0xC4, 0xE2, 0x7B, 0x4B, byte(0x04|t<<3), byte(amxGP[index]<<3|amxGP[base]))
}

// tilestored stores tile t to rows at base, index bytes apart.
func tilestored(t int, base, index GPPhysical) {
	amxRaw(fmt.Sprintf("TILESTORED (%s)(%s*1), tmm%d", base.Asm(), index.Asm(), t),
		0xC4, 0xE2, 0x7A, 0x4B, byte(0x04|t<<3), byte(amxGP[index]<<3|amxGP[base]))
}

// tdpbsud: c += a (signed bytes) · b (unsigned bytes).
func tdpbsud(c, a, b int) { tdp("TDPBSUD", 2, c, a, b) }

// tdpbssd: c += a (signed bytes) · b (signed bytes).
func tdpbssd(c, a, b int) { tdp("TDPBSSD", 3, c, a, b) }

// tdp appends a tile dot product, its signedness by the VEX prefix's pp
// field (2: F3, TDPBSUD; 3: F2, TDPBSSD): c in ModRM.reg, a in ModRM.rm,
// b in VEX.vvvv.
func tdp(mnemonic string, pp byte, c, a, b int) {
	amxRaw(fmt.Sprintf("%s tmm%d, tmm%d, tmm%d", mnemonic, c, a, b),
		0xC4, 0xE2, byte((^b&15)<<3)|pp, 0x5E, byte(0xC0|c<<3|a))
}

func genAMXQ4K() {
	scr := amxPrologue("amxQ4K", "Q4_K", "amx.go", amxFrame, amxSave)
	bcast(0x0F0F0F0F, Z31)
	bcast(0x3F3F3F3F, Z30)
	bcast(0x03030303, Z29)
	bcast(7, Z28)

	Label("amxQ4K_block")
	// The 12 scale bytes of the 16 rows (X0-X11, row r in byte r).
	for b := 0; b < 12; b++ {
		VMOVDQU(Mem{Base: RDI, Disp: 2048 + 16*b}, xreg(b))
	}
	// scaleMin puts sub-block j's scales in xs and mins in xm (a byte a
	// row), as unpackScalesK4 does.
	scaleMin := func(j int, xs, xm, t VecPhysical) {
		if j < 4 {
			VPANDD(X30, xreg(j), xs)
			VPANDD(X30, xreg(j+4), xm)
			return
		}
		VPANDD(X31, xreg(j+4), xs)
		VPSRLW(U8(6), xreg(j-4), t)
		VPANDD(X29, t, t)
		VPSLLW(U8(4), t, t)
		VPORD(t, xs, xs)
		VPSRLW(U8(4), xreg(j+4), xm)
		VPANDD(X31, xm, xm)
		VPSRLW(U8(6), xreg(j), t)
		VPANDD(X29, t, t)
		VPSLLW(U8(4), t, t)
		VPORD(t, xm, xm)
	}
	for g := 0; g < 4; g++ {
		// h and l of sub-blocks 2g (Z16, Z17) and 2g+1 (Z18, Z19) as
		// word pairs a row; the mins' pair (m_2g, m_2g+1) a row in Z12+g.
		for half, hl := range [2][2]VecPhysical{{Z16, Z17}, {Z18, Z19}} {
			scaleMin(2*g+half, X20, X21, X22)
			VPMOVZXBD(X20, Z23)
			VPSRLD(U8(3), Z23, hl[0])
			VPSLLD(U8(16), hl[0], Z24)
			VPORD(Z24, hl[0], hl[0])
			VPANDD(Z28, Z23, hl[1])
			VPSLLD(U8(16), hl[1], Z24)
			VPORD(Z24, hl[1], hl[1])
			if half == 0 {
				VPMOVZXBD(X21, zreg(12+g))
			} else {
				VPMOVZXBD(X21, Z24)
				VPSLLD(U8(16), Z24, Z24)
				VPORD(Z24, zreg(12+g), zreg(12+g))
			}
		}
		// The piece's B tiles: row k (quad k's low nibbles, sub-block 2g)
		// and row 8+k (its high nibbles, sub-block 2g+1).
		for k := 0; k < 8; k++ {
			amxPrefetch(2304, 8*g+k, 32)
			VMOVDQU64(Mem{Base: RDI, Disp: 512*g + 64*k}, Z25)
			VPANDD(Z31, Z25, Z26)
			VPSRLW(U8(4), Z25, Z27)
			VPANDD(Z31, Z27, Z27)
			for _, st := range []struct {
				scale, nib VecPhysical
				off        int
			}{{Z16, Z26, amxBHi + 64*k}, {Z18, Z27, amxBHi + 64*(8+k)}, {Z17, Z26, amxBLo + 64*k}, {Z19, Z27, amxBLo + 64*(8+k)}} {
				VPMULLW(st.scale, st.nib, Z24)
				VMOVDQU64(Z24, Mem{Base: scr, Disp: 1024*g + st.off})
			}
		}
	}
	VCVTPH2PS(Mem{Base: RDI, Disp: 2240}, Z10) // d of the 16 rows
	VCVTPH2PS(Mem{Base: RDI, Disp: 2272}, Z11) // dmin

	ldoArg, _ := Param("ldo").Resolve()
	Load(Param("passes"), R9)
	Load(Param("table"), R10)
	Label("amxQ4K_pass")
	// The pass's two tiles start at tokens a0 and a1 (table: a0, a1,
	// from, to); each tile's sub-block sums, pairwise from Q8_K's bsums,
	// go to the scratch (tile 1's 256 bytes on).
	for tile, disp := range []int{0, 8} {
		MOVQ(Mem{Base: R10, Disp: disp}, RAX)
		IMULQ(RBX, RAX)
		ADDQ(R12, RAX)
		MOVQ(RAX, []GPPhysical{R11, R13}[tile]) // the tile's first row
		LEAQ(Mem{Base: scr, Disp: amxS + 256*tile}, RSI)
		MOVQ(U32(16), RCX)
		Label(fmt.Sprintf("amxQ4K_sums%d", tile))
		VMOVDQU(Mem{Base: RAX, Disp: 4 + 256}, Y4) // bsums: 16 int16
		VPHADDW(Y4, Y4, Y4)                        // pairs: S0-3 in qword 0, S4-7 in qword 2
		VPERMQ(U8(0x08), Y4, Y4)
		VMOVDQU(X4, Mem{Base: RSI})
		ADDQ(RBX, RAX)
		ADDQ(U8(16), RSI)
		DECQ(RCX)
		JNZ(LabelRef(fmt.Sprintf("amxQ4K_sums%d", tile)))
	}
	amxProducts(func(g int) {
		LEAQ(Mem{Base: scr, Disp: amxBHi + 1024*g}, RAX)
		tileloadd(2, RAX, RDX)
		tdpbsud(3, 0, 2)
		tdpbsud(4, 1, 2)
		LEAQ(Mem{Base: scr, Disp: amxBLo + 1024*g}, RAX)
		tileloadd(2, RAX, RDX)
		tdpbsud(5, 0, 2)
		tdpbsud(6, 1, 2)
	})
	amxEpilogue("amxQ4K", amxC, 2304, func(first bool) { amxFinish(first, ldoArg.Addr) })
}

// amxProducts emits a pass's tile products: the C tiles 3-6 zeroed, then
// for each 64-element piece g of the block the pass's two token tiles
// loaded (tmm0 from the rows at R11, tmm1 from those at R13, RBX apart)
// and piece(g), which loads the piece's B tiles and multiplies.
func amxProducts(piece func(g int)) {
	for c := 3; c <= 6; c++ {
		tilezero(c)
	}
	for g := 0; g < 4; g++ {
		LEAQ(Mem{Base: R11, Disp: 4 + 64*g}, RAX) // tile 0's tokens' K values 64g-64g+63
		tileloadd(0, RAX, RBX)
		LEAQ(Mem{Base: R13, Disp: 4 + 64*g}, RAX) // tile 1's
		tileloadd(1, RAX, RBX)
		piece(g)
	}
}

// amxPrologue starts the AMX kernel name over repacked weights of type
// typ (its generator in file) with frame bytes of scratch: the tile
// configuration loaded, the scratch 64-byte aligned at R14 (returned),
// RDI = w, R8 = nb, R12 = x, RBX = ab, RDX = 64 (the scratch tiles'
// stride), out saved on the scratch at save.
func amxPrologue(name, typ, file string, frame, save int) GPPhysical {
	TEXT(name, 0, "func(cfg *[64]byte, w *byte, nb int, x *byte, ab int, table *[4]int, passes int, out *float32, ldo int)")
	Pragma("noescape")
	Doc(fmt.Sprintf("%s adds one group of 16 repacked %s rows times the prepared activations into out, with AMX tiles (see ops/_asm/%s).", name, typ, file))
	local := AllocLocal(frame)
	Load(Param("cfg"), RAX)
	ldtilecfg(RAX)
	scr := R14 // the aligned scratch
	LEAQ(local.Offset(63), scr)
	ANDQ(I32(^63), scr)
	Load(Param("w"), RDI)
	Load(Param("nb"), R8)
	Load(Param("x"), R12)
	MOVQ(U32(64), RDX)
	Load(Param("ab"), RBX)
	Load(Param("out"), RAX)
	MOVQ(RAX, Mem{Base: scr, Disp: save})
	return scr
}

// bcast broadcasts the dword v into z.
func bcast(v uint32, z VecPhysical) {
	MOVL(U32(v), R9L)
	VPBROADCASTD(R9L, z)
}

// amxEpilogue ends a pass of an AMX kernel named prefix: the C tiles 3-6
// stored to the scratch at c, the pass's tokens finished (finish, at the
// first block or a later one: the first block's sums are the tokens'
// first, stored, not added, as the twin's accumulator starts at zero, so
// out needs no clearing), then the next pass, the next block (block
// bytes of weights on) and the return.
func amxEpilogue(prefix string, c, block int, finish func(first bool)) {
	for i, t := range []int{3, 4, 5, 6} {
		LEAQ(Mem{Base: R14, Disp: c + 1024*i}, RAX)
		tilestored(t, RAX, RDX)
	}
	nbArg, _ := Param("nb").Resolve()
	CMPQ(R8, nbArg.Addr)
	JNE(LabelRef(prefix + "_later"))
	finish(true)
	JMP(LabelRef(prefix + "_finished"))
	Label(prefix + "_later")
	finish(false)
	Label(prefix + "_finished")
	ADDQ(U8(32), R10) // the next pass
	DECQ(R9)
	JNZ(LabelRef(prefix + "_pass"))
	// The next block.
	ADDQ(U32(block), RDI)
	ADDQ(U32(292), R12)
	DECQ(R8)
	JNZ(LabelRef(prefix + "_block"))
	tilerelease()
	VZEROUPPER()
	RET()
}

// amxFinish finishes tokens from to to of the pass (amxTokenLoop): a
// tile's q·h rows are at C + 1024·tile + 64·row, its q·l rows 2048 on,
// its sums at S + 256·tile + 16·row.
func amxFinish(first bool, ldo Mem) {
	amxTokenLoop("amxQ4K", first, ldo, amxC, amxS, amxSave, func() {
		VMOVDQU32(Mem{Base: RAX}, Z0)
		VPSLLD(U8(3), Z0, Z0)
		VPADDD(Mem{Base: RAX, Disp: 2048}, Z0, Z0) // iacc
		VPXORD(Z1, Z1, Z1)
		for p := 0; p < 4; p++ {
			vpdpwssdBcst(Mem{Base: R13, Disp: 4 * p}, zreg(12+p), Z1) // macc
		}
		// finishBlock's float steps.
		VCVTDQ2PS(Z0, Z0)
		VMULPS(Z10, Z0, Z0)
		VCVTDQ2PS(Z1, Z1)
		VFNMADD231PS(Z11, Z1, Z0)
	})
}

// amxTokenLoop emits the finishing of tokens from to to of a pass (its
// table at R10) of an AMX kernel named prefix: those before a0+16 from
// tile 0 (row t-a0), the others from tile 1 (row t-a1). For each token,
// RAX points at its row of the tile's first C tile (c + 1024·tile +
// 64·row, on the kernel's scratch at R14), R13 at its row of the tile's
// sub-block sums when sums is not negative (sums + 256·tile + 16·row),
// R11 at its Q8_K block (yd first) and R15 at its row of out (out saved at
// save); value leaves the token's block in Z0 as floats, which the loop
// adds into out times yd, or at the first block stores (the twin's
// accumulator starts at zero).
func amxTokenLoop(prefix string, first bool, ldo Mem, c, sums, save int, value func()) {
	scr := R14
	name := "later"
	if first {
		name = "first"
	}
	MOVQ(Mem{Base: R10, Disp: 16}, RSI) // t = from
	for tile := 0; tile < 2; tile++ {
		end := fmt.Sprintf("%s_%s_done%d", prefix, name, tile)
		if tile == 0 {
			MOVQ(Mem{Base: R10}, RCX)
			ADDQ(U8(16), RCX)
			CMPQ(Mem{Base: R10, Disp: 24}, RCX)
			CMOVQLT(Mem{Base: R10, Disp: 24}, RCX) // the tile's end: min(a0+16, to)
		} else {
			MOVQ(Mem{Base: R10, Disp: 24}, RCX)
		}
		SUBQ(RSI, RCX) // tokens from this tile
		JLE(LabelRef(end))
		MOVQ(RSI, RAX)
		SUBQ(Mem{Base: R10, Disp: 8 * tile}, RAX) // row = t - a
		if sums >= 0 {
			MOVQ(RAX, R13)
		}
		SHLQ(U8(6), RAX)
		if sums >= 0 {
			SHLQ(U8(4), R13)
		}
		LEAQ(Mem{Base: scr, Index: RAX, Scale: 1, Disp: c + 1024*tile}, RAX)
		if sums >= 0 {
			LEAQ(Mem{Base: scr, Index: R13, Scale: 1, Disp: sums + 256*tile}, R13)
		}
		MOVQ(RSI, R11)
		IMULQ(RBX, R11)
		ADDQ(R12, R11) // token t's Q8_K block
		MOVQ(RSI, R15)
		IMULQ(ldo, R15)
		ADDQ(Mem{Base: scr, Disp: save}, R15) // token t's out row
		ADDQ(RCX, RSI)                        // t after this tile's
		Label(fmt.Sprintf("%s_%s_token%d", prefix, name, tile))
		value()
		if first {
			VPXORD(Z2, Z2, Z2)
		} else {
			VMOVUPS(Mem{Base: R15}, Z2)
		}
		VFMADD231PS_BCST(Mem{Base: R11}, Z0, Z2)
		VMOVUPS(Z2, Mem{Base: R15})
		ADDQ(U8(64), RAX)
		if sums >= 0 {
			ADDQ(U8(16), R13)
		}
		ADDQ(RBX, R11)
		ADDQ(ldo, R15)
		DECQ(RCX)
		JNZ(LabelRef(fmt.Sprintf("%s_%s_token%d", prefix, name, tile)))
		Label(end)
	}
}

// amxPrefetch prefetches part i of n of the next weight block (RDI +
// block on; the next group's first block after the last): in an MoE
// layer's experts the weights come from memory, and the first loads of
// each block would otherwise wait for it (the VNNI kernels do the same,
// prefetchNext).
func amxPrefetch(block, i, n int) {
	lines := (block + 63) / 64
	for l := i * lines / n; l < (i+1)*lines/n; l++ {
		PREFETCHT0(Mem{Base: RDI, Disp: block + 64*l})
	}
}

// fixAMX joins each AMX instruction's BYTE lines (after its mnemonic's
// comment line) in the assembly file at path into one line, the mnemonic
// as its comment.
func fixAMX(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`(?m)^\n?\t// ((?:LDTILECFG|TILE|TDP)[^\n]*)\n((?:\tBYTE +\$0x[0-9a-f]{2}\n)+)`)
	out := re.ReplaceAllStringFunc(string(b), func(block string) string {
		m := re.FindStringSubmatch(block)
		var bs []string
		for _, l := range strings.Split(strings.TrimSpace(m[2]), "\n") {
			bs = append(bs, "BYTE "+strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(l), "BYTE")))
		}
		return "\t" + strings.Join(bs, "; ") + " // " + m[1] + "\n"
	})
	return os.WriteFile(path, []byte(out), 0o644)
}

func xreg(i int) VecPhysical {
	return []VecPhysical{X0, X1, X2, X3, X4, X5, X6, X7, X8, X9, X10, X11}[i]
}

func zreg(i int) VecPhysical {
	return []VecPhysical{Z0, Z1, Z2, Z3, Z4, Z5, Z6, Z7, Z8, Z9, Z10, Z11, Z12, Z13, Z14, Z15}[i]
}
