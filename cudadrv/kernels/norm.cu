// RMSNorm kernels: out = x / sqrt(mean(x²) + eps) * w, one row at a time.
// Their Go launchers are in norm.go; the CPU twin is ops.RMSNorm.
//
// Thread mapping: one block per row. The block's threads stride over the
// row's columns (consecutive threads, consecutive columns: coalesced), each
// keeps a partial sum of squares, the block reduces the partials through
// warp shuffles and shared memory, and every thread then scales its own
// columns. Rows are model-width (up to ~8192) or head-width (64-256), so a
// block of up to 256 threads sees each element a few times at most.
//
// Numerics follow ops.RMSNorm: mean = float(sum / n); the scale is
// 1/sqrt(mean + eps) computed in double and rounded to float; out is
// (x * scale) * w, in that order. The sum itself is float here (the CPU
// keeps it in float64); the difference is a few units in the last place of
// the scale.

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

// warp_sum returns the sum of v over the 32 lanes of the warp, in every lane.
__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// block_sum returns the sum of v over the block (blockDim.x a multiple of
// 32, at most 1024), in every thread. red must hold 32 floats.
__device__ __forceinline__ float block_sum(float v, float *red)
{
    v = warp_sum(v);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int nwarps = blockDim.x >> 5;
    __syncthreads(); // red may still be read from a previous call
    if (lane == 0)
        red[warp] = v;
    __syncthreads();
    v = lane < nwarps ? red[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float rms_scale(float sumsq, int ncols, float eps)
{
    const float mean = sumsq / (float)ncols;
    return (float)(1.0 / sqrt((double)(mean + eps)));
}

// rms_norm_f32: dst[r] = rmsnorm(src[r]) * w for r < nrows (grid.x = nrows,
// or fewer: rows stride by gridDim.x). Rows are ncols floats, back to back.
// w may be null (no weight). dst may alias src.
extern "C" __global__ void rms_norm_f32(float *dst, const float *src, const float *w,
                                        int ncols, float eps, long long nrows)
{
    PDL_ENTRY();
    __shared__ float red[32];
    for (long long r = blockIdx.x; r < nrows; r += gridDim.x) {
        const float *x = src + r * ncols;
        float *y = dst + r * ncols;
        float s = 0.0f;
        for (int i = threadIdx.x; i < ncols; i += blockDim.x)
            s += x[i] * x[i];
        const float scale = rms_scale(block_sum(s, red), ncols, eps);
        // Each thread reads back only the columns it read above, so the
        // in-place case needs no barrier between the two loops.
        for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
            const float v = x[i] * scale;
            y[i] = w ? v * w[i] : v;
        }
    }
}

// add_rms_norm_f32 fuses the residual add with the next norm, the pair that
// ends every half-block of a decoder:
//     sum[r] = a[r] + b[r];   dst[r] = rmsnorm(sum[r]) * w.
// sum may alias a or b (x = x + y in place); dst must not alias a, b or sum.
extern "C" __global__ void add_rms_norm_f32(float *sum, const float *a, const float *b,
                                            float *dst, const float *w,
                                            int ncols, float eps, long long nrows)
{
    PDL_ENTRY();
    __shared__ float red[32];
    for (long long r = blockIdx.x; r < nrows; r += gridDim.x) {
        const long long o = r * ncols;
        float s = 0.0f;
        for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
            const float v = a[o + i] + b[o + i];
            sum[o + i] = v;
            s += v * v;
        }
        const float scale = rms_scale(block_sum(s, red), ncols, eps);
        // The thread wrote sum[o+i] itself above: reading it back is ordered.
        for (int i = threadIdx.x; i < ncols; i += blockDim.x) {
            const float v = sum[o + i] * scale;
            dst[o + i] = w ? v * w[i] : v;
        }
    }
}

// q8_1_quant and q8_1_block are matvec.cu's (the same expressions, so the
// matrix products see the same activations whether the norm or
// quantize_q8_1 made them): a warp's block of 32 values in ats's GPU Q8_1
// layout, and with plane > 0 its residual's rounding as the second plane.
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

