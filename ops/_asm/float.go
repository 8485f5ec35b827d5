package main

import (
	"fmt"

	. "github.com/mmcloughlin/avo/build"
	. "github.com/mmcloughlin/avo/operand"
	. "github.com/mmcloughlin/avo/reg"
)

// Float dot products (twins: dotF16, dotF32 in quant_float.go) and the
// attention's value accumulation (twin: axpyF16Generic in attention.go).
//
// floatSig is mulSig plus a row stride ws: attention runs the F16 kernel
// over the rows of a KV cache, where one head's keys are a strided column
// block. nb counts chunks of 4 vectors (64 elements at 512 bits, 32 at
// 256); the Go side adds the last n%chunk elements. Each token has four
// accumulators (an FMA's latency is four cycles), added in a fixed order.
const floatSig = "func(w *byte, ws uintptr, rows int, x *byte, xs uintptr, out *float32, os uintptr, nb int)"

type floatKind int

const (
	floatF16 floatKind = iota
	floatF32
)

func genF16(s isa) {
	for _, t := range floatTokens(s) {
		genFloatMul(s, t, floatF16)
	}
	genAxpyF16(s)
}

func genF32(s isa) {
	for _, t := range floatTokens(s) {
		genFloatMul(s, t, floatF32)
	}
}

// floatTokens: four accumulators per token need 4T+4 registers.
func floatTokens(s isa) []int {
	if s.w512 {
		return []int{1, 2, 4}
	}
	return []int{1, 2}
}

func genFloatMul(s isa, T int, kind floatKind) {
	family, esize := "F16", 2
	if kind == floatF32 {
		family, esize = "F32", 4
	}
	lanes := s.bytes() / 4
	name := fmt.Sprintf("mul%s%s%d", family, s.name, T)
	registerSig(family, s, T, name, "float")
	TEXT(name, NOSPLIT, floatSig)
	Pragma("noescape")
	Doc(fmt.Sprintf("%s multiplies strided rows of %s weights by %d row(s) (%s).", name, family, T, s.name))
	wr := Load(Param("w"), GP64()).(GPVirtual)
	xs := Load(Param("xs"), GP64()).(GPVirtual)
	outp := Load(Param("out"), GP64()).(GPVirtual)
	rows, _ := Param("rows").Resolve()
	wsArg, _ := Param("ws").Resolve()
	xArg, _ := Param("x").Resolve()
	nbArg, _ := Param("nb").Resolve()
	osArg, _ := Param("os").Resolve()
	k := &mulKernel{s: s, T: T, xs: xs}

	acc := make([][4]VecVirtual, T)
	for t := range acc {
		for c := range acc[t] {
			acc[t][c] = s.vec()
		}
	}
	load := func(m Mem, r VecVirtual) {
		if kind == floatF16 {
			if s.w512 {
				VCVTPH2PS(m, r)
			} else {
				VCVTPH2PS(m, r)
			}
		} else {
			VMOVUPS(m, r)
		}
	}
	Label(name + "_row")
	for t := range acc {
		for c := range acc[t] {
			zero(s, acc[t][c])
		}
	}
	k.wp = GP64().(GPVirtual)
	MOVQ(wr, k.wp)
	k.xb = GP64().(GPVirtual)
	MOVQ(xArg.Addr, k.xb)
	if T > 1 {
		k.xb1 = GP64().(GPVirtual)
		LEAQ(Mem{Base: k.xb, Index: xs, Scale: 1}, k.xb1)
	}
	n := GP64()
	MOVQ(nbArg.Addr, n)
	Label(name + "_chunk")
	var wv [4]VecVirtual
	for c := range wv {
		wv[c] = s.vec()
		load(k.w(c*lanes*esize), wv[c])
	}
	for t := 0; t < T; t++ {
		for c := 0; c < 4; c++ {
			m := k.xmem(t, c*lanes*esize)
			if kind == floatF16 {
				xv := s.vec()
				VCVTPH2PS(m, xv)
				VFMADD231PS(xv, wv[c], acc[t][c])
			} else {
				VFMADD231PS(m, wv[c], acc[t][c])
			}
		}
	}
	step := 4 * lanes * esize
	ADDQ(U32(step), k.wp)
	ADDQ(U32(step), k.xb)
	if T > 1 {
		ADDQ(U32(step), k.xb1)
	}
	DECQ(n)
	JNZ(LabelRef(name + "_chunk"))

	os := GP64()
	MOVQ(osArg.Addr, os)
	for t := 0; t < T; t++ {
		a := acc[t]
		VADDPS(a[1], a[0], a[0])
		VADDPS(a[3], a[2], a[2])
		VADDPS(a[2], a[0], a[0])
		r := hsum(s, a[0])
		switch t {
		case 0:
			VMOVSS(r, Mem{Base: outp})
		case 1:
			VMOVSS(r, Mem{Base: outp, Index: os, Scale: 1})
		case 2:
			VMOVSS(r, Mem{Base: outp, Index: os, Scale: 2})
		case 3:
			o3 := GP64()
			LEAQ(Mem{Base: os, Index: os, Scale: 2}, o3)
			VMOVSS(r, Mem{Base: outp, Index: o3, Scale: 1})
		}
	}
	ADDQ(U8(4), outp)
	ADDQ(wsArg.Addr, wr)
	DECQ(rows.Addr)
	JNZ(LabelRef(name + "_row"))
	VZEROUPPER()
	RET()
}

