// Prefill-time weight products on the tensor cores, embedding rows and the
// MoE grouping for them. Go launchers: weightops.go. Block layouts of the
// weight types: matvec.cu and ops/quant_*.go.
//
//   get_rows       out[i][:] = dequantize(W[ids[i]]), f32, for any type
//   convert_f16    f32 activation rows -> f16 rows padded to a multiple of
//                  32 values (optionally gathered through a slot list)
//   moe_group      per-expert slot lists and the tile table for mm_*
//   mm_<type>      out[n][m] = sum_k W[m][k] * xh[n][k] with mma.sync
//
// ## Dequantization
//
// Every type is decoded in runs of 16 consecutive values (all sub-block
// scales cover 16 or 32 values), in two steps so that the loads of the next
// tile can be issued before the math of the current one: fetch<T> reads
// the bytes a run needs (block header and 16 bytes of quants) into
// registers, convert<T> turns them into 16 floats with the same float32
// operations, in the same order and without fused multiply-adds, as ops'
// Dequantize, so get_rows reproduces the CPU bit for bit.
//
// ## mm_<type>, mm64_<type>, mm32_<type>: thread mapping
//
// A CTA of 256 threads (8 warps) computes a tile of 128 weight rows (M) by
// BN tokens (N: 128, 64 or 32), stepping over K 32 values at a time with
// two shared-memory buffers. Per step each thread dequantizes one run of 16
// weights (row tid/2, half tid%2) to f16 into the A tile, and copies
// 16-byte pieces of f16 activations into the B tile (cp.async on CC >=
// 8.0). The warps form BN/32 columns of 32 tokens by 256/BN rows: warp w
// computes the (128*32/BN)x32 sub-tile at rows (128*32/BN)*(w%(256/BN)),
// tokens 32*(w/(256/BN)) with mma.sync m16n8k16 (f16 in, f32 accumulate;
// two m16n8k8 on CC 7.5), fragments loaded with ldmatrix from rows padded
// to 40 halves (80 bytes, conflict-free); n8 fragments past the tile's
// token count skip their MMAs. Each thread keeps the raw bytes of PF runs
// in flight in registers (a ring: step ks+1's weights are converted at the
// end of step ks from loads issued PF steps earlier); the activations of
// step ks+1 (tile 128) or ks+2 (tiles 64 and 32: three stages) load during
// step ks.
//
// Dense launches: grid (ceil(rows/128) summed over the launch's up to three
// matrices, ceil(ntok/BN)), tiles == NULL.
// MoE launches: grid.y = the tile table's capacity; tile y (if y < *ntiles)
// is {expert, start, count}: rows start..start+count-1 of the gathered
// activations, results scattered to out rows perm[start+i].

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

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef signed char i8;

#define T_F32 0
#define T_F16 1
#define T_Q4_0 2
#define T_Q4_1 3
#define T_Q5_0 6
#define T_Q5_1 7
#define T_Q8_0 8
#define T_Q2_K 10
#define T_Q3_K 11
#define T_Q4_K 12
#define T_Q5_K 13
#define T_Q6_K 14
#define T_BF16 30

// ---------------------------------------------------------------- helpers

__device__ __forceinline__ float h2f(u16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f)
{
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Two floats to a packed f16x2 (lo in the low half).
__device__ __forceinline__ u32 pack_h2(float lo, float hi)
{
#if __CUDA_ARCH__ >= 800
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return (u32)f2h(lo) | ((u32)f2h(hi) << 16);
#endif
}

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float((u32)h << 16); }

// Global loads at the alignment the format guarantees.
__device__ __forceinline__ u16 g16(const u8 *p) { return __ldg((const unsigned short *)p); }
template <int A> __device__ __forceinline__ u32 g32(const u8 *p)
{
    if (A >= 4)
        return __ldg((const unsigned int *)p);
    return (u32)g16(p) | ((u32)g16(p + 2) << 16);
}
__device__ __forceinline__ uint4 g128(const u8 *p) { return __ldg((const uint4 *)p); }

// 16 bytes at p (2-byte aligned) into o[0..3]: the covering aligned words
// joined with funnel shifts (the fifth word only when p is misaligned; it
// then holds bytes of the run, so the read stays in the run's last 4-byte
// granule).
__device__ __forceinline__ void g128u(const u8 *p, u32 *o)
{
    const u8 *a = (const u8 *)((unsigned long long)p & ~3ull);
    const int sh = (int)((unsigned long long)p & 3) * 8;
    u32 v[5];
#pragma unroll
    for (int i = 0; i < 4; i++)
        v[i] = __ldg((const unsigned int *)(a + 4 * i));
    v[4] = sh ? __ldg((const unsigned int *)(a + 16)) : 0u;
#pragma unroll
    for (int i = 0; i < 4; i++)
        o[i] = __funnelshift_r(v[i], v[i + 1], sh);
}

__device__ __forceinline__ u32 byte_of(u32 w, int i) { return (w >> (8 * i)) & 0xFF; }

// ---------------------------------------------------------------- runs of 16

// Raw bytes of one run; the meaning of the words is per type.
struct Raw {
    u32 w[16];
};