__device__ __forceinline__ void q8_1_block(float v, signed char *q, float2 *ds, long long plane)
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

// rms_norm_ex is the norm with everything that may surround it in a
// decoder fused in, each part optional (null pointers skip it). Per row r:
//     term = b[r]                          (k == 0, b not null), or
//            Σ_j y[r][j] * yw[r][j]        (k > 0: the MoE weighted sum,
//                                           slots in order, as moe_weighted_sum)
//     x    = a[r] + term                   (a[r] alone without a term)
//     bout[r] = term,  sum[r] = x          (when given)
//     dst[r] = rmsnorm(x) * w              (when dst is given)
//     q, ds  = Q8_1 of dst[r]              (when q is given; cols % 32 == 0),
//              and its second plane plane values on (plane > 0)
// y is [rows][k][cols], yw [rows][k]. sum may alias a; bout may alias b;
// dst must not alias a, b or y. Thread mapping as rms_norm_f32; with q, a
// warp's 32 consecutive columns of one pass are one Q8_1 block (blockDim
// is a multiple of 32, so passes start on block boundaries).
// The row held in registers: up to NORM_ITEMS values a thread, for rows
// without the MoE sum. Decode normalises one row with one block, so its
// time is a chain of memory round trips: loading every input of the row
// before the first store lets them overlap (the stores could alias the
// inputs as far as the compiler knows, so loads after a store wait for
// it), and the second pass reads registers instead of memory.
#define NORM_ITEMS 8

__device__ __forceinline__ void norm_ex_regs(float *sum, const float *a, const float *b, float *bout,
                                             float *dst, const float *w,
                                             signed char *q, float2 *ds, long long plane,
                                             int cols, float eps, long long r, float *red)
{
    const long long o = r * cols;
    float v[NORM_ITEMS], t[NORM_ITEMS];
#pragma unroll
    for (int it = 0; it < NORM_ITEMS; it++) {
        const int i = it * blockDim.x + threadIdx.x;
        v[it] = i < cols ? a[o + i] : 0.0f;
        t[it] = (b && i < cols) ? b[o + i] : 0.0f;
    }
    const bool term = b != nullptr;
    float s = 0.0f;
#pragma unroll
    for (int it = 0; it < NORM_ITEMS; it++) {
        const int i = it * blockDim.x + threadIdx.x;
        if (term)
            v[it] = __fadd_rn(v[it], t[it]);
        if (i < cols) {
            if (term && bout)
                bout[o + i] = t[it];
            if (sum)
                sum[o + i] = v[it];
        }
        s += v[it] * v[it]; // zero past the row
    }
    if (!dst)
        return; // the add alone; every thread of the block returns alike
    const float scale = rms_scale(block_sum(s, red), cols, eps);
#pragma unroll
    for (int it = 0; it < NORM_ITEMS; it++) {
        const int i0 = it * blockDim.x;
        const int i = i0 + threadIdx.x;
        if (i0 >= cols)
            break; // uniform over the block
        float x = v[it] * scale;
        if (i < cols) {
            if (w)
                x = x * w[i];
            dst[o + i] = x;
        }
        // cols % 32 == 0 with q: a warp's lanes are all in range or all out.
        if (q && i0 + (threadIdx.x & ~31) < cols)
            q8_1_block(x, q + o + i, ds + (o + i) / 32, plane);
    }
}

// The norm with the MoE weighted sum, the row in registers: up to
// NORM_MOE_SLOTS slots and ITEMS values a thread (2: rows up to 2048 wide
// with 1024 threads; 4 would spill under the 64 registers of 1024-thread
// blocks). Every input of the row (a, the slots' weights and outputs) is
// loaded before the first store, so the whole row is one memory round
// trip rather than one per value (the loop below waits for each value's
// stores before the next loads). The sum's expressions and order are the
// loop's.
#define NORM_MOE_SLOTS 8

