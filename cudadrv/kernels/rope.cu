// Rotary position embedding (RoPE), optionally preceded by an RMSNorm of
// each head (Qwen3's Q/K norms), for one or two tensors in one launch (Q and
// K of a layer). Go launcher: rope.go; CPU twins: ops.Rope.Table and
// ops.Rope.Apply, ops.RMSNorm per head.
//
// Thread mapping: grid (nTok, nTensors, head groups). Block (t, j, g)
// handles heads g*hpb .. g*hpb+hpb-1 of token t of tensor j: its threads
// first compute the cos/sin table of the token's position into shared
// memory (one pair per thread), then each warp takes whole heads (warp w:
// the group's heads w, w + nwarps, ...): the lanes stride over the head's
// values for the norm (a warp reduction) and over its rotated pairs. Decode
// (one token) spreads the heads over many blocks (small hpb); prefill keeps
// a token's heads in one block so the table is computed once per token.
//
// Positions come from device memory, so a CUDA graph captured once replays
// at every position: pos[0] + t (perToken == 0: one sequence's tokens) or
// pos[t] (perToken != 0: a batch of several sequences).
//
// Numerics follow ggml's rope cache as ops.Rope.Table does: theta starts at
// the position and is multiplied by theta_scale once per pair in float, so
// pair i's angle is the same float the CPU computes; it is divided by the
// pair's frequency factor (when given) and multiplied by freq_scale, and
// cos/sin are taken in double and rounded to float.
//
// A quantized cache (q8_0, q4_0) holds its keys and values rotated by a
// Walsh-Hadamard transform (llama.cpp's rotation; ops.KVRotation), the
// queries rotated alike: with rotK the kernel rotates every head of both
// tensors after RoPE, and with rotV the values on their way into the
// cache, so a decode step needs no fwht_f32 launches and no kv_store of
// its own (fwht_warp).

// PDL_ENTRY starts every kernel: under programmatic dependent launch
// (cudadrv Stream.SetProgrammatic, CC 9.0 and later) a kernel's blocks may
// be scheduled while the kernel before it still runs; griddepcontrol.wait
// returns once the kernels before have completed and their writes are
// visible, and launch_dependents then lets the next kernel's blocks be
// scheduled. Launched without it, wait returns at once. Older
// architectures have neither instruction.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define PDL_ENTRY() asm volatile("griddepcontrol.wait;\n\tgriddepcontrol.launch_dependents;" ::: "memory")
#else
#define PDL_ENTRY() do { } while (0)
#endif

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

#define ROPE_MAX_PAIRS 256 // n_rot up to 512

#include "kvquant.cuh"

// kv_block writes the warp's 32 values x as block b of the quantized cache
// row at row (kvType 1: Q8_0, 34 bytes a block; 2: Q4_0, 18).
__device__ __forceinline__ void kv_block(int kvType, float x, unsigned char *row, long long b)
{
    if (kvType == 1)
        q8_0_block(x, row + 34 * b);
    else
        q4_0_block(x, row + 18 * b);
}

// kv_row_bytes is the bytes of a quantized cache row of width values.
__device__ __forceinline__ long long kv_row_bytes(int kvType, long long width)
{
    return width / 32 * (kvType == 1 ? 34 : 18);
}

// rope_cache_row is the cache row of token t at position p: the position
// itself without tables, else its cell through the tables (attention.cu's
// "cache rows").
__device__ __forceinline__ long long rope_cache_row(int t, int p, const int *seq, const int *tables, int maxBlocks,
                                                    int blockShift)
{
    if (!tables)
        return p;
    const long long blk = tables[(long long)seq[t] * maxBlocks + (p >> blockShift)];
    return (blk << blockShift) | (p & ((1 << blockShift) - 1));
}

// rope_store_chunk writes the chunk of 32*nj values the warp holds (value
// 32j + lane of the chunk in r[j]) at value e of cache row row (rows of
// width values; kvType 0 f16, 1 Q8_0, 2 Q4_0: e is then a multiple of 32,
// and r[j] across the warp is one block).
__device__ __forceinline__ void rope_store_chunk(void *cache, int kvType, long long width, long long row, long long e,
                                                 const float (&r)[FWHT_REGS], int nj)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int j = 0; j < FWHT_REGS; j++) {
        if (j >= nj)
            break;
        if (kvType == 0)
            ((unsigned short *)cache)[row * width + e + 32 * j + lane] = f2h(r[j]);
        else
            kv_block(kvType, r[j], (unsigned char *)cache + row * kv_row_bytes(kvType, width), e / 32 + j);
    }
}

