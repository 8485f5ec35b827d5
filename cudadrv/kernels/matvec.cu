// Decode-time weight products: activation quantization to Q8_1 and the
// matrix-vector kernels (1..8 tokens) for every weight type ats supports,
// dense and MoE (expert-gathered). Go launchers: weightops.go.
//
// Weights stay in their GGUF block layout (ggml-common.h; the layouts are
// spelled out at each decoder below and in ops/quant_legacy.go and
// ops/quant_k.go): a matrix is `rows` rows of `rowBytes` bytes back to back,
// an MoE expert stack is n_expert such matrices back to back
// (`expertBytes` apart). The base pointer must be 16-byte aligned.
//
// ## Activations: ats's GPU Q8_1 layout
//
// quantize_q8_1 turns f32 rows (ntok rows of `cols` values, cols a multiple
// of 32) into two arrays in one scratch buffer:
//
//   q  : int8  [ntok][cols]        q = roundf(x / d), half away from zero
//   ds : float2[ntok][cols/32]     per block of 32: {d = amax/127, d*sum(q)}
//
// The values are those of ggml's quantize_row_q8_1 (and ops.Quantize(Q8_1)),
// but kept apart (16-byte aligned int8 rows for vector loads) and with d and
// d*sum in float32 rather than half: more exact, and the scratch is small.
// ds starts at the first 16-byte boundary after ntok*cols bytes.
//
// ## Integer matvec: thread mapping
//
// A CTA has 4 warps, grouped into 4/ks row groups of ks warps (ks = 1, 2
// or 4, chosen by the launcher so that small matrices still fill the GPU).
// A row group owns R consecutive weight rows; its ks warps split each row
// into chunks of 1024 values (4 super-blocks of the k-quants, 32 blocks of
// the legacy formats) and take every ks-th chunk. A warp streams a chunk of
// each of its R rows from global memory into its own shared-memory stage
// with coalesced 16-byte loads of the aligned span that covers it (blocks
// of 18, 34 or 210 bytes are not 16-byte aligned: the stage keeps the
// misalignment and the decoders read 2- or 4-byte words). The loads of the
// warp's next chunk are issued before the current one is decoded, so a
// warp always has one chunk per row in flight.
//
// Within a chunk lane l decodes one "unit" of 32 weights: 16 bytes of
// quants, as two runs of 16 consecutive elements (A and B) with one scale
// each. For the k-quants the block is lane/8 and the unit lane%8; for the
// legacy formats the block is lane and its two halves are A and B. The
// decoded unit (8 ints of 4 int8 weights, 2 scales, 2 min terms) is kept in
// registers while the lane walks the tokens: per token it loads the two
// matching 16-byte runs of int8 activations and their block scales and
// accumulates with __dp4a. Each lane keeps R x NTOK partial sums, reduced
// over the warp with shuffles and over the ks warps in shared memory.
//
// Float weights (F32/F16/BF16) use the same staging, with f32 activations
// read directly (no quantization) and FMA in float32.
//
// The kernels are templates instantiated per weight type and token count
// NTOK in {1,2,4,8}; a launch with ntok < NTOK repeats the last token's
// activations and drops the extra sums. MoE: grid.y enumerates problems p
// (token-slot pairs); the weight of problem p is expert ids[p] of the stack,
// its activations are row p/actDiv (actDiv = k when the k slots of a token
// share that token's input, 1 when each slot has its own), its output row p.
// Dense launches have ids == NULL and grid.y == 1.

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

// ggml type ids (gguf.Type).
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

#define MV_WARPS 4    // warps per CTA, splitting each row's chunks
#define CHUNK 1024    // values per chunk of the quantized types

// ---------------------------------------------------------------- helpers

__device__ __forceinline__ float h2f(u16 h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float((u32)h << 16); }

// Little-endian loads from shared memory at the alignment A the format
// guarantees (every block of every type starts at an even address).
__device__ __forceinline__ u16 ld16(const u8 *p) { return *(const u16 *)p; }
template <int A> __device__ __forceinline__ u32 ld32(const u8 *p)
{
    if (A >= 4)
        return *(const u32 *)p;
    return (u32)((const u16 *)p)[0] | ((u32)((const u16 *)p)[1] << 16);
}

// 16 bytes at p as 4 little-endian words, for p aligned to A: one vector
// load (A = 16), four word loads (A = 4), or, for 2-byte alignment, the
// covering aligned words joined with funnel shifts (the fifth word only
// when p is misaligned; it then holds bytes of the run, so the read never
// leaves the run's last 4-byte granule).
template <int A> __device__ __forceinline__ void ld128(const u8 *p, u32 *o)
{
    if (A >= 16) {
        uint4 v = *(const uint4 *)p;
        o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
    } else if (A >= 4) {
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[i] = *(const u32 *)(p + 4 * i);
    } else {
        const u32 *w = (const u32 *)((unsigned long long)p & ~3ull);
        const int sh = (int)((unsigned long long)p & 3) * 8;
        u32 v[5];
#pragma unroll
        for (int i = 0; i < 4; i++)
            v[i] = w[i];
        v[4] = sh ? w[4] : 0u;
#pragma unroll
        for (int i = 0; i < 4; i++)
            o[i] = __funnelshift_r(v[i], v[i + 1], sh);
    }
}

// Per-byte x-c for bytes x in 0..2c+... without borrows between bytes: for
// each byte (x + 128 - c) stays below 256, and flipping the top bit
// subtracts 128 modulo 256.
#define SUB8(x, c) (((x) + (0x80808080u - 0x01010101u * (c))) ^ 0x80808080u)

// Spread the low 4 bits of b into bit 0 of the 4 bytes.
__device__ __forceinline__ u32 spread4(u32 b)
{
    return (b & 1u) | ((b & 2u) << 7) | ((b & 4u) << 14) | ((b & 8u) << 21);
}