template <int T> struct Fmt;
template <> struct Fmt<T_Q4_0> { enum { BV = 32, BB = 18, RW = 5 }; };
template <> struct Fmt<T_Q4_1> { enum { BV = 32, BB = 20, RW = 5 }; };
template <> struct Fmt<T_Q5_0> { enum { BV = 32, BB = 22, RW = 6 }; };
template <> struct Fmt<T_Q5_1> { enum { BV = 32, BB = 24, RW = 6 }; };
template <> struct Fmt<T_Q8_0> { enum { BV = 32, BB = 34, RW = 5 }; };
template <> struct Fmt<T_Q2_K> { enum { BV = 256, BB = 84, RW = 6 }; };
template <> struct Fmt<T_Q3_K> { enum { BV = 256, BB = 110, RW = 11 }; };
template <> struct Fmt<T_Q4_K> { enum { BV = 256, BB = 144, RW = 8 }; };
template <> struct Fmt<T_Q5_K> { enum { BV = 256, BB = 176, RW = 12 }; };
template <> struct Fmt<T_Q6_K> { enum { BV = 256, BB = 210, RW = 10 }; };
template <> struct Fmt<T_F32> { enum { BV = 1, BB = 4, RW = 16 }; };
template <> struct Fmt<T_F16> { enum { BV = 1, BB = 2, RW = 8 }; };
template <> struct Fmt<T_BF16> { enum { BV = 1, BB = 2, RW = 8 }; };

// RW: the words of Raw a run of the type uses (what a register ring of
// fetched runs costs, see mm_pf).
// fetch<T>(row, e, cols, r): the bytes of values e..e+15 of the row (e a
// multiple of 16; for the float types values at or past cols read as 0).
// convert<T>(r, e, y): the 16 values.
template <int T> __device__ __forceinline__ void fetch(const u8 *row, int e, int cols, Raw &r);
template <int T> __device__ __forceinline__ void convert(const Raw &r, int e, float *y);

// Q4_0 {f16 d; u8 qs[16]}: run 0 = low nibbles, run 1 = high; x = (q-8)*d.
template <> __device__ __forceinline__ void fetch<T_Q4_0>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 5) * 18;
    r.w[0] = g16(b);
    g128u(b + 2, r.w + 1);
}
template <> __device__ __forceinline__ void convert<T_Q4_0>(const Raw &r, int e, float *y)
{
    float d = h2f((u16)r.w[0]);
    int sh = (e & 16) ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = (byte_of(r.w[1 + j / 4], j % 4) >> sh) & 0xF;
        y[j] = __fmul_rn((float)(q - 8), d);
    }
}

// Q4_1 {f16 d; f16 m; u8 qs[16]}: x = d*q + m.
template <> __device__ __forceinline__ void fetch<T_Q4_1>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 5) * 20;
    r.w[0] = g32<4>(b);
#pragma unroll
    for (int i = 0; i < 4; i++)
        r.w[1 + i] = g32<4>(b + 4 + 4 * i);
}
template <> __device__ __forceinline__ void convert<T_Q4_1>(const Raw &r, int e, float *y)
{
    float d = h2f((u16)r.w[0]), m = h2f((u16)(r.w[0] >> 16));
    int sh = (e & 16) ? 4 : 0;
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = (byte_of(r.w[1 + j / 4], j % 4) >> sh) & 0xF;
        y[j] = __fadd_rn(__fmul_rn((float)q, d), m);
    }
}

// Q5_0 {f16 d; u32 qh; u8 qs[16]}: bit i of qh is bit 4 of element i; x = (q-16)*d.
template <> __device__ __forceinline__ void fetch<T_Q5_0>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 5) * 22;
    r.w[0] = g16(b);
    r.w[5] = g32<2>(b + 2);
    g128u(b + 6, r.w + 1);
}
template <> __device__ __forceinline__ void convert<T_Q5_0>(const Raw &r, int e, float *y)
{
    float d = h2f((u16)r.w[0]);
    int hi = (e & 16) ? 1 : 0;
    u32 qh = r.w[5] >> (16 * hi);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = ((byte_of(r.w[1 + j / 4], j % 4) >> (4 * hi)) & 0xF) | (((qh >> j) & 1) << 4);
        y[j] = __fmul_rn((float)(q - 16), d);
    }
}

// Q5_1 {f16 d; f16 m; u32 qh; u8 qs[16]}: x = d*q + m.
template <> __device__ __forceinline__ void fetch<T_Q5_1>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 5) * 24;
    r.w[0] = g32<4>(b);
    r.w[5] = g32<4>(b + 4);
#pragma unroll
    for (int i = 0; i < 4; i++)
        r.w[1 + i] = g32<4>(b + 8 + 4 * i);
}
template <> __device__ __forceinline__ void convert<T_Q5_1>(const Raw &r, int e, float *y)
{
    float d = h2f((u16)r.w[0]), m = h2f((u16)(r.w[0] >> 16));
    int hi = (e & 16) ? 1 : 0;
    u32 qh = r.w[5] >> (16 * hi);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = ((byte_of(r.w[1 + j / 4], j % 4) >> (4 * hi)) & 0xF) | (((qh >> j) & 1) << 4);
        y[j] = __fadd_rn(__fmul_rn((float)q, d), m);
    }
}

// Q8_0 {f16 d; i8 qs[32]}: x = q*d.
template <> __device__ __forceinline__ void fetch<T_Q8_0>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 5) * 34;
    r.w[0] = g16(b);
    g128u(b + 2 + (e & 16), r.w + 1);
}
template <> __device__ __forceinline__ void convert<T_Q8_0>(const Raw &r, int, float *y)
{
    float d = h2f((u16)r.w[0]);
#pragma unroll
    for (int j = 0; j < 16; j++)
        y[j] = __fmul_rn((float)(i8)byte_of(r.w[1 + j / 4], j % 4), d);
}

