// Causal grouped-query attention over an f16 KV cache, and the cache
// writes. Go launchers: attention.go; CPU twins: ops.KVLayer.Store and
// ops.Attention.Run.
//
// Layouts (as on the CPU): q and out are [nTok][nHeads*hs] float; the cache
// of a layer is two arrays [ctx][nKV*hs] of f16 (raw binary16 bits). Token t
// of the batch sits at position pos0 + t, where pos0 is read from device
// memory so that a captured CUDA graph replays at every position, and
// attends to positions 0..pos0+t.
//
// attn_mma_*: flash attention on the tensor cores, for prefill with head
// sizes 64 and 128 (below, after attn_f16). attn_dec_*: decode (one query
// row) with head sizes 32, 64, 128 and 256, a block per head and split
// (after attn_f16; attention.go's planAttentionDec). attn_f16_*: flash
// attention (online softmax) on the CUDA cores, for every shape the other
// two do not take (planAttentionMMA; ATS_GPU_ATTN=simt makes it take all
// prefill, ATS_GPU_ATTN=tile all decode). A block owns ATT_ROWS query rows, each a (token, head) pair: hb
// heads of one KV group times ATT_ROWS/hb tokens, so the K/V tile it loads
// into shared memory serves every head of the group (GQA) and several
// tokens. It walks its range of cache positions in tiles of bk:
//   1. load K and V of the tile (f16 -> float) into shared memory;
//   2. scores: thread (r = tid/tpr, c0 = tid%tpr) computes S[r][c0 + tpr*j],
//      the tpr threads of a row (8; 16 when a block has at most 8 rows, as
//      in decode) being adjacent lanes, which then reduce the row's max
//      and sum with shuffles; P = exp(S - m) goes to shared memory;
//   3. output: warp w, lane l accumulates O[w + 4i][l + 32k] in registers,
//      rescaled by exp(m_old - m_new) and increased by P·V.
// Split-K (decode over long contexts): grid.z splits the positions into
// chunks; each split writes its unnormalised O and its (max, sum) and
// attn_combine merges them. With one split the kernel writes out directly.
//
// Numerics: as ops.Attention.Run with an f16 cache, q is rounded to f16
// before the products; scores and softmax are float (the CPU sums in
// double, and rounds the weights to f16 before P·V, which this does not).
//
// A q8_0 cache holds its values rotated (Walsh-Hadamard, ops.KVRotation):
// the paged decode kernels rotate their output rows back as they write
// them (DecKVParams.rot); after the others, fwht_f32 (elementwise.cu) does.

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

#define ATT_ROWS 16    // query rows per block
#define ATT_THREADS 128 // 4 warps; ATT_ROWS * 8 threads in the score phase (8 rows * 16 in decode)

__device__ __forceinline__ float h2f(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

#include "kvquant.cuh"

// ---------------------------------------------------------------- cache rows
//
// Where a token's key and value rows live. A layer's cache is two arrays of
// rows (cells), K and V, each row the NKV*hs values of one token in the
// cache's type: f16 (2 bytes a value) or q8_0 (ggml's blocks of 32 values,
// {f16 d; int8 q[32]}, 34 bytes). Two addressings:
//   - contiguous (tables == 0): token t's row is its position, pos[0] + t
//     (perToken == 0, the prefill and decode of one sequence) or pos[t];
//   - paged (the batch of several sequences): token t of sequence seq[t] at
//     position pos[t] sits in cell tables[seq[t]*maxBlocks + pos/B]*B +
//     pos%B, B = 1 << blockShift positions a block. Sequences may share
//     blocks (a common prefix); the tables are read on the device, so a
//     captured graph replays at any positions and tables.

// kv_token_pos is token t's position.
__device__ __forceinline__ int kv_token_pos(const int *pos, int perToken, int t)
{
    return perToken ? pos[t] : pos[0] + t;
}

// kv_cell_in is the cache row of position p in cache block blk (a table
// entry).
__device__ __forceinline__ long long kv_cell_in(long long blk, int blockShift, int p)
{
    return (blk << blockShift) | (p & ((1 << blockShift) - 1));
}

// kv_cell is the cache row of position p of sequence s (the position itself
// without tables).
__device__ __forceinline__ long long kv_cell(const int *tables, int maxBlocks, int blockShift, int s, int p)
{
    if (!tables)
        return p;
    return kv_cell_in(tables[(long long)s * maxBlocks + (p >> blockShift)], blockShift, p);
}

// kv_store_f16 writes the keys and values of nTok tokens (k, v: [nTok][width]
// float) as f16 into their cache rows ([rows][width] f16 each).
extern "C" __global__ void kv_store_f16(unsigned short *kc, unsigned short *vc,
                                        const float *k, const float *v, int width,
                                        const int *pos, int perToken, const int *seq,
                                        const int *tables, int maxBlocks, int blockShift, int nTok)
{
    PDL_ENTRY();
    const long long n = (long long)nTok * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const int t = (int)(i / width);
        const long long e = i - (long long)t * width;
        const int p = kv_token_pos(pos, perToken, t);
        const long long dst = kv_cell(tables, maxBlocks, blockShift, tables ? seq[t] : 0, p) * width + e;
        kc[dst] = f2h(k[i]);
        vc[dst] = f2h(v[i]);
    }
}

// kv_store_block writes the keys and values of nTok tokens (k, v:
// [nTok][width] float, width % 32 == 0) as blocks of 32 values (KVT 1:
// Q8_0, 34 bytes; 2: Q4_0, 18) into their cache rows: a warp per block, the
// block of K then of V.
template <int KVT>
__device__ __forceinline__ void kv_store_block(unsigned char *kc, unsigned char *vc,
                                               const float *k, const float *v, int width,
                                               const int *pos, int perToken, const int *seq,
                                               const int *tables, int maxBlocks, int blockShift, int nTok)
{
    constexpr int BB = KVT == 1 ? 34 : 18; // bytes a block
    const int bpr = width / 32;            // blocks a row
    const long long rowBytes = (long long)bpr * BB;
    const long long n = (long long)nTok * bpr;
    const int lane = threadIdx.x & 31;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long w = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); w < n; w += warps) {
        const int t = (int)(w / bpr);
        const int b = (int)(w - (long long)t * bpr);
        const int p = kv_token_pos(pos, perToken, t);
        const long long dst = kv_cell(tables, maxBlocks, blockShift, tables ? seq[t] : 0, p) * rowBytes + (long long)BB * b;
        const long long src = (long long)t * width + 32LL * b + lane;
        if (KVT == 1) {
            q8_0_block(k[src], kc + dst);
            q8_0_block(v[src], vc + dst);
        } else {
            q4_0_block(k[src], kc + dst);
            q4_0_block(v[src], vc + dst);
        }
    }
}

extern "C" __global__ void kv_store_q8_0(unsigned char *kc, unsigned char *vc, const float *k, const float *v, int width,
                                         const int *pos, int perToken, const int *seq, const int *tables, int maxBlocks,
                                         int blockShift, int nTok)
{
    PDL_ENTRY();
    kv_store_block<1>(kc, vc, k, v, width, pos, perToken, seq, tables, maxBlocks, blockShift, nTok);
}

extern "C" __global__ void kv_store_q4_0(unsigned char *kc, unsigned char *vc, const float *k, const float *v, int width,
                                         const int *pos, int perToken, const int *seq, const int *tables, int maxBlocks,
                                         int blockShift, int nTok)
{
    PDL_ENTRY();
    kv_store_block<2>(kc, vc, k, v, width, pos, perToken, seq, tables, maxBlocks, blockShift, nTok);
}

// Parameters of the attention kernels, passed by value.
struct AttnParams {
    float *out;                 // [nTok][nHeads*hs], written when nsplit == 1
    float *part;                // [nsplit][nTok*nHeads][hs] unnormalised O, when nsplit > 1
    float *ml;                  // [nsplit][nTok*nHeads][2] running max and sum, when nsplit > 1
    const float *q;             // [nTok][nHeads*hs]
    const unsigned short *kc;   // [ctx][nKV*hs] f16
    const unsigned short *vc;   // [ctx][nKV*hs] f16
    const int *pos0;            // device: position of token 0
    float scale;                // usually 1/sqrt(hs)
    int nTok, nHeads, nKV, hs;
    int hb;                     // heads per block, dividing nHeads/nKV, at most ATT_ROWS
    int bk;                     // cache positions per tile, a multiple of tpr, at most 8*tpr
    int tpr;                    // threads per query row in the score phase: 8, or 16 when a
                                // block has at most 8 rows (decode), halving each one's work
    int chunk;                  // cache positions per split
    int nsplit;
    signed char *q8;            // optional: out also in ats's GPU Q8_1 layout (hs % 32 == 0)
    float2 *q8ds;               //   its block scales {d, d*sum(q)}
};

// q8_1_quant and q8_1_block are matvec.cu's (the expressions of
// quantize_q8_1, so the product after sees the activations quantize_q8_1
// would have made): a warp's block of 32 values (one per lane) in ats's
// GPU Q8_1 layout, and with plane > 0 its residual's rounding as the
// second plane, plane values on.
__device__ __forceinline__ int q8_1_quant(float v, float &d, int &sum)
{
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    d = amax / 127.0f;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    int qv = (int)roundf(v * id);
    qv = max(-128, min(127, qv));
    sum = qv;
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return qv;
}

// q8_1_residual is the second plane of a block whose first plane q8_1_quant
// made (d, qv): v - d*q in steps of d2 = d/254, half the first plane's
// step / 127, so that |v - d*q| <= d/2 fits int8 unclamped and a product
// may add the two planes' integer sums, the first's times 254, before it
// scales them (unit_dot2 in matvec.cu).
__device__ __forceinline__ int q8_1_residual(float v, float d, int qv, float &d2, int &sum)
{
    d2 = d / 254.0f;
    const float id2 = d2 != 0.f ? 1.0f / d2 : 0.f;
    int q2 = (int)roundf(__fmaf_rn(-d, (float)qv, v) * id2);
    q2 = max(-128, min(127, q2));
    sum = q2;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    return q2;
}

__device__ __forceinline__ void q8_1_block(float v, signed char *q, float2 *ds, long long plane = 0)
{
    float d;
    int sum;
    const int qv = q8_1_quant(v, d, sum);
    *q = (signed char)qv;
    if ((threadIdx.x & 31) == 0)
        *ds = make_float2(d, (float)sum * d);
    if (plane) {
        float d2;
        int sum2;
        const int q2 = q8_1_residual(v, d, qv, d2, sum2);
        q[plane] = (signed char)q2;
        if ((threadIdx.x & 31) == 0)
            ds[plane / 32] = make_float2(d2, (float)sum2 * d2);
    }
}

// q8_1_plane2 writes the second Q8_1 plane of n values x (n % 32 == 0)
// whose first plane is at q, ds: q8_1_block's, from the values the
// attention kernels of AttnParams wrote (they write the first plane only:
// their registers are short, and prompt chunks seldom ask for Q8_1). One
// warp a block, grid-stride.
extern "C" __global__ void q8_1_plane2(const float *x, long long n, signed char *q, float2 *ds, long long plane)
{
    PDL_ENTRY();
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); 32 * b < n; b += warps) {
        const long long i = 32 * b + (threadIdx.x & 31);
        const float v = x[i];
        float d, d2;
        int sum, sum2;
        const int qv = q8_1_quant(v, d, sum);
        const int q2 = q8_1_residual(v, d, qv, d2, sum2);
        q[plane + i] = (signed char)q2;
        if ((threadIdx.x & 31) == 0)
            ds[(plane + i) / 32] = make_float2(d2, (float)sum2 * d2);
    }
}

// Dynamic shared memory layout (floats):
//   Q  [ATT_ROWS][hs+1]  query rows (padded: rows of one warp hit other banks)
//   K  [bk][hs+1]        key tile (padded likewise)
//   V  [bk][hs]          value tile
//   P  [ATT_ROWS][bk]    softmax numerators of the tile
//   M, L, A [ATT_ROWS]   running max, running sum, rescale factor
// attnSharedFloats in attention.go computes the same size.

