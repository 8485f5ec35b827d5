//go:build arm64 && !noasm

// Hand-written arm64 NEON kernels (avo, which generates dot_amd64.s, has no
// arm64 backend). Kept deliberately small: each function only computes the
// exact int32 dot product of every block's quants into sums[0:nb]; the
// float scaling is done in Go (dot_arm64.go) in the generic code's order, so
// the results are bit-identical to the pure-Go reference.
//
// Go's assembler has no SMULL, SADALP or SDOT, so they are encoded with WORD
// (encodings checked with llvm-mc -triple=aarch64 -mattr=+dotprod); the
// mnemonic is written next to each.
//
// Signature of every function: func(w, x *byte, nb int, sums *int32)

#include "textflag.h"

// BSUM_SMULL: V16.S[0] = Σ V0.b·V2.b + Σ V1.b·V3.b (signed bytes), base NEON.
// int8·int8 fits int16 (at most 128·128 = 16384), SADALP widens to int32.
#define BSUM_SMULL \
	WORD $0x0e22c004 \ // smull  v4.8h, v0.8b,  v2.8b
	WORD $0x4e22c005 \ // smull2 v5.8h, v0.16b, v2.16b
	WORD $0x0e23c026 \ // smull  v6.8h, v1.8b,  v3.8b
	WORD $0x4e23c027 \ // smull2 v7.8h, v1.16b, v3.16b
	VEOR V16.B16, V16.B16, V16.B16 \
	WORD $0x4e606890 \ // sadalp v16.4s, v4.8h
	WORD $0x4e6068b0 \ // sadalp v16.4s, v5.8h
	WORD $0x4e6068d0 \ // sadalp v16.4s, v6.8h
	WORD $0x4e6068f0 \ // sadalp v16.4s, v7.8h
	VADDV V16.S4, V16

// BSUM_SDOT: the same with the dot-product extension (FEAT_DotProd).
#define BSUM_SDOT \
	VEOR V16.B16, V16.B16, V16.B16 \
	WORD $0x4e829410 \ // sdot v16.4s, v0.16b, v2.16b
	WORD $0x4e839430 \ // sdot v16.4s, v1.16b, v3.16b
	VADDV V16.S4, V16

// Q8_0 block: f16 scale, 32 int8 quants (34 bytes); so is Q8_0 activation.
#define Q80_BODY(BSUM) \
	MOVD w+0(FP), R0 \
	MOVD x+8(FP), R1 \
	MOVD nb+16(FP), R2 \
	MOVD sums+24(FP), R3 \
	CBZ  R2, done \
loop: \
	ADD  $2, R0, R4 \
	ADD  $2, R1, R5 \
	VLD1 (R4), [V0.B16, V1.B16] \
	VLD1 (R5), [V2.B16, V3.B16] \
	BSUM \
	VMOV V16.S[0], R6 \
	MOVW R6, (R3) \
	ADD  $4, R3 \
	ADD  $34, R0 \
	ADD  $34, R1 \
	SUBS $1, R2 \
	BNE  loop \
done: \
	RET

// Q4_0 block: f16 scale, 16 bytes of nibbles (18 bytes); low nibbles are
// elements 0-15, high nibbles 16-31, each minus 8.
#define Q40_BODY(BSUM) \
	MOVD w+0(FP), R0 \
	MOVD x+8(FP), R1 \
	MOVD nb+16(FP), R2 \
	MOVD sums+24(FP), R3 \
	VMOVI $15, V30.B16 \
	VMOVI $8, V29.B16 \
	CBZ  R2, done \
loop: \
	ADD  $2, R0, R4 \
	ADD  $2, R1, R5 \
	VLD1 (R4), [V4.B16] \
	VLD1 (R5), [V2.B16, V3.B16] \
	VAND V30.B16, V4.B16, V0.B16 \
	VUSHR $4, V4.B16, V1.B16 \
	VSUB V29.B16, V0.B16, V0.B16 \
	VSUB V29.B16, V1.B16, V1.B16 \
	BSUM \
	VMOV V16.S[0], R6 \
	MOVW R6, (R3) \
	ADD  $4, R3 \
	ADD  $18, R0 \
	ADD  $34, R1 \
	SUBS $1, R2 \
	BNE  loop \