__device__ __forceinline__ uint4 ldg16(const void *p)
{
    uint4 v;
    asm volatile("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// ---------------------------------------------------------------- formats

// Per-type constants: BV values and BB bytes per block, A the alignment of
// a block in the stage, MIN how the unit's minimum/offset term is formed.
#define MIN_NONE 0  // signed weights, no offset term
#define MIN_S32 1   // + ma*s(blockA) + mb*s(blockB), s = d_act*sum(q_act) over 32
#define MIN_S16 2   // + ma*d_act*sum(q_act over run A) + same for B

template <int T> struct Fmt;
template <> struct Fmt<T_Q4_0> { enum { BV = 32, BB = 18, A = 2, MIN = MIN_NONE }; };
template <> struct Fmt<T_Q4_1> { enum { BV = 32, BB = 20, A = 4, MIN = MIN_S32 }; };
template <> struct Fmt<T_Q5_0> { enum { BV = 32, BB = 22, A = 2, MIN = MIN_NONE }; };
template <> struct Fmt<T_Q5_1> { enum { BV = 32, BB = 24, A = 4, MIN = MIN_S32 }; };
template <> struct Fmt<T_Q8_0> { enum { BV = 32, BB = 34, A = 2, MIN = MIN_NONE }; };
template <> struct Fmt<T_Q2_K> { enum { BV = 256, BB = 84, A = 4, MIN = MIN_S16 }; };
template <> struct Fmt<T_Q3_K> { enum { BV = 256, BB = 110, A = 2, MIN = MIN_NONE }; };
template <> struct Fmt<T_Q4_K> { enum { BV = 256, BB = 144, A = 16, MIN = MIN_S32 }; };
template <> struct Fmt<T_Q5_K> { enum { BV = 256, BB = 176, A = 16, MIN = MIN_S32 }; };
template <> struct Fmt<T_Q6_K> { enum { BV = 256, BB = 210, A = 2, MIN = MIN_NONE }; };

// One lane's 32 weights: runs A and B of 16 consecutive elements starting
// at element ea / eb of the block, as int8 (4 per int), with their scales
// (weight = sa * qa) and min terms.
struct Unit {
    u32 qa[4], qb[4];
    float sa, sb, ma, mb;
    int ea, eb;
};

// Q3_K scale j (0..15), bias removed: low 4 bits in byte j%8 (nibble j/8),
// top 2 bits in byte 8+j%4 (bits 2*(j/4)).
__device__ __forceinline__ int scale_q3k(int j, const u8 *s)
{
    int lo = (s[j & 7] >> (4 * (j >> 3))) & 0xF;
    int hi = (s[8 + (j & 3)] >> (2 * (j >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

template <int T> __device__ __forceinline__ void unit(const u8 *b, int u, Unit &w);

// Q4_0 {f16 d; u8 qs[16]}: byte j = element j (low nibble), j+16 (high); x = d*(q-8).
template <> __device__ __forceinline__ void unit<T_Q4_0>(const u8 *b, int, Unit &w)
{
    float d = h2f(ld16(b));
    u32 qs[4];
    ld128<2>(b + 2, qs);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 q = qs[i];
        w.qa[i] = SUB8(q & 0x0F0F0F0Fu, 8);
        w.qb[i] = SUB8((q >> 4) & 0x0F0F0F0Fu, 8);
    }
    w.sa = w.sb = d;
    w.ma = w.mb = 0.f;
    w.ea = 0;
    w.eb = 16;
}

// Q4_1 {f16 d; f16 m; u8 qs[16]}: x = d*q + m.
template <> __device__ __forceinline__ void unit<T_Q4_1>(const u8 *b, int, Unit &w)
{
    float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
    u32 qs[4];
    ld128<4>(b + 4, qs);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 q = qs[i];
        w.qa[i] = q & 0x0F0F0F0Fu;
        w.qb[i] = (q >> 4) & 0x0F0F0F0Fu;
    }
    w.sa = w.sb = d;
    w.ma = m; // both runs are one activation block: count its sum once
    w.mb = 0.f;
    w.ea = 0;
    w.eb = 16;
}

// Q5_0 {f16 d; u32 qh; u8 qs[16]}: bit i of qh is bit 4 of element i; x = d*(q-16).
template <> __device__ __forceinline__ void unit<T_Q5_0>(const u8 *b, int, Unit &w)
{
    float d = h2f(ld16(b));
    u32 qh = ld32<2>(b + 2);
    u32 qs[4];
    ld128<2>(b + 6, qs);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 q = qs[i];
        w.qa[i] = SUB8((q & 0x0F0F0F0Fu) | (spread4(qh >> (4 * i)) << 4), 16);
        w.qb[i] = SUB8(((q >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * i)) << 4), 16);
    }
    w.sa = w.sb = d;
    w.ma = w.mb = 0.f;
    w.ea = 0;
    w.eb = 16;
}

// Q5_1 {f16 d; f16 m; u32 qh; u8 qs[16]}: x = d*q + m.
template <> __device__ __forceinline__ void unit<T_Q5_1>(const u8 *b, int, Unit &w)
{
    float d = h2f(ld16(b)), m = h2f(ld16(b + 2));
    u32 qh = ld32<4>(b + 4);
    u32 qs[4];
    ld128<4>(b + 8, qs);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 q = qs[i];
        w.qa[i] = (q & 0x0F0F0F0Fu) | (spread4(qh >> (4 * i)) << 4);
        w.qb[i] = ((q >> 4) & 0x0F0F0F0Fu) | (spread4(qh >> (16 + 4 * i)) << 4);
    }
    w.sa = w.sb = d;
    w.ma = m;
    w.mb = 0.f;
    w.ea = 0;
    w.eb = 16;
}

// Q8_0 {f16 d; i8 qs[32]}: x = d*q.
template <> __device__ __forceinline__ void unit<T_Q8_0>(const u8 *b, int, Unit &w)
{
    float d = h2f(ld16(b));
    ld128<2>(b + 2, w.qa);
    ld128<2>(b + 18, w.qb);
    w.sa = w.sb = d;
    w.ma = w.mb = 0.f;
    w.ea = 0;
    w.eb = 16;
}

// Q2_K {u8 scales[16]; u8 qs[64]; f16 d; f16 dmin}: element i has 2 bits at
// shift 2*((i%128)/32) of qs[32*(i/128) + i%32]; scales[i/16] holds the
// 4-bit scale (low) and min (high); x = d*sc*q - dmin*m.
// Unit u: half = u/4, l0 = 16*((u/2)%2), shifts s = 2*(u%2) and s+1: qs
// bytes [32*half + l0, +16) give runs at elements 128*half + 32*s + l0 (A)
// and 32 further (B).
template <> __device__ __forceinline__ void unit<T_Q2_K>(const u8 *b, int u, Unit &w)
{
    int half = u >> 2, lh = (u >> 1) & 1, s = 2 * (u & 1);
    float d = h2f(ld16(b + 80)), dmin = h2f(ld16(b + 82));
    u32 qs[4];
    ld128<4>(b + 16 + 32 * half + 16 * lh, qs);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 q = qs[i];
        w.qa[i] = (q >> (2 * s)) & 0x03030303u;
        w.qb[i] = (q >> (2 * s + 2)) & 0x03030303u;
    }
    int ja = 8 * half + 2 * s + lh; // scale index = first element / 16
    int sca = b[ja], scb = b[ja + 2];
    w.sa = d * (float)(sca & 0xF);
    w.sb = d * (float)(scb & 0xF);
    w.ma = -dmin * (float)(sca >> 4);
    w.mb = -dmin * (float)(scb >> 4);
    w.ea = 16 * ja;
    w.eb = 16 * ja + 32;
}

// Q3_K {u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d}: low 2 bits as Q2_K,
// bit i/32 of hmask[i%32] is the third bit (clear means -4): x = d*sc*(q-4).
template <> __device__ __forceinline__ void unit<T_Q3_K>(const u8 *b, int u, Unit &w)
{
    int half = u >> 2, lh = (u >> 1) & 1, s = 2 * (u & 1);
    float d = h2f(ld16(b + 108));
    u32 qs[4], hm[4];
    ld128<2>(b + 32 + 32 * half + 16 * lh, qs);
    ld128<2>(b + 16 * lh, hm);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 q = qs[i], h = hm[i];
        int bit = 4 * half + s;
        w.qa[i] = SUB8(((q >> (2 * s)) & 0x03030303u) | (((h >> bit) & 0x01010101u) << 2), 4);
        w.qb[i] = SUB8(((q >> (2 * s + 2)) & 0x03030303u) | (((h >> (bit + 1)) & 0x01010101u) << 2), 4);
    }
    int ja = 8 * half + 2 * s + lh;
    w.sa = d * (float)scale_q3k(ja, b + 96);
    w.sb = d * (float)scale_q3k(ja + 2, b + 96);
    w.ma = w.mb = 0.f;
    w.ea = 16 * ja;
    w.eb = 16 * ja + 32;
}

// Q4_K/Q5_K scales and mins of sub-blocks 2g and 2g+1 from the three
// words of scale bytes (s0 = bytes 0-3, s1 = 4-7, s2 = 8-11): all eight
// 6-bit scales and mins are assembled as bytes of four words (sub-block j
// is byte j of lo:hi), then one byte permute picks the lane's pair, so
// lanes with different g run the same instructions.
__device__ __forceinline__ void scale_min_k4_pair(int g, u32 s0, u32 s1, u32 s2, int &sc1, int &m1, int &sc2, int &m2)
{
    const u32 sc_lo = s0 & 0x3F3F3F3Fu;                                      // scales 0-3
    const u32 m_lo = s1 & 0x3F3F3F3Fu;                                       // mins 0-3
    const u32 sc_hi = (s2 & 0x0F0F0F0Fu) | ((s0 >> 2) & 0x30303030u);        // scales 4-7
    const u32 m_hi = ((s2 >> 4) & 0x0F0F0F0Fu) | ((s1 >> 2) & 0x30303030u);  // mins 4-7
    const u32 sel = (u32)(2 * g) | ((u32)(2 * g + 1) << 4); // result bytes 0, 1
    const u32 sc = __byte_perm(sc_lo, sc_hi, sel), m = __byte_perm(m_lo, m_hi, sel);
    sc1 = sc & 0xFF;
    sc2 = (sc >> 8) & 0xFF;
    m1 = m & 0xFF;
    m2 = (m >> 8) & 0xFF;
}

// Q4_K {f16 d; f16 dmin; u8 scales[12]; u8 qs[128]}: 64-element groups g;
// qs[32g + l] holds element 64g+l (low nibble, sub-block 2g) and 64g+32+l
// (high, sub-block 2g+1); x = d*sc*q - dmin*m. Unit u: g = u/2, h = u%2:
// qs bytes [32g + 16h, +16). The lane with h == 0 adds the min terms of
// both sub-blocks, which are whole activation blocks.
// Q5_K {f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]}: Q4_K plus
// a fifth bit: bit 2g of qh[l] for element 64g+l, bit 2g+1 for 64g+32+l;
// the unit's qh bytes are [16h, +16).
// unit_k4 decodes from the block's first 16 bytes (hdr: d, dmin, scales),
// the unit's 16 quant bytes and (Q5_K) its 16 qh bytes.
template <int T>
__device__ __forceinline__ void unit_k4(const uint4 &hdr, const uint4 &q, const uint4 &qh, int u, Unit &w)
{
    const int g = u >> 1, h = u & 1;
    const float d = h2f((u16)hdr.x), dmin = h2f((u16)(hdr.x >> 16));
    const u32 qq[4] = {q.x, q.y, q.z, q.w};
    const u32 hh[4] = {qh.x, qh.y, qh.z, qh.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        w.qa[i] = qq[i] & 0x0F0F0F0Fu;
        w.qb[i] = (qq[i] >> 4) & 0x0F0F0F0Fu;
        if (T == T_Q5_K) {
            w.qa[i] |= ((hh[i] >> (2 * g)) & 0x01010101u) << 4;
            w.qb[i] |= ((hh[i] >> (2 * g + 1)) & 0x01010101u) << 4;
        }
    }
    int sc1, m1, sc2, m2;
    scale_min_k4_pair(g, hdr.y, hdr.z, hdr.w, sc1, m1, sc2, m2);
    w.sa = d * (float)sc1;
    w.sb = d * (float)sc2;
    w.ma = h ? 0.f : -dmin * (float)m1;
    w.mb = h ? 0.f : -dmin * (float)m2;
    w.ea = 64 * g + 16 * h;
    w.eb = 64 * g + 32 + 16 * h;
}