template <int ITEMS>
__device__ __forceinline__ void norm_ex_moe_regs(float *sum, const float *a, const float *y, const float *yw, int k,
                                                 float *bout, float *dst, const float *w,
                                                 signed char *q, float2 *ds, long long plane,
                                                 int cols, float eps, long long r, float *red)
{
    const long long o = r * cols;
    float wj[NORM_MOE_SLOTS];
#pragma unroll
    for (int j = 0; j < NORM_MOE_SLOTS; j++)
        wj[j] = j < k ? yw[r * k + j] : 0.0f;
    float v[ITEMS], yv[ITEMS][NORM_MOE_SLOTS];
#pragma unroll
    for (int it = 0; it < ITEMS; it++) {
        const int i = it * blockDim.x + threadIdx.x;
        v[it] = i < cols ? a[o + i] : 0.0f;
        const float *yr = y + o * k + i;
#pragma unroll
        for (int j = 0; j < NORM_MOE_SLOTS; j++)
            yv[it][j] = (j < k && i < cols) ? yr[(long long)j * cols] : 0.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int it = 0; it < ITEMS; it++) {
        const int i = it * blockDim.x + threadIdx.x;
        float t = __fmul_rn(yv[it][0], wj[0]);
#pragma unroll
        for (int j = 1; j < NORM_MOE_SLOTS; j++)
            if (j < k)
                t = __fadd_rn(t, __fmul_rn(yv[it][j], wj[j]));
        v[it] = __fadd_rn(v[it], t);
        if (i < cols) {
            if (bout)
                bout[o + i] = t;
            if (sum)
                sum[o + i] = v[it];
        }
        s += v[it] * v[it]; // zero past the row
    }
    if (!dst)
        return; // the add alone; every thread of the block returns alike
    const float scale = rms_scale(block_sum(s, red), cols, eps);
#pragma unroll
    for (int it = 0; it < ITEMS; it++) {
        const int i0 = it * blockDim.x;
        const int i = i0 + threadIdx.x;
        if (i0 >= cols)
            break; // uniform over the block
        float x = v[it] * scale;
        if (i < cols) {
            if (w)
                x = x * w[i];
            dst[o + i] = x;
        }
        if (q && i0 + (threadIdx.x & ~31) < cols)
            q8_1_block(x, q + o + i, ds + (o + i) / 32, 0);
    }
    if (!q || !plane)
        return;
    // The second planes in a pass of their own, from the thread's own
    // outputs in dst: inline above they made this path spill on CC 9.0.
#pragma unroll
    for (int it = 0; it < ITEMS; it++) {
        const int i0 = it * blockDim.x;
        const int i = i0 + threadIdx.x;
        if (i0 + (threadIdx.x & ~31) >= cols)
            break; // uniform over the warp (cols % 32 == 0)
        const float x = dst[o + i];
        float d, d2;
        int sum, sum2;
        const int qv = q8_1_quant(x, d, sum);
        const int q2 = q8_1_residual(x, d, qv, d2, sum2);
        q[plane + o + i] = (signed char)q2;
        if ((threadIdx.x & 31) == 0)
            ds[(plane + o + i) / 32] = make_float2(d2, (float)sum2 * d2);
    }
}