done: \
	RET

// Two-token Q8_0 (prefill): the block sums of one weight row against two
// activation rows, each weight block loaded once; token 0's sums go to
// sums[0:nb], token 1's to sums[64:64+nb] (neonChunk int32s on).
#define Q80X2_BODY(BSUM) \
	MOVD w+0(FP), R0 \
	MOVD x0+8(FP), R1 \
	MOVD x1+16(FP), R7 \
	MOVD nb+24(FP), R2 \
	MOVD sums+32(FP), R3 \
	CBZ  R2, done \
loop: \
	ADD  $2, R0, R4 \
	ADD  $2, R1, R5 \
	ADD  $2, R7, R8 \
	VLD1 (R4), [V0.B16, V1.B16] \
	VLD1 (R5), [V2.B16, V3.B16] \
	BSUM \
	VMOV V16.S[0], R6 \
	MOVW R6, (R3) \
	VLD1 (R8), [V2.B16, V3.B16] \
	BSUM \
	VMOV V16.S[0], R6 \
	MOVW R6, 256(R3) \
	ADD  $4, R3 \
	ADD  $34, R0 \
	ADD  $34, R1 \
	ADD  $34, R7 \
	SUBS $1, R2 \
	BNE  loop \
done: \
	RET

// func blockSumsQ80NEON(w, x *byte, nb int, sums *int32)
TEXT ·blockSumsQ80NEON(SB), NOSPLIT, $0-32
	Q80_BODY(BSUM_SMULL)

// func blockSumsQ80SDOT(w, x *byte, nb int, sums *int32)
TEXT ·blockSumsQ80SDOT(SB), NOSPLIT, $0-32
	Q80_BODY(BSUM_SDOT)

// func blockSumsQ40NEON(w, x *byte, nb int, sums *int32)
TEXT ·blockSumsQ40NEON(SB), NOSPLIT, $0-32
	Q40_BODY(BSUM_SMULL)

// func blockSumsQ40SDOT(w, x *byte, nb int, sums *int32)
TEXT ·blockSumsQ40SDOT(SB), NOSPLIT, $0-32
	Q40_BODY(BSUM_SDOT)

// Q4_K: aux[l] (l < 8) = Σ over the four 32-quant groups g and l' ≡ l
// (mod 8) of sc[2g]·q_lo[l']·a[64g+l'] + sc[2g+1]·q_hi[l']·a[64g+32+l'],
// exactly dotQ4_K's aux lanes. Per group, products are summed into int16
// lanes (4 products of at most 15·128: < 2^15), then widened and scaled
// into int32 (SMLAL by element, the scale in V15.H[0] and V15.H[1]; V15 is
// rotated by two scales per group).
//
// func q4KAux(qs, q8 *byte, sc *int16, aux *int32)
TEXT ·q4KAux(SB), NOSPLIT, $0-32
	MOVD qs+0(FP), R0
	MOVD q8+8(FP), R1
	MOVD sc+16(FP), R2
	MOVD aux+24(FP), R3
	VLD1 (R2), [V15.H8]
	VMOVI $15, V30.B16
	VEOR V16.B16, V16.B16, V16.B16
	VEOR V17.B16, V17.B16, V17.B16
	MOVD $4, R4