// Q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: run p = e%256 (a
// multiple of 16) has the 2 bits at shift 2*((p%128)/32) of
// qs[32*(p/128) + p%32 ..+16] and scale byte scales[p/16] (4-bit scale low,
// 4-bit min high); x = d*sc*q - dmin*m.
template <> __device__ __forceinline__ void fetch<T_Q2_K>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 8) * 84;
    int p = e & 255;
    r.w[0] = g32<4>(b + 80);
    r.w[5] = g32<4>(b + (p >> 4 & ~3)); // the scale byte's word
#pragma unroll
    for (int i = 0; i < 4; i++)
        r.w[1 + i] = g32<4>(b + 16 + 32 * (p >> 7) + (p & 31) + 4 * i);
}
template <> __device__ __forceinline__ void convert<T_Q2_K>(const Raw &r, int e, float *y)
{
    int p = e & 255;
    float d = h2f((u16)r.w[0]), dmin = h2f((u16)(r.w[0] >> 16));
    u32 s = byte_of(r.w[5], (p >> 4) & 3);
    float dl = __fmul_rn(d, (float)(s & 0xF)), ml = __fmul_rn(dmin, (float)(s >> 4));
    int sh = 2 * ((p & 127) >> 5);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = (byte_of(r.w[1 + j / 4], j % 4) >> sh) & 3;
        y[j] = __fsub_rn(__fmul_rn(dl, (float)q), ml);
    }
}

// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: low 2 bits as Q2_K,
// bit p/32 of hmask[p%32 + j] the third (clear: -4), 6-bit scales biased
// by 32 (low 4 bits in scales[j%8] nibble j/8, top 2 in scales[8+j%4] bits
// 2*(j/4)); x = d*sc*v.
template <> __device__ __forceinline__ void fetch<T_Q3_K>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 8) * 110;
    int p = e & 255, j = p >> 4;
    r.w[0] = g16(b + 108);
    r.w[9] = g16(b + 96 + ((j & 7) & ~1));      // word holding scales[j%8]
    r.w[10] = g16(b + 104 + ((j & 3) & ~1));    // word holding scales[8 + j%4]
    g128u(b + 32 + 32 * (p >> 7) + (p & 31), r.w + 1);
    g128u(b + (p & 31), r.w + 5);
}
template <> __device__ __forceinline__ void convert<T_Q3_K>(const Raw &r, int e, float *y)
{
    int p = e & 255, j = p >> 4;
    float d = h2f((u16)r.w[0]);
    int lo = (byte_of(r.w[9], j & 1) >> (4 * (j >> 3))) & 0xF;
    int hi = (byte_of(r.w[10], j & 1) >> (2 * (j >> 2))) & 3;
    float dl = __fmul_rn(d, (float)((lo | (hi << 4)) - 32));
    int sh = 2 * ((p & 127) >> 5), bit = p >> 5;
#pragma unroll
    for (int k = 0; k < 16; k++) {
        int q = (byte_of(r.w[1 + k / 4], k % 4) >> sh) & 3;
        int h = (byte_of(r.w[5 + k / 4], k % 4) >> bit) & 1;
        y[k] = __fmul_rn(dl, (float)(q - 4 + 4 * h));
    }
}

// Q4_K/Q5_K scale j (0..7) and min from the 12 scale bytes, held in three
// words.
__device__ __forceinline__ void scale_min_k4w(int j, u32 s0, u32 s1, u32 s2, int &sc, int &m)
{
    u32 s[3] = {s0, s1, s2};
    if (j < 4) {
        sc = byte_of(s[0], j) & 63;
        m = byte_of(s[1], j) & 63;
    } else {
        u32 b = byte_of(s[2], j - 4);
        sc = (b & 0xF) | ((byte_of(s[0], j - 4) >> 6) << 4);
        m = (b >> 4) | ((byte_of(s[1], j - 4) >> 6) << 4);
    }
}

// Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: run p: group g = p/64;
// p%64 < 32: low nibbles of qs[32g + p%32 ..], sub-block 2g, else high
// nibbles, sub-block 2g+1; x = d*sc*q - dmin*m.
template <> __device__ __forceinline__ void fetch<T_Q4_K>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 8) * 144;
    int p = e & 255;
    uint4 h = g128(b), q = g128(b + 16 + 32 * (p >> 6) + (p & 31));
    r.w[0] = h.x; r.w[1] = h.y; r.w[2] = h.z; r.w[3] = h.w;
    r.w[4] = q.x; r.w[5] = q.y; r.w[6] = q.z; r.w[7] = q.w;
}
template <> __device__ __forceinline__ void convert<T_Q4_K>(const Raw &r, int e, float *y)
{
    int p = e & 255, sb = p >> 5, sh = (p & 32) ? 4 : 0;
    float d = h2f((u16)r.w[0]), dmin = h2f((u16)(r.w[0] >> 16));
    int sc, m;
    scale_min_k4w(sb, r.w[1], r.w[2], r.w[3], sc, m);
    float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = (byte_of(r.w[4 + j / 4], j % 4) >> sh) & 0xF;
        y[j] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

// Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K plus
// bit p/32 of qh[p%32 + j] as the fifth bit.
template <> __device__ __forceinline__ void fetch<T_Q5_K>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 8) * 176;
    int p = e & 255;
    uint4 h = g128(b), qh = g128(b + 16 + (p & 31)), q = g128(b + 48 + 32 * (p >> 6) + (p & 31));
    r.w[0] = h.x; r.w[1] = h.y; r.w[2] = h.z; r.w[3] = h.w;
    r.w[4] = q.x; r.w[5] = q.y; r.w[6] = q.z; r.w[7] = q.w;
    r.w[8] = qh.x; r.w[9] = qh.y; r.w[10] = qh.z; r.w[11] = qh.w;
}
template <> __device__ __forceinline__ void convert<T_Q5_K>(const Raw &r, int e, float *y)
{
    int p = e & 255, sb = p >> 5, sh = (p & 32) ? 4 : 0;
    float d = h2f((u16)r.w[0]), dmin = h2f((u16)(r.w[0] >> 16));
    int sc, m;
    scale_min_k4w(sb, r.w[1], r.w[2], r.w[3], sc, m);
    float d1 = __fmul_rn(d, (float)sc), m1 = __fmul_rn(dmin, (float)m);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = ((byte_of(r.w[4 + j / 4], j % 4) >> sh) & 0xF) | (((byte_of(r.w[8 + j / 4], j % 4) >> sb) & 1) << 4);
        y[j] = __fsub_rn(__fmul_rn(d1, (float)q), m1);
    }
}

// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: run p: half h2 =
// p/128, r = p%128, k = r/32, l0 = r%32: quants in ql[64h2 + 32*(k&1) + l0
// ..] (nibble k/2) and bits 2k of qh[32h2 + l0 ..], scale
// scales[8h2 + l0/16 + 2k]; x = d*sc*(q-32).
template <> __device__ __forceinline__ void fetch<T_Q6_K>(const u8 *row, int e, int, Raw &r)
{
    const u8 *b = row + (e >> 8) * 210;
    int p = e & 255, h2 = p >> 7, k = (p & 127) >> 5, l0 = p & 31;
    r.w[0] = g16(b + 208);
    int si = 192 + 8 * h2 + (l0 >> 4) + 2 * k;
    r.w[9] = g16(b + (si & ~1));
    g128u(b + 64 * h2 + 32 * (k & 1) + l0, r.w + 1);
    g128u(b + 128 + 32 * h2 + l0, r.w + 5);
}
template <> __device__ __forceinline__ void convert<T_Q6_K>(const Raw &r, int e, float *y)
{
    int p = e & 255, h2 = p >> 7, k = (p & 127) >> 5, l0 = p & 31;
    int si = 192 + 8 * h2 + (l0 >> 4) + 2 * k;
    float d = h2f((u16)r.w[0]);
    float ds = __fmul_rn(d, (float)(i8)byte_of(r.w[9], si & 1));
    int sh = 4 * (k >> 1);
#pragma unroll
    for (int j = 0; j < 16; j++) {
        int q = ((byte_of(r.w[1 + j / 4], j % 4) >> sh) & 0xF) | (((byte_of(r.w[5 + j / 4], j % 4) >> (2 * k)) & 3) << 4);
        y[j] = __fmul_rn(ds, (float)(q - 32));
    }
}

// F16/BF16: 16 halves (2-byte aligned rows), zero past cols.
template <int T> __device__ __forceinline__ void fetch_half(const u8 *row, int e, int cols, Raw &r)
{
    const u8 *p = row + 2 * e;
    if (e + 16 <= cols && (((unsigned long long)p) & 15) == 0) {
        uint4 a = g128(p), b = g128(p + 16);
        r.w[0] = a.x; r.w[1] = a.y; r.w[2] = a.z; r.w[3] = a.w;
        r.w[4] = b.x; r.w[5] = b.y; r.w[6] = b.z; r.w[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u32 lo = e + 2 * i < cols ? g16(p + 4 * i) : 0u;
            u32 hi = e + 2 * i + 1 < cols ? g16(p + 4 * i + 2) : 0u;
            r.w[i] = lo | (hi << 16);
        }
    }
}
template <> __device__ __forceinline__ void fetch<T_F16>(const u8 *row, int e, int cols, Raw &r) { fetch_half<T_F16>(row, e, cols, r); }
template <> __device__ __forceinline__ void fetch<T_BF16>(const u8 *row, int e, int cols, Raw &r) { fetch_half<T_BF16>(row, e, cols, r); }
template <> __device__ __forceinline__ void convert<T_F16>(const Raw &r, int, float *y)
{
#pragma unroll
    for (int j = 0; j < 16; j++)
        y[j] = h2f((u16)(r.w[j / 2] >> (16 * (j & 1))));
}
template <> __device__ __forceinline__ void convert<T_BF16>(const Raw &r, int, float *y)
{
#pragma unroll
    for (int j = 0; j < 16; j++)
        y[j] = bf2f((u16)(r.w[j / 2] >> (16 * (j & 1))));
}

// F32: 16 words, zero past cols.
template <> __device__ __forceinline__ void fetch<T_F32>(const u8 *row, int e, int cols, Raw &r)
{
    const u8 *p = row + 4 * e;
    if (e + 16 <= cols && (((unsigned long long)p) & 15) == 0) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 a = g128(p + 16 * i);
            r.w[4 * i] = a.x; r.w[4 * i + 1] = a.y; r.w[4 * i + 2] = a.z; r.w[4 * i + 3] = a.w;
        }
    } else {
#pragma unroll
        for (int i = 0; i < 16; i++)
            r.w[i] = e + i < cols ? g32<4>(p + 4 * i) : 0u;
    }
}
template <> __device__ __forceinline__ void convert<T_F32>(const Raw &r, int, float *y)
{
#pragma unroll
    for (int j = 0; j < 16; j++)
        y[j] = __uint_as_float(r.w[j]);
}