// Byte offsets in a Q4_K/Q5_K block of unit u's quants and (Q5_K) qh.
template <int T> __device__ __forceinline__ int k4_qs_off(int u) { return (T == T_Q5_K ? 48 : 16) + 32 * (u >> 1) + 16 * (u & 1); }
__device__ __forceinline__ int k4_qh_off(int u) { return 16 + 16 * (u & 1); }

template <> __device__ __forceinline__ void unit<T_Q4_K>(const u8 *b, int u, Unit &w)
{
    unit_k4<T_Q4_K>(*(const uint4 *)b, *(const uint4 *)(b + k4_qs_off<T_Q4_K>(u)), make_uint4(0, 0, 0, 0), u, w);
}

template <> __device__ __forceinline__ void unit<T_Q5_K>(const u8 *b, int u, Unit &w)
{
    unit_k4<T_Q5_K>(*(const uint4 *)b, *(const uint4 *)(b + k4_qs_off<T_Q5_K>(u)), *(const uint4 *)(b + k4_qh_off(u)), u, w);
}

// Q6_K {u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d}: two 128-element
// halves; in half h2, ql[64h2 + l] holds elements l (low nibble) and l+64
// (high), ql[64h2 + l+32] elements l+32 and l+96, qh[32h2 + l] their top 2
// bits (bits 0-1, 2-3, 4-5, 6-7 for l, l+32, l+64, l+96); element l+32k
// has scale scales[8h2 + l/16 + 2k]; x = d*sc*(q-32).
// Unit u: h2 = u/4, l0 = 16*((u/2)%2), p = u%2: ql bytes [l0 + 32p, +16)
// give run A (elements l0+32p.., k = p) and run B (+64, k = p+2).
template <> __device__ __forceinline__ void unit<T_Q6_K>(const u8 *b, int u, Unit &w)
{
    int h2 = u >> 2, lseg = (u >> 1) & 1, p = u & 1;
    int l0 = 16 * lseg;
    float d = h2f(ld16(b + 208));
    u32 qls[4], qhs[4];
    ld128<2>(b + 64 * h2 + l0 + 32 * p, qls);
    ld128<2>(b + 128 + 32 * h2 + l0, qhs);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        u32 ql = qls[i], qh = qhs[i];
        w.qa[i] = SUB8((ql & 0x0F0F0F0Fu) | (((qh >> (2 * p)) & 0x03030303u) << 4), 32);
        w.qb[i] = SUB8(((ql >> 4) & 0x0F0F0F0Fu) | (((qh >> (4 + 2 * p)) & 0x03030303u) << 4), 32);
    }
    const i8 *sc = (const i8 *)(b + 192 + 8 * h2 + lseg);
    w.sa = d * (float)sc[2 * p];
    w.sb = d * (float)sc[4 + 2 * p];
    w.ma = w.mb = 0.f;
    w.ea = 128 * h2 + l0 + 32 * p;
    w.eb = w.ea + 64;
}

// The unit's dot product with one token's activations: a and bq the int8
// activations of runs A and B, dsa and dsb their blocks' {d, d*sum}.
template <int T>
__device__ __forceinline__ float unit_dot(const Unit &w, const uint4 &a, const uint4 &bq, float2 dsa, float2 dsb)
{
    int ia = __dp4a((int)w.qa[0], (int)a.x, 0);
    ia = __dp4a((int)w.qa[1], (int)a.y, ia);
    ia = __dp4a((int)w.qa[2], (int)a.z, ia);
    ia = __dp4a((int)w.qa[3], (int)a.w, ia);
    int ib = __dp4a((int)w.qb[0], (int)bq.x, 0);
    ib = __dp4a((int)w.qb[1], (int)bq.y, ib);
    ib = __dp4a((int)w.qb[2], (int)bq.z, ib);
    ib = __dp4a((int)w.qb[3], (int)bq.w, ib);
    float r = w.sa * dsa.x * (float)ia + w.sb * dsb.x * (float)ib;
    if (Fmt<T>::MIN == MIN_S32) {
        r += w.ma * dsa.y + w.mb * dsb.y;
    } else if (Fmt<T>::MIN == MIN_S16) {
        const int one = 0x01010101;
        int sa = __dp4a(one, (int)a.x, __dp4a(one, (int)a.y, __dp4a(one, (int)a.z, __dp4a(one, (int)a.w, 0))));
        int sb = __dp4a(one, (int)bq.x, __dp4a(one, (int)bq.y, __dp4a(one, (int)bq.z, __dp4a(one, (int)bq.w, 0))));
        r += w.ma * dsa.x * (float)sa + w.mb * dsb.x * (float)sb;
    }
    return r;
}

// unit_dot2 is unit_dot of one token's activations in two planes: a, bq
// the first plane's runs, a2, bq2 the second's, ds2a, ds2b the second
// plane's {d2, d2*sum}. The second plane's step is the first's / 254
// (q8_1_residual), so the planes' integer sums add, the first's times
// 254, before the scales multiply them: one weight decode and one set of
// float products serve both planes. |254*ia + ia2| < 2^27 for int8
// weights.
template <int T>
__device__ __forceinline__ float unit_dot2(const Unit &w, const uint4 &a, const uint4 &bq, const uint4 &a2,
                                           const uint4 &bq2, float2 dsa, float2 dsb, float2 ds2a, float2 ds2b)
{
    int ia = __dp4a((int)w.qa[0], (int)a.x, 0);
    ia = __dp4a((int)w.qa[1], (int)a.y, ia);
    ia = __dp4a((int)w.qa[2], (int)a.z, ia);
    ia = __dp4a((int)w.qa[3], (int)a.w, ia);
    int ia2 = __dp4a((int)w.qa[0], (int)a2.x, 0);
    ia2 = __dp4a((int)w.qa[1], (int)a2.y, ia2);
    ia2 = __dp4a((int)w.qa[2], (int)a2.z, ia2);
    ia2 = __dp4a((int)w.qa[3], (int)a2.w, ia2);
    int ib = __dp4a((int)w.qb[0], (int)bq.x, 0);
    ib = __dp4a((int)w.qb[1], (int)bq.y, ib);
    ib = __dp4a((int)w.qb[2], (int)bq.z, ib);
    ib = __dp4a((int)w.qb[3], (int)bq.w, ib);
    int ib2 = __dp4a((int)w.qb[0], (int)bq2.x, 0);
    ib2 = __dp4a((int)w.qb[1], (int)bq2.y, ib2);
    ib2 = __dp4a((int)w.qb[2], (int)bq2.z, ib2);
    ib2 = __dp4a((int)w.qb[3], (int)bq2.w, ib2);
    float r = w.sa * ds2a.x * (float)(254 * ia + ia2) + w.sb * ds2b.x * (float)(254 * ib + ib2);
    if (Fmt<T>::MIN == MIN_S32) {
        r += w.ma * (dsa.y + ds2a.y) + w.mb * (dsb.y + ds2b.y);
    } else if (Fmt<T>::MIN == MIN_S16) {
        const int one = 0x01010101;
        int sa = __dp4a(one, (int)a.x, __dp4a(one, (int)a.y, __dp4a(one, (int)a.z, __dp4a(one, (int)a.w, 0))));
        int sb = __dp4a(one, (int)bq.x, __dp4a(one, (int)bq.y, __dp4a(one, (int)bq.z, __dp4a(one, (int)bq.w, 0))));
        int sa2 = __dp4a(one, (int)a2.x, __dp4a(one, (int)a2.y, __dp4a(one, (int)a2.z, __dp4a(one, (int)a2.w, 0))));
        int sb2 = __dp4a(one, (int)bq2.x, __dp4a(one, (int)bq2.y, __dp4a(one, (int)bq2.z, __dp4a(one, (int)bq2.w, 0))));
        r += w.ma * ds2a.x * (float)(254 * sa + sa2) + w.mb * ds2b.x * (float)(254 * sb + sb2);
    }
    return r;
}

// ---------------------------------------------------------------- the driver

// Shared-memory stage of one chunk of one row: up to SV 16-byte vectors,
// VPL of them loaded per lane.
template <int CBYTES> struct Stage {
    enum { SV = CBYTES / 16 + 2, VPL = (CBYTES / 16 + 2 + 31) / 32 };
};

