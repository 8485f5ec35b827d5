package main

import (
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	. "github.com/mmcloughlin/avo/build"
	"github.com/mmcloughlin/avo/ir"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// isa is one instruction-set level.
type isa struct {
	name string
	w512 bool // 512-bit vectors and AVX-512 masks
	vnni bool // VPDPBUSD / VPDPWSSD
	vex  bool // AVX-VNNI: 256-bit AVX2 kernels with the VEX VPDPBUSD (vpdpbusdVEX)
}

var (
	isaAVX2    = isa{"AVX2", false, false, false}
	isaAVXVNNI = isa{"AVXVNNI", false, false, true}
	isaAVX512  = isa{"AVX512", true, false, false}
	isaVNNI    = isa{"VNNI", true, true, false}
)

// tokens lists the token counts T that multi-token kernels are generated
// for: T activation rows are dotted with each weight block while it sits
// in registers, so its unpacking is paid once per T tokens. AVX-512 has 32
// vector registers, room for 8 tokens' accumulators; AVX2 has 16, enough
// for 4 only by keeping a few block values on the stack (see q4k.go).
func (s isa) tokens() []int {
	if v := os.Getenv("TOK"); v != "" {
		n, _ := strconv.Atoi(v)
		return []int{n}
	}
	if s.w512 {
		return []int{1, 2, 4, 8}
	}
	return []int{1, 2, 4}
}

// packedTokens lists the token counts of the kernels over repacked
// weights (packed.go): their per-token state is one or two vectors, so
// AVX-512 takes 16 tokens, AVX2's 16 registers 4.
func (s isa) packedTokens() []int {
	if v := os.Getenv("TOK"); v != "" {
		n, _ := strconv.Atoi(v)
		return []int{n}
	}
	if s.w512 {
		return []int{1, 2, 4, 8, 16}
	}
	return []int{1, 2, 4}
}

// vec allocates a vector register of the level's width.
func (s isa) vec() VecVirtual {
	if s.w512 {
		return ZMM()
	}
	return YMM()
}

// bytes is the vector width in bytes.
func (s isa) bytes() int {
	if s.w512 {
		return 64
	}
	return 32
}

// vpdpbusd appends acc += Σ4 u8(u)·s8(s) per dword lane (AVX512_VNNI,
// EVEX). Go operand order: signed source (register or memory), unsigned
// source, accumulator.
func vpdpbusd(s, u, acc Op) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPBUSD",
		Operands: []Op{s, u, acc},
		Inputs:   []Op{s, u, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512_VNNI"},
	})
}

// vexOps are the placeholder opcodes of the VEX-encoded (AVX-VNNI)
// VPDPBUSD and VPDPWSSD, by their opcode byte: Go's assembler knows only
// the EVEX forms, which need AVX-512, so fixVEX rewrites each placeholder
// line of the generated file into raw bytes once avo has allocated the
// registers.
var vexOps = map[string]int{"VPDPBUSD_VEX": 0x50, "VPDPWSSD_VEX": 0x52}