q4kloop:
	VLD1.P 32(R0), [V0.B16, V1.B16]
	VLD1.P 64(R1), [V2.B16, V3.B16, V4.B16, V5.B16]
	VAND V30.B16, V0.B16, V6.B16
	VAND V30.B16, V1.B16, V7.B16
	VUSHR $4, V0.B16, V8.B16
	VUSHR $4, V1.B16, V9.B16
	WORD $0x0e22c0ca // smull v10.8h, v6.8b, v2.8b
	WORD $0x4e2280ca // smlal2 v10.8h, v6.16b, v2.16b
	WORD $0x0e2380ea // smlal v10.8h, v7.8b, v3.8b
	WORD $0x4e2380ea // smlal2 v10.8h, v7.16b, v3.16b
	WORD $0x0e24c10b // smull v11.8h, v8.8b, v4.8b
	WORD $0x4e24810b // smlal2 v11.8h, v8.16b, v4.16b
	WORD $0x0e25812b // smlal v11.8h, v9.8b, v5.8b
	WORD $0x4e25812b // smlal2 v11.8h, v9.16b, v5.16b
	WORD $0x0f4f2150 // smlal v16.4s, v10.4h, v15.h[0]
	WORD $0x4f4f2151 // smlal2 v17.4s, v10.8h, v15.h[0]
	WORD $0x0f5f2170 // smlal v16.4s, v11.4h, v15.h[1]
	WORD $0x4f5f2171 // smlal2 v17.4s, v11.8h, v15.h[1]
	VEXT $4, V15.B16, V15.B16, V15.B16
	SUBS $1, R4
	BNE  q4kloop
	VST1 [V16.S4, V17.S4], (R3)
	RET

// Q6_K: aux[l] (l < 8) as in dotQ6_K. Per half h (128 quants): ql 64 bytes,
// qh 32 bytes, 8 scales. Quant vector i = 2j+k (j: which of v0-v3, k: quants
// 0-15 or 16-31 of the 32) pairs with activations q8[128h+16i:][:16] and
// scale sc[8h+i]. Products go to int16 lanes (2 of at most 32·128), then are
// widened and scaled into int32 by V15.H[0], V15 rotated by one scale each.
//
// func q6KAux(b, q8 *byte, sc *int16, aux *int32)
TEXT ·q6KAux(SB), NOSPLIT, $0-32
	MOVD b+0(FP), R0
	MOVD q8+8(FP), R1
	MOVD sc+16(FP), R2
	MOVD aux+24(FP), R3
	ADD  $128, R0, R5
	VMOVI $15, V30.B16
	VMOVI $48, V28.B16
	VMOVI $32, V29.B16
	VEOR V16.B16, V16.B16, V16.B16
	VEOR V17.B16, V17.B16, V17.B16
	MOVD $2, R4
