// The KV cache's block quantizers and the Walsh-Hadamard rotation, shared
// by attention.cu (the cache writes, the decode kernels' output rotation)
// and rope.cu (the cache write fused with RoPE), so that both store the
// same bits. Their CPU twins: ops.KVLayer.Store and ops.FWHT.

#pragma once

// f2h rounds to f16, to nearest even.
__device__ __forceinline__ unsigned short f2h(float f)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// q8_0_block quantizes the 32 values x of a warp (lane j holds value j) into
// the Q8_0 block at dst ({f16 d; int8 q[32]}) as ggml's
// quantize_row_q8_0_ref does: d = amax/127, q = roundf(x/d) computed as
// x*(1/d), halves away from zero; d rounded to f16 to nearest even.
// Division is IEEE (nvcc's default -prec-div=true), and __fmul_rn keeps the
// product from being fused into anything.
__device__ __forceinline__ void q8_0_block(float x, unsigned char *dst)
{
    float amax = fabsf(x);
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const int q = max(-128, min(127, (int)roundf(__fmul_rn(x, id))));
    const int lane = threadIdx.x & 31;
    dst[2 + lane] = (unsigned char)q;
    if (lane == 0)
        *(unsigned short *)dst = f2h(d);
}

// q4_0_block quantizes the 32 values x of a warp (lane j holds value j) into
// the Q4_0 block at dst ({f16 d; 16 bytes: value j in the low nibble of byte
// j, value j+16 in its high nibble}) as ggml's quantize_row_q4_0_ref and the
// CPU's quantQ4_0 do: vmax is the value of largest magnitude (the first of
// equals), d = vmax / -8, q = min(15, trunc(x*(1/d) + 8.5)); d rounded to f16
// to nearest even, an overflow held at the largest finite f16 (putScaleF16).
__device__ __forceinline__ void q4_0_block(float x, unsigned char *dst)
{
    const int lane = threadIdx.x & 31;
    float a = fabsf(x), vm = x;
    int at = lane;
    for (int o = 16; o > 0; o >>= 1) {
        const float oa = __shfl_xor_sync(0xffffffffu, a, o), ov = __shfl_xor_sync(0xffffffffu, vm, o);
        const int oat = __shfl_xor_sync(0xffffffffu, at, o);
        if (oa > a || (oa == a && oat < at))
            a = oa, vm = ov, at = oat;
    }
    if (!(a > 0.0f))
        vm = 0.0f; // the CPU's scan keeps its starting +0 when nothing is larger
    const float d = __fdiv_rn(vm, -8.0f);
    const float id = d != 0.0f ? __fdiv_rn(1.0f, d) : 0.0f;
    const float f = __fadd_rn(__fmul_rn(x, id), 8.5f);
    const int q = f > 0.0f ? min(15, (int)f) : 0; // truncClamp (NaN to 0)
    const int hi = __shfl_down_sync(0xffffffffu, q, 16);
    if (lane < 16)
        dst[2 + lane] = (unsigned char)(q | hi << 4);
    if (lane == 0) {
        unsigned short h = f2h(d);
        if ((h & 0x7fffu) == 0x7c00u)
            h = (h & 0x8000u) | 0x7bffu;
        *(unsigned short *)dst = h;
    }
}

#define FWHT_REGS 8 // chunks of up to 256 values: 8 a lane

// fwht_warp replaces the chunk of n = 32*nj values (nj 1, 2, 4 or 8; uniform
// across the warp) a warp holds, lane l holding value l + 32j in x[j], by
// its orthonormal Walsh-Hadamard transform as ops.FWHT and fwht_f32 compute
// it: scaled by 1/sqrt(n) first, then butterflies (u+v, u-v) of growing
// span, in float, no fused multiply-add: spans 1..16 pair lanes
// (shuffles), spans 32..128 a lane's registers. Every value goes through
// the same operations on the same operands as on the CPU (addition
// commutes exactly), so the bits agree.
__device__ __forceinline__ void fwht_warp(float (&x)[FWHT_REGS], int nj)
{
    const float scale = __fdiv_rn(1.0f, __fsqrt_rn((float)(32 * nj))); // 1.0f/sqrtf(n)
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < FWHT_REGS; j++)
        x[j] = __fmul_rn(x[j], scale);
#pragma unroll
    for (int s = 1; s < 32; s <<= 1) {
        const bool hi = (lane & s) != 0;
#pragma unroll
        for (int j = 0; j < FWHT_REGS; j++) {
            if (j < nj) {
                const float y = __shfl_xor_sync(0xffffffffu, x[j], s);
                // The low lane holds u, the high one v: u+v, u-v.
                x[j] = hi ? __fsub_rn(y, x[j]) : __fadd_rn(x[j], y);
            }
        }
    }
#pragma unroll
    for (int m = 1; m < FWHT_REGS; m <<= 1) {
        if (m < nj) {
#pragma unroll
            for (int j = 0; j < FWHT_REGS; j++) {
                if ((j & m) == 0) {
                    const float u = x[j], v = x[j | m];
                    x[j] = __fadd_rn(u, v);
                    x[j | m] = __fsub_rn(u, v);
                }
            }
        }
    }
}
