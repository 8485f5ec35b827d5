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
    PDL_ENTRY();
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