// ---------------------------------------------------------------- runs of 16 as f16

// convert_h<T>(r, e, h): the 16 values of a run as 8 packed f16 pairs for
// the tensor-core tiles. By default convert<T> rounded to f16. Q4_K and
// Q6_K, the types of a Q4_K_M model's large matrices, decode in f16x2
// instead: a quant q (< 64) becomes the f16 1024+q by putting its byte
// under the exponent 0x64 (prmt), 1024 (+32) is subtracted exactly, and one
// f16x2 fma (mul) applies the scale (and min): about 2-3 instructions a
// value instead of 6. The scale and min are rounded to f16 first, which
// moves a value by at most about 2^-11 of itself more than the f32 path
// followed by the f16 rounding does: the same order as that rounding.
__device__ __forceinline__ u32 h2_splat(float f)
{
    u32 h = f2h(f);
    return h | (h << 16);
}
__device__ __forceinline__ u32 hsub2(u32 a, u32 b)
{
    u32 r;
    asm("sub.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hmul2(u32 a, u32 b)
{
    u32 r;
    asm("mul.rn.f16x2 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b));
    return r;
}
__device__ __forceinline__ u32 hfma2(u32 a, u32 b, u32 c)
{
    u32 r;
    asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
}
// Bytes 0,1 (lo) or 2,3 (hi) of v, each < 64, as the f16 pair 1024+b.
__device__ __forceinline__ u32 q_lo_h2(u32 v) { return __byte_perm(v, 0x64646464u, 0x4140); }
__device__ __forceinline__ u32 q_hi_h2(u32 v) { return __byte_perm(v, 0x64646464u, 0x4342); }
#define H2_1024 0x64006400u // f16 pair 1024, 1024
#define H2_1056 0x64206420u // f16 pair 1056, 1056 (1024 + Q6_K's offset 32)

template <int T> __device__ __forceinline__ void convert_h(const Raw &r, int e, u32 *h)
{
    float y[16];
    convert<T>(r, e, y);
#pragma unroll
    for (int j = 0; j < 8; j++)
        h[j] = pack_h2(y[2 * j], y[2 * j + 1]);
}
template <> __device__ __forceinline__ void convert_h<T_Q4_K>(const Raw &r, int e, u32 *h)
{
    int p = e & 255, sb = p >> 5, sh = (p & 32) ? 4 : 0;
    float d = h2f((u16)r.w[0]), dmin = h2f((u16)(r.w[0] >> 16));
    int sc, m;
    scale_min_k4w(sb, r.w[1], r.w[2], r.w[3], sc, m);
    u32 d1 = h2_splat(__fmul_rn(d, (float)sc)), m1 = h2_splat(-__fmul_rn(dmin, (float)m));
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 v = (r.w[4 + i] >> sh) & 0x0F0F0F0Fu;
        h[2 * i] = hfma2(hsub2(q_lo_h2(v), H2_1024), d1, m1);
        h[2 * i + 1] = hfma2(hsub2(q_hi_h2(v), H2_1024), d1, m1);
    }
}
template <> __device__ __forceinline__ void convert_h<T_Q6_K>(const Raw &r, int e, u32 *h)
{
    int p = e & 255, h2 = p >> 7, k = (p & 127) >> 5, l0 = p & 31;
    int si = 192 + 8 * h2 + (l0 >> 4) + 2 * k;
    float d = h2f((u16)r.w[0]);
    u32 ds = h2_splat(__fmul_rn(d, (float)(i8)byte_of(r.w[9], si & 1)));
    int sh = 4 * (k >> 1);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 v = ((r.w[1 + i] >> sh) & 0x0F0F0F0Fu) | (((r.w[5 + i] >> (2 * k)) & 0x03030303u) << 4);
        h[2 * i] = hmul2(hsub2(q_lo_h2(v), H2_1056), ds);
        h[2 * i + 1] = hmul2(hsub2(q_hi_h2(v), H2_1056), ds);
    }
}

// ---------------------------------------------------------------- get_rows

// get_rows_<type>(W, rowBytes, cols, ids, n, out, ldOut): out[i][0..cols)
// = row ids[i] of W, dequantized. One CTA per output row, threads over
// runs of 16 values.
template <int T>
__device__ __forceinline__ void get_rows_body(const u8 *__restrict__ W, long long rowBytes, int cols,
                                              const int *__restrict__ ids, int n, float *__restrict__ out,
                                              long long ldOut)
{
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        const u8 *row = W + (long long)ids[i] * rowBytes;
        float *o = out + (long long)i * ldOut;
        for (int e = 16 * threadIdx.x; e < cols; e += 16 * blockDim.x) {
            Raw r;
            float y[16];
            fetch<T>(row, e, cols, r);
            convert<T>(r, e, y);
            int m = min(16, cols - e);
#pragma unroll
            for (int j = 0; j < 16; j++)
                if (j < m)
                    o[e + j] = y[j];
        }
    }
}

#define GET_ROWS(NAME, T)                                                                                      \
    extern "C" __global__ void get_rows_##NAME(const u8 *W, long long rowBytes, int cols, const int *ids, int n, \
                                               float *out, long long ldOut)                                    \
    {                                                                                                          \
        PDL_ENTRY();                                                                                           \
        get_rows_body<T>(W, rowBytes, cols, ids, n, out, ldOut);                                               \
    }

// ---------------------------------------------------------------- activations