// rope_store_v writes head h of token t's values (vv: [nTok][heads *
// headSize] float) to the value cache vc, rotated in chunks of rotV in a
// warp's registers on their way (vv is left as it is).
__device__ __forceinline__ void rope_store_v(void *vc, const float *vv, int kvType, int heads, int headSize, int h, int t,
                                             int p, const int *seq, const int *tables, int maxBlocks, int blockShift,
                                             int rotV)
{
    const int lane = threadIdx.x & 31;
    const long long width = (long long)heads * headSize;
    const long long src = (long long)t * width + (long long)h * headSize;
    const long long row = rope_cache_row(t, p, seq, tables, maxBlocks, blockShift);
    const int nj = rotV / 32;
    for (int c = 0; c < headSize; c += rotV) {
        float r[FWHT_REGS];
#pragma unroll
        for (int j = 0; j < FWHT_REGS; j++)
            r[j] = j < nj ? vv[src + c + 32 * j + lane] : 0.0f;
        fwht_warp(r, nj);
        rope_store_chunk(vc, kvType, width, row, (long long)h * headSize + c, r, nj);
    }
}

// rope_norm_f32 rotates the first nDims values of every head of x_j[t]
// (heads_j heads of headSize floats, back to back) for t < nTok and
// j < gridDim.y (heads hpb at a time, grid.z = ceil(max heads / hpb)),
// after normalising each head with weight w_j when w_j is not null.
// nDims = 0 skips the rotation (a head norm alone). neox selects the pairs
// (i, i + nDims/2) instead of (2i, 2i + 1). factors (nDims/2 floats) may
// be null.
//
// With store >= 0, tensor x_store is the keys of an attention layer: its
// rotated heads are also written to the token's cache row of the key cache
// kc, and the same heads of the values vv ([nTok][heads*headSize] float)
// to the value cache vc: the cache write of attention.cu's kv_store_*,
// fused here to save a launch per layer. The row is the
// token's position without tables, else its cell through the tables
// (attention.cu's "cache rows"); kvType 0 writes f16, 1 Q8_0, 2 Q4_0
// (headSize % 32 == 0: a head is whole blocks).
//
// rotK > 0 then rotates every head of both tensors (queries and keys) in
// chunks of rotK values (fwht_warp), in place, the keys stored from the
// registers that rotated them; rotV > 0 rotates the stored values in
// chunks of rotV on their way into the cache (vv is left as it is), in
// blocks of their own (grid.y = tensors + 1, the last row of blocks), so
// that a key's warp does not also carry its value's rotation. Both are
// powers of two from 32 to 256 that divide headSize.
extern "C" __global__ void rope_norm_f32(float *x0, int heads0, const float *w0,
                                         float *x1, int heads1, const float *w1,
                                         int headSize, int nDims, int neox,
                                         float thetaScale, float freqScale,
                                         const float *factors, float eps,
                                         const int *pos, int perToken, int nTok, int hpb,
                                         int store, void *kc, void *vc, const float *vv, int kvType,
                                         const int *seq, const int *tables, int maxBlocks, int blockShift,
                                         int rotK, int rotV)
{
    PDL_ENTRY();
    __shared__ float cs[ROPE_MAX_PAIRS], sn[ROPE_MAX_PAIRS];
    const int t = blockIdx.x;
    if (t >= nTok)
        return;
    const int p = perToken ? pos[t] : pos[0] + t;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarps = blockDim.x >> 5;
    if (rotV > 0 && store >= 0 && (int)blockIdx.y == (x1 ? 2 : 1)) {
        // The values' row of blocks: the stored tensor's heads.
        const int heads = store == 0 ? heads0 : heads1;
        const int hEnd = min(heads, (int)blockIdx.z * hpb + hpb);
        for (int h = blockIdx.z * hpb + warp; h < hEnd; h += nwarps)
            rope_store_v(vc, vv, kvType, heads, headSize, h, t, p, seq, tables, maxBlocks, blockShift, rotV);
        return;
    }
    float *x = blockIdx.y == 0 ? x0 : x1;
    const int heads = blockIdx.y == 0 ? heads0 : heads1;
    const float *w = blockIdx.y == 0 ? w0 : w1;
    const int half = nDims / 2;
    const int hBegin = blockIdx.z * hpb;
    const int hEnd = min(heads, hBegin + hpb);
    if (hBegin >= hEnd)
        return; // the other tensor has more heads; the whole block leaves together

    if (half > 0) {
        const float fp = (float)p;
        for (int i = threadIdx.x; i < half; i += blockDim.x) {
            float theta = fp;
            // Repeated multiplication, as the CPU's table loop does: i steps.
            for (int k = 0; k < i; k++)
                theta = __fmul_rn(theta, thetaScale);
            float a = theta;
            if (factors)
                a = __fdiv_rn(a, factors[i]);
            a = __fmul_rn(a, freqScale);
            double s, c;
            sincos((double)a, &s, &c);
            cs[i] = (float)c;
            sn[i] = (float)s;
        }
        __syncthreads();
    }

    const bool storing = (int)blockIdx.y == store;
    const long long row = storing ? rope_cache_row(t, p, seq, tables, maxBlocks, blockShift) : 0;
    const long long width = (long long)heads * headSize;
    for (int h = hBegin + warp; h < hEnd; h += nwarps) {
        float *v = x + ((long long)t * heads + h) * headSize;
        if (w) {
            float s = 0.0f;
            for (int i = lane; i < headSize; i += 32)
                s += v[i] * v[i];
            s = warp_sum(s);
            const float mean = s / (float)headSize;
            const float scale = (float)(1.0 / sqrt((double)(mean + eps)));
            for (int i = lane; i < headSize; i += 32)
                v[i] = (v[i] * scale) * w[i];
            // The pairs below mix values other lanes wrote.
            __syncwarp();
        }
        for (int i = lane; i < half; i += 32) {
            const int a = neox ? i : 2 * i;
            const int b = neox ? i + half : 2 * i + 1;
            const float x0v = v[a], x1v = v[b];
            v[a] = __fsub_rn(__fmul_rn(x0v, cs[i]), __fmul_rn(x1v, sn[i]));
            v[b] = __fadd_rn(__fmul_rn(x0v, sn[i]), __fmul_rn(x1v, cs[i]));
        }
        if (rotK > 0) {
            __syncwarp(); // the head's values, written by any lane
            const int nj = rotK / 32;
            for (int c = 0; c < headSize; c += rotK) {
                float r[FWHT_REGS];
#pragma unroll
                for (int j = 0; j < FWHT_REGS; j++)
                    r[j] = j < nj ? v[c + 32 * j + lane] : 0.0f;
                fwht_warp(r, nj);
#pragma unroll
                for (int j = 0; j < FWHT_REGS; j++)
                    if (j < nj)
                        v[c + 32 * j + lane] = r[j];
                if (storing)
                    rope_store_chunk(kc, kvType, width, row, (long long)h * headSize + c, r, nj);
            }
        }
        if (storing) {
            const long long src = (long long)t * width + (long long)h * headSize;
            if (rotK == 0) {
                __syncwarp(); // the head's values, written by any lane
                if (kvType == 0) {
                    unsigned short *kd = (unsigned short *)kc + row * width + (long long)h * headSize;
                    for (int i = lane; i < headSize; i += 32)
                        kd[i] = f2h(v[i]);
                } else {
                    unsigned char *kr = (unsigned char *)kc + row * kv_row_bytes(kvType, width);
                    for (int j = 0; j < headSize / 32; j++)
                        kv_block(kvType, v[32 * j + lane], kr, (long long)h * (headSize / 32) + j);
                }
            }
            if (rotV == 0) {
                if (kvType == 0) {
                    unsigned short *vd = (unsigned short *)vc + row * width + (long long)h * headSize;
                    for (int i = lane; i < headSize; i += 32)
                        vd[i] = f2h(vv[src + i]);
                } else {
                    unsigned char *vr = (unsigned char *)vc + row * kv_row_bytes(kvType, width);
                    for (int j = 0; j < headSize / 32; j++)
                        kv_block(kvType, vv[src + 32 * j + lane], vr, (long long)h * (headSize / 32) + j);
                }
            }
        }
        // The next head of this warp touches other memory; no barrier needed.
    }
}