// Issues the loads of the aligned span covering bytes [off, off+len) of the
// row at rp into v (this lane's share) and returns the span's misalignment.
// The span may extend up to 15 bytes past the row (and past the matrix)
// within its last 16-byte granule, which never crosses a page.
template <int VPL>
__device__ __forceinline__ int stage_load(const u8 *rp, long long off, int len, int lane, uint4 *v, int &nvec)
{
    unsigned long long a = (unsigned long long)(rp + off);
    unsigned long long a0 = a & ~15ull;
    nvec = (int)((a + len + 15 - a0) >> 4);
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        int j = lane + 32 * i;
        if (j < nvec)
            v[i] = ldg16((const void *)(a0 + 16ull * j));
    }
    return (int)(a - a0);
}

template <int VPL>
__device__ __forceinline__ void stage_store(uint4 *st, const uint4 *v, int nvec, int lane)
{
#pragma unroll
    for (int i = 0; i < VPL; i++) {
        int j = lane + 32 * i;
        if (j < nvec)
            st[j] = v[i];
    }
}

// A further matrix of a launch: products of the same input, weight type
// and width (Q, K and V; an MoE layer's gate and up stacks) share one
// launch, each owning a range of blockIdx.x from bx0 on.
struct MvMember {
    const u8 *W;
    float *out;
    long long rowBytes, ldOut, expertBytes;
    int rows, bx0;
};

// The launch parameters every matvec kernel takes.
struct MvArgs {
    const u8 *W;          // weights (16-byte aligned), or the expert stack
    long long rowBytes;   // bytes per weight row
    int rows, cols;       // of one matrix
    int ks;               // warps per row group: 1, 2 or 4
    int planeRows;        // 0, or two planes: act_row
    const i8 *xq;         // Q8_1 activations (integer kernels)
    const float2 *xds;    //   their block scales
    const float *x;       // f32 activations (float kernels)
    long long ldx;        //   their row stride in values
    int ntok;             // tokens (<= NTOK)
    float *out;           // out[(p + t) * ldOut + row]
    long long ldOut;
    const int *ids;       // MoE: expert of problem blockIdx.y, else NULL
    long long expertBytes;
    int actDiv;           // activation row of problem p: p / actDiv
    int nextra;           // further matrices in this launch (0..2), below
    MvMember m[2];
};

// act_row is the activation row of token t of a launch (past ntok, the
// last). With two planes (planeRows > 0: Q8_1 activations held as a block
// of int8 and the int8 rounding of its residual, whose products sum to
// nearly the product of the unrounded values) a launch's ntok tokens are
// its ntok/2 rows' first planes, then their second planes, planeRows rows
// on; mv_store and mvt_drive add each row's two sums.
__device__ __forceinline__ int act_row(int ntok, int planeRows, int t)
{
    t = min(t, ntok - 1);
    if (planeRows == 0)
        return t;
    const int half = ntok >> 1;
    return t < half ? t : planeRows + t - half;
}

// unit_dot_at dots the unit with the activations of row row and, with
// P2, that row's second plane planeRows rows on, at elements ea and eb.
template <int T, bool P2>
__device__ __forceinline__ float unit_dot_at(const Unit &w, const MvArgs &a, long long row, int ea, int eb)
{
    const int ncols32 = a.cols >> 5;
    const i8 *q = a.xq + row * a.cols;
    const float2 *ds = a.xds + row * ncols32;
    const uint4 qa = *(const uint4 *)(q + ea);
    const uint4 qb = *(const uint4 *)(q + eb);
    const float2 dsa = ds[ea >> 5], dsb = ds[eb >> 5];
    if (!P2)
        return unit_dot<T>(w, qa, qb, dsa, dsb);
    const long long off = (long long)a.planeRows * a.cols;
    const uint4 qa2 = *(const uint4 *)(q + off + ea);
    const uint4 qb2 = *(const uint4 *)(q + off + eb);
    const float2 *ds2 = ds + (long long)a.planeRows * ncols32;
    return unit_dot2<T>(w, qa, qb, qa2, qb2, dsa, dsb, ds2[ea >> 5], ds2[eb >> 5]);
}

// MvMat is the matrix a block works on: member 0 (MvArgs's own fields) for
// blockIdx.x below m[0].bx0, else the last extra member whose bx0 it
// reaches; bx is the block's index within that matrix. Scalars, not a
// copy of MvArgs: a local copy of the struct would live in local memory.
struct MvMat {
    const u8 *W;
    float *out;
    long long rowBytes, ldOut, expertBytes;
    int rows, bx;
};

__device__ __forceinline__ MvMat mv_member(const MvArgs &a)
{
    const int bx = blockIdx.x;
    MvMat m = {a.W, a.out, a.rowBytes, a.ldOut, a.expertBytes, a.rows, bx};
    if (a.nextra > 1 && bx >= a.m[1].bx0) {
        m = {a.m[1].W, a.m[1].out, a.m[1].rowBytes, a.m[1].ldOut, a.m[1].expertBytes, a.m[1].rows, bx - a.m[1].bx0};
    } else if (a.nextra > 0 && bx >= a.m[0].bx0) {
        m = {a.m[0].W, a.m[0].out, a.m[0].rowBytes, a.m[0].ldOut, a.m[0].expertBytes, a.m[0].rows, bx - a.m[0].bx0};
    }
    return m;
}

// Reduces the R x NTOK sums over the warp, then over the ks warps of the
// row group (through red), and writes them: out[(p + t) * ldOut + row].
// PLANES: the kernel may take two planes (the integer kernels of two
// tokens and more; see act_row).
template <int NTOK, int R, bool PLANES>
__device__ __forceinline__ void mv_store(const MvArgs &a, const MvMat &mm, float *acc, float (*red)[R * NTOK], int row0, int p)
{
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, kw = warp % a.ks;
#pragma unroll
    for (int k = 0; k < R * NTOK; k++) {
        float s = acc[k];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            s += __shfl_xor_sync(0xffffffffu, s, o);
        acc[k] = s;
    }
    if (lane == 0) {
#pragma unroll
        for (int k = 0; k < R * NTOK; k++)
            red[warp][k] = acc[k];
    }
    __syncthreads();
    if (kw == 0 && lane < R * NTOK) {
        const int r = lane / NTOK, t = lane % NTOK;
        const int nout = PLANES && a.planeRows ? a.ntok >> 1 : a.ntok; // see act_row
        if (row0 + r < mm.rows && t < nout) {
            float s = 0.f;
            for (int w = warp; w < warp + a.ks; w++)
                s += red[w][lane];
            if (PLANES && a.planeRows) {
                float s2 = 0.f;
                for (int w = warp; w < warp + a.ks; w++)
                    s2 += red[w][lane + nout];
                s += s2;
            }
            mm.out[(long long)(p + t) * mm.ldOut + row0 + r] = s;
        }
    }
}