// convert_f16(x, ldx, cols, perm, actDiv, nrows, xh, ldh): for i < nrows,
// xh[i][j] = f16(x[src][j]) for j < cols and 0 for cols <= j < ldh, with
// src = perm ? perm[i] / actDiv : i. Values beyond the f16 range saturate
// at +-65504 rather than becoming infinite. Grid-stride over pairs.
extern "C" __global__ void convert_f16(const float *__restrict__ x, long long ldx, int cols,
                                       const int *__restrict__ perm, int actDiv, int nrows, u32 *__restrict__ xh,
                                       int ldh)
{
    PDL_ENTRY();
    const int pairs = ldh >> 1;
    const long long total = (long long)nrows * pairs;
    for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < total;
         k += (long long)gridDim.x * blockDim.x) {
        int i = (int)(k / pairs), j = 2 * (int)(k - (long long)i * pairs);
        int src = perm ? perm[i] / actDiv : i;
        const float *xr = x + (long long)src * ldx;
        float a = j < cols ? xr[j] : 0.f, b = j + 1 < cols ? xr[j + 1] : 0.f;
        a = fminf(fmaxf(a, -65504.f), 65504.f);
        b = fminf(fmaxf(b, -65504.f), 65504.f);
        xh[k] = pack_h2(a, b);
    }
}

// ---------------------------------------------------------------- MoE grouping

// moe_group(ids, nslots, nexpert, bn, perm, tiles, ntiles): one CTA.
// Groups the slots s (ids[s] = the expert of slot s) by expert: perm lists
// the slots of expert 0, then expert 1, ... (within an expert in no
// particular order: each output row depends only on its own slot), and
// tiles[t] = {expert, start, count, 0} covers perm[start..start+count),
// count <= bn, for t < *ntiles. Dynamic shared memory: 3*nexpert ints.
// Slots whose id is outside [0, nexpert) are dropped (their outputs are
// not written).
extern "C" __global__ void moe_group(const int *__restrict__ ids, int nslots, int nexpert, int bn,
                                     int *__restrict__ perm, int4 *__restrict__ tiles, int *__restrict__ ntiles)
{
    PDL_ENTRY();
    extern __shared__ int sh[];
    int *cnt = sh, *off = sh + nexpert, *toff = sh + 2 * nexpert;
    for (int e = threadIdx.x; e < nexpert; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    for (int s = threadIdx.x; s < nslots; s += blockDim.x) {
        int e = ids[s];
        if (e >= 0 && e < nexpert)
            atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    __shared__ int total;
    if (threadIdx.x == 0) {
        int o = 0, t = 0;
        for (int e = 0; e < nexpert; e++) {
            off[e] = o;
            toff[e] = t;
            o += cnt[e];
            t += (cnt[e] + bn - 1) / bn;
        }
        *ntiles = t;
        total = o;
    }
    __syncthreads();
    for (int s = total + threadIdx.x; s < nslots; s += blockDim.x)
        perm[s] = 0; // dropped slots: keep the gather of convert_f16 in bounds
    for (int e = threadIdx.x; e < nexpert; e += blockDim.x) {
        int c = cnt[e];
        for (int j = 0; j * bn < c; j++)
            tiles[toff[e] + j] = make_int4(e, off[e] + j * bn, min(bn, c - j * bn), 0);
        cnt[e] = 0; // reused as the fill cursor
    }
    __syncthreads();
    for (int s = threadIdx.x; s < nslots; s += blockDim.x) {
        int e = ids[s];
        if (e >= 0 && e < nexpert)
            perm[off[e] + atomicAdd(&cnt[e], 1)] = s;
    }
}

// ---------------------------------------------------------------- tensor-core matmul

#define MM_BM 128
#define MM_BN 128
#define MM_BK 32
#define MM_LD 40 // halves per shared row: BK + 8 of padding (80 bytes)
#define MM_THREADS 256

__device__ __forceinline__ u32 smem_addr(const void *p) { return (u32)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void ldmatrix_x4(u32 *r, const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c += a (16x16, row) * b (16x8, col), f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma16816(float *c, const u32 *a, const u32 *b)
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

// 16 bytes global -> shared; zero-filled when !valid.
__device__ __forceinline__ void cp16(void *dst, const void *src, bool valid)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
#else
    uint4 v = valid ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
    *(uint4 *)dst = v;
#endif
}

__device__ __forceinline__ void cp_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;");
#endif
}

// All but the most recent group complete.
__device__ __forceinline__ void cp_wait_prev()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 1;");
#endif
}

__device__ __forceinline__ void cp_wait_all()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group 0;");
#endif
}