// DPL: values of a head per lane in the output phase, ceil(hs/32).
template <int DPL>
__device__ void attn_f16(const AttnParams p)
{
    extern __shared__ float sm[];
    const int hs = p.hs, bk = p.bk;
    float *Qs = sm;
    float *Ks = Qs + ATT_ROWS * (hs + 1);
    float *Vs = Ks + bk * (hs + 1);
    float *Ps = Vs + bk * hs;
    float *Ms = Ps + ATT_ROWS * bk;
    float *Ls = Ms + ATT_ROWS;
    float *As = Ls + ATT_ROWS;

    const int tid = threadIdx.x;
    const int tb = ATT_ROWS / p.hb;            // tokens per block
    const int t0 = blockIdx.x * tb;            // first token
    const int h0 = blockIdx.y * p.hb;          // first head
    const int group = p.nHeads / p.nKV;
    const int kvh = h0 / group;
    const int split = blockIdx.z;
    const int qw = p.nHeads * hs;              // q/out row width
    const int kvw = p.nKV * hs;                // cache row width
    const int pos0 = p.pos0[0];
    const int nRows = min(tb, p.nTok - t0) * p.hb; // valid rows; row r = (token r/hb, head r%hb)

    // The block's positions: its split's chunk, cut at the last row's position.
    const int lastPos = pos0 + t0 + min(tb, p.nTok - t0) - 1;
    const int begin = split * p.chunk;
    const int end = min(begin + p.chunk, lastPos + 1);

    // Load Q rounded to f16 (as the CPU path does for an f16 cache).
    for (int i = tid; i < ATT_ROWS * hs; i += ATT_THREADS) {
        const int r = i / hs, d = i % hs;
        float v = 0.0f;
        if (r < nRows) {
            const int t = t0 + r / p.hb, h = h0 + r % p.hb;
            v = h2f(f2h(p.q[(long long)t * qw + h * hs + d]));
        }
        Qs[r * (hs + 1) + d] = v;
    }
    if (tid < ATT_ROWS) {
        Ms[tid] = -INFINITY;
        Ls[tid] = 0.0f;
    }

    // Score phase mapping: tpr adjacent lanes per row.
    const int tpr = p.tpr;
    const int sr = tid / tpr, sc = tid % tpr;
    const int myPos = pos0 + t0 + sr / p.hb; // this score row's position
    const bool rowValid = sr < nRows;
    // Output phase mapping.
    const int warp = tid >> 5, lane = tid & 31;
    float o[ATT_ROWS / 4][DPL];
#pragma unroll
    for (int i = 0; i < ATT_ROWS / 4; i++)
#pragma unroll
        for (int k = 0; k < DPL; k++)
            o[i][k] = 0.0f;

    for (int kv0 = begin; kv0 < end; kv0 += bk) {
        __syncthreads(); // the previous tile's K, V and P are consumed (and Q, M, L are written)
        // 1. K and V tile, 4 halves (8 bytes) per load; hs % 4 == 0.
        const int q4 = hs >> 2;
        for (int i = tid; i < bk * q4; i += ATT_THREADS) {
            const int c = i / q4, d = (i % q4) * 4;
            const int pos = kv0 + c;
            float k0 = 0, k1 = 0, k2 = 0, k3 = 0, v0 = 0, v1 = 0, v2 = 0, v3 = 0;
            if (pos < end) {
                const long long off = (long long)pos * kvw + kvh * hs + d;
                const uint2 kk = *(const uint2 *)(p.kc + off);
                const uint2 vv = *(const uint2 *)(p.vc + off);
                k0 = h2f(kk.x & 0xffff); k1 = h2f(kk.x >> 16);
                k2 = h2f(kk.y & 0xffff); k3 = h2f(kk.y >> 16);
                v0 = h2f(vv.x & 0xffff); v1 = h2f(vv.x >> 16);
                v2 = h2f(vv.y & 0xffff); v3 = h2f(vv.y >> 16);
            }
            float *kr = Ks + c * (hs + 1) + d;
            kr[0] = k0; kr[1] = k1; kr[2] = k2; kr[3] = k3;
            float *vr = Vs + c * hs + d;
            vr[0] = v0; vr[1] = v1; vr[2] = v2; vr[3] = v3;
        }
        __syncthreads();

        // 2. Scores of row sr, columns sc + 8j.
        float s[8];
        float mx = -INFINITY;
        const float *qr = Qs + sr * (hs + 1);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            s[j] = -INFINITY;
            const int c = sc + tpr * j;
            if (c < bk) {
                const int pos = kv0 + c;
                if (rowValid && pos < end && pos <= myPos) {
                    const float *kr = Ks + c * (hs + 1);
                    float acc = 0.0f;
                    for (int d = 0; d < hs; d++)
                        acc += qr[d] * kr[d];
                    s[j] = acc * p.scale;
                }
                mx = fmaxf(mx, s[j]);
            }
        }
        for (int off = tpr >> 1; off > 0; off >>= 1)
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float mOld = Ms[sr];
        const float mNew = fmaxf(mOld, mx);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            const int c = sc + tpr * j;
            if (c < bk) {
                // exp(-inf) is 0: masked columns, and rows with nothing yet.
                const float e = s[j] == -INFINITY ? 0.0f : expf(s[j] - mNew);
                Ps[sr * bk + c] = e;
                sum += e;
            }
        }
        for (int off = tpr >> 1; off > 0; off >>= 1)
            sum += __shfl_xor_sync(0xffffffffu, sum, off);
        __syncwarp(); // every lane of the row has read Ms[sr]
        if (sc == 0) {
            const float alpha = mOld == -INFINITY ? 0.0f : expf(mOld - mNew);
            Ms[sr] = mNew;
            Ls[sr] = Ls[sr] * alpha + sum;
            As[sr] = alpha;
        }
        __syncthreads();

        // 3. O = O * alpha + P·V for rows warp + 4i, columns lane + 32k.
#pragma unroll
        for (int i = 0; i < ATT_ROWS / 4; i++) {
            const int r = warp + 4 * i;
            const float a = As[r];
#pragma unroll
            for (int k = 0; k < DPL; k++)
                o[i][k] *= a;
        }
        for (int c = 0; c < bk; c++) {
            float vv[DPL];
#pragma unroll
            for (int k = 0; k < DPL; k++) {
                const int d = lane + 32 * k;
                vv[k] = d < hs ? Vs[c * hs + d] : 0.0f;
            }
#pragma unroll
            for (int i = 0; i < ATT_ROWS / 4; i++) {
                const float pr = Ps[(warp + 4 * i) * bk + c];
#pragma unroll
                for (int k = 0; k < DPL; k++)
                    o[i][k] += pr * vv[k];
            }
        }
    }
    __syncthreads(); // M and L final (also when the range was empty)

#pragma unroll
    for (int i = 0; i < ATT_ROWS / 4; i++) {
        const int r = warp + 4 * i;
        if (r >= nRows)
            continue;
        const int t = t0 + r / p.hb, h = h0 + r % p.hb;
        const long long row = (long long)t * p.nHeads + h;
        if (p.nsplit == 1) {
            const float inv = 1.0f / Ls[r];
#pragma unroll
            for (int k = 0; k < DPL; k++) {
                const int d = lane + 32 * k;
                if (d < hs) {
                    const float v = o[i][k] * inv;
                    p.out[row * hs + d] = v;
                    // With q8, hs % 32 == 0: the warp's lanes hold one
                    // whole block (32 consecutive values of the head).
                    if (p.q8)
                        q8_1_block(v, p.q8 + row * hs + d, p.q8ds + (row * hs + d) / 32);
                }
            }
        } else {
            const long long prow = (long long)split * p.nTok * p.nHeads + row;
#pragma unroll
            for (int k = 0; k < DPL; k++) {
                const int d = lane + 32 * k;
                if (d < hs)
                    p.part[prow * hs + d] = o[i][k];
            }
            if (lane == 0) {
                p.ml[2 * prow] = Ms[r];
                p.ml[2 * prow + 1] = Ls[r];
            }
        }
    }
}

// One entry point per register budget; the launcher picks ceil(hs/32).
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d1(const AttnParams p) { PDL_ENTRY(); attn_f16<1>(p); }
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d2(const AttnParams p) { PDL_ENTRY(); attn_f16<2>(p); }
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d3(const AttnParams p) { PDL_ENTRY(); attn_f16<3>(p); }
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d4(const AttnParams p) { PDL_ENTRY(); attn_f16<4>(p); }
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d8(const AttnParams p) { PDL_ENTRY(); attn_f16<8>(p); }

// ---------------------------------------------------------------- decode
//
// attn_dec_e1/e2/e4/e8: decode (p.nTok == 1) with head sizes 32*E, on the
// CUDA cores. attn_f16 gives a block the heads of a KV group and walks the
// positions in tiles behind four barriers each, so a decode step had one
// block per KV head and split: a few blocks, each a long serial chain. Here
// a block owns one query head and split, DEC_WARPS warps, and lane l holds
// dims l*E .. l*E+E-1 of q (rounded to f16 as attn_f16 does, in registers),
// of every key and value row it reads and of its output. Warp w walks the
// split's positions in runs of DEC_B (base = begin + DEC_B*w, stepping by
// DEC_WARPS*DEC_B): it loads the run's keys and values at once (E halves a
// lane, coalesced rows; positions past the end reload the last row and are
// masked), reduces the DEC_B scores with butterflies (every lane ends with
// the same sums) and keeps its own running max, sum and output (online
// softmax), without barriers. At the end the warps' states merge through
// shared memory: one barrier. One split writes out (and its Q8_1 form), as
// attn_f16 does; several write their unnormalised output and (max, sum)
// for attn_combine. Heads of one KV group read the same rows, from L2.
#define DEC_WARPS 8
#define DEC_B 8

// DecKV holds the E halves of one row a lane reads, as loaded.
template <int E> struct DecKV {
    unsigned int w[(E + 1) / 2];
};

template <int E> __device__ __forceinline__ DecKV<E> dec_load(const unsigned short *p);
template <> __device__ __forceinline__ DecKV<1> dec_load<1>(const unsigned short *p)
{
    DecKV<1> r;
    r.w[0] = p[0];
    return r;
}
template <> __device__ __forceinline__ DecKV<2> dec_load<2>(const unsigned short *p)
{
    DecKV<2> r;
    r.w[0] = *(const unsigned int *)p;
    return r;
}
template <> __device__ __forceinline__ DecKV<4> dec_load<4>(const unsigned short *p)
{
    const uint2 t = *(const uint2 *)p;
    DecKV<4> r;
    r.w[0] = t.x, r.w[1] = t.y;
    return r;
}
template <> __device__ __forceinline__ DecKV<8> dec_load<8>(const unsigned short *p)
{
    const uint4 t = *(const uint4 *)p;
    DecKV<8> r;
    r.w[0] = t.x, r.w[1] = t.y, r.w[2] = t.z, r.w[3] = t.w;
    return r;
}

// dec_f is half e of r as a float.
template <int E> __device__ __forceinline__ float dec_f(const DecKV<E> &r, int e)
{
    const unsigned int w = r.w[e >> 1];
    return h2f((unsigned short)((e & 1) ? (w >> 16) : (w & 0xffffu)));
}

template <int E>
__device__ void attn_dec(const AttnParams p)
{
    __shared__ float So[DEC_WARPS][32 * E];
    __shared__ float Sm[DEC_WARPS], Sl[DEC_WARPS];
    const int hs = 32 * E;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int h = blockIdx.y, split = blockIdx.z;
    const int kvh = h / (p.nHeads / p.nKV);
    const long long kvw = (long long)p.nKV * hs;
    const int begin = split * p.chunk;
    const int end = (int)min((long long)begin + p.chunk, (long long)p.pos0[0] + 1);

    float q[E], o[E];
    const float *qp = p.q + (long long)h * hs + lane * E;
#pragma unroll
    for (int e = 0; e < E; e++) {
        q[e] = h2f(f2h(qp[e]));
        o[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const unsigned short *kb = p.kc + kvh * hs + lane * E;
    const unsigned short *vb = p.vc + kvh * hs + lane * E;
    for (int base = begin + DEC_B * warp; base < end; base += DEC_WARPS * DEC_B) {
        DecKV<E> kr[DEC_B], vr[DEC_B];
#pragma unroll
        for (int j = 0; j < DEC_B; j++) {
            const long long pos = min(base + j, end - 1);
            kr[j] = dec_load<E>(kb + pos * kvw);
            vr[j] = dec_load<E>(vb + pos * kvw);
        }
        float s[DEC_B];
#pragma unroll
        for (int j = 0; j < DEC_B; j++) {
            float a = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++)
                a += q[e] * dec_f<E>(kr[j], e);
            s[j] = a;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
#pragma unroll
            for (int j = 0; j < DEC_B; j++)
                s[j] += __shfl_xor_sync(0xffffffffu, s[j], off);
        float mx = m;
#pragma unroll
        for (int j = 0; j < DEC_B; j++) {
            s[j] = base + j < end ? s[j] * p.scale : -INFINITY;
            mx = fmaxf(mx, s[j]);
        }
        // base < end: mx is finite.
        const float alpha = m == -INFINITY ? 0.0f : expf(m - mx);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < DEC_B; j++) {
            s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - mx);
            sum += s[j];
        }
        l = l * alpha + sum;
#pragma unroll
        for (int e = 0; e < E; e++) {
            float a = o[e] * alpha;
#pragma unroll
            for (int j = 0; j < DEC_B; j++)
                a += s[j] * dec_f<E>(vr[j], e);
            o[e] = a;
        }
        m = mx;
    }

    // Merge the warps: O = Σ_w o_w·exp(m_w − M), L = Σ_w l_w·exp(m_w − M).
#pragma unroll
    for (int e = 0; e < E; e++)
        So[warp][lane * E + e] = o[e];
    if (lane == 0) {
        Sm[warp] = m;
        Sl[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++)
        M = fmaxf(M, Sm[w]);
    float wt[DEC_WARPS], L = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) {
        wt[w] = Sm[w] == -INFINITY ? 0.0f : expf(Sm[w] - M);
        L += Sl[w] * wt[w];
    }
    // Thread d writes dim d: a warp's lanes are 32 consecutive dims, one
    // Q8_1 block (hs % 32 == 0, so whole warps take part or none).
    for (int d = threadIdx.x; d < hs; d += DEC_WARPS * 32) {
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++)
            acc += So[w][d] * wt[w];
        if (p.nsplit == 1) {
            const float v = acc * (1.0f / L);
            const long long e = (long long)h * hs + d;
            p.out[e] = v;
            if (p.q8)
                q8_1_block(v, p.q8 + e, p.q8ds + e / 32);
        } else {
            p.part[((long long)split * p.nHeads + h) * hs + d] = acc;
        }
    }
    if (p.nsplit > 1 && threadIdx.x == 0) {
        const long long prow = (long long)split * p.nHeads + h;
        p.ml[2 * prow] = M;
        p.ml[2 * prow + 1] = L;
    }
}

extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec_e1(const AttnParams p) { PDL_ENTRY(); attn_dec<1>(p); }
extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec_e2(const AttnParams p) { PDL_ENTRY(); attn_dec<2>(p); }
extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec_e4(const AttnParams p) { PDL_ENTRY(); attn_dec<4>(p); }
extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec_e8(const AttnParams p) { PDL_ENTRY(); attn_dec<8>(p); }

// ---------------------------------------------------------------- tensor cores
//
// attn_mma_d64, attn_mma_d128: flash attention for prefill on the tensor
// cores (mma.sync m16n8k16, f16 in, f32 accumulate; two m16n8k8 on CC 7.5),
// head sizes 64 and 128, one split (p.nsplit == 1), the same AttnParams and
// the same outputs as attn_f16 (out, and the optional Q8_1 copy).
//
// A block of 4 warps owns AM_ROWS = 64 query rows, row r being token
// t0 + r/hb, head h0 + r%hb (hb divides 64 and the group: the launcher's
// planAttentionMMA), warp w rows 16w..16w+15. It walks the cache positions
// 0..(its last row's position) in tiles of AM_BN = 64:
//   - K and V of the next tile load with cp.async (16 bytes a copy, zero
//     past the block's last position) while the current tile is used: two
//     buffers [64][D+8] f16 each for K and V (the 8 halves of padding make
//     ldmatrix conflict-free); Q, converted to f16 once, is staged in the
//     second buffer and kept in registers as A fragments;
//   - S = Q·Kᵀ: a warp's 16x64 scores in 8 n8 accumulator fragments (B
//     fragments of K by ldmatrix from rows [position][d]);
//   - online softmax in registers: a thread holds 2 columns of 8 n8 blocks
//     for rows g and g+8 (g = lane/4); the 4 threads of a quad own a row and
//     reduce its max with two shuffles; P = exp2(S·scale·log2e − m);
//   - O += P·V: the S accumulators are, pairwise, the A fragments of P
//     (rounded to f16), V's B fragments come by ldmatrix.trans from rows
//     [position][d]; O is 16 x D f32 per warp in registers, rescaled by
//     exp2(m_old − m_new) per tile.
// The row sums stay per thread until the end (a quad's partial sums share
// their rescale factors), then a quad reduces them.
//
// Numerics against ops.Attention.Run: Q is rounded to f16 as there; the
// scores accumulate in f32; the probabilities are rounded to f16 before
// P·V as there, but unnormalised (relative to the running max) where the
// CPU rounds the normalised weights: each weight carries an independent
// rounding of relative size <= 2^-11 on each side.

#define AM_ROWS 64     // query rows per block: 4 warps of 16
#define AM_BN 64       // cache positions per tile
#define AM_THREADS 128

typedef unsigned int am_u32;

__device__ __forceinline__ am_u32 am_smem_addr(const void *p) { return (am_u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void am_ldmatrix_x4(am_u32 *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(am_smem_addr(p)));
}

__device__ __forceinline__ void am_ldmatrix_x4_trans(am_u32 *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(am_smem_addr(p)));
}

// c += a (16x16, row) * b (16x8, col), f16 inputs, f32 accumulators.
__device__ __forceinline__ void am_mma16816(float *c, const am_u32 *a, const am_u32 *b)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(b[0]));
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[2]), "r"(a[3]), "r"(b[1]));
#endif
}

// Two floats to a packed f16x2 (lo in the low half), rounded to nearest.
__device__ __forceinline__ am_u32 am_pack_h2(float lo, float hi)
{
#if __CUDA_ARCH__ >= 800
    am_u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (am_u32)f2h(lo) | ((am_u32)f2h(hi) << 16);
#endif
}

// 16 bytes global -> shared; zero-filled when !valid (src is then not read).
__device__ __forceinline__ void am_cp16(void *dst, const void *src, bool valid)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(am_smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
#else
    uint4 v = valid ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
    *(uint4 *)dst = v;
#endif
}

__device__ __forceinline__ void am_cp_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

// All but the most recent group complete.
__device__ __forceinline__ void am_cp_wait_prev()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 1;");
#endif
}

// Dynamic shared memory: K0, V0, K1, V1, each [AM_BN][D+8] f16; Q [AM_ROWS][D+8]
// is staged in K1 before the loop (AM_ROWS == AM_BN). attnMMAShared in
// attention.go computes the size.
template <int D>
__device__ __forceinline__ void attn_mma(const AttnParams p)
{
    constexpr int LD = D + 8;        // halves per shared row
    constexpr int TILE = AM_BN * LD; // halves of one K or V tile
    constexpr int NB = D / 8;        // n8 blocks of O
    constexpr int CH = D / 8;        // 16-byte pieces of a row of the head
    extern __shared__ __align__(16) unsigned short am_smem[];

    const int tid = threadIdx.x;
    const int warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    const int hb = p.hb;
    const int tb = AM_ROWS / hb;                      // tokens per block
    const int t0 = (gridDim.x - 1 - blockIdx.x) * tb; // the longest walks start first
    const int h0 = blockIdx.y * hb;
    const int kvh = h0 / (p.nHeads / p.nKV);
    const int qw = p.nHeads * D;
    const int kvw = p.nKV * D;
    const int pos0 = p.pos0[0];
    const int nRows = min(tb, p.nTok - t0) * hb;
    const int end = pos0 + t0 + min(tb, p.nTok - t0); // one past the last row's position

    // Stage Q (f16, rounded as the CPU rounds it) in the K1 buffer.
    unsigned short *Qs = am_smem + 2 * TILE;
    for (int i = tid; i < AM_ROWS * (D / 4); i += AM_THREADS) {
        const int r = i / (D / 4), d = (i % (D / 4)) * 4;
        uint2 v = make_uint2(0, 0);
        if (r < nRows) {
            const int t = t0 + r / hb, h = h0 + r % hb;
            const float4 f = *(const float4 *)(p.q + (long long)t * qw + h * D + d);
            v = make_uint2(am_pack_h2(f.x, f.y), am_pack_h2(f.z, f.w));
        }
        *(uint2 *)(Qs + r * LD + d) = v;
    }

    // Cache tile kv0 into buffer buf (K at buf*2*TILE, V after it).
    auto load_tile = [&](int kv0, int buf) {
        unsigned short *Kd = am_smem + buf * 2 * TILE;
        unsigned short *Vd = Kd + TILE;
        for (int i = tid; i < AM_BN * CH; i += AM_THREADS) {
            const int col = i / CH, ch = i % CH;
            const int pos = kv0 + col;
            const bool valid = pos < end;
            const long long off = (long long)(valid ? pos : 0) * kvw + kvh * D + ch * 8;
            am_cp16(Kd + col * LD + ch * 8, p.kc + off, valid);
            am_cp16(Vd + col * LD + ch * 8, p.vc + off, valid);
        }
    };
    load_tile(0, 0);
    am_cp_commit();
    __syncthreads(); // Q staged

    am_u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        am_ldmatrix_x4(qf[kk], Qs + (16 * warp + (lane & 15)) * LD + 16 * kk + (lane >> 4) * 8);

    // This thread's rows (r0 = 16*warp + g and r0 + 8) and their positions;
    // the warp's first and last positions decide masking and skipping.
    const int r0 = 16 * warp + g;
    const int rowPos0 = pos0 + t0 + r0 / hb, rowPos1 = pos0 + t0 + (r0 + 8) / hb;
    const int warpFirst = pos0 + t0 + (16 * warp) / hb;
    const int warpLast = min(pos0 + t0 + (16 * warp + 15) / hb, end - 1);
    const float sl2 = p.scale * 1.4426950408889634f; // exp(x) = exp2(x*log2e)

    float o[NB][4];
#pragma unroll
    for (int n = 0; n < NB; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    __syncthreads(); // Q is in registers: the K1 buffer is free
    for (int kv0 = 0, it = 0; kv0 < end; kv0 += AM_BN, it++) {
        if (kv0 + AM_BN < end)
            load_tile(kv0 + AM_BN, (it + 1) & 1);
        am_cp_commit(); // possibly empty: the wait below always leaves one group
        am_cp_wait_prev();
        __syncthreads(); // tile it is in shared memory for every thread

        // Warps whose rows all precede the tile skip it (warp-uniform).
        if (kv0 <= warpLast) {
            const unsigned short *Ks = am_smem + (it & 1) * 2 * TILE;
            const unsigned short *Vs = Ks + TILE;
            float s[8][4];
#pragma unroll
            for (int j = 0; j < 8; j++)
                s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
                for (int jj = 0; jj < 4; jj++) {
                    am_u32 b[4];
                    am_ldmatrix_x4(b, Ks + (16 * jj + (lane & 7) + ((lane >> 4) << 3)) * LD + 16 * kk + ((lane >> 3) & 1) * 8);
                    am_mma16816(s[2 * jj], qf[kk], b);
                    am_mma16816(s[2 * jj + 1], qf[kk], b + 2);
                }
            }
            // Scale; mask positions after a row's own (and past the block's
            // last: their K was zero-filled) when the tile reaches them.
            const bool mask = kv0 + AM_BN - 1 > warpFirst;
            float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int col = kv0 + 8 * j + 2 * c;
                s[j][0] = mask && col > rowPos0 ? -INFINITY : s[j][0] * sl2;
                s[j][1] = mask && col + 1 > rowPos0 ? -INFINITY : s[j][1] * sl2;
                s[j][2] = mask && col > rowPos1 ? -INFINITY : s[j][2] * sl2;
                s[j][3] = mask && col + 1 > rowPos1 ? -INFINITY : s[j][3] * sl2;
                mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
                mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
            }
#pragma unroll
            for (int off = 1; off <= 2; off <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
            }
            const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
            // A row with nothing seen yet keeps m = -inf: subtract 0 then
            // (every exp2 is of -inf, 0), never -inf - -inf.
            const float base0 = mn0 == -INFINITY ? 0.0f : mn0;
            const float base1 = mn1 == -INFINITY ? 0.0f : mn1;
            const float a0 = exp2f(m0 - base0), a1 = exp2f(m1 - base1);
            m0 = mn0;
            m1 = mn1;
            float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                s[j][0] = exp2f(s[j][0] - base0);
                s[j][1] = exp2f(s[j][1] - base0);
                s[j][2] = exp2f(s[j][2] - base1);
                s[j][3] = exp2f(s[j][3] - base1);
                sum0 += s[j][0] + s[j][1];
                sum1 += s[j][2] + s[j][3];
            }
            l0 = l0 * a0 + sum0;
            l1 = l1 * a1 + sum1;
#pragma unroll
            for (int n = 0; n < NB; n++) {
                o[n][0] *= a0;
                o[n][1] *= a0;
                o[n][2] *= a1;
                o[n][3] *= a1;
            }
            // O += P·V, 16 positions a step.
#pragma unroll
            for (int kk = 0; kk < AM_BN / 16; kk++) {
                const am_u32 a[4] = {am_pack_h2(s[2 * kk][0], s[2 * kk][1]), am_pack_h2(s[2 * kk][2], s[2 * kk][3]),
                                     am_pack_h2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                     am_pack_h2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int jd = 0; jd < D / 16; jd++) {
                    am_u32 b[4];
                    am_ldmatrix_x4_trans(b, Vs + (16 * kk + ((lane >> 3) & 1) * 8 + (lane & 7)) * LD + 16 * jd + (lane >> 4) * 8);
                    am_mma16816(o[2 * jd], a, b);
                    am_mma16816(o[2 * jd + 1], a, b + 2);
                }
            }
        }
        __syncthreads(); // the tile is consumed before the next iteration refills its buffer
    }

    // Row sums: a quad's partial sums.
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
        l0 += __shfl_xor_sync(0xffffffffu, l0, off);
        l1 += __shfl_xor_sync(0xffffffffu, l1, off);
    }
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    const bool ok0 = r0 < nRows, ok1 = r0 + 8 < nRows;
    const long long row0 = ok0 ? (long long)(t0 + r0 / hb) * p.nHeads + h0 + r0 % hb : 0;
    const long long row1 = ok1 ? (long long)(t0 + (r0 + 8) / hb) * p.nHeads + h0 + (r0 + 8) % hb : 0;