q6kloop:
	VLD1.P 16(R2), [V15.H8]
	VLD1.P 64(R0), [V10.B16, V11.B16, V12.B16, V13.B16]
	VLD1.P 32(R5), [V26.B16, V27.B16]
	VLD1.P 64(R1), [V18.B16, V19.B16, V20.B16, V21.B16]
	VLD1.P 64(R1), [V22.B16, V23.B16, V24.B16, V25.B16]
	// v0: ql[l]&15 | (qh[l]&3)<<4
	VSHL $4, V26.B16, V8.B16
	VSHL $4, V27.B16, V14.B16
	VAND V28.B16, V8.B16, V8.B16
	VAND V28.B16, V14.B16, V14.B16
	VAND V30.B16, V10.B16, V0.B16
	VAND V30.B16, V11.B16, V1.B16
	VORR V8.B16, V0.B16, V0.B16
	VORR V14.B16, V1.B16, V1.B16
	// v1: ql[l+32]&15 | (qh[l]>>2&3)<<4
	VSHL $2, V26.B16, V8.B16
	VSHL $2, V27.B16, V14.B16
	VAND V28.B16, V8.B16, V8.B16
	VAND V28.B16, V14.B16, V14.B16
	VAND V30.B16, V12.B16, V2.B16
	VAND V30.B16, V13.B16, V3.B16
	VORR V8.B16, V2.B16, V2.B16
	VORR V14.B16, V3.B16, V3.B16
	// v2: ql[l]>>4 | (qh[l]>>4&3)<<4
	VAND V28.B16, V26.B16, V8.B16
	VAND V28.B16, V27.B16, V14.B16
	VUSHR $4, V10.B16, V4.B16
	VUSHR $4, V11.B16, V5.B16
	VORR V8.B16, V4.B16, V4.B16
	VORR V14.B16, V5.B16, V5.B16
	// v3: ql[l+32]>>4 | (qh[l]>>6)<<4
	VUSHR $2, V26.B16, V8.B16
	VUSHR $2, V27.B16, V14.B16
	VAND V28.B16, V8.B16, V8.B16
	VAND V28.B16, V14.B16, V14.B16
	VUSHR $4, V12.B16, V6.B16
	VUSHR $4, V13.B16, V7.B16
	VORR V8.B16, V6.B16, V6.B16
	VORR V14.B16, V7.B16, V7.B16
	// minus 32
	VSUB V29.B16, V0.B16, V0.B16
	VSUB V29.B16, V1.B16, V1.B16
	VSUB V29.B16, V2.B16, V2.B16
	VSUB V29.B16, V3.B16, V3.B16
	VSUB V29.B16, V4.B16, V4.B16
	VSUB V29.B16, V5.B16, V5.B16
	VSUB V29.B16, V6.B16, V6.B16
	VSUB V29.B16, V7.B16, V7.B16
	WORD $0x0e32c009 // smull v9.8h, v0.8b, v18.8b
	WORD $0x4e328009 // smlal2 v9.8h, v0.16b, v18.16b
	WORD $0x0f4f2130 // smlal v16.4s, v9.4h, v15.h[0]
	WORD $0x4f4f2131 // smlal2 v17.4s, v9.8h, v15.h[0]
	VEXT $2, V15.B16, V15.B16, V15.B16
	WORD $0x0e33c029 // smull v9.8h, v1.8b, v19.8b
	WORD $0x4e338029 // smlal2 v9.8h, v1.16b, v19.16b
	WORD $0x0f4f2130 // smlal v16.4s, v9.4h, v15.h[0]
	WORD $0x4f4f2131 // smlal2 v17.4s, v9.8h, v15.h[0]
	VEXT $2, V15.B16, V15.B16, V15.B16
	WORD $0x0e34c049 // smull v9.8h, v2.8b, v20.8b
	WORD $0x4e348049 // smlal2 v9.8h, v2.16b, v20.16b
	WORD $0x0f4f2130 // smlal v16.4s, v9.4h, v15.h[0]
	WORD $0x4f4f2131 // smlal2 v17.4s, v9.8h, v15.h[0]
	VEXT $2, V15.B16, V15.B16, V15.B16
	WORD $0x0e35c069 // smull v9.8h, v3.8b, v21.8b
	WORD $0x4e358069 // smlal2 v9.8h, v3.16b, v21.16b
	WORD $0x0f4f2130 // smlal v16.4s, v9.4h, v15.h[0]
	WORD $0x4f4f2131 // smlal2 v17.4s, v9.8h, v15.h[0]
	VEXT $2, V15.B16, V15.B16, V15.B16
	WORD $0x0e36c089 // smull v9.8h, v4.8b, v22.8b
	WORD $0x4e368089 // smlal2 v9.8h, v4.16b, v22.16b
	WORD $0x0f4f2130 // smlal v16.4s, v9.4h, v15.h[0]
	WORD $0x4f4f2131 // smlal2 v17.4s, v9.8h, v15.h[0]
	VEXT $2, V15.B16, V15.B16, V15.B16
	WORD $0x0e37c0a9 // smull v9.8h, v5.8b, v23.8b
	WORD $0x4e3780a9 // smlal2 v9.8h, v5.16b, v23.16b
	WORD $0x0f4f2130 // smlal v16.4s, v9.4h, v15.h[0]
	WORD $0x4f4f2131 // smlal2 v17.4s, v9.8h, v15.h[0]
	VEXT $2, V15.B16, V15.B16, V15.B16
	WORD $0x0e38c0c9 // smull v9.8h, v6.8b, v24.8b
	WORD $0x4e3880c9 // smlal2 v9.8h, v6.16b, v24.16b
	WORD $0x0f4f2130 // smlal v16.4s, v9.4h, v15.h[0]
	WORD $0x4f4f2131 // smlal2 v17.4s, v9.8h, v15.h[0]
	VEXT $2, V15.B16, V15.B16, V15.B16
	WORD $0x0e39c0e9 // smull v9.8h, v7.8b, v25.8b
	WORD $0x4e3980e9 // smlal2 v9.8h, v7.16b, v25.16b
	WORD $0x0f4f2130 // smlal v16.4s, v9.4h, v15.h[0]
	WORD $0x4f4f2131 // smlal2 v17.4s, v9.8h, v15.h[0]
	VEXT $2, V15.B16, V15.B16, V15.B16
	SUBS $1, R4
	BNE  q6kloop
	VST1 [V16.S4, V17.S4], (R3)
	RET