// BN tokens per tile (128, 64 or 32): the 8 warps form BN/32 columns of 32
// tokens by 256/BN rows of 128*32/BN weight rows, so a warp always holds
// MI = BN/32 m16 fragments by 4 n8 fragments. Fragments of tokens past
// the tile's count skip their MMAs (warp-uniform), so a short MoE tile
// costs its dequantization and little more.
template <int T, int BN, int PF>
__device__ __forceinline__ void mm_body(const u8 *__restrict__ W, long long rowBytes, int rows, int cols,
                                        long long expertBytes, const u16 *__restrict__ xh, int ldh, int ntok,
                                        const int4 *__restrict__ tiles, const int *__restrict__ ntiles,
                                        const int *__restrict__ perm, int rowTile, int seg, float *out0,
                                        long long ldOut0, float *out1, long long ldOut1, float *out2,
                                        long long ldOut2)
{
    constexpr int WARPS_N = BN / 32, WARPS_M = 8 / WARPS_N, WM = MM_BM / WARPS_M, MI = WM / 16;
    constexpr int BPIECES = BN * 4, BPER = (BPIECES + MM_THREADS - 1) / MM_THREADS;
    __shared__ __align__(16) u16 As[2][MM_BM][MM_LD];
    // NSB stages of activations: with 3, step ks+2's are loaded during step
    // ks (the 128-token tile has no room for a third in 48 KiB).
    constexpr int NSB = BN == 128 ? 2 : 3;
    __shared__ __align__(16) u16 Bs[NSB][BN][MM_LD];

    int ex = 0, start, count;
    if (tiles) {
        if ((int)blockIdx.y >= *ntiles)
            return;
        int4 tt = tiles[blockIdx.y];
        ex = tt.x;
        start = tt.y;
        count = tt.z;
    } else {
        start = blockIdx.y * BN;
        count = min(BN, ntok - start);
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int m0 = rowTile * MM_BM;

    // A loader: row ar of the tile, run ah (values 16*ah..+16 of the step).
    const int ar = tid >> 1, ah = tid & 1;
    const u8 *arow = W + (long long)ex * expertBytes + (long long)min(m0 + ar, rows - 1) * rowBytes;
    // B loader: pieces c = tid + 256*i (< BPIECES) of the BN rows x 4 pieces.
    const u16 *brow[BPER];
    int bn[BPER], bp[BPER];
#pragma unroll
    for (int i = 0; i < BPER; i++) {
        int c = tid + MM_THREADS * i;
        bn[i] = c >> 2;
        bp[i] = c & 3;
        brow[i] = xh + (long long)(start + min(bn[i], count - 1)) * ldh + 8 * bp[i];
    }
    const int nk = (cols + MM_BK - 1) / MM_BK;

    // A ring of PF runs in registers: the weights of step ks+1 are stored
    // (converted) at the end of step ks, from loads issued PF steps before.
    Raw raw[PF];
    auto fetchA = [&](Raw &r, int ks) { fetch<T>(arow, ks * MM_BK + 16 * ah, cols, r); };
    auto storeA = [&](const Raw &r, int buf, int ks) {
        u32 h[8];
        convert_h<T>(r, ks * MM_BK + 16 * ah, h);
        uint4 *d = (uint4 *)&As[buf][ar][16 * ah];
        d[0] = make_uint4(h[0], h[1], h[2], h[3]);
        d[1] = make_uint4(h[4], h[5], h[6], h[7]);
    };
    auto loadB = [&](int buf, int ks) {
#pragma unroll
        for (int i = 0; i < BPER; i++)
            if (BPIECES % MM_THREADS == 0 || tid + MM_THREADS * i < BPIECES)
                cp16(&Bs[buf][bn[i]][8 * bp[i]], brow[i] + ks * MM_BK, bn[i] < count);
    };

    float acc[MI][4][4];
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int k = 0; k < 4; k++)
                acc[i][j][k] = 0.f;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    // Token fragments of this warp that hold tokens of the tile (0..4).
    const int nfrag = min(4, max(0, (count - 32 * wn + 7) >> 3));

#pragma unroll
    for (int u = 0; u < PF; u++)
        if (u < nk)
            fetchA(raw[u], u);
    loadB(0, 0);
    cp_commit();
    if (NSB == 3) {
        if (nk > 1)
            loadB(1, 1);
        cp_commit();
    }
    storeA(raw[0], 0, 0);
    if (PF < nk)
        fetchA(raw[0], PF);
    if (NSB == 3)
        cp_wait_prev();
    else
        cp_wait_all();
    __syncthreads();

    for (int k0 = 0; k0 < nk; k0 += PF) {
#pragma unroll
        for (int u = 0; u < PF; u++) {
            const int ks = k0 + u;
            if (ks >= nk)
                break;
            const int buf = ks & 1, bbuf = NSB == 3 ? ks % 3 : buf;
            const bool more = ks + 1 < nk;
            if (NSB == 3) {
                // Every step commits a group (maybe empty), so that
                // wait_group 1 below always leaves only step ks+2's.
                if (ks + 2 < nk)
                    loadB((ks + 2) % 3, ks + 2);
                cp_commit();
            } else if (more) {
                loadB(buf ^ 1, ks + 1);
                cp_commit();
            }
            if (nfrag > 0) {
#pragma unroll
                for (int kk = 0; kk < MM_BK; kk += 16) {
                    u32 a[MI][4], b[4][2];
#pragma unroll
                    for (int i = 0; i < MI; i++)
                        ldmatrix_x4(a[i], &As[buf][WM * wm + 16 * i + (lane & 15)][kk + (lane >> 4) * 8]);
#pragma unroll
                    for (int j = 0; j < 2; j++) {
                        u32 r[4];
                        ldmatrix_x4(r, &Bs[bbuf][32 * wn + 16 * j + (lane & 7) + ((lane >> 4) << 3)][kk + ((lane >> 3) & 1) * 8]);
                        b[2 * j][0] = r[0];
                        b[2 * j][1] = r[1];
                        b[2 * j + 1][0] = r[2];
                        b[2 * j + 1][1] = r[3];
                    }
#pragma unroll
                    for (int j = 0; j < 4; j++)
                        if (j < nfrag)
#pragma unroll
                            for (int i = 0; i < MI; i++)
                                mma16816(acc[i][j], a[i], b[j]);
                }
            }
            if (more) {
                Raw &r = raw[(u + 1) % PF];
                storeA(r, buf ^ 1, ks + 1);
                if (ks + 1 + PF < nk)
                    fetchA(r, ks + 1 + PF);
            }
            if (NSB == 3)
                cp_wait_prev();
            else
                cp_wait_all();
            __syncthreads();
        }
    }

    // Epilogue: accumulator (i, j, 2h+q) is row WM*wm + 16i + lane/4 + 8h,
    // token 32wn + 8j + 2*(lane%4) + q of the tile.
#pragma unroll
    for (int j = 0; j < 4; j++) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int n = 32 * wn + 8 * j + 2 * (lane & 3) + q;
            if (n >= count)
                continue;
            long long orow = tiles ? perm[start + n] : start + n;
            // The output of the launch's matrix seg, chosen only here so
            // that the main loop holds no registers for it.
            float *out = seg == 2 ? out2 : seg == 1 ? out1 : out0;
            long long ldOut = seg == 2 ? ldOut2 : seg == 1 ? ldOut1 : ldOut0;
            float *o = out + orow * ldOut;
#pragma unroll
            for (int i = 0; i < MI; i++) {
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int m = m0 + WM * wm + 16 * i + (lane >> 2) + 8 * h;
                    if (m < rows)
                        o[m] = acc[i][j][2 * h + q];
                }
            }
        }
    }
}