// Runs the staging pipeline over the chunks of the row group's R rows and
// calls op.chunk(stage rows, misalignments, chunk index, lane, acc) for
// each chunk the warp owns; then reduces and writes the R x NTOK results.
template <class Op, int NTOK, int R>
__device__ __forceinline__ void mv_drive(const MvArgs &a0)
{
    const MvArgs &a = a0;
    const MvMat mm = mv_member(a);
    const int bx = mm.bx;
    typedef Stage<Op::CBYTES> S;
    __shared__ uint4 stage[MV_WARPS][R][S::SV];
    __shared__ float red[MV_WARPS][R * NTOK];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ks = a.ks, rg = warp / ks, kw = warp % ks;
    const int p = blockIdx.y;
    const u8 *Wp = mm.W + (a.ids ? (long long)a.ids[p] * mm.expertBytes : 0ll);
    const int row0 = (bx * (MV_WARPS / ks) + rg) * R;
    const int nchunk = Op::nchunk(a);

    const u8 *rp[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        rp[r] = Wp + (long long)min(row0 + r, mm.rows - 1) * mm.rowBytes;

    float acc[R * NTOK];
#pragma unroll
    for (int k = 0; k < R * NTOK; k++)
        acc[k] = 0.f;

    uint4 v[R][S::VPL];
    int nvec[R], mis[R];
    int c = kw;
    if (c < nchunk) {
#pragma unroll
        for (int r = 0; r < R; r++)
            mis[r] = stage_load<S::VPL>(rp[r], (long long)c * Op::CBYTES,
                                        (int)min((long long)Op::CBYTES, mm.rowBytes - (long long)c * Op::CBYTES), lane,
                                        v[r], nvec[r]);
    }
    for (; c < nchunk; c += ks) {
        int cmis[R];
        __syncwarp();
#pragma unroll
        for (int r = 0; r < R; r++) {
            stage_store<S::VPL>(stage[warp][r], v[r], nvec[r], lane);
            cmis[r] = mis[r];
        }
        __syncwarp();
        const int cn = c + ks;
        if (cn < nchunk) {
#pragma unroll
            for (int r = 0; r < R; r++)
                mis[r] = stage_load<S::VPL>(rp[r], (long long)cn * Op::CBYTES,
                                            (int)min((long long)Op::CBYTES, mm.rowBytes - (long long)cn * Op::CBYTES),
                                            lane, v[r], nvec[r]);
        }
        const u8 *st[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            st[r] = (const u8 *)stage[warp][r] + cmis[r];
        Op::template chunk<NTOK, R>(a, st, c, lane, p / a.actDiv, acc);
    }

    mv_store<NTOK, R, NTOK >= 2 && Op::PLANES>(a, mm, acc, red, row0, p);
}

// ---------------------------------------------------------------- integer chunks

// P2: tokens in two planes whose integer sums add (unit_dot2), the
// kernels mv_<type>_<ntok>p; without it, two planes are two tokens.
template <int T, bool P2 = false> struct QuantOp {
    enum { BV = Fmt<T>::BV, BB = Fmt<T>::BB, CB = CHUNK / BV, UPB = BV / 32, CBYTES = CB * BB, PLANES = !P2 };

    static __device__ __forceinline__ int nchunk(const MvArgs &a) { return (a.cols / BV + CB - 1) / CB; }

    // Lane's unit of chunk c for each of the R rows, dotted with NTOK tokens.
    template <int NTOK, int R>
    static __device__ __forceinline__ void chunk(const MvArgs &a, const u8 *const *st, int c, int lane, int act0,
                                                 float *acc)
    {
        const int b = lane / UPB, u = lane % UPB;
        const int blk = c * CB + b;
        if (blk * BV >= a.cols)
            return;
        Unit w[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            unit<T>(st[r] + b * BB, u, w[r]);
        const int ea = blk * BV + w[0].ea, eb = blk * BV + w[0].eb;
        if (P2) {
#pragma unroll
            for (int t = 0; t < NTOK; t++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r * NTOK + t] += unit_dot_at<T, true>(w[r], a, act0 + min(t, a.ntok - 1), ea, eb);
        }
        const int ncols32 = a.cols >> 5;
#pragma unroll
        for (int t = 0; t < (P2 ? 0 : NTOK); t++) {
            const long long row = act0 + (NTOK == 1 ? 0 : act_row(a.ntok, a.planeRows, t));
            const i8 *q = a.xq + row * a.cols;
            const float2 *ds = a.xds + row * ncols32;
            const uint4 qa = *(const uint4 *)(q + ea);
            const uint4 qb = *(const uint4 *)(q + eb);
            const float2 dsa = ds[ea >> 5], dsb = ds[eb >> 5];
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r * NTOK + t] += unit_dot<T>(w[r], qa, qb, dsa, dsb);
        }
    }
};

// ---------------------------------------------------------------- direct Q4_K / Q5_K

// Q4_K and Q5_K blocks (144 and 176 bytes) are 16-byte aligned, so they
// skip the stage: lane l of a warp reads its unit (block l/8 of the chunk,
// unit l%8) straight from global memory, the block header and 16 quant
// bytes (plus 16 qh bytes for Q5_K) as 16-byte loads (the 8 lanes of a
// block read 128 contiguous quant bytes), and the loads of the warp's next
// chunk are issued before the current one is decoded.
struct K4Regs {
    uint4 hdr, qs, qh;
};

template <int T, int NTOK, int R, bool P2 = false>
__device__ __forceinline__ void mv_direct_k4(const MvArgs &a0)
{
    const MvArgs &a = a0;
    const MvMat mm = mv_member(a);
    const int bx = mm.bx;
    enum { BB = Fmt<T>::BB, CB = 4 };
    __shared__ float red[MV_WARPS][R * NTOK];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ks = a.ks, rg = warp / ks, kw = warp % ks;
    const int p = blockIdx.y;
    const u8 *Wp = mm.W + (a.ids ? (long long)a.ids[p] * mm.expertBytes : 0ll);
    const int row0 = (bx * (MV_WARPS / ks) + rg) * R;
    const int nblk = a.cols >> 8, nchunk = (nblk + CB - 1) / CB;
    const int b = lane >> 3, u = lane & 7;
    const int qsOff = k4_qs_off<T>(u), qhOff = k4_qh_off(u);
    const int act0 = p / a.actDiv, ncols32 = a.cols >> 5;

    const u8 *rp[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        rp[r] = Wp + (long long)min(row0 + r, mm.rows - 1) * mm.rowBytes;

    float acc[R * NTOK];
#pragma unroll
    for (int k = 0; k < R * NTOK; k++)
        acc[k] = 0.f;

    auto load = [&](int c, K4Regs *k) {
        const int blk = c * CB + b;
        if (blk < nblk) {
#pragma unroll
            for (int r = 0; r < R; r++) {
                const u8 *bp = rp[r] + (long long)blk * BB;
                k[r].hdr = ldg16(bp);
                k[r].qs = ldg16(bp + qsOff);
                k[r].qh = T == T_Q5_K ? ldg16(bp + qhOff) : make_uint4(0, 0, 0, 0);
            }
        }
    };
    auto compute = [&](int c, const K4Regs *k) {
        const int blk = c * CB + b;
        if (blk >= nblk)
            return;
        Unit w[R];
#pragma unroll
        for (int r = 0; r < R; r++)
            unit_k4<T>(k[r].hdr, k[r].qs, k[r].qh, u, w[r]);
        const int ea = blk * 256 + w[0].ea, eb = blk * 256 + w[0].eb;
        if (P2) {
#pragma unroll
            for (int t = 0; t < NTOK; t++)
#pragma unroll
                for (int r = 0; r < R; r++)
                    acc[r * NTOK + t] += unit_dot_at<T, true>(w[r], a, act0 + min(t, a.ntok - 1), ea, eb);
        }
#pragma unroll
        for (int t = 0; t < (P2 ? 0 : NTOK); t++) {
            const long long row = act0 + (NTOK == 1 ? 0 : act_row(a.ntok, a.planeRows, t));
            const i8 *q = a.xq + row * a.cols;
            const float2 *ds = a.xds + row * ncols32;
            const uint4 qa = *(const uint4 *)(q + ea);
            const uint4 qb = *(const uint4 *)(q + eb);
            const float2 dsa = ds[ea >> 5], dsb = ds[eb >> 5];
#pragma unroll
            for (int r = 0; r < R; r++)
                acc[r * NTOK + t] += unit_dot<T>(w[r], qa, qb, dsa, dsb);
        }
    };
    // Two register sets in turn (no copies between iterations: a copy of
    // a register with a load in flight would wait for the load).
    K4Regs ra[R], rb[R];
    int c = kw;
    if (c < nchunk)
        load(c, ra);
    for (; c < nchunk; c += 2 * ks) {
        if (c + ks < nchunk)
            load(c + ks, rb);
        compute(c, ra);
        if (c + ks >= nchunk)
            break;
        if (c + 2 * ks < nchunk)
            load(c + 2 * ks, ra);
        compute(c + ks, rb);
    }
    mv_store<NTOK, R, NTOK >= 2 && !P2>(a, mm, acc, red, row0, p);
}

// ---------------------------------------------------------------- float chunks

// F32/F16/BF16 weights times f32 activations. Chunks of FCV values (1 KiB
// of weights); lane l takes the 8-value pieces at 8l + 256i.
template <int T> struct FFmt;
template <> struct FFmt<T_F32> { enum { ES = 4, FCV = 256 }; };
template <> struct FFmt<T_F16> { enum { ES = 2, FCV = 512 }; };
template <> struct FFmt<T_BF16> { enum { ES = 2, FCV = 512 }; };

// Eight weights starting at byte p of the stage (2-aligned; 4 for F32).
template <int T> __device__ __forceinline__ void fdecode8(const u8 *p, float *w)
{
    if (T == T_F32) {
#pragma unroll
        for (int i = 0; i < 8; i++)
            w[i] = __uint_as_float(ld32<4>(p + 4 * i));
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) {
            u16 h = ld16(p + 2 * i);
            w[i] = T == T_F16 ? h2f(h) : bf2f(h);
        }
    }
}

template <int T> struct FloatOp {
    enum { ES = FFmt<T>::ES, FCV = FFmt<T>::FCV, CBYTES = FCV * ES, PIECES = FCV / 256, PLANES = 0 };

    static __device__ __forceinline__ int nchunk(const MvArgs &a) { return (a.cols + FCV - 1) / FCV; }

    template <int NTOK, int R>
    static __device__ __forceinline__ void chunk(const MvArgs &a, const u8 *const *st, int c, int lane, int act0,
                                                 float *acc)
    {
        const bool vec = ((a.ldx | (long long)a.cols) & 3) == 0 && (((unsigned long long)a.x) & 15) == 0;
#pragma unroll
        for (int pc = 0; pc < PIECES; pc++) {
            const int li = 8 * lane + 256 * pc; // value index within the chunk
            const int e0 = c * FCV + li;        // within the row
            if (e0 >= a.cols)
                continue;
            const int n = min(8, a.cols - e0);
            float w[R][8];
#pragma unroll
            for (int r = 0; r < R; r++) {
                fdecode8<T>(st[r] + li * ES, w[r]);
#pragma unroll
                for (int i = 0; i < 8; i++)
                    if (i >= n)
                        w[r][i] = 0.f;
            }
#pragma unroll
            for (int t = 0; t < NTOK; t++) {
                const float *xr = a.x + (long long)(act0 + min(t, a.ntok - 1)) * a.ldx + e0;
                float x[8];
                if (vec && n == 8) {
                    const float4 x0 = __ldg((const float4 *)xr), x1 = __ldg((const float4 *)xr + 1);
                    x[0] = x0.x; x[1] = x0.y; x[2] = x0.z; x[3] = x0.w;
                    x[4] = x1.x; x[5] = x1.y; x[6] = x1.z; x[7] = x1.w;
                } else {
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        x[i] = i < n ? __ldg(xr + i) : 0.f;
                }
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float s = acc[r * NTOK + t];
#pragma unroll
                    for (int i = 0; i < 8; i++)
                        s = fmaf(w[r][i], x[i], s);
                    acc[r * NTOK + t] = s;
                }
            }
        }
    }
};

// ---------------------------------------------------------------- decode rows on the tensor cores

// mvt_<type>_<NT>, mvt2_<type>_<NT>: the Q8_1 product for 4 to 32 tokens
// (decode rows of many sequences) on the integer tensor cores, one launch
// reading each weight once. The matvec's dp4a kernels reload every
// token's activations for each weight unit, so their cost grows with the
// tokens; here a warp multiplies MT 16-row tiles of weights (mvt_: 1,
// mvt2_: 2) by NF fragments of 8 tokens with mma.sync (s8 x s8 -> s32,
// exact), one MMA per scale group of the weight format, and applies the
// scales in float32 per group as unit_dot does.
//
// A CTA of MVT_WARPS warps forms MVT_WARPS/ks groups of ks warps (ks = 1,
// 2 or 4, the launcher's choice); a group owns MT 16-row tiles, its warps
// take every ks-th super-block of K and sum through shared memory at the
// end. Lane (g, t) = (lane/4, lane%4) holds, per the PTX fragment
// layouts, rows g and g+8 of A and token g of each B fragment, and the
// sums of rows g, g+8 by tokens 2t, 2t+1. A dot product does not depend
// on the order of its K terms, so each MMA's K is permuted to give a
// thread contiguous bytes: in a group of 32 (m16n8k32), thread t takes
// values 8t..8t+7 (the fragments' columns 4t..4t+3 and 16+4t..16+4t+3);
// in a group of 16 (m16n8k16), values 4t..4t+3. Weights and activations
// use the same permutation. CC 8.0 and later; the launcher keeps older
// GPUs on matvec.
#define MVT_WARPS 4

__device__ __forceinline__ void mma_s8_k32(int *c, u32 a0, u32 a1, u32 a2, u32 a3, u32 b0, u32 b1)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%10,%10,%10,%10};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "r"(0));
#else
    __trap(); // the launcher never runs mvt_ before CC 8.0 (WeightOps.mvtUse)