#pragma unroll
    for (int n = 0; n < NB; n++) {
        const int d = 8 * n + 2 * c;
        o[n][0] *= inv0;
        o[n][1] *= inv0;
        o[n][2] *= inv1;
        o[n][3] *= inv1;
        if (ok0)
            *(float2 *)(p.out + row0 * D + d) = make_float2(o[n][0], o[n][1]);
        if (ok1)
            *(float2 *)(p.out + row1 * D + d) = make_float2(o[n][2], o[n][3]);
    }
    if (p.q8) {
        // A Q8_1 block is 32 values of a row: n8 blocks 4b..4b+3, held by
        // the row's quad (8 values a thread). The expressions are
        // q8_1_block's, so the blocks equal attn_f16's. Every lane
        // shuffles; only the stores are guarded.
#pragma unroll
        for (int blk = 0; blk < D / 32; blk++) {
#pragma unroll
            for (int half = 0; half < 2; half++) {
                float amax = 0.0f;
#pragma unroll
                for (int n = 4 * blk; n < 4 * blk + 4; n++)
                    amax = fmaxf(amax, fmaxf(fabsf(o[n][2 * half]), fabsf(o[n][2 * half + 1])));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
                const float dq = amax / 127.0f;
                const float id = dq != 0.f ? 1.0f / dq : 0.f;
                const bool ok = half ? ok1 : ok0;
                const long long base = (half ? row1 : row0) * D;
                int sum = 0;
#pragma unroll
                for (int n = 4 * blk; n < 4 * blk + 4; n++) {
                    int qa = max(-128, min(127, (int)roundf(o[n][2 * half] * id)));
                    int qb = max(-128, min(127, (int)roundf(o[n][2 * half + 1] * id)));
                    sum += qa + qb;
                    if (ok) {
                        const int d = 8 * n + 2 * c;
                        p.q8[base + d] = (signed char)qa;
                        p.q8[base + d + 1] = (signed char)qb;
                    }
                }
                sum += __shfl_xor_sync(0xffffffffu, sum, 1);
                sum += __shfl_xor_sync(0xffffffffu, sum, 2);
                if (ok && c == 0)
                    p.q8ds[(base + 32 * blk) / 32] = make_float2(dq, (float)sum * dq);
            }
        }
    }
}

// Head size 128 on CC 9.0: 168 registers (its natural count is 170) let 3
// blocks share a multiprocessor, which 69632 bytes of shared memory each
// allow there; on CC 8.x the same cap spills, and the shared memory of
// sm_86/89 holds one block anyway.
#if __CUDA_ARCH__ >= 900
#define AM_MIN_BLOCKS_128 3
#else
#define AM_MIN_BLOCKS_128 1
#endif

extern "C" __global__ void __launch_bounds__(AM_THREADS) attn_mma_d64(const AttnParams p) { PDL_ENTRY(); attn_mma<64>(p); }
extern "C" __global__ void __launch_bounds__(AM_THREADS, AM_MIN_BLOCKS_128) attn_mma_d128(const AttnParams p) { PDL_ENTRY(); attn_mma<128>(p); }

// ---------------------------------------------------------------- paged decode
//
// attn_dec_<type>_d<hs> (type f16 or q8_0, hs 32, 64, 128, 256): decode over
// the paged cache: nTok query rows, each token t its own sequence seq[t] and
// position pos[t], attending to positions 0..pos[t] of its sequence through
// the block tables (see "cache rows" above), split-K as attn_dec: grid
// (nTok, nKV * ceil(group/16), nsplit).
//
// A block takes one token and up to 16 query heads of one KV group (the
// group's heads share each K and V row it reads: GQA), so each row is read
// once per block, not once per head. Its warps (1, 2, 4 or 8: the launcher's
// fit) walk the split's positions in runs of 16 (warp w: runs w, w+nwarps,
// ...); a run lies in one block of the table (the block size is a multiple
// of 16, a split's chunk of 64), so it is 16 consecutive cells. A warp
// streams its runs through `stages` shared-memory buffers with cp.async
// (the next runs load while it computes one; zero-filled past the token's
// position) and computes on the tensor cores as attn_mma does: S = Q·Kᵀ for
// its 16 heads (rows, zero past the group's) by 16 positions, an online
// softmax in registers (base 2), O += P·V with P rounded to f16. No barrier
// until the warps' states merge through shared memory at the end. A row
// whose positions one split holds is written out there (and its Q8_1
// form); one that spans several has each write its unnormalised O and (max,
// sum), and the last of them to finish (a counter a block column, count)
// merges them as attn_combine does: no launch of its own.
//
// f16 rows load straight into the [16][hs+8] tiles ldmatrix reads. q8_0
// rows (hs/32 blocks of 34 bytes a head, 2-byte aligned at best) load raw,
// in the widest copies their alignment allows (hs 64: 4 bytes, 128: 8, 256:
// 16; hs 32: 2, synchronous), and each warp dequantizes its run into f16
// tiles: f16(d*q), the value llama.cpp's conversion of a q8_0 cache to f16
// gives, before the same mma path. Numerics: Q is rounded to f16 for both
// types; scores accumulate in f32 on the tensor cores.
//
// int8 keys (attn_dec_q8_0i_d<hs>: a q8_0 cache whose KV group has at most
// 8 query heads, CC 8.0 and later). Dequantizing a run's keys was most of
// the q8_0 kernel's instructions, and its registers held it to two warps a
// scheduler. This variant quantizes Q to Q8_0 once a block (per head and
// block of 32, as ggml's quantize_row_q8_0_ref and the CPU's q8_0 flash
// attention), and takes Sᵀ = K·Qᵀ on the integer tensor cores straight from
// the staged rows (m16n8k32: 16 positions by 8 heads, one Q8_0 block a
// product, exact), each block's sums times its key's and query's scales in
// f32. The heads being the products' columns, O is kept transposed (Oᵀ +=
// Vᵀ·Pᵀ, V dequantized to f16 as above, P's fragments transposed with
// movmatrix): half the accumulators of 16 rows, of which a group of 8 or
// fewer would use half. The scores then match the CPU's to f32 rounding.
//
// With rot > 0 (a q8_0 cache, which holds its values rotated by a
// Walsh-Hadamard transform: ops.KVRotation) the merged rows are rotated
// back, in chunks of rot, before they and their Q8_1 form are written: the
// rows go to shared memory (warp 0's O), then each warp rotates whole
// chunks in its registers (dk_rot_out, fwht_warp), so the step needs no
// fwht_f32 launch and the epilogue's Q8_1 still serves the projection.
//
// Shared memory: Q [16][hs+8] f16, then per warp a region of `region`
// bytes: `stages` buffers of K and V runs ([16][rowStage] bytes each), for
// q8_0 followed by the dequantized K and V tiles ([16][hs+8] f16 each); at
// the end the region holds the warp's O [16][hs+8] float, m[16], l[16].
// attention.go's planDecodeKV computes the same sizes.

#define DK_RUN 16    // positions a run
#define DK_MAX_WARPS 8

struct DecKVParams {
    float *out;                // [nTok][nHeads*hs]
    float *part;               // [nsplit][nTok*nHeads][hs], when a row spans splits
    float *ml;                 // [nsplit][nTok*nHeads][2] max (natural log units) and sum
    const float *q;            // [nTok][nHeads*hs]
    const unsigned char *kc;   // paged caches [rows][rowBytes]
    const unsigned char *vc;
    const int *pos;            // [nTok]
    const int *seq;            // [nTok]
    const int *tables;         // [nSeq][maxBlocks]
    signed char *q8;           // optional: out in ats's GPU Q8_1 layout as well
    float2 *q8ds;
    int *count;                // [nTok][gridDim.y] arrivals of the splits, zero between launches
    float scale;
    int nTok, nHeads, nKV;
    int maxBlocks, blockShift;
    int chunk, nsplit;         // chunk % 64 == 0
    int rowBytes;              // bytes of a cache row
    int stages;                // 1..4 buffers a warp
    int region;                // shared bytes a warp
    int rot;                   // attn_dec_kv: rotate each head's output back in chunks of rot (0: none)
    long long q8plane;         // 0, or where q8's second plane starts (q8_1_block)
};

// dk_rot_out writes the block's hb output rows of D values, held in shared
// memory at O (row r at O + r*ld), rotated back in chunks of rot (a q8_0
// cache holds its values rotated, so the rows are rotated too), to out
// (rows of D from row0) and, when q8 is set, in Q8_1: warp w takes chunks
// w, w + nwarps, ... of the rows in order; a chunk is whole blocks of 32,
// x[j] across the warp one of them.
__device__ __forceinline__ void dk_rot_out(float *out, signed char *q8, float2 *q8ds, long long q8plane, int rot, int D,
                                           const float *O, int ld, int hb, long long row0)
{
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nwarps = blockDim.x >> 5;
    const int nj = rot / 32, per = D / rot;
    for (int it = warp; it < hb * per; it += nwarps) {
        const int r = it / per, c0 = (it % per) * rot;
        float x[FWHT_REGS];
#pragma unroll
        for (int j = 0; j < FWHT_REGS; j++)
            x[j] = j < nj ? O[r * ld + c0 + 32 * j + lane] : 0.0f;
        fwht_warp(x, nj);
        const long long at = (row0 + r) * D + c0 + lane;
#pragma unroll
        for (int j = 0; j < FWHT_REGS; j++) {
            if (j >= nj)
                break;
            out[at + 32 * j] = x[j];
            if (q8)
                q8_1_block(x[j], q8 + at + 32 * j, q8ds + (at + 32 * j) / 32, q8plane);
        }
    }
}

// dk_copy copies G bytes global -> shared (G = 16, 8 or 4 with cp.async on
// CC 8.0+, a plain copy before; G = 2 always plain), zeros when !valid (src
// is then not read).
template <int G>
__device__ __forceinline__ void dk_copy(void *dst, const void *src, bool valid)
{
#if __CUDA_ARCH__ >= 800
    if (G == 16) {
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(am_smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
        return;
    }
    if (G == 8 || G == 4) {
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(am_smem_addr(dst)), "l"(src), "n"(G),
                     "r"(valid ? G : 0));
        return;
    }
#endif
    if (G == 16)
        *(uint4 *)dst = valid ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
    else if (G == 8)
        *(uint2 *)dst = valid ? *(const uint2 *)src : make_uint2(0, 0);
    else if (G == 4)
        *(unsigned int *)dst = valid ? *(const unsigned int *)src : 0u;
    else
        *(unsigned short *)dst = valid ? *(const unsigned short *)src : (unsigned short)0;
}

// dk_wait waits until at most n of this thread's cp.async groups are pending.
__device__ __forceinline__ void dk_wait(int n)
{
#if __CUDA_ARCH__ >= 800
    switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 3;" ::: "memory"); break;
    }
#endif
}

// f16x8_biased turns eight bytes (xl: 0..3, xh: 4..7, low byte first),
// each a value plus a bias b, into eight f16 d*(byte - b), packed in pairs:
// a byte in the low mantissa bits of 1024.0 is 1024 + byte, and
// subtracting bias (1024 + b in both halves) leaves the value exactly; the
// f16 product with dd (f16 d in both halves) is rounded once.
__device__ __forceinline__ uint4 f16x8_biased(unsigned int xl, unsigned int xh, unsigned int bias, unsigned int dd)
{
    unsigned int h[4] = {__byte_perm(xl, 0x64646464u, 0x4140), __byte_perm(xl, 0x64646464u, 0x4342),
                         __byte_perm(xh, 0x64646464u, 0x4140), __byte_perm(xh, 0x64646464u, 0x4342)};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(h[i]) : "r"(bias));
        asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(h[i]) : "r"(dd));
    }
    return make_uint4(h[0], h[1], h[2], h[3]);
}

