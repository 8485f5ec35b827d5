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
// attn_f16_*: flash attention (online softmax), one kernel for prefill and
// decode. A block owns ATT_ROWS query rows, each a (token, head) pair: hb
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

#define ATT_ROWS 16    // query rows per block
#define ATT_THREADS 128 // 4 warps; ATT_ROWS * 8 threads in the score phase (8 rows * 16 in decode)

__device__ __forceinline__ float h2f(unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ unsigned short f2h(float f)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// kv_store_f16 writes the keys and values of nTok tokens (k, v: [nTok][width]
// float) as f16 into rows pos0[0] .. pos0[0]+nTok-1 of the caches.
extern "C" __global__ void kv_store_f16(unsigned short *kc, unsigned short *vc,
                                        const float *k, const float *v,
                                        int width, const int *pos0, int nTok)
{
    const long long n = (long long)nTok * width;
    const long long base = (long long)pos0[0] * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        kc[base + i] = f2h(k[i]);
        vc[base + i] = f2h(v[i]);
    }
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

// q8_1_block quantizes the 32 values v of a warp (one per lane) into one
// block of ats's GPU Q8_1 layout with the expressions of quantize_q8_1
// (matvec.cu), so the product after sees the activations quantize_q8_1
// would have made.
__device__ __forceinline__ void q8_1_block(float v, signed char *q, float2 *ds)
{
    float amax = fabsf(v);
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.0f;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    int qv = (int)roundf(v * id);
    qv = max(-128, min(127, qv));
    int sum = qv;
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    *q = (signed char)qv;
    if ((threadIdx.x & 31) == 0)
        *ds = make_float2(d, (float)sum * d);
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
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d1(const AttnParams p) { attn_f16<1>(p); }
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d2(const AttnParams p) { attn_f16<2>(p); }
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d3(const AttnParams p) { attn_f16<3>(p); }
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d4(const AttnParams p) { attn_f16<4>(p); }
extern "C" __global__ void __launch_bounds__(ATT_THREADS) attn_f16_d8(const AttnParams p) { attn_f16<8>(p); }

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