#endif
}

__device__ __forceinline__ void mma_s8_k16(int *c, u32 a0, u32 a1, u32 b0)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5}, {%6}, {%7,%7,%7,%7};"
                 : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0), "r"(0));
#else
    __trap();
#endif
}

// A 32-bit little-endian load from an address that is at least 2-aligned
// (Q6_K blocks are 210 bytes).
__device__ __forceinline__ u32 ldg32a2(const u8 *p)
{
    if ((((unsigned long long)p) & 3) == 0)
        return __ldg((const unsigned int *)p);
    const unsigned short *h = (const unsigned short *)p;
    return (u32)__ldg(h) | ((u32)__ldg(h + 1) << 16);
}

// A warp's activations of one super-block, staged in shared memory: the
// B fragments read the int8 values from there. Read from global memory
// they cost one L1 wavefront per token and fragment row (8 tokens, 8
// lines an instruction), and the L1 bounded the kernels (ncu: 85% busy,
// DRAM 29%); staged, each token's 256 bytes load as two whole lines. P is
// the row pitch in bytes: 256 plus a pad that keeps the B reads free of
// bank conflicts (288 for Q4_K's 8-byte reads, 272 for Q6_K's 4-byte ones).
// The block scales {d, d*sum} of the C tokens (f*8 + 2t, +1) load from
// global memory, as int offsets (to spare registers).
template <int NF, int P> struct MvtAct {
    const i8 *xq;
    const float2 *xds;
    u8 *stg; // the warp's stage: NF*8 rows of P bytes
    int ntok, planeRows, cols, g;
    int ds[NF][2];

    __device__ __forceinline__ MvtAct(const MvArgs &a, u8 *stage, int g_, int t)
        : xq(a.xq), xds(a.xds), stg(stage), ntok(a.ntok), planeRows(a.planeRows), cols(a.cols), g(g_)
    {
        const int ncols32 = a.cols >> 5;
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < 2; i++)
                ds[f][i] = act_row(a.ntok, a.planeRows, 8 * f + 2 * t + i) * ncols32;
    }
    // Stages super-block sb of every token: 16 bytes a lane, a token's 256
    // bytes by 16 lanes (tokens past ntok repeat the last).
    __device__ __forceinline__ void stage(int sb, int lane) const
    {
        const int h = lane >> 4, off = 16 * (lane & 15);
#pragma unroll
        for (int f = 0; f < NF; f++) {
            uint4 v[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int tok = act_row(ntok, planeRows, 8 * f + 2 * i + h);
                v[i] = ldg16(xq + (long long)tok * cols + sb * 256 + off);
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
                *(uint4 *)(stg + (8 * f + 2 * i + h) * P + off) = v[i];
        }
    }
    // Fragment f's B bytes at value e of the staged super-block.
    __device__ __forceinline__ const u8 *bq(int f, int e) const { return stg + (8 * f + g) * P + (e & 255); }
    // The scales of blocks e/32 and e/32+1 (e a multiple of 64) of C token
    // i of fragment f: one 16-byte load.
    __device__ __forceinline__ float4 s2(int f, int i, int e) const
    {
        return __ldg((const float4 *)(xds + ds[f][i] + (e >> 5)));
    }
};

// Adds one MMA's integer sums c (rows g, g+8 by tokens 2t, 2t+1) to acc
// with the rows' scales ws and min terms wm (MIN: Q4_K's dmin*m, times the
// block's d*sum) and the tokens' block scales s0, s1 ({d, d*sum}).
template <bool MIN>
__device__ __forceinline__ void mvt_acc(float *acc, const int *c, float ws0, float ws1, float wm0, float wm1,
                                        float s0d, float s0s, float s1d, float s1s)
{
    acc[0] += ws0 * (s0d * (float)c[0]);
    acc[1] += ws0 * (s1d * (float)c[1]);
    acc[2] += ws1 * (s0d * (float)c[2]);
    acc[3] += ws1 * (s1d * (float)c[3]);
    if (MIN) {
        acc[0] -= wm0 * s0s;
        acc[1] -= wm0 * s1s;
        acc[2] -= wm1 * s0s;
        acc[3] -= wm1 * s1s;
    }
}

// Q4_K super-block sb of the warp's MT 16-row tiles (rows g and g+8 of
// tile m at p[2m], p[2m+1]): eight groups of 32 with one scale and min
// each; the quant bytes of groups 2i and 2i+1 are the low and high nibbles
// of qs[32i..32i+31]. The loads (mvt_q4_k_load) are issued before the
// activations are staged; the B fragments and scales serve the MT tiles.
template <int MT> struct MvtQ4K {
    uint4 h[2 * MT];
    uint2 q[4][2 * MT];
};

template <int MT>
__device__ __forceinline__ void mvt_q4_k_load(const u8 *const *p, int sb, int t, MvtQ4K<MT> &w)
{
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        const u8 *b = p[r] + (long long)sb * 144;
        w.h[r] = ldg16(b);
#pragma unroll
        for (int i = 0; i < 4; i++)
            w.q[i][r] = __ldg((const uint2 *)(b + 16 + 32 * i + 8 * t));
    }
}

template <int NF, int MT, int P>
__device__ __forceinline__ void mvt_q4_k(const MvtQ4K<MT> &w, int sb, int t, const MvtAct<NF, P> &x,
                                         float (*acc)[NF][4])
{
    float d[2 * MT], dm[2 * MT];
    u32 sc[2 * MT][3];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        d[r] = h2f(w.h[r].x & 0xffff), dm[r] = h2f(w.h[r].x >> 16);
        sc[r][0] = w.h[r].y, sc[r][1] = w.h[r].z, sc[r][2] = w.h[r].w;
    }