// MOE: the kernel for the MoE sum (rms_norm_ex_moe), with its register
// paths; a kernel of its own, so that their registers do not weigh on the
// plain and residual norms' code (rms_norm_ex).
template <bool MOE>
__device__ __forceinline__ void rms_norm_ex_body(float *sum, const float *a, const float *b,
                                                 const float *y, const float *yw, int k, float *bout,
                                                 float *dst, const float *w,
                                                 signed char *q, float2 *ds, long long plane,
                                                 int cols, float eps, long long rows)
{
    __shared__ float red[32];
    for (long long r = blockIdx.x; r < rows; r += gridDim.x) {
        // Measured on an H200 (docs/bench/gpu.md): registers help the plain
        // and residual norms a little. The MoE sum takes its own register
        // path (all loads first; blocks of up to 1024 threads, see
        // RMSNormEx) for up to NORM_MOE_SLOTS slots and rows up to twice
        // the block, else the loop.
        if (k == 0 && cols <= NORM_ITEMS * (int)blockDim.x) {
            norm_ex_regs(sum, a, b, bout, dst, w, q, ds, plane, cols, eps, r, red);
            continue;
        }
        if (MOE && k > 0 && k <= NORM_MOE_SLOTS && cols <= 2 * (int)blockDim.x) {
            norm_ex_moe_regs<2>(sum, a, y, yw, k, bout, dst, w, q, ds, plane, cols, eps, r, red);
            continue;
        }

        const long long o = r * cols;
        float s = 0.0f;
        for (int i = threadIdx.x; i < cols; i += blockDim.x) {
            float v = a[o + i];
            if (k > 0) {
                const float *yr = y + o * k + i;
                const float *wr = yw + r * k;
                float t = __fmul_rn(yr[0], wr[0]);
                for (int j = 1; j < k; j++)
                    t = __fadd_rn(t, __fmul_rn(yr[(long long)j * cols], wr[j]));
                if (bout)
                    bout[o + i] = t;
                v = __fadd_rn(v, t);
            } else if (b) {
                const float t = b[o + i];
                if (bout)
                    bout[o + i] = t;
                v = __fadd_rn(v, t);
            }
            if (sum)
                sum[o + i] = v;
            s += v * v;
        }
        if (!dst)
            continue; // the add alone; every thread of the block skips alike
        // Keep the values of the first pass: re-read from sum when stored,
        // else recompute (a and b unchanged: dst aliases neither).
        const float scale = rms_scale(block_sum(s, red), cols, eps);
        for (int i0 = 0; i0 < cols; i0 += blockDim.x) {
            const int i = i0 + threadIdx.x;
            float v = 0.0f;
            if (i < cols) {
                if (sum) {
                    v = sum[o + i];
                } else {
                    v = a[o + i];
                    if (k > 0) {
                        const float *yr = y + o * k + i;
                        const float *wr = yw + r * k;
                        float t = __fmul_rn(yr[0], wr[0]);
                        for (int j = 1; j < k; j++)
                            t = __fadd_rn(t, __fmul_rn(yr[(long long)j * cols], wr[j]));
                        v = __fadd_rn(v, t);
                    } else if (b) {
                        v = __fadd_rn(v, b[o + i]);
                    }
                }
                v = v * scale;
                if (w)
                    v = v * w[i];
                dst[o + i] = v;
            }
            // The whole warp takes part in the block's shuffles; cols % 32
            // == 0 makes a warp's lanes all in range or all out.
            if (q && i0 + (threadIdx.x & ~31) < cols)
                q8_1_block(v, q + o + i, ds + (o + i) / 32, plane);
        }
    }
}

extern "C" __global__ void __launch_bounds__(1024) rms_norm_ex(float *sum, const float *a, const float *b,
                                                               const float *y, const float *yw, int k, float *bout,
                                                               float *dst, const float *w,
                                                               signed char *q, float2 *ds, long long plane,
                                                               int cols, float eps, long long rows)
{
    PDL_ENTRY();
    rms_norm_ex_body<false>(sum, a, b, y, yw, k, bout, dst, w, q, ds, plane, cols, eps, rows);
}

extern "C" __global__ void __launch_bounds__(1024) rms_norm_ex_moe(float *sum, const float *a, const float *b,
                                                                   const float *y, const float *yw, int k, float *bout,
                                                                   float *dst, const float *w,
                                                                   signed char *q, float2 *ds, long long plane,
                                                                   int cols, float eps, long long rows)
{
    PDL_ENTRY();
    rms_norm_ex_body<true>(sum, a, b, y, yw, k, bout, dst, w, q, ds, plane, cols, eps, rows);
}