// q8_0_dequant8 turns eight int8 values (lo: q0..q3, hi: q4..q7, low byte
// first) and a block scale dd (f16 d in both halves) into eight f16
// f16(d*q), packed in pairs. Exact: (q ^ 0x80) in the low mantissa bits of
// 1024.0 is 1024 + q + 128, and subtracting 1152 leaves q exactly; the f16
// product, rounded once to nearest (subnormals kept), is f16(float(q)*d).
__device__ __forceinline__ uint4 q8_0_dequant8(unsigned int lo, unsigned int hi, unsigned int dd)
{
    return f16x8_biased(lo ^ 0x80808080u, hi ^ 0x80808080u, 0x64806480u, dd); // 1152, 1152
}

// q8_0_load8 reads values 8j..8j+7 of the Q8_0 block at b (2-byte aligned)
// and its scale, dequantized as q8_0_dequant8.
__device__ __forceinline__ uint4 q8_0_load8(const unsigned char *b, int j)
{
    const unsigned short *w = (const unsigned short *)(b + 2 + 8 * j);
    const unsigned int d = *(const unsigned short *)b;
    const unsigned int lo = (unsigned int)w[0] | ((unsigned int)w[1] << 16);
    const unsigned int hi = (unsigned int)w[2] | ((unsigned int)w[3] << 16);
    return q8_0_dequant8(lo, hi, d | (d << 16));
}

// q4_0_dequant8 turns eight 4-bit values (nibble `shift` (0 or 4) of the
// bytes of lo: q0..q3 and hi: q4..q7, low byte first) and a block scale dd
// (f16 d in both halves) into eight f16 f16(d*(q-8)), packed in pairs. As
// q8_0_dequant8: q in the low mantissa bits of 1024.0 is 1024 + q, and
// subtracting 1032 leaves q - 8 exactly; the product is rounded once.
__device__ __forceinline__ uint4 q4_0_dequant8(unsigned int lo, unsigned int hi, int shift, unsigned int dd)
{
    return f16x8_biased((lo >> shift) & 0x0f0f0f0fu, (hi >> shift) & 0x0f0f0f0fu, 0x64086408u, dd); // 1032, 1032
}

// q4_0_load8 reads values 8j..8j+7 of the Q4_0 block at b (2-byte aligned)
// and its scale, dequantized as q4_0_dequant8: values 0..15 are the low
// nibbles of the 16 bytes, 16..31 the high ones.
__device__ __forceinline__ uint4 q4_0_load8(const unsigned char *b, int j)
{
    const unsigned short *w = (const unsigned short *)(b + 2 + 8 * (j & 1));
    const unsigned int d = *(const unsigned short *)b;
    const unsigned int lo = (unsigned int)w[0] | ((unsigned int)w[1] << 16);
    const unsigned int hi = (unsigned int)w[2] | ((unsigned int)w[3] << 16);
    return q4_0_dequant8(lo, hi, 4 * (j >> 1), d | (d << 16));
}

// dk_dequant_block_q4 turns Q4_0 block b of a staged row (r: the row's
// first word, 2-byte aligned blocks of 18 bytes from there) into 32 f16 at
// t + 32b, as dk_dequant_block does Q8_0: the 5 aligned words holding its
// bytes, then pairs of bytes, whose low nibbles are values 2k, 2k+1 and
// high ones 16+2k, 17+2k.
__device__ __forceinline__ void dk_dequant_block_q4(const unsigned int *r, unsigned short *t, int b)
{
    const int wb = 18 * b / 4, o = 18 * b % 4; // block b's first word; its offset in it, 0 or 2
    unsigned int w[5];
#pragma unroll
    for (int i = 0; i < 5; i++)
        w[i] = r[wb + i];
    const unsigned int d = o ? (w[0] >> 16) : (w[0] & 0xffffu);
    const unsigned int dd = d | (d << 16);
    unsigned int h[16];
#pragma unroll
    for (int k = 0; k < 8; k++) {
        const int at = o + 2 + 2 * k; // bytes 2k, 2k+1 of the values: half of one word
        const unsigned int x = __byte_perm(w[at / 4], 0, (at % 4) ? 0x4342 : 0x4140);
        h[k] = (x & 0x000f000fu) | 0x64006400u;
        h[k + 8] = ((x >> 4) & 0x000f000fu) | 0x64006400u;
    }
#pragma unroll
    for (int k = 0; k < 16; k++) {
        asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(h[k]) : "r"(0x64086408u));
        asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(h[k]) : "r"(dd));
    }
#pragma unroll
    for (int q = 0; q < 4; q++)
        *(uint4 *)(t + 32 * b + 8 * q) = make_uint4(h[4 * q], h[4 * q + 1], h[4 * q + 2], h[4 * q + 3]);
}

// dk_dequant_block turns Q8_0 block b of a staged row (r: the row's first
// word, 2-byte aligned blocks of 34 bytes from there) into 32 f16 at t +
// 32b: the 9 aligned words holding its bytes, then its 16 pairs. b is a
// constant where the callers unroll, and so are the word and half each
// pair takes.
__device__ __forceinline__ void dk_dequant_block(const unsigned int *r, unsigned short *t, int b)
{
    const int wb = 34 * b / 4, o = 34 * b % 4; // block b's first word; its offset in it, 0 or 2
    unsigned int w[9];
#pragma unroll
    for (int i = 0; i < 9; i++)
        w[i] = r[wb + i] ^ 0x80808080u;
    const unsigned int d = (o ? (w[0] >> 16) : (w[0] & 0xffffu)) ^ 0x8080u; // undo the flip
    const unsigned int dd = d | (d << 16);
    unsigned int h[16];
#pragma unroll
    for (int k = 0; k < 16; k++) {
        // Pair k (values 2k, 2k+1) is bytes o+2+2k and o+3+2k: half of one word.
        const int at = o + 2 + 2 * k;
        h[k] = __byte_perm(w[at / 4], 0x64646464u, (at % 4) ? 0x4342 : 0x4140);
        asm("sub.rn.f16x2 %0, %0, %1;" : "+r"(h[k]) : "r"(0x64806480u));
        asm("mul.rn.f16x2 %0, %0, %1;" : "+r"(h[k]) : "r"(dd));
    }
#pragma unroll
    for (int q = 0; q < 4; q++)
        *(uint4 *)(t + 32 * b + 8 * q) = make_uint4(h[4 * q], h[4 * q + 1], h[4 * q + 2], h[4 * q + 3]);
}

// dk_dequant turns a buffer of q8_0 (KVT 1) or q4_0 (KVT 2) rows (16 K
// rows, then 16 V rows, ROW bytes apart, ROW/4 odd) into f16 tiles (16 K rows, then 16 V rows, of
// D+8 halves): lane l takes row l%16 of K (l < 16) or V, block by block
// (dk_dequant_block). All lanes read the same word of 32 rows that start
// in 32 different banks, and write 16 bytes of 8 rows that start 4 banks
// apart: no conflicts.
template <int D, int ROW, int KVT>
__device__ __forceinline__ void dk_dequant(const unsigned char *raw, unsigned short *tile, int lane)
{
    constexpr int LD = D + 8;
    const unsigned int *r = (const unsigned int *)(raw + (lane >> 4) * DK_RUN * ROW + (lane & 15) * ROW);
    unsigned short *t = tile + ((lane >> 4) * DK_RUN + (lane & 15)) * LD;
#pragma unroll
    for (int b = 0; b < D / 32; b++) {
        if (KVT == 2)
            dk_dequant_block_q4(r, t, b);
        else
            dk_dequant_block(r, t, b);
    }
}

// dk_dequant_v turns the 16 q8_0 V rows of a buffer (ROW bytes apart, raw
// word-aligned) into an f16 tile of D+8 halves a row, as dk_dequant, on
// all 32 lanes: lane l takes row l%16 and half l/16 of its blocks (heads
// of 64: lanes 0-15 a whole row each). The two halves' reads (17 words
// apart at heads of 128) fall in distinct banks; rows staged 16-byte
// aligned (the int8 kernel's) meet in pairs, r and r+8.
template <int D, int ROW>
__device__ __forceinline__ void dk_dequant_v(const unsigned char *raw, unsigned short *tile, int lane)
{
    constexpr int LD = D + 8;
    constexpr int BPH = D >= 128 ? D / 64 : D / 32; // blocks a lane
    if (D < 128 && lane >= 16)
        return;
    const int h = D >= 128 ? lane >> 4 : 0;
    // A half's first block starts on a word: 34*BPH bytes, BPH even.
    const unsigned int *r = (const unsigned int *)(raw + (lane & 15) * ROW + h * 34 * BPH);
    unsigned short *t = tile + (lane & 15) * LD + h * 32 * BPH;
#pragma unroll
    for (int b = 0; b < BPH; b++)
        dk_dequant_block(r, t, b);
}

// dk_imma: c += a (16x32 s8, row) * b (32x8 s8, col), s32 accumulators
// (CC 8.0 and later; the int8 kernels are not launched before).
__device__ __forceinline__ void dk_imma(int *c, const am_u32 *a, const am_u32 *b)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// dk_trans transposes the 8x8 f16 matrix the warp holds in the mma
// fragment layout (lane 4g+c: row g, columns 2c, 2c+1).
__device__ __forceinline__ am_u32 dk_trans(am_u32 x)
{
    am_u32 y = x;
#if __CUDA_ARCH__ >= 800
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"(y) : "r"(x));
#endif
    return y;
}

// dk_ld4 reads 4 bytes at p, which is 4-byte aligned when A4, else 2.
template <bool A4>
__device__ __forceinline__ am_u32 dk_ld4(const unsigned char *p)
{
    if (A4)
        return *(const am_u32 *)p;
    const am_u32 *w = (const am_u32 *)(p - 2);
    return __byte_perm(w[0], w[1], 0x5432);
}