func vexInstr(op string, a, b, acc VecVirtual) {
	Instruction(&ir.Instruction{
		Opcode:   op,
		Operands: []Op{a, b, acc},
		Inputs:   []Op{a, b, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX_VNNI"},
	})
}

// vpdpbusdVEX appends acc += Σ4 u8(u)·s8(s) per dword lane on YMM
// registers (AVX-VNNI, VEX.256.66.0F38.W0 50 /r). Register operands only;
// Go operand order as vpdpbusd.
func vpdpbusdVEX(s, u, acc VecVirtual) { vexInstr("VPDPBUSD_VEX", s, u, acc) }

// vpdpwssdVEX appends acc += a.lo·b.lo + a.hi·b.hi per dword lane, int16
// halves, on YMM registers (AVX-VNNI, VEX.256.66.0F38.W0 52 /r).
func vpdpwssdVEX(a, b, acc VecVirtual) { vexInstr("VPDPWSSD_VEX", a, b, acc) }

// dotU8S8 returns a new YMM register holding, per dword lane, Σ4 u8(u)·s8(x)
// (AVX-VNNI) or its AVX2 equivalent VPMADDWD(ones, VPMADDUBSW(x, u)) when
// ones is given; x is a register or memory. Σ2 in the AVX2 form must not
// saturate int16 (every caller's operands keep it within range), so both
// give the same lanes.
func dotU8S8(s isa, x Op, u, ones VecVirtual) VecVirtual {
	p := YMM()
	if s.vex {
		xr, ok := x.(VecVirtual)
		if !ok {
			xr = YMM()
			VMOVDQU(x, xr)
		}
		VPXOR(p, p, p)
		vpdpbusdVEX(xr, u, p)
		return p
	}
	VPMADDUBSW(x, u, p)
	VPMADDWD(ones, p, p)
	return p
}

// fixVEX replaces each vexOps line of the assembly file at path by the
// raw bytes of OP ymm1(acc), ymm2(b), ymm3(a) in its 3-byte VEX form:
//
//	C4  R̄ X̄ B̄ 00010       (R̄: ~acc bit 3, X̄ = 1, B̄: ~a bit 3; map 0F38)
//	    W=0 v̄v̄v̄v̄ L=1 pp=01   (vvvv: ~b; 256-bit; prefix 66)
//	op  ModRM 11 acc[2:0] a[2:0]   (op 50 VPDPBUSD, 52 VPDPWSSD)
func fixVEX(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	re := regexp.MustCompile(`(?m)^\t(VPDP[A-Z]+)_VEX\s+Y([0-9]+), Y([0-9]+), Y([0-9]+)$`)
	var bad error
	out := re.ReplaceAllStringFunc(string(b), func(line string) string {
		m := re.FindStringSubmatch(line)
		op, ok := vexOps[m[1]+"_VEX"]
		ar, _ := strconv.Atoi(m[2])
		br, _ := strconv.Atoi(m[3])
		cr, _ := strconv.Atoi(m[4])
		if !ok || ar > 15 || br > 15 || cr > 15 {
			bad = fmt.Errorf("%s: cannot encode %q (VEX needs registers 0-15)", path, line)
		}
		b1 := 0x40 | 0x02 | (^cr>>3&1)<<7 | (^ar>>3&1)<<5
		b2 := (^br&15)<<3 | 0x04 | 0x01
		modrm := 0xc0 | (cr&7)<<3 | ar&7
		return fmt.Sprintf("\tBYTE $0xc4; BYTE $0x%02x; BYTE $0x%02x; BYTE $0x%02x; BYTE $0x%02x // %s Y%d, Y%d, Y%d (VEX, AVX-VNNI)",
			b1, b2, op, modrm, m[1], ar, br, cr)
	})
	if bad != nil {
		return bad
	}
	if strings.Contains(out, "_VEX") {
		return fmt.Errorf("%s: a VEX placeholder is left with operands fixVEX cannot encode", path)
	}
	return os.WriteFile(path, []byte(out), 0o644)
}

// vpdpwssd appends acc += a.lo·b.lo + a.hi·b.hi per dword lane, int16 halves.
func vpdpwssd(a, b, acc Op) {
	Instruction(&ir.Instruction{
		Opcode:   "VPDPWSSD",
		Operands: []Op{a, b, acc},
		Inputs:   []Op{a, b, acc},
		Outputs:  []Op{acc},
		ISA:      []string{"AVX512_VNNI"},
	})
}

// ternlog returns the VPTERNLOGD immediate computing f(A, B, C), where A is
// the destination operand, B the middle and C the first (Go order).
func ternlog(f func(a, b, c bool) bool) U8 {
	var imm uint8
	for i := 0; i < 8; i++ {
		if f(i&4 != 0, i&2 != 0, i&1 != 0) {
			imm |= 1 << i
		}
	}
	return U8(imm)
}

// constant emits a read-only table and returns it.
func constant(name string, words ...uint64) Mem {
	m := GLOBL(name, RODATA|NOPTR)
	for i, w := range words {
		DATA(8*i, U64(w))
	}
	return m
}

var constants = map[string]Mem{}

// constOnce returns the table name, emitting it on first use.
func constOnce(name string, words ...uint64) Mem {
	if m, ok := constants[name]; ok {
		return m
	}
	m := constant(name, words...)
	constants[name] = m
	return m
}

// splat repeats byte b over 8 bytes.
func splat(b uint8) uint64 { return 0x0101010101010101 * uint64(b) }

// mulKernel is the state of a multi-row, multi-token kernel: its loops are
// the same for every weight type (see genMul).
type mulKernel struct {
	s        isa
	T        int
	wp       GPVirtual    // the current weight block
	xb, xb1  GPVirtual    // the current activation block of tokens 0 and 1
	xb4, xb5 GPVirtual    // ... and of tokens 4 and 5 (T = 8)
	xb8      [4]GPVirtual // ... and of tokens 8, 9, 12, 13 (T = 16)
	xs       GPVirtual    // bytes between tokens' activation rows
	facc     []VecVirtual // per token float accumulators
	blockTag string
}

// xmem is byte disp of the current activation block of token t. Tokens 2
// and 3 are reached through the stride register (scale 2) from tokens 0
// and 1, which keeps four tokens within three pointer registers.
func (k *mulKernel) xmem(t, disp int) Mem {
	base := [2]GPVirtual{k.xb, k.xb1}
	switch {
	case t >= 12:
		base = [2]GPVirtual{k.xb8[2], k.xb8[3]}
		t -= 12
	case t >= 8:
		base = [2]GPVirtual{k.xb8[0], k.xb8[1]}
		t -= 8
	case t >= 4:
		base = [2]GPVirtual{k.xb4, k.xb5}
		t -= 4
	}
	switch t {
	case 0, 1:
		return Mem{Base: base[t], Disp: disp}
	case 2, 3:
		return Mem{Base: base[t-2], Index: k.xs, Scale: 2, Disp: disp}
	}
	panic("token index out of range")
}

// w is byte disp of the current weight block.
func (k *mulKernel) w(disp int) Mem { return Mem{Base: k.wp, Disp: disp} }

// mulSig is the Go signature of every multi-row kernel:
//
//	out[t*os/4 + r] = Σ_b dot(weight block b of row r, activation block b of token t)
//
// for r < rows and t < T, over nb blocks per row. Weight rows are
// contiguous (row r+1 starts where row r ends); activation rows are xs
// bytes apart, output rows (tokens) os bytes apart.
const mulSig = "func(w *byte, rows int, x *byte, xs uintptr, out *float32, os uintptr, nb int)"

// genMul emits one kernel: setup runs once, block once per weight block and
// accumulates T tokens into k.facc; each token's 16 (or 8) float lanes are
// summed at the end of the row in a fixed order, so a token's result does
// not depend on T or on the other tokens.
func genMul(family string, s isa, T, wBlock, xBlock int, setup func(k *mulKernel), block func(k *mulKernel)) {
	genMulTail(family, s, T, wBlock, xBlock, 1, setup, block, nil)
}

// genMulTail is genMul for kernels whose loop body takes per blocks at a
// time (per = 2: two 32-element blocks fill a 512-bit register); tail then
// handles the nb%per blocks left at the end of each row.
func genMulTail(family string, s isa, T, wBlock, xBlock, per int, setup, block, tail func(k *mulKernel)) {
	name := fmt.Sprintf("mul%s%s%d", family, s.name, T)
	register(family, s, T, name)
	TEXT(name, NOSPLIT, mulSig)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s multiplies rows of weights by %d activation row(s) (%s).", name, T, s.name))
	k := &mulKernel{s: s, T: T}
	k.wp = Load(Param("w"), GP64()).(GPVirtual)
	k.xs = Load(Param("xs"), GP64()).(GPVirtual)
	outp := Load(Param("out"), GP64()).(GPVirtual)
	rows, _ := Param("rows").Resolve()
	xArg, _ := Param("x").Resolve()
	nbArg, _ := Param("nb").Resolve()
	osArg, _ := Param("os").Resolve()
	setup(k)
	k.facc = make([]VecVirtual, T)
	for t := range k.facc {
		k.facc[t] = s.vec()
	}

	Label(name + "_row")
	for _, f := range k.facc {
		zero(s, f)
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
	n := GP64()
	MOVQ(nbArg.Addr, n)
	if per == 2 {
		SHRQ(U8(1), n)
		JZ(LabelRef(name + "_tail"))
	}

	Label(name + "_block")
	block(k)
	ADDQ(U32(per*wBlock), k.wp)
	ADDQ(U32(per*xBlock), k.xb)
	if T > 1 {
		ADDQ(U32(per*xBlock), k.xb1)
	}
	if T > 4 {
		ADDQ(U32(per*xBlock), k.xb4)
		ADDQ(U32(per*xBlock), k.xb5)
	}
	DECQ(n)
	JNZ(LabelRef(name + "_block"))

	if per == 2 {
		Label(name + "_tail")
		MOVQ(nbArg.Addr, n)
		TESTQ(U32(1), n)
		JZ(LabelRef(name + "_sum"))
		tail(k)
		ADDQ(U32(wBlock), k.wp)
	}

	// Sum each token's lanes and store it.
	Label(name + "_sum")
	os := GP64()
	MOVQ(osArg.Addr, os)
	storeSums(s, k.facc, outp, os)
	ADDQ(U8(4), outp)
	DECQ(rows.Addr)
	JNZ(LabelRef(name + "_row"))
	VZEROUPPER()
	RET()
}

// storeSums sums each token's lanes and stores token t's result at
// outp + t·os.
func storeSums(s isa, facc []VecVirtual, outp, os GPVirtual) {
	var o3 GPVirtual
	for t, f := range facc {
		r := hsum(s, f)
		switch t {
		case 0:
			VMOVSS(r, Mem{Base: outp})
		case 1, 2, 4, 8:
			VMOVSS(r, Mem{Base: outp, Index: os, Scale: uint8(t)})
		default:
			if o3 == nil {
				o3 = GP64().(GPVirtual)
			}
			// o3 = t·os for t = 3, 5, 6, 7.
			switch t {
			case 3:
				LEAQ(Mem{Base: os, Index: os, Scale: 2}, o3)
			case 5:
				LEAQ(Mem{Base: os, Index: os, Scale: 4}, o3)
			case 6:
				LEAQ(Mem{Base: os, Index: os, Scale: 2}, o3)
				ADDQ(o3, o3)
			case 7:
				LEAQ(Mem{Base: os, Index: os, Scale: 2}, o3)
				LEAQ(Mem{Base: o3, Index: os, Scale: 4}, o3)
			}
			VMOVSS(r, Mem{Base: outp, Index: o3, Scale: 1})
		}
	}
}

// zero clears v (a zero idiom: no execution unit, no input dependency).
// avo's table marks the VEX VPXOR as a zero idiom but not the EVEX VPXORD,
// which would make the register look live before it; hence the raw form.
func zero(s isa, v Op) {
	if s.w512 {
		Instruction(&ir.Instruction{
			Opcode:           "VPXORD",
			Operands:         []Op{v, v, v},
			Inputs:           []Op{v, v},
			Outputs:          []Op{v},
			CancellingInputs: true,
		})
	} else {
		VPXOR(v, v, v)
	}
}

// hsum adds the float lanes of v in a fixed order and returns an XMM
// register whose low lane holds the sum.
func hsum(s isa, v VecVirtual) VecVirtual { return hfold(s, v, VADDPS, VADDSS) }

// hmax is the largest float lane of v (no lane NaN), as hsum returns it.
func hmax(s isa, v VecVirtual) VecVirtual { return hfold(s, v, VMAXPS, VMAXSS) }

// hfold folds the float lanes of v with the packed operation ps, halving
// the width each time, and the last pair with its scalar form ss.
func hfold(s isa, v VecVirtual, ps, ss func(...Op)) VecVirtual {
	y := v.AsY().(VecVirtual)
	if s.w512 {
		hi := YMM()
		VEXTRACTF64X4(U8(1), v, hi)
		ps(hi, v.AsY(), hi)
		y = hi
	}
	x := XMM()
	if s.w512 {
		VEXTRACTF32X4(U8(1), y, x) // EVEX: the register may be 16-31
	} else {
		VEXTRACTF128(U8(1), y, x)
	}
	ps(x, y.AsX(), x)
	t := XMM()
	VMOVHLPS(x, x, t)
	ps(t, x, x)
	VMOVSHDUP(x, t)
	ss(t, x, x)
	return x
}