// genAxpyF16 emits out[i] += Σ_j p[j]·v_j[i] for i < cols, over n rows v_j
// of f16 that are vs bytes apart: the attention's weighted sum of values.
// cols is a multiple of the vector width and at most 8 vectors (128
// floats at 512 bits, 64 at 256); the output stays in registers while the
// rows stream by, and every lane adds its terms in row order.
func genAxpyF16(s isa) {
	name := "axpyF16" + s.name
	TEXT(name, NOSPLIT, "func(p *float32, n int, v *byte, vs uintptr, cols int, out *float32)")
	Pragma("noescape")
	Doc(name + " adds the p-weighted sum of n f16 rows to out (" + s.name + ").")
	p := Load(Param("p"), GP64()).(GPVirtual)
	n := Load(Param("n"), GP64()).(GPVirtual)
	v := Load(Param("v"), GP64()).(GPVirtual)
	vs := Load(Param("vs"), GP64()).(GPVirtual)
	cols := Load(Param("cols"), GP64()).(GPVirtual)
	out := Load(Param("out"), GP64()).(GPVirtual)
	lanes := s.bytes() / 4
	// Dispatch on the number of vectors (1..8): each variant keeps its
	// accumulators in registers.
	SHRQ(U8(map[bool]uint8{true: 4, false: 3}[s.w512]), cols)
	for nv := 1; nv <= 8; nv++ {
		CMPQ(cols, U32(nv))
		JEQ(LabelRef(fmt.Sprintf("%s_%d", name, nv)))
	}
	VZEROUPPER()
	RET()
	for nv := 1; nv <= 8; nv++ {
		Label(fmt.Sprintf("%s_%d", name, nv))
		acc := make([]VecVirtual, nv)
		for i := range acc {
			acc[i] = s.vec()
			VMOVUPS(Mem{Base: out, Disp: 4 * lanes * i}, acc[i])
		}
		Label(fmt.Sprintf("%s_%d_row", name, nv))
		pv := s.vec()
		VBROADCASTSS(Mem{Base: p}, pv)
		for i := range acc {
			x := s.vec()
			VCVTPH2PS(Mem{Base: v, Disp: 2 * lanes * i}, x)
			VFMADD231PS(x, pv, acc[i])
		}
		ADDQ(U8(4), p)
		ADDQ(vs, v)
		DECQ(n)
		JNZ(LabelRef(fmt.Sprintf("%s_%d_row", name, nv)))
		for i := range acc {
			VMOVUPS(acc[i], Mem{Base: out, Disp: 4 * lanes * i})
		}
		VZEROUPPER()
		RET()
	}
}
