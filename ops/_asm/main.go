// Command _asm generates ats's amd64 CPU kernels (../dot_amd64.s and the
// Go declarations in ../dot_decl_amd64.go, the dispatch in ../dot_dispatch_amd64.go) with avo. It is a module of its
// own so that the main module does not depend on avo:
//
//	cd ops/_asm && go generate
//
// Every kernel has a pure-Go twin in package ops (quant*.go) that is the
// reference: the generated code must agree with it, bit for bit where the
// arithmetic is integer and within float rounding elsewhere; ops's tests
// check that on random data for every CPU level.
//
// Four instruction-set levels are generated from the same code:
//
//	AVX2     256-bit AVX2 + FMA + F16C (VPMADDUBSW / VPMADDWD for the int8 dots)
//	AVXVNNI  the AVX2 integer dots with the VEX VPDPBUSD (AVX-VNNI) in place
//	         of VPMADDUBSW + VPMADDWD; only the row×token kernels (the rest
//	         of that level is AVX2's)
//	AVX512   512-bit AVX-512 F/BW/VL/DQ, same integer method as AVX2
//	VNNI     AVX-512 + AVX512_VNNI (VPDPBUSD / VPDPWSSD)
//
// avo v0.5.0's instruction table predates AVX512_VNNI, so VPDPBUSD and
// VPDPWSSD are emitted as raw IR instructions (see common.go); Go's
// assembler encodes them (EVEX). The VEX-encoded AVX-VNNI form, which CPUs
// without AVX-512 (Alder Lake and later client cores, Zen 5 client) need,
// has no Go assembler mnemonic: avo emits a placeholder instruction
// (vpdpbusdVEX) and fixVEX, after avo has allocated the registers, rewrites
// each into its five raw bytes with the mnemonic as a comment.
//
// Two kernels beside the levels, amxQ4K (amx.go) and amxQ6K (amx6.go),
// run the products of repacked Q4_K and Q6_K weights of many tokens on AMX
// tiles, which Go's assembler does not know either: their tile
// instructions are raw bytes (fixAMX puts each on one line, its mnemonic
// as a comment).
package main

//go:generate go run . -out ../dot_amd64.s -stubs ../dot_decl_amd64.go -pkg ops -dispatch ../dot_dispatch_amd64.go

import (
	"flag"
	"log"
	"os"

	. "github.com/mmcloughlin/avo/build"
)

var dispatch = flag.String("dispatch", "", "write the Go dispatch of the row×token kernels here")

// While working on one kernel, ISA=AVX2|AVXVNNI|AVX512|VNNI, FAMILY=Q4K|Q5K|Q6K|Q80|Q40
// and TOK=n restrict what is generated (the output is then incomplete:
// never commit it).
func isas() []isa {
	if v := os.Getenv("ISA"); v != "" {
		for _, s := range []isa{isaAVX2, isaAVXVNNI, isaAVX512, isaVNNI} {
			if s.name == v {
				return []isa{s}
			}
		}
	}
	return []isa{isaAVX2, isaAVXVNNI, isaAVX512, isaVNNI}
}

func main() {
	flag.Parse()
	ConstraintExpr("amd64,!noasm")
	for _, s := range isas() {
		for _, t := range s.tokens() {
			for _, f := range []struct {
				name string
				gen  func(isa, int)
			}{{"Q4K", genQ4K}, {"Q5K", genQ5K}, {"Q6K", genQ6K}, {"Q80", genQ8_0}, {"Q40", genQ4_0}} {
				if fam := os.Getenv("FAMILY"); fam == "" || fam == f.name {
					f.gen(s, t)
				}
			}
		}
		if s.vex {
			continue // the rest of AVXVNNI is AVX2's (ops/dot_amd64.go)
		}
		for _, t := range s.packedTokens() {
			if fam := os.Getenv("FAMILY"); fam == "" || fam == "P4K" {
				genPackedQ4K(s, t)
			}
			if fam := os.Getenv("FAMILY"); fam == "" || fam == "P6K" {
				genPackedQ6K(s, t)
			}
		}
		genF32(s)
		genF16(s)
		genQuantQ8K(s)
		genQuantQ8_0(s)
		genSwiGLU(s)
		genExpShift(s)
		genCvtF16(s)
		genScaleRoundF16(s)
		genMaxF32(s)
		genAttn(s)
	}
	genSanitizeF32()
	genFirstAboveF32()
	if fam := os.Getenv("FAMILY"); fam == "" || fam == "AMX" {
		genAMXQ4K()
		genAMXQ6K()
	}
	Generate()
	if out := flag.Lookup("out").Value.String(); out != "" {
		if err := fixVEX(out); err != nil {
			log.Fatal(err)
		}
		if err := fixAMX(out); err != nil {
			log.Fatal(err)
		}
	}
	if *dispatch != "" {
		if err := writeDispatch(*dispatch); err != nil {
			log.Fatal(err)
		}
	}
}