// KVT: 0 f16, 1 q8_0, 2 q4_0. I8 (q8_0, a group of at most 8 heads, CC 8.0 and
// later): the int8 path below ("int8 keys").
template <int D, int KVT, bool I8>
__device__ __forceinline__ void attn_dec_kv(const DecKVParams &p)
{
    constexpr int LD = D + 8;                                  // halves a tile row
    constexpr int SEG = KVT == 0 ? 2 * D : D / 32 * (KVT == 1 ? 34 : 18); // bytes of a head's row
    // A staged q8_0 row is an odd number of words: the 16 K and 16 V rows
    // of a buffer then start in 32 different banks (dk_dequant).
    constexpr int ROWW = (SEG + 3) / 4; // words of a q8_0 row, rounded up
    // The int8 path copies a head's q8_0 row 16 bytes at a time, as the
    // f16 rows are, from the 16-byte boundary at or before it (its cache
    // rows are multiples of 16 bytes: DecodeKVInt8; a head's row starts
    // SEG*kvh % 16 bytes past a boundary): WSEG bytes, the head's own from
    // byte `shift` of the staged row. Copies of 4 or 8 bytes go through L1
    // (cp.async.ca), whose share of the multiprocessor the shared memory
    // of 12 warps leaves small; copies of 16 go around it.
    constexpr int SALIGN = SEG % 16 == 0 ? 16 : SEG % 8 == 0 ? 8 : 4;   // alignment of a head's row
    constexpr int WSEG = I8 ? (SEG + 16 - SALIGN + 15) / 16 * 16 : SEG; // bytes copied a row
    constexpr int ROW = KVT == 0 ? 2 * LD : I8 ? WSEG : 4 * (ROWW | 1);  // bytes a staged row
    constexpr int NH = I8 ? 8 : 16;                                     // query heads a block at most
    // Bytes a copy: 16 for f16 rows and the int8 path; other q8_0 rows 4
    // (2 at heads of 32).
    constexpr int GRAN = KVT == 0 || I8 ? 16 : (SEG % 4 == 0 ? 4 : 2);
    constexpr int NCH = WSEG / GRAN; // copies a row
    constexpr int STAGE = 2 * DK_RUN * ROW;                    // a buffer: K run, then V run
    constexpr bool QREG = D <= 128;                            // Q fragments in registers
    extern __shared__ __align__(16) unsigned char dk_smem[];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int g = lane >> 2, c = lane & 3;
    const int nwarps = blockDim.x >> 5;
    const int t = blockIdx.x;
    const int group = p.nHeads / p.nKV;
    const int subs = (group + NH - 1) / NH;
    const int kvh = blockIdx.y / subs;
    const int h0 = kvh * group + (blockIdx.y % subs) * NH;
    const int hb = min(NH, (kvh + 1) * group - h0); // heads of this block
    const int split = blockIdx.z;
    const int qpos = p.pos[t];
    const int sq = p.seq[t];
    // The row's positions spread over all the splits: chunks of a multiple
    // of 64 (runs never cross a cache block), at most p.chunk (which covers
    // the whole cache), so that a short sequence in a large cache walks as
    // few positions per block as it would in a small one. The launch shape
    // does not change, so a captured graph replays at any length.
    const int rowChunk = min(p.chunk, max(64, ((qpos + p.nsplit) / p.nsplit + 63) & ~63));
    const long long begin = (long long)split * rowChunk;
    const int end = (int)min(begin + rowChunk, (long long)qpos + 1);
    const long long row0 = (long long)t * p.nHeads + h0; // output row of head h0
    // The splits that hold positions of this row: with one, it writes the
    // output itself; with several, the last of them to finish merges.
    const int nact = (qpos + rowChunk) / rowChunk;

    if (begin >= end)
        return; // an empty split: nothing to write, not counted

    unsigned char *wbase = dk_smem + 32 * LD + warp * p.region;
    const int S = p.stages;
    const int total = (int)((end - begin + DK_RUN - 1) / DK_RUN); // runs of the split
    const int my = total > warp ? (total - warp + nwarps - 1) / nwarps : 0;
    const int shift = I8 ? kvh * SEG % 16 : 0;
    const long long kvOff = (long long)kvh * SEG - shift;

    // A run's copies: lane l takes copies x = l + 32k of the 16 rows'
    // NCH each (row x / NCH, chunk x % NCH). A warp spends its time issuing
    // instructions one after another (a scheduler holds one or two warps),
    // so the copies' offsets are worked out once: each copy of a whole run
    // is then an add and a cp.async. f16 rows are whole numbers of a
    // warp's copies (32 % NCH == 0): row and offsets step by 32/NCH rows a
    // copy. q8_0 rows are 17 copies (9 on the int8 path at heads of 128):
    // copy k's source and staging offsets
    // are packed in one register (source << 13 | staging; the source fits
    // in 19 bits while a cache row is under 32 KiB, else the general loop).
    constexpr int NC = (DK_RUN * NCH + 31) / 32; // copies a lane, the last maybe partial
    constexpr bool LINEAR = 32 % NCH == 0;
    const bool packed = LINEAR || p.rowBytes < 32768;
    unsigned int code[LINEAR ? 1 : NC];
#pragma unroll
    for (int k = 0; k < (LINEAR ? 1 : NC); k++) {
        const int x = lane + 32 * k, j = x / NCH, ch = x % NCH;
        code[k] = ((unsigned int)j * (unsigned int)p.rowBytes + ch * GRAN) << 13 | (unsigned int)(j * ROW + ch * GRAN);
    }
    const int lrow = lane / NCH, lch = lane % NCH; // LINEAR: copy k is row lrow + k*32/NCH
    const long long lsrc = (long long)lrow * p.rowBytes + lch * GRAN;
    const int ldst = lrow * ROW + lch * GRAN;

    // The cache-table entry of run i's block, read a run ahead: load uses
    // run i's, read while run i-1 was computed, and reads run i+1's, so a
    // warp never waits on the table before queueing its copies.
    auto entry = [&](int i) -> int {
        const int start = (int)begin + DK_RUN * (warp + nwarps * i);
        return p.tables && i < my ? p.tables[(long long)sq * p.maxBlocks + (start >> p.blockShift)] : 0;
    };
    int blk = entry(0);

    // load queues run i of this warp into buffer b (runs in order, each once).
    auto load = [&](int i, int b) {
        const int start = (int)begin + DK_RUN * (warp + nwarps * i);
        const long long cell = p.tables ? kv_cell_in(blk, p.blockShift, start) : start;
        blk = entry(i + 1);
        const unsigned char *sk = p.kc + cell * p.rowBytes + kvOff;
        const unsigned char *sv = p.vc + cell * p.rowBytes + kvOff;
        unsigned char *dk = wbase + b * STAGE, *dv = dk + DK_RUN * ROW;
        if (packed && start + DK_RUN <= end) {
            // A whole run.
#pragma unroll
            for (int k = 0; k < NC; k++) {
                if (k == NC - 1 && DK_RUN * NCH % 32 != 0 && lane >= DK_RUN * NCH % 32)
                    break;
                if (LINEAR) {
                    const long long src = lsrc + (long long)k * (32 / NCH) * p.rowBytes;
                    const int dst = ldst + k * (32 / NCH) * ROW;
                    dk_copy<GRAN>(dk + dst, sk + src, true);
                    dk_copy<GRAN>(dv + dst, sv + src, true);
                } else {
                    const unsigned int src = code[LINEAR ? 0 : k] >> 13, dst = code[LINEAR ? 0 : k] & 0x1fffu;
                    dk_copy<GRAN>(dk + dst, sk + src, true);
                    dk_copy<GRAN>(dv + dst, sv + src, true);
                }
            }
            return;
        }
        for (int x = lane; x < DK_RUN * NCH; x += 32) {
            const int j = x / NCH, ch = x % NCH;
            const bool valid = start + j < end;
            const long long off = (valid ? (long long)j * p.rowBytes : 0) + ch * GRAN;
            dk_copy<GRAN>(dk + j * ROW + ch * GRAN, sk + off, valid);
            dk_copy<GRAN>(dv + j * ROW + ch * GRAN, sv + off, valid);
        }
    };

    const float sl2 = p.scale * 1.4426950408889634f;
    // O: 16 heads by D values as D/8 n8 fragments, or for I8 its transpose,
    // D values by 8 heads as D/16 m16 fragments.
    constexpr int NO = I8 ? D / 16 : D / 8;
    float o[NO][4];
#pragma unroll
    for (int n = 0; n < NO; n++)
        o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.0f, l1 = 0.0f;

    for (int i = 0; i < S - 1; i++) {
        if (i < my)
            load(i, i);
        am_cp_commit();
    }
    // Q rounded to f16, rows past the block's heads zero: after the first
    // runs' loads are queued, so that they wait on the cache together.
    // The int8 path quantizes it instead (see "int8 keys").
    unsigned short *Qs = (unsigned short *)dk_smem;
    signed char *Qi = (signed char *)dk_smem;     // I8: [8][D] int8
    float *Qd = (float *)(dk_smem + 8 * D);        // I8: [8][D/32] scales times sl2
    if (!I8) {
        for (int i = tid; i < 16 * (D / 4); i += blockDim.x) {
            const int r = i / (D / 4), d = (i % (D / 4)) * 4;
            uint2 v = make_uint2(0, 0);
            if (r < hb) {
                const float4 f = *(const float4 *)(p.q + (row0 + r) * D + d);
                v = make_uint2(am_pack_h2(f.x, f.y), am_pack_h2(f.z, f.w));
            }
            *(uint2 *)(Qs + r * LD + d) = v;
        }
    } else {
        for (int i = warp; i < 8 * (D / 32); i += nwarps) {
            const int r = i / (D / 32), b = i % (D / 32);
            const float x = r < hb ? p.q[(row0 + r) * D + 32 * b + lane] : 0.0f;
            float amax = fabsf(x);
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float d = amax / 127.0f;
            const float id = d != 0.0f ? 1.0f / d : 0.0f;
            Qi[r * D + 32 * b + lane] = (signed char)max(-128, min(127, (int)roundf(__fmul_rn(x, id))));
            if (lane == 0)
                Qd[r * (D / 32) + b] = h2f(f2h(d)) * sl2;
        }
    }
    __syncthreads();

    am_u32 qf[QREG && !I8 ? D / 16 : 1][4];
    if (QREG && !I8) {
#pragma unroll
        for (int kk = 0; kk < (QREG && !I8 ? D / 16 : 1); kk++)
            am_ldmatrix_x4(qf[kk], Qs + (lane & 15) * LD + 16 * kk + (lane >> 4) * 8);
    }
    // I8: Q's B fragments (k: 32 values of a block, n: head g) and the
    // scales of heads 2c and 2c+1, a pair a block.
    constexpr int NB = I8 ? D / 32 : 1;
    am_u32 qb[NB][2];
    float qd[NB][2];
    if (I8) {
#pragma unroll
        for (int b = 0; b < NB; b++) {
            qb[b][0] = *(const am_u32 *)(Qi + g * D + 32 * b + 4 * c);
            qb[b][1] = *(const am_u32 *)(Qi + g * D + 32 * b + 16 + 4 * c);
            qd[b][0] = Qd[(2 * c) * (D / 32) + b];
            qd[b][1] = Qd[(2 * c + 1) * (D / 32) + b];
        }
    }

    // The buffers of the run to load (i + S - 1) and of run i: counters,
    // not (i + S - 1) % S, a division by a launch parameter every run.
    int bl = S - 1, bc = 0;
    for (int i = 0; i < my; i++, bl = bl + 1 == S ? 0 : bl + 1, bc = bc + 1 == S ? 0 : bc + 1) {
        if (i + S - 1 < my)
            load(i + S - 1, bl);
        am_cp_commit();
        dk_wait(S - 1); // run i's group is complete
        __syncwarp();

        if (I8) {
            // int8 keys: Sᵀ = K·Qᵀ on the integer tensor cores, a block of
            // 32 values a product (A: K's raw int8, rows g and g+8 of the
            // run; B: Q's int8), each block's integer sums scaled by its
            // key's and query's scales; Sᵀ holds positions g, g+8 by heads
            // 2c, 2c+1. Then Oᵀ += Vᵀ·Pᵀ, V dequantized to f16 as before,
            // Pᵀ the scores' f16 fragments transposed (movmatrix).
            const unsigned char *kr = wbase + bc * STAGE + shift;
            unsigned short *tv = (unsigned short *)(wbase + S * STAGE);
            dk_dequant_v<D, ROW>(kr + DK_RUN * ROW, tv, lane);
            const unsigned char *k0 = kr + g * ROW, *k1 = k0 + 8 * ROW;
            float st[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int b = 0; b < NB; b++) {
                // Block b's values start at byte 34b+2 of the row (kr's
                // shift is a multiple of 4): word-aligned for odd b.
                am_u32 a[4];
                const int q0 = 34 * b + 2 + 4 * c;
                if (b & 1) {
                    a[0] = dk_ld4<true>(k0 + q0), a[1] = dk_ld4<true>(k1 + q0);
                    a[2] = dk_ld4<true>(k0 + q0 + 16), a[3] = dk_ld4<true>(k1 + q0 + 16);
                } else {
                    a[0] = dk_ld4<false>(k0 + q0), a[1] = dk_ld4<false>(k1 + q0);
                    a[2] = dk_ld4<false>(k0 + q0 + 16), a[3] = dk_ld4<false>(k1 + q0 + 16);
                }
                int acc[4] = {0, 0, 0, 0};
                dk_imma(acc, a, qb[b]);
                const float d0 = h2f(*(const unsigned short *)(k0 + 34 * b));
                const float d1 = h2f(*(const unsigned short *)(k1 + 34 * b));
                st[0] = fmaf((float)acc[0], d0 * qd[b][0], st[0]);
                st[1] = fmaf((float)acc[1], d0 * qd[b][1], st[1]);
                st[2] = fmaf((float)acc[2], d1 * qd[b][0], st[2]);
                st[3] = fmaf((float)acc[3], d1 * qd[b][1], st[3]);
            }
            const int start = (int)begin + DK_RUN * (warp + nwarps * i);
            if (start + g >= end)
                st[0] = st[1] = -INFINITY;
            if (start + g + 8 >= end)
                st[2] = st[3] = -INFINITY;
            // Maxima of heads 2c, 2c+1 over the run's positions (lanes c, c+4, ...).
            float mx0 = fmaxf(st[0], st[2]), mx1 = fmaxf(st[1], st[3]);
#pragma unroll
            for (int off = 4; off <= 16; off <<= 1) {
                mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
                mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
            }
            // The run's first position is valid: the maxima are finite.
            const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
            const float a0 = exp2f(m0 - mn0), a1 = exp2f(m1 - mn1);
            m0 = mn0;
            m1 = mn1;
            st[0] = exp2f(st[0] - mn0);
            st[1] = exp2f(st[1] - mn1);
            st[2] = exp2f(st[2] - mn0);
            st[3] = exp2f(st[3] - mn1);
            l0 = l0 * a0 + (st[0] + st[2]);
            l1 = l1 * a1 + (st[1] + st[3]);
            if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
                for (int n = 0; n < NO; n++) {
                    o[n][0] *= a0;
                    o[n][1] *= a1;
                    o[n][2] *= a0;
                    o[n][3] *= a1;
                }
            }
            const am_u32 pb[2] = {dk_trans(am_pack_h2(st[0], st[1])), dk_trans(am_pack_h2(st[2], st[3]))};
            __syncwarp(); // the V tile is written
#pragma unroll
            for (int jd = 0; jd < D / 16; jd++) {
                am_u32 av[4];
                am_ldmatrix_x4_trans(av, tv + ((lane & 7) + ((lane >> 4) & 1) * 8) * LD + 16 * jd + ((lane >> 3) & 1) * 8);
                am_mma16816(o[jd % NO], av, pb);
            }
            __syncwarp(); // the buffer and tile are read before the next loads land in them
            continue;
        }

        const unsigned short *Ks, *Vs;
        if (KVT == 0) {
            Ks = (const unsigned short *)(wbase + bc * STAGE);
            Vs = Ks + DK_RUN * LD;
        } else {
            unsigned short *tk = (unsigned short *)(wbase + S * STAGE);
            dk_dequant<D, ROW, KVT>(wbase + bc * STAGE, tk, lane);
            __syncwarp();
            Ks = tk;
            Vs = tk + DK_RUN * LD;
        }

        // S = Q·Kᵀ: rows g, g+8; positions 2c, 2c+1 of each n8 block.
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            am_u32 b[4], qa[4];
            am_ldmatrix_x4(b, Ks + ((lane & 7) + ((lane >> 4) << 3)) * LD + 16 * kk + ((lane >> 3) & 1) * 8);
            if (QREG) {
                qa[0] = qf[QREG ? kk : 0][0], qa[1] = qf[QREG ? kk : 0][1];
                qa[2] = qf[QREG ? kk : 0][2], qa[3] = qf[QREG ? kk : 0][3];
            } else {
                am_ldmatrix_x4(qa, Qs + (lane & 15) * LD + 16 * kk + (lane >> 4) * 8);
            }
            am_mma16816(s[0], qa, b);
            am_mma16816(s[1], qa, b + 2);
        }
        const int start = (int)begin + DK_RUN * (warp + nwarps * i);
        float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            const int col = start + 8 * j + 2 * c;
            s[j][0] = col < end ? s[j][0] * sl2 : -INFINITY;
            s[j][1] = col + 1 < end ? s[j][1] * sl2 : -INFINITY;
            s[j][2] = col < end ? s[j][2] * sl2 : -INFINITY;
            s[j][3] = col + 1 < end ? s[j][3] * sl2 : -INFINITY;
            mx0 = fmaxf(mx0, fmaxf(s[j][0], s[j][1]));
            mx1 = fmaxf(mx1, fmaxf(s[j][2], s[j][3]));
        }
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, off));
            mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, off));
        }
        // The run's first position is valid: the maxima are finite.
        const float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        const float a0 = exp2f(m0 - mn0), a1 = exp2f(m1 - mn1); // 0 on the first run
        m0 = mn0;
        m1 = mn1;
        float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
        for (int j = 0; j < 2; j++) {
            s[j][0] = exp2f(s[j][0] - mn0);
            s[j][1] = exp2f(s[j][1] - mn0);
            s[j][2] = exp2f(s[j][2] - mn1);
            s[j][3] = exp2f(s[j][3] - mn1);
            sum0 += s[j][0] + s[j][1];
            sum1 += s[j][2] + s[j][3];
        }
        l0 = l0 * a0 + sum0;
        l1 = l1 * a1 + sum1;
        // Deep in a row the maxima seldom move (a0 = a1 = 1 exactly): the
        // warp skips the rescale, a tenth of a run's instructions.
        if (__any_sync(0xffffffffu, a0 != 1.0f || a1 != 1.0f)) {
#pragma unroll
            for (int n = 0; n < D / 8; n++) {
                o[n][0] *= a0;
                o[n][1] *= a0;
                o[n][2] *= a1;
                o[n][3] *= a1;
            }
        }
        // O += P·V over the run's 16 positions.
        const am_u32 a[4] = {am_pack_h2(s[0][0], s[0][1]), am_pack_h2(s[0][2], s[0][3]),
                             am_pack_h2(s[1][0], s[1][1]), am_pack_h2(s[1][2], s[1][3])};