// Q5_K: aux[l] (l < 8) as in dotQ5_K: q4KAux with a fifth bit per quant,
// qh[l] bit 2g (low nibbles of group g) and 2g+1 (high nibbles), moved to
// bit 4 (VSHL $4 / $3, AND 16; V12, V13 hold qh shifted right 2g). Products
// of at most 31·128, four to an int16 lane: < 2^15.
//
// func q5KAux(qs, qh, q8 *byte, sc *int16, aux *int32)
TEXT ·q5KAux(SB), NOSPLIT, $0-40
	MOVD qs+0(FP), R0
	MOVD qh+8(FP), R5
	MOVD q8+16(FP), R1
	MOVD sc+24(FP), R2
	MOVD aux+32(FP), R3
	VLD1 (R2), [V15.H8]
	VLD1 (R5), [V12.B16, V13.B16]
	VMOVI $15, V30.B16
	VMOVI $16, V31.B16
	VEOR V16.B16, V16.B16, V16.B16
	VEOR V17.B16, V17.B16, V17.B16
	MOVD $4, R4
q5kloop:
	VLD1.P 32(R0), [V0.B16, V1.B16]
	VLD1.P 64(R1), [V2.B16, V3.B16, V4.B16, V5.B16]
	VAND V30.B16, V0.B16, V6.B16
	VAND V30.B16, V1.B16, V7.B16
	VUSHR $4, V0.B16, V8.B16
	VUSHR $4, V1.B16, V9.B16
	VSHL $4, V12.B16, V18.B16
	VSHL $4, V13.B16, V19.B16
	VSHL $3, V12.B16, V20.B16
	VSHL $3, V13.B16, V21.B16
	VAND V31.B16, V18.B16, V18.B16
	VAND V31.B16, V19.B16, V19.B16
	VAND V31.B16, V20.B16, V20.B16
	VAND V31.B16, V21.B16, V21.B16
	VORR V18.B16, V6.B16, V6.B16
	VORR V19.B16, V7.B16, V7.B16
	VORR V20.B16, V8.B16, V8.B16
	VORR V21.B16, V9.B16, V9.B16
	VUSHR $2, V12.B16, V12.B16
	VUSHR $2, V13.B16, V13.B16
	WORD $0x0e22c0ca // smull v10.8h, v6.8b, v2.8b
	WORD $0x4e2280ca // smlal2 v10.8h, v6.16b, v2.16b
	WORD $0x0e2380ea // smlal v10.8h, v7.8b, v3.8b
	WORD $0x4e2380ea // smlal2 v10.8h, v7.16b, v3.16b
	WORD $0x0e24c10b // smull v11.8h, v8.8b, v4.8b
	WORD $0x4e24810b // smlal2 v11.8h, v8.16b, v4.16b
	WORD $0x0e25812b // smlal v11.8h, v9.8b, v5.8b
	WORD $0x4e25812b // smlal2 v11.8h, v9.16b, v5.16b
	WORD $0x0f4f2150 // smlal v16.4s, v10.4h, v15.h[0]
	WORD $0x4f4f2151 // smlal2 v17.4s, v10.8h, v15.h[0]
	WORD $0x0f5f2170 // smlal v16.4s, v11.4h, v15.h[1]
	WORD $0x4f5f2171 // smlal2 v17.4s, v11.8h, v15.h[1]
	VEXT $4, V15.B16, V15.B16, V15.B16
	SUBS $1, R4
	BNE  q5kloop
	VST1 [V16.S4, V17.S4], (R3)
	RET