#define SCB(s, i) ((int)(((s)[(i) >> 2] >> (8 * ((i) & 3))) & 0xff))
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float ws[2][2 * MT], wm[2][2 * MT];
#pragma unroll
        for (int r = 0; r < 2 * MT; r++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = 2 * i + h;
                int scv, mnv;
                if (j < 4) {
                    scv = SCB(sc[r], j) & 63, mnv = SCB(sc[r], j + 4) & 63;
                } else {
                    scv = (SCB(sc[r], j + 4) & 0xF) | ((SCB(sc[r], j - 4) >> 6) << 4);
                    mnv = (SCB(sc[r], j + 4) >> 4) | ((SCB(sc[r], j) >> 6) << 4);
                }
                ws[h][r] = d[r] * (float)scv, wm[h][r] = dm[r] * (float)mnv;
            }
        const int e = sb * 256 + 64 * i; // first value of group 2i
#pragma unroll
        for (int f = 0; f < NF; f++) {
            const uint2 b0 = *(const uint2 *)(x.bq(f, e) + 8 * t);
            const uint2 b1 = *(const uint2 *)(x.bq(f, e + 32) + 8 * t);
            const float4 s0 = x.s2(f, 0, e), s1 = x.s2(f, 1, e);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const uint2 bq = h ? b1 : b0;
#pragma unroll
                for (int m = 0; m < MT; m++) {
                    const int sh = 4 * h;
                    const uint2 q0 = w.q[i][2 * m], q1 = w.q[i][2 * m + 1];
                    int c[4];
                    mma_s8_k32(c, (q0.x >> sh) & 0x0F0F0F0Fu, (q1.x >> sh) & 0x0F0F0F0Fu, (q0.y >> sh) & 0x0F0F0F0Fu,
                               (q1.y >> sh) & 0x0F0F0F0Fu, bq.x, bq.y);
                    if (h)
                        mvt_acc<true>(acc[m][f], c, ws[1][2 * m], ws[1][2 * m + 1], wm[1][2 * m], wm[1][2 * m + 1],
                                      s0.z, s0.w, s1.z, s1.w);
                    else
                        mvt_acc<true>(acc[m][f], c, ws[0][2 * m], ws[0][2 * m + 1], wm[0][2 * m], wm[0][2 * m + 1],
                                      s0.x, s0.y, s1.x, s1.y);
                }
            }
        }
    }
#undef SCB
}

// Q6_K super-block sb of the warp's MT tiles: sixteen groups of 16 with one
// int8 scale each. Group (hf, c, s) holds values 128hf + 32c + 16s + l (l <
// 16): the low (c < 2) or high nibble of ql[64hf + 32(c&1) + 16s + l],
// bits 2c of qh[32hf + 16s + l] above them, less 32; its scale is
// scales[8hf + 2c + s].
template <int MT> struct MvtQ6K {
    u32 sc[2 * MT][4], l[2][2][2 * MT][2], hq[2][2][2 * MT];
    float d[2 * MT];
};

template <int MT>
__device__ __forceinline__ void mvt_q6_k_load(const u8 *const *p, int sb, int t, MvtQ6K<MT> &w)
{
#pragma unroll
    for (int r = 0; r < 2 * MT; r++) {
        const u8 *b = p[r] + (long long)sb * 210;
#pragma unroll
        for (int i = 0; i < 4; i++)
            w.sc[r][i] = ldg32a2(b + 192 + 4 * i);
        w.d[r] = h2f(__ldg((const unsigned short *)(b + 208)));
#pragma unroll
        for (int hf = 0; hf < 2; hf++)
#pragma unroll
            for (int s = 0; s < 2; s++) {
                w.l[hf][s][r][0] = ldg32a2(b + 64 * hf + 16 * s + 4 * t);
                w.l[hf][s][r][1] = ldg32a2(b + 64 * hf + 32 + 16 * s + 4 * t);
                w.hq[hf][s][r] = ldg32a2(b + 128 + 32 * hf + 16 * s + 4 * t);
            }
    }
}

template <int NF, int MT, int P>
__device__ __forceinline__ void mvt_q6_k(const MvtQ6K<MT> &w, int sb, int t, const MvtAct<NF, P> &x,
                                         float (*acc)[NF][4])
{
#pragma unroll
    for (int hf = 0; hf < 2; hf++)
#pragma unroll
        for (int s = 0; s < 2; s++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const int si = 8 * hf + 2 * c + s;
                u32 a[2 * MT];
                float ws[2 * MT];
#pragma unroll
                for (int r = 0; r < 2 * MT; r++) {
                    ws[r] = w.d[r] * (float)(signed char)((w.sc[r][si >> 2] >> (8 * (si & 3))) & 0xff);
                    a[r] = __vsub4(((w.l[hf][s][r][c & 1] >> (4 * (c >> 1))) & 0x0F0F0F0Fu) |
                                       (((w.hq[hf][s][r] >> (2 * c)) & 0x03030303u) << 4),
                                   0x20202020u);
                }
                const int e = sb * 256 + 128 * hf + 32 * c + 16 * s; // first value of the group
#pragma unroll
                for (int f = 0; f < NF; f++) {
                    const u32 bq = *(const u32 *)(x.bq(f, e) + 4 * t);
                    const float2 s0 = x.xds[x.ds[f][0] + (e >> 5)], s1 = x.xds[x.ds[f][1] + (e >> 5)];
#pragma unroll
                    for (int m = 0; m < MT; m++) {
                        int cc[4];
                        mma_s8_k16(cc, a[2 * m], a[2 * m + 1], bq);
                        mvt_acc<false>(acc[m][f], cc, ws[2 * m], ws[2 * m + 1], 0.f, 0.f, s0.x, 0.f, s1.x, 0.f);
                    }
                }
            }
}

// A CTA's MVT_WARPS warps form MVT_WARPS/ks groups of ks warps; a group
// owns MT 16-row tiles and its ks warps take every ks-th super-block. Per
// super-block a warp issues its weight loads, stages the activations and
// then computes. The stage, free after the loop, holds the warps' sums.
template <int T, int NF, int MT>
__device__ __forceinline__ void mvt_drive(const MvArgs &a0)
{
    const MvArgs &a = a0;
    const MvMat mm = mv_member(a);
    enum { P = T == T_Q4_K ? 288 : 272, STAGE = NF * 8 * P };
    static_assert(STAGE >= MT * NF * 4 * 32 * 4, "the stage holds the sums");
    __shared__ __align__(16) u8 stage[MVT_WARPS][STAGE];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int ks = a.ks, rg = warp / ks, kw = warp % ks;
    const int g = lane >> 2, t = lane & 3;
    const int row0 = (mm.bx * (MVT_WARPS / ks) + rg) * 16 * MT;
    const u8 *p[2 * MT];
#pragma unroll
    for (int r = 0; r < 2 * MT; r++)
        p[r] = mm.W + (long long)min(row0 + g + 8 * r, mm.rows - 1) * mm.rowBytes;
    const MvtAct<NF, P> x(a, stage[warp], g, t);
    float acc[MT][NF][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                acc[m][f][i] = 0.f;
    const int nsb = a.cols >> 8;
    for (int sb = kw; sb < nsb; sb += ks) {
        if (T == T_Q4_K) {
            MvtQ4K<MT> w;
            mvt_q4_k_load<MT>(p, sb, t, w);
            __syncwarp();
            x.stage(sb, lane);
            __syncwarp();
            mvt_q4_k<NF, MT, P>(w, sb, t, x, acc);
        } else {
            MvtQ6K<MT> w;
            mvt_q6_k_load<MT>(p, sb, t, w);
            __syncwarp();
            x.stage(sb, lane);
            __syncwarp();
            mvt_q6_k<NF, MT, P>(w, sb, t, x, acc);
        }
    }
    __syncwarp();
    float(*red)[32] = (float(*)[32])stage[warp];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                red[(m * NF + f) * 4 + i][lane] = acc[m][f][i];
    __syncthreads();
    if (kw != 0)
        return;
    const int nout = a.planeRows ? a.ntok >> 1 : a.ntok; // see act_row
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int f = 0; f < NF; f++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int k = (m * NF + f) * 4 + i;
                const int row = row0 + 16 * m + g + 8 * (i >> 1), tok = 8 * f + 2 * t + (i & 1);
                float s = red[k][lane];
                for (int w = 1; w < ks; w++)
                    s += ((const float(*)[32])stage[warp + w])[k][lane];
                if (a.planeRows && tok < nout) {
                    // The second plane's sum of this row and token: token
                    // tok + nout, held by lane g*4 + its pair's index.
                    const int t2 = tok + nout, j = t2 & 7;
                    const int k2 = (m * NF + (t2 >> 3)) * 4 + (i & 2) + (j & 1), l2 = g * 4 + (j >> 1);
                    float s2 = 0.f;
                    for (int w = 0; w < ks; w++)
                        s2 += ((const float(*)[32])stage[warp + w])[k2][l2];
                    s += s2;
                }
                if (row < mm.rows && tok < nout)
                    mm.out[(long long)tok * mm.ldOut + row] = s;
            }
}