#pragma unroll
        for (int jd = 0; jd < D / 16; jd++) {
            am_u32 b[4];
            am_ldmatrix_x4_trans(b, Vs + (((lane >> 3) & 1) * 8 + (lane & 7)) * LD + 16 * jd + (lane >> 4) * 8);
            am_mma16816(o[2 * jd], a, b);
            am_mma16816(o[2 * jd + 1], a, b + 2);
        }
        __syncwarp(); // the buffer and tiles are read before the next loads land in them
    }
    dk_wait(0);
    __syncwarp();

    // The warp's state into its region: O rows g, g+8 (stride hs+8 floats),
    // then m and the quad-reduced l. I8: O's rows 2c, 2c+1 (columns of Oᵀ),
    // l reduced over the lanes of a column.
    constexpr int OLD = D + 8;
    float *Mo = (float *)wbase;
    float *Mm = Mo + 16 * OLD, *Ml = Mm + 16;
    if (I8) {
#pragma unroll
        for (int off = 4; off <= 16; off <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, off);
            l1 += __shfl_xor_sync(0xffffffffu, l1, off);
        }
#pragma unroll
        for (int n = 0; n < NO; n++) {
            const int d = 16 * n + g;
            Mo[(2 * c) * OLD + d] = o[n][0];
            Mo[(2 * c + 1) * OLD + d] = o[n][1];
            Mo[(2 * c) * OLD + d + 8] = o[n][2];
            Mo[(2 * c + 1) * OLD + d + 8] = o[n][3];
        }
        if (g == 0) {
            Mm[2 * c] = m0;
            Mm[2 * c + 1] = m1;
            Ml[2 * c] = l0;
            Ml[2 * c + 1] = l1;
        }
    } else {
#pragma unroll
        for (int off = 1; off <= 2; off <<= 1) {
            l0 += __shfl_xor_sync(0xffffffffu, l0, off);
            l1 += __shfl_xor_sync(0xffffffffu, l1, off);
        }
#pragma unroll
        for (int n = 0; n < NO; n++) {
            const int d = 8 * n + 2 * c;
            *(float2 *)(Mo + g * OLD + d) = make_float2(o[n][0], o[n][1]);
            *(float2 *)(Mo + (g + 8) * OLD + d) = make_float2(o[n][2], o[n][3]);
        }
        if (c == 0) {
            Mm[g] = m0;
            Mm[g + 8] = m1;
            Ml[g] = l0;
            Ml[g + 8] = l1;
        }
    }
    __syncthreads();

    // Merge: thread e takes value d of head row r; a warp's 32 lanes are 32
    // consecutive values of one row (hs % 32 == 0): one Q8_1 block, and
    // every lane of a warp runs the same iterations.
    for (int e = tid; e < hb * D; e += blockDim.x) {
        const int r = e / D, d = e % D;
        float M = -INFINITY;
        for (int w = 0; w < nwarps; w++)
            M = fmaxf(M, ((const float *)(dk_smem + 32 * LD + w * p.region))[16 * OLD + r]);
        float L = 0.0f, acc = 0.0f;
        for (int w = 0; w < nwarps; w++) {
            const float *R = (const float *)(dk_smem + 32 * LD + w * p.region);
            const float m = R[16 * OLD + r];
            if (m != -INFINITY) {
                const float wt = exp2f(m - M);
                L += wt * R[16 * OLD + 16 + r];
                acc += wt * R[r * OLD + d];
            }
        }
        const long long row = row0 + r;
        if (nact == 1) {
            const float v = acc * (1.0f / L);
            if (p.rot) {
                // Rotated back below: into warp 0's O, in place (this thread
                // alone reads and writes value (r, d) of it).
                ((float *)(dk_smem + 32 * LD))[r * OLD + d] = v;
                continue;
            }
            p.out[row * D + d] = v;
            if (p.q8)
                q8_1_block(v, p.q8 + row * D + d, p.q8ds + (row * D + d) / 32, p.q8plane);
        } else {
            const long long prow = (long long)split * p.nTok * p.nHeads + row;
            p.part[prow * D + d] = acc;
            if (d == 0) {
                p.ml[2 * prow] = M * 0.6931471805599453f; // attn_combine's natural units
                p.ml[2 * prow + 1] = L;
            }
        }
    }
    if (nact > 1) {
        // The merge, without a launch of its own (a decode step saves one
        // a layer): the partials are made visible, then counted; the block
        // that counts last merges them as attn_combine does and leaves the
        // counter zero for the next launch (the next kernel starts after
        // this one has completed, PDL or not).
        __threadfence();
        __syncthreads(); // every thread's partials are written and fenced; the regions are read
        int *flag = (int *)dk_smem;
        int *cnt = p.count + (long long)t * gridDim.y + blockIdx.y;
        if (tid == 0)
            *flag = atomicAdd(cnt, 1) == nact - 1;
        __syncthreads();
        if (!*flag)
            return;
        __threadfence();
        // A thread sums four values of a head row over the splits, loads
        // unrolled: one block merges a KV group's rows while the rest of
        // the GPU waits, so its loads must overlap (at 16384 positions a
        // row spans 16 splits on an H200). Into warp 0's O, then written out as the
        // direct path writes (a warp a Q8_1 block), or rotated back below.
        const long long rows = (long long)p.nTok * p.nHeads;
        float *O0 = (float *)(dk_smem + 32 * LD);
        for (int e = tid; e < hb * (D / 4); e += blockDim.x) {
            const int r = e / (D / 4), d = 4 * (e % (D / 4));
            const long long row = row0 + r;
            const float2 *ml = (const float2 *)p.ml + row; // split sp's at ml[sp * rows]
            // One pass, the running maximum rescaling the sums (every
            // split's maximum is finite: it holds positions), so that a
            // batch of 16 splits' loads is one wait.
            float M = -INFINITY, L = 0.0f;
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 16
            for (int sp = 0; sp < nact; sp++) {
                const float2 m = __ldcg(ml + sp * rows);
                const float4 v = __ldcg((const float4 *)(p.part + (sp * rows + row) * D + d));
                if (m.x > M) {
                    const float sc = expf(M - m.x); // 0 for the first
                    L *= sc;
                    acc.x *= sc;
                    acc.y *= sc;
                    acc.z *= sc;
                    acc.w *= sc;
                    M = m.x;
                }
                const float wt = expf(m.x - M);
                L += m.y * wt;
                acc.x += v.x * wt;
                acc.y += v.y * wt;
                acc.z += v.z * wt;
                acc.w += v.w * wt;
            }
            const float inv = 1.0f / L;
            *(float4 *)(O0 + r * OLD + d) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
        }
        if (tid == 0)
            *cnt = 0;
        if (!p.rot) {
            __syncthreads();
            for (int e = tid; e < hb * D; e += blockDim.x) {
                const int r = e / D, d = e % D;
                const long long row = row0 + r;
                const float v = O0[r * OLD + d];
                p.out[row * D + d] = v;
                if (p.q8)
                    q8_1_block(v, p.q8 + row * D + d, p.q8ds + (row * D + d) / 32, p.q8plane);
            }
        }
    }
    if (p.rot) {
        // The block's rows, in warp 0's O (either way of merging), rotated
        // back and written: one call a kernel.
        __syncthreads();
        dk_rot_out(p.out, p.q8, p.q8ds, p.q8plane, p.rot, D, (const float *)(dk_smem + 32 * LD), OLD, hb, row0);
    }
}