// Float dots over n elements, n a positive multiple of 8: each product is
// formed in float32 (FMUL, as dotF32/dotF16 do), widened exactly to
// float64 (FCVTL/FCVTL2) and summed in four float64 vectors of two lanes;
// the total is returned as a float64. F16 inputs are widened to float32
// first (FCVTL/FCVTL2 of halves: exact).

// F64_ACC: V16, V17, V20, V21 (float64) += V4, V5 (four float32 each).
#define F64_ACC \
	WORD $0x0e617886 \ // fcvtl  v6.2d, v4.2s
	WORD $0x4e617887 \ // fcvtl2 v7.2d, v4.4s
	WORD $0x0e6178b2 \ // fcvtl  v18.2d, v5.2s
	WORD $0x4e6178b3 \ // fcvtl2 v19.2d, v5.4s
	WORD $0x4e66d610 \ // fadd v16.2d, v16.2d, v6.2d
	WORD $0x4e67d631 \ // fadd v17.2d, v17.2d, v7.2d
	WORD $0x4e72d694 \ // fadd v20.2d, v20.2d, v18.2d
	WORD $0x4e73d6b5   // fadd v21.2d, v21.2d, v19.2d

// F64_SUM: F0 = the sum of the lanes of V16, V17, V20, V21.
#define F64_SUM \
	WORD $0x4e71d610 \ // fadd v16.2d, v16.2d, v17.2d
	WORD $0x4e75d694 \ // fadd v20.2d, v20.2d, v21.2d
	WORD $0x4e74d610 \ // fadd v16.2d, v16.2d, v20.2d
	WORD $0x7e70da00   // faddp d0, v16.2d

#define F64_ZERO \
	VEOR V16.B16, V16.B16, V16.B16 \
	VEOR V17.B16, V17.B16, V17.B16 \
	VEOR V20.B16, V20.B16, V20.B16 \
	VEOR V21.B16, V21.B16, V21.B16

// func dotF32Body(w, x *byte, n int) float64
TEXT ·dotF32Body(SB), NOSPLIT, $0-32
	MOVD w+0(FP), R0
	MOVD x+8(FP), R1
	MOVD n+16(FP), R2
	F64_ZERO
f32loop:
	VLD1.P 32(R0), [V0.S4, V1.S4]
	VLD1.P 32(R1), [V2.S4, V3.S4]
	WORD $0x6e22dc04 // fmul v4.4s, v0.4s, v2.4s
	WORD $0x6e23dc25 // fmul v5.4s, v1.4s, v3.4s
	F64_ACC
	SUBS $8, R2
	BNE  f32loop
	F64_SUM
	FMOVD F0, ret+24(FP)
	RET

// func dotF16Body(w, x *byte, n int) float64
TEXT ·dotF16Body(SB), NOSPLIT, $0-32
	MOVD w+0(FP), R0
	MOVD x+8(FP), R1
	MOVD n+16(FP), R2
	F64_ZERO
f16loop:
	VLD1.P 16(R0), [V22.H8]
	VLD1.P 16(R1), [V23.H8]
	WORD $0x0e217ac0 // fcvtl  v0.4s, v22.4h
	WORD $0x4e217ac1 // fcvtl2 v1.4s, v22.8h
	WORD $0x0e217ae2 // fcvtl  v2.4s, v23.4h
	WORD $0x4e217ae3 // fcvtl2 v3.4s, v23.8h
	WORD $0x6e22dc04 // fmul v4.4s, v0.4s, v2.4s
	WORD $0x6e23dc25 // fmul v5.4s, v1.4s, v3.4s
	F64_ACC
	SUBS $8, R2
	BNE  f16loop
	F64_SUM
	FMOVD F0, ret+24(FP)
	RET

// func blockSumsQ80x2NEON(w, x0, x1 *byte, nb int, sums *int32)
TEXT ·blockSumsQ80x2NEON(SB), NOSPLIT, $0-40
	Q80X2_BODY(BSUM_SMULL)

// func blockSumsQ80x2SDOT(w, x0, x1 *byte, nb int, sums *int32)
TEXT ·blockSumsQ80x2SDOT(SB), NOSPLIT, $0-40
	Q80X2_BODY(BSUM_SDOT)