// ---------------------------------------------------------------- entry points

// Every matvec kernel takes one MvArgs by value. mv_<type>_<ntok> are the
// Q8_1 integer kernels, mv_<type>_<ntok>p their tokens in two planes,
// mvf_<type>_<ntok> the float ones; R rows per row group (MV_R). The _r1/_r4 variants of a few types exist for benchmarks.
#define MV_R 2
#define COMMA , // a template argument list inside a macro argument
#define MV_KERNEL(NAME, OP, NTOK, R, MINB)                                                        \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, MINB) NAME(const MvArgs a) \
    {                                                                                         \
        PDL_ENTRY();                                                                          \
        mv_drive<OP, NTOK, R>(a);                                                             \
    }

#define MVQ_ALL(NAME, T)                                           \
    MV_KERNEL(mv_##NAME##_1, QuantOp<T>, 1, MV_R, 8)               \
    MV_KERNEL(mv_##NAME##_1p, QuantOp<T COMMA true>, 1, MV_R, 6)   \
    MV_KERNEL(mv_##NAME##_2, QuantOp<T>, 2, MV_R, 6)               \
    MV_KERNEL(mv_##NAME##_4, QuantOp<T>, 4, MV_R, 4)               \
    MV_KERNEL(mv_##NAME##_8, QuantOp<T>, 8, MV_R, 3)               \
    MV_KERNEL(mv_##NAME##_2p, QuantOp<T COMMA true>, 2, MV_R, 4)   \
    MV_KERNEL(mv_##NAME##_4p, QuantOp<T COMMA true>, 4, MV_R, 3)   \
    MV_KERNEL(mv_##NAME##_8p, QuantOp<T COMMA true>, 8, MV_R, 2)
#define MVF_ALL(NAME, T)                                           \
    MV_KERNEL(mvf_##NAME##_1, FloatOp<T>, 1, MV_R, 8)              \
    MV_KERNEL(mvf_##NAME##_2, FloatOp<T>, 2, MV_R, 6)              \
    MV_KERNEL(mvf_##NAME##_4, FloatOp<T>, 4, MV_R, 4)              \
    MV_KERNEL(mvf_##NAME##_8, FloatOp<T>, 8, MV_R, 3)
#define MVQ_BENCH(NAME, T)                                         \
    MV_KERNEL(mv_##NAME##_1_r1, QuantOp<T>, 1, 1, 8)               \
    MV_KERNEL(mv_##NAME##_1_r4, QuantOp<T>, 1, 4, 6)

// Q4_K and Q5_K: the direct driver.
#define MVK_KERNEL(NAME, T, NTOK, R, MINB, ...)                                              \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * 32, MINB) NAME(const MvArgs a) \
    {                                                                                         \
        PDL_ENTRY();                                                                          \
        mv_direct_k4<T, NTOK, R __VA_ARGS__>(a);                                              \
    }
#define MVK_ALL(NAME, T, MINB1, MINB2)                             \
    MVK_KERNEL(mv_##NAME##_1, T, 1, MV_R, MINB1)                   \
    MVK_KERNEL(mv_##NAME##_1p, T, 1, MV_R, MINB2, COMMA true)      \
    MVK_KERNEL(mv_##NAME##_2, T, 2, MV_R, MINB2)                   \
    MVK_KERNEL(mv_##NAME##_4, T, 4, MV_R, 4)                       \
    MVK_KERNEL(mv_##NAME##_8, T, 8, MV_R, 3)                       \
    MVK_KERNEL(mv_##NAME##_2p, T, 2, MV_R, 4, COMMA true)          \
    MVK_KERNEL(mv_##NAME##_4p, T, 4, MV_R, 3, COMMA true)          \
    MVK_KERNEL(mv_##NAME##_8p, T, 8, MV_R, 2, COMMA true)

MVQ_ALL(q4_0, T_Q4_0)
MVQ_ALL(q4_1, T_Q4_1)
MVQ_ALL(q5_0, T_Q5_0)
MVQ_ALL(q5_1, T_Q5_1)
MVQ_ALL(q8_0, T_Q8_0)
MVQ_ALL(q2_k, T_Q2_K)
MVQ_ALL(q3_k, T_Q3_K)
MVK_ALL(q4_k, T_Q4_K, 6, 5)
MVK_ALL(q5_k, T_Q5_K, 5, 4)
MVQ_ALL(q6_k, T_Q6_K)
MVF_ALL(f32, T_F32)
MVF_ALL(f16, T_F16)
MVF_ALL(bf16, T_BF16)
MVK_KERNEL(mv_q4_k_1_r1, T_Q4_K, 1, 1, 8)
MVK_KERNEL(mv_q4_k_1_r4, T_Q4_K, 1, 4, 4)
MVQ_BENCH(q6_k, T_Q6_K)
MVQ_BENCH(q8_0, T_Q8_0)

// The tensor-core decode kernels: NF fragments of 8 tokens (8, 16, 32
// tokens), MT 16-row tiles per warp (mvt_: 1, mvt2_: 2, for matrices of
// many rows: the B fragments load once for both tiles).
#define MVT_KERNEL(NAME, T, NF, MT, MINB)                                                         \
    extern "C" __global__ void __launch_bounds__(MVT_WARPS * 32, MINB) NAME(const MvArgs a) \
    {                                                                                         \
        PDL_ENTRY();                                                                          \
        mvt_drive<T, NF, MT>(a);                                                              \
    }
#define MVT_ALL(NAME, T)                      \
    MVT_KERNEL(mvt_##NAME##_8, T, 1, 1, 4)    \
    MVT_KERNEL(mvt_##NAME##_16, T, 2, 1, 4)   \
    MVT_KERNEL(mvt_##NAME##_32, T, 4, 1, 4)   \
    MVT_KERNEL(mvt2_##NAME##_8, T, 1, 2, 4)   \
    MVT_KERNEL(mvt2_##NAME##_16, T, 2, 2, 4)  \
    MVT_KERNEL(mvt2_##NAME##_32, T, 4, 2, 3)
MVT_ALL(q4_k, T_Q4_K)
MVT_ALL(q6_k, T_Q6_K)

// q8_1_quant is the Q8_1 rounding of one block of 32 values, one a lane
// of the warp: d = amax/127, q = round(v/d) (v*(1/d), as ggml), and the
// block's sum of q. norm.cu, glu.cu and attention.cu repeat it, so that a
// product sees the same activations whichever kernel wrote them.
__device__ __forceinline__ int q8_1_quant(float v, float &d, int &sum)
{
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    d = amax / 127.0f;
    const float id = d != 0.f ? 1.0f / d : 0.f;
    int qv = (int)roundf(v * id);
    qv = max(-128, min(127, qv));
    sum = qv;
#pragma unroll
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

// q8_1_block writes a warp's 32 values v as one Q8_1 block (q, and ds
// {d, d*sum}) and, when plane > 0, their residual v - d*q rounded alike as
// the block plane values on (scales plane/32 on): the second plane.
__device__ __forceinline__ void q8_1_block(float v, i8 *q, float2 *ds, long long plane)
{
    float d;
    int sum;
    const int qv = q8_1_quant(v, d, sum);
    *q = (i8)qv;
    if ((threadIdx.x & 31) == 0)
        *ds = make_float2(d, (float)sum * d);
    if (plane) {
        float d2;
        int sum2;
        const int q2 = q8_1_residual(v, d, qv, d2, sum2);
        q[plane] = (i8)q2;
        if ((threadIdx.x & 31) == 0)
            ds[plane / 32] = make_float2(d2, (float)sum2 * d2);
    }
}

// quantize_q8_1: x f32 [ntok][ldx] -> q int8 [ntok][cols], ds float2
// [ntok][cols/32] (layout above); with plane > 0 (ntok*cols) the second
// planes too, as rows ntok.. of the same layout. One warp per block of 32
// values, grid-stride over the ntok*cols/32 blocks.
extern "C" __global__ void quantize_q8_1(const float *__restrict__ x, long long ldx, int ntok, int cols,
                                         i8 *__restrict__ q, float2 *__restrict__ ds, long long plane)
{
    PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const int nb = cols >> 5;
    const long long total = (long long)ntok * nb;
    const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long gb = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); gb < total; gb += warps) {
        long long t = gb / nb;
        int j = (int)(gb - t * nb);
        q8_1_block(x[t * ldx + 32 * j + lane], q + t * cols + 32 * j + lane, ds + gb, plane);
    }
}