// mm_<type> (128-token tiles), mm64_<type>, mm32_<type>: (W, rowBytes,
// rows, cols, expertBytes, xh, ldh, ntok, tiles, ntiles, perm, out, ldOut,
// W1, out1, ldOut1, rows1, tile1, W2, out2, ldOut2, rows2, tile2).
// The smaller tiles hold fewer accumulators, so more CTAs fit an SM.
// Dense launches may carry up to two more matrices of the same type and
// width on the same input (attn_q/k/v, ffn_gate/up): row tiles from tile1
// (tile2) on are matrix 1 (2); an absent one has tile 0x7fffffff. One
// launch then fills the SMs where each alone would leave a partial wave.
#define MM_VARIANT(PREFIX, NAME, T, BN, PF, MINB)                                                                 \
    extern "C" __global__ void __launch_bounds__(MM_THREADS, MINB)                                                \
        PREFIX##NAME(const u8 *W, long long rowBytes, int rows, int cols, long long expertBytes, const u16 *xh,   \
                     int ldh, int ntok, const int4 *tiles, const int *ntiles, const int *perm, float *out,        \
                     long long ldOut, const u8 *W1, float *out1, long long ldOut1, int rows1, int tile1,          \
                     const u8 *W2, float *out2, long long ldOut2, int rows2, int tile2)                            \
    {                                                                                                             \
        PDL_ENTRY();                                                                                              \
        int rt = blockIdx.x, seg = 0;                                                                             \
        if (rt >= tile2) {                                                                                        \
            W = W2, rows = rows2, rt -= tile2, seg = 2;                                                           \
        } else if (rt >= tile1) {                                                                                 \
            W = W1, rows = rows1, rt -= tile1, seg = 1;                                                           \
        }                                                                                                         \
        mm_body<T, BN, PF>(W, rowBytes, rows, cols, expertBytes, xh, ldh, ntok, tiles, ntiles, perm, rt, seg, out, \
                           ldOut, out1, ldOut1, out2, ldOut2);                                                    \
    }
// Runs in flight per thread (mm_body's PF) and CTAs per SM, chosen from
// ptxas's reports on sm_90 so that no variant spills: the small tiles hold
// few accumulators and spend the registers on a deeper ring, which is
// what the MoE products (a 32- or 64-token tile, 2048 or 768 columns)
// wait on; the 128-token tile has room for a second run when its type's
// runs are small.
#if __CUDA_ARCH__ >= 800
#define MM_PF128(T) (Fmt<T>::RW <= 10 ? 2 : 1)
#else // CC 7.5's two m16n8k8 per product leave no room (ptxas spills)
#define MM_PF128(T) 1
#endif
#define MM_PF64(T) (Fmt<T>::RW <= 12 ? 4 : 3)
#define MM_PF32(T) (Fmt<T>::RW <= 8 ? 3 : 2)
#define MM(NAME, T)                                                                                               \
    MM_VARIANT(mm_, NAME, T, 128, MM_PF128(T), 2)                                                                 \
    MM_VARIANT(mm64_, NAME, T, 64, MM_PF64(T), 2) MM_VARIANT(mm32_, NAME, T, 32, MM_PF32(T), 3)

#define WEIGHT_TYPE_KERNELS(NAME, T) GET_ROWS(NAME, T) MM(NAME, T)

WEIGHT_TYPE_KERNELS(f32, T_F32)
WEIGHT_TYPE_KERNELS(f16, T_F16)
WEIGHT_TYPE_KERNELS(bf16, T_BF16)
WEIGHT_TYPE_KERNELS(q4_0, T_Q4_0)
WEIGHT_TYPE_KERNELS(q4_1, T_Q4_1)
WEIGHT_TYPE_KERNELS(q5_0, T_Q5_0)
WEIGHT_TYPE_KERNELS(q5_1, T_Q5_1)
WEIGHT_TYPE_KERNELS(q8_0, T_Q8_0)
WEIGHT_TYPE_KERNELS(q2_k, T_Q2_K)
WEIGHT_TYPE_KERNELS(q3_k, T_Q3_K)
WEIGHT_TYPE_KERNELS(q4_k, T_Q4_K)
WEIGHT_TYPE_KERNELS(q5_k, T_Q5_K)
WEIGHT_TYPE_KERNELS(q6_k, T_Q6_K)