// ---------------------------------------------------------------- lone-row paged decode
//
// attn_dec1_f16_e<E>: the paged f16 decode of few rows on the CUDA cores,
// attn_dec's walk (a block a query head and split, DEC_WARPS warps, lane l
// holding dims l*E.. of q, K, V and O) with its rows found through the
// tables: a run of DEC_B positions starts at a multiple of DEC_B and a cache
// block holds a multiple of 16, so a run is DEC_B consecutive cells. For
// one decode row the tensor-core kernel's 16-row tile is mostly padding,
// and its ~100 KiB of shared memory a block is the price of a long cache:
// on the H200 it took 8.9 µs a layer where this takes attn_dec's 4.7
// (Qwen3-14B, 22 positions). Splits as attn_dec_kv: the row's positions
// spread over them; one split writes out, the last of several merges.
template <int E>
__device__ void attn_dec1(const DecKVParams &p)
{
    __shared__ float So[DEC_WARPS][32 * E];
    __shared__ float Sm[DEC_WARPS], Sl[DEC_WARPS];
    __shared__ int last;
    const int hs = 32 * E;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int t = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    const int kvh = h / (p.nHeads / p.nKV);
    const long long kvw = (long long)p.nKV * hs; // halves a cache row
    const int qpos = p.pos[t], sq = p.seq[t];
    const int rowChunk = min(p.chunk, max(64, ((qpos + p.nsplit) / p.nsplit + 63) & ~63));
    const int nact = (qpos + rowChunk) / rowChunk;
    const long long begin = (long long)split * rowChunk;
    const int end = (int)min(begin + rowChunk, (long long)qpos + 1);
    if (begin >= end)
        return; // an empty split: nothing to write, not counted
    const long long row = (long long)t * p.nHeads + h, rows = (long long)p.nTok * p.nHeads;

    float q[E], o[E];
    const float *qp = p.q + row * hs + lane * E;
#pragma unroll
    for (int e = 0; e < E; e++) {
        q[e] = h2f(f2h(qp[e]));
        o[e] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const unsigned short *kb = (const unsigned short *)p.kc + kvh * hs + lane * E;
    const unsigned short *vb = (const unsigned short *)p.vc + kvh * hs + lane * E;
    for (int base = (int)begin + DEC_B * warp; base < end; base += DEC_WARPS * DEC_B) {
        const long long cell = kv_cell(p.tables, p.maxBlocks, p.blockShift, sq, base);
        DecKV<E> kr[DEC_B], vr[DEC_B];
#pragma unroll
        for (int j = 0; j < DEC_B; j++) {
            const long long c = cell + min(j, end - 1 - base);
            kr[j] = dec_load<E>(kb + c * kvw);
            vr[j] = dec_load<E>(vb + c * kvw);
        }
        float s[DEC_B];
#pragma unroll
        for (int j = 0; j < DEC_B; j++) {
            float a = 0.0f;
#pragma unroll
            for (int e = 0; e < E; e++)
                a += q[e] * dec_f<E>(kr[j], e);
            s[j] = a;
        }
#pragma unroll
        for (int off = 16; off > 0; off >>= 1)
#pragma unroll
            for (int j = 0; j < DEC_B; j++)
                s[j] += __shfl_xor_sync(0xffffffffu, s[j], off);
        float mx = m;
#pragma unroll
        for (int j = 0; j < DEC_B; j++) {
            s[j] = base + j < end ? s[j] * p.scale : -INFINITY;
            mx = fmaxf(mx, s[j]);
        }
        const float alpha = m == -INFINITY ? 0.0f : expf(m - mx);
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < DEC_B; j++) {
            s[j] = s[j] == -INFINITY ? 0.0f : expf(s[j] - mx);
            sum += s[j];
        }
        l = l * alpha + sum;
#pragma unroll
        for (int e = 0; e < E; e++) {
            float a = o[e] * alpha;
#pragma unroll
            for (int j = 0; j < DEC_B; j++)
                a += s[j] * dec_f<E>(vr[j], e);
            o[e] = a;
        }
        m = mx;
    }

#pragma unroll
    for (int e = 0; e < E; e++)
        So[warp][lane * E + e] = o[e];
    if (lane == 0) {
        Sm[warp] = m;
        Sl[warp] = l;
    }
    __syncthreads();
    float M = -INFINITY;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++)
        M = fmaxf(M, Sm[w]);
    float wt[DEC_WARPS], L = 0.0f;
#pragma unroll
    for (int w = 0; w < DEC_WARPS; w++) {
        wt[w] = Sm[w] == -INFINITY ? 0.0f : expf(Sm[w] - M);
        L += Sl[w] * wt[w];
    }
    for (int d = threadIdx.x; d < hs; d += DEC_WARPS * 32) {
        float acc = 0.0f;
#pragma unroll
        for (int w = 0; w < DEC_WARPS; w++)
            acc += So[w][d] * wt[w];
        if (nact == 1) {
            const float v = acc * (1.0f / L);
            p.out[row * hs + d] = v;
            if (p.q8)
                q8_1_block(v, p.q8 + row * hs + d, p.q8ds + (row * hs + d) / 32, p.q8plane);
        } else {
            p.part[(split * rows + row) * hs + d] = acc;
        }
    }
    if (nact == 1)
        return;
    if (threadIdx.x == 0) {
        p.ml[2 * (split * rows + row)] = M;
        p.ml[2 * (split * rows + row) + 1] = L;
    }
    // The merge, as attn_dec_kv's (a short row spans a few splits).
    __threadfence();
    __syncthreads();
    int *cnt = p.count + (long long)t * gridDim.y + blockIdx.y;
    if (threadIdx.x == 0)
        last = atomicAdd(cnt, 1) == nact - 1;
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    float MM = -INFINITY;
    for (int sp = 0; sp < nact; sp++)
        MM = fmaxf(MM, __ldcg(p.ml + 2 * (sp * rows + row)));
    float LL = 0.0f;
    for (int sp = 0; sp < nact; sp++)
        LL += __ldcg(p.ml + 2 * (sp * rows + row) + 1) * expf(__ldcg(p.ml + 2 * (sp * rows + row)) - MM);
    for (int d = threadIdx.x; d < hs; d += DEC_WARPS * 32) {
        float acc = 0.0f;
        for (int sp = 0; sp < nact; sp++)
            acc += __ldcg(p.part + (sp * rows + row) * hs + d) * expf(__ldcg(p.ml + 2 * (sp * rows + row)) - MM);
        const float v = acc * (1.0f / LL);
        p.out[row * hs + d] = v;
        if (p.q8)
            q8_1_block(v, p.q8 + row * hs + d, p.q8ds + (row * hs + d) / 32, p.q8plane);
    }
    if (threadIdx.x == 0)
        *cnt = 0;
}

extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec1_f16_e1(const DecKVParams p) { PDL_ENTRY(); attn_dec1<1>(p); }
extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec1_f16_e2(const DecKVParams p) { PDL_ENTRY(); attn_dec1<2>(p); }
extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec1_f16_e4(const DecKVParams p) { PDL_ENTRY(); attn_dec1<4>(p); }
extern "C" __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec1_f16_e8(const DecKVParams p) { PDL_ENTRY(); attn_dec1<8>(p); }

#define DEC_KV(T, KVT, D)                                                                                           \
    extern "C" __global__ void __launch_bounds__(DK_MAX_WARPS * 32) attn_dec_##T##_d##D(const DecKVParams p) \
    {                                                                                                               \
        PDL_ENTRY();                                                                                                \
        attn_dec_kv<D, KVT, false>(p);                                                                              \
    }
DEC_KV(f16, 0, 32)
DEC_KV(f16, 0, 64)
DEC_KV(f16, 0, 128)
DEC_KV(f16, 0, 256)
DEC_KV(q8_0, 1, 32)
DEC_KV(q8_0, 1, 64)
DEC_KV(q8_0, 1, 128)
DEC_KV(q8_0, 1, 256)
DEC_KV(q4_0, 2, 32)
DEC_KV(q4_0, 2, 64)
DEC_KV(q4_0, 2, 128)
DEC_KV(q4_0, 2, 256)

// attn_dec_q8_0i_d<hs>: a q8_0 cache's int8 path (a KV group of at most 8
// query heads, CC 8.0 and later), in blocks of up to 12 warps (its
// registers fit three warps a scheduler).
#define DK_I8_MAX_WARPS 12
#define DEC_KV_I8(D)                                                                                              \
    extern "C" __global__ void __launch_bounds__(DK_I8_MAX_WARPS * 32) attn_dec_q8_0i_d##D(const DecKVParams p) \
    {                                                                                                          \
        PDL_ENTRY();                                                                                           \
        attn_dec_kv<D, 1, true>(p);                                                                            \
    }
DEC_KV_I8(64)
DEC_KV_I8(128)
DEC_KV_I8(256)

// ---------------------------------------------------------------- gather
//
// kv_gather_f16, kv_gather_q8_0, kv_gather_q4_0: positions
// 0..min(pos[tok]+1, maxLen)-1 of sequence seq[tok] from the paged cache
// into contiguous f16 rows ko, vo [maxLen][width], so that the prefill
// kernels (attn_mma, attn_f16) run on them as on a contiguous cache. q8_0
// is dequantized to f16(d*q), q4_0 to f16(d*(q-8)), as in attn_dec_*. Grid-stride, so any grid covers any length.

extern "C" __global__ void kv_gather_f16(unsigned short *ko, unsigned short *vo,
                                         const unsigned short *kc, const unsigned short *vc, int width,
                                         const int *pos, const int *seq, int tok,
                                         const int *tables, int maxBlocks, int blockShift, int maxLen)
{
    PDL_ENTRY();
    const int len = min(pos[tok] + 1, maxLen);
    const int s = seq[tok];
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (width % 8 == 0) {
        // 16 bytes a copy (the launcher checks the alignment).
        const int cpr = width / 8;
        for (long long i = i0; i < (long long)len * cpr; i += stride) {
            const int j = (int)(i / cpr), ch = (int)(i - (long long)j * cpr);
            const long long src = kv_cell(tables, maxBlocks, blockShift, s, j) * cpr + ch;
            ((uint4 *)ko)[i] = ((const uint4 *)kc)[src];
            ((uint4 *)vo)[i] = ((const uint4 *)vc)[src];
        }
        return;
    }
    for (long long i = i0; i < (long long)len * width; i += stride) {
        const int j = (int)(i / width);
        const long long src = kv_cell(tables, maxBlocks, blockShift, s, j) * width + (i - (long long)j * width);
        ko[i] = kc[src];
        vo[i] = vc[src];
    }
}

// kv_gather_block: a thread per 8 values (position, block, eighth) of a
// cache of blocks of 32 (KVT 1: Q8_0, 34 bytes; 2: Q4_0, 18).
template <int KVT>
__device__ __forceinline__ void kv_gather_block(unsigned short *ko, unsigned short *vo, const unsigned char *kc,
                                                const unsigned char *vc, int width, const int *pos, const int *seq,
                                                int tok, const int *tables, int maxBlocks, int blockShift, int maxLen)
{
    constexpr int BB = KVT == 1 ? 34 : 18; // bytes a block
    const int len = min(pos[tok] + 1, maxLen);
    const int s = seq[tok];
    const int tpr = width / 8; // tasks a row
    const long long rowBytes = (long long)width / 32 * BB;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < (long long)len * tpr; i += stride) {
        const int j = (int)(i / tpr), x = (int)(i - (long long)j * tpr);
        const long long src = kv_cell(tables, maxBlocks, blockShift, s, j) * rowBytes + (long long)BB * (x >> 2);
        if (KVT == 1) {
            ((uint4 *)ko)[i] = q8_0_load8(kc + src, x & 3);
            ((uint4 *)vo)[i] = q8_0_load8(vc + src, x & 3);
        } else {
            ((uint4 *)ko)[i] = q4_0_load8(kc + src, x & 3);
            ((uint4 *)vo)[i] = q4_0_load8(vc + src, x & 3);
        }
    }
}

extern "C" __global__ void kv_gather_q8_0(unsigned short *ko, unsigned short *vo, const unsigned char *kc,
                                          const unsigned char *vc, int width, const int *pos, const int *seq, int tok,
                                          const int *tables, int maxBlocks, int blockShift, int maxLen)
{
    PDL_ENTRY();
    kv_gather_block<1>(ko, vo, kc, vc, width, pos, seq, tok, tables, maxBlocks, blockShift, maxLen);
}

extern "C" __global__ void kv_gather_q4_0(unsigned short *ko, unsigned short *vo, const unsigned char *kc,
                                          const unsigned char *vc, int width, const int *pos, const int *seq, int tok,
                                          const int *tables, int maxBlocks, int blockShift, int maxLen)
{
    PDL_ENTRY();
    kv_gather_block<2>(ko, vo, kc, vc, width, pos, seq, tok, tables, maxBlocks, blockShift, maxLen);
}

// attn_combine merges the nsplit partial results of each (token, head) row:
// out = Σ_s O_s·exp(m_s − M) / Σ_s l_s·exp(m_s − M), M = max_s m_s. Splits
// that saw no position carry m = -inf, l = 0 and drop out. One block per
// row (grid.x = nRows), threads over the head's values.
//
// With q8 (hs % 32 == 0, blockDim a multiple of 32), out is also written in
// ats's GPU Q8_1 layout: a warp's 32 values are one block.
extern "C" __global__ void attn_combine(float *out, const float *part, const float *ml,
                                        int nsplit, int nRows, int hs,
                                        signed char *q8, float2 *q8ds)
{
    PDL_ENTRY();
    const int row = blockIdx.x;
    if (row >= nRows)
        return;
    float M = -INFINITY;
    for (int s = 0; s < nsplit; s++)
        M = fmaxf(M, ml[2 * ((long long)s * nRows + row)]);
    float L = 0.0f;
    for (int s = 0; s < nsplit; s++) {
        const float m = ml[2 * ((long long)s * nRows + row)];
        if (m != -INFINITY)
            L += ml[2 * ((long long)s * nRows + row) + 1] * expf(m - M);
    }
    const float inv = 1.0f / L;
    for (int d = threadIdx.x; d < hs; d += blockDim.x) {
        float acc = 0.0f;
        for (int s = 0; s < nsplit; s++) {
            const float m = ml[2 * ((long long)s * nRows + row)];
            if (m != -INFINITY)
                acc += part[((long long)s * nRows + row) * hs + d] * expf(m - M);
        }
        const long long e = (long long)row * hs + d;
        out[e] = acc * inv;
        if (q8)
            q8_1_block(acc * inv, q8 + e, q8ds + e / 32);
    }
}
