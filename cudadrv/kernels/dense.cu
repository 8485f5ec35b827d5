// Reference products of float32 weights with float32 activations: the
// matrix product, the embedding row gather and the MoE expert product. The
// runtime's reference weight path dequantizes every weight to float32 on
// the CPU (ops' own dequantizers) and runs these; it is the GPU executor's
// fallback and the yardstick for the quantized kernels. Plain, not fast.
// Go launchers: dense.go.
//
// Thread mapping of the products: one warp per output row r of the
// weight; its lanes stride over the row's columns (coalesced) and reduce
// with shuffles, once per token; the weight row stays in L1/L2 across the
// tokens. Blocks of 4 warps, grid-stride over rows.

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

// dense_matmul_f32: out[t*ldOut + r] = W[r] · x[t] for r < rows, t < nTok.
// W is [rows][cols], x [nTok][cols].
extern "C" __global__ void dense_matmul_f32(float *out, const float *W, const float *x,
                                            int rows, int cols, int nTok, int ldOut)
{
    PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const long long nw = (long long)gridDim.x * (blockDim.x >> 5);
    for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += nw) {
        const float *w = W + r * cols;
        for (int t = 0; t < nTok; t++) {
            const float *xt = x + (long long)t * cols;
            float s = 0.0f;
            for (int c = lane; c < cols; c += 32)
                s += w[c] * xt[c];
            s = warp_sum(s);
            if (lane == 0)
                out[(long long)t * ldOut + r] = s;
        }
    }
}

// dense_matmul_f32_t8: dense_matmul_f32's product, each warp computing its
// row for a tile of 8 tokens at once: the weight row is read once per tile
// instead of once per token, 16 bytes a lane where cols % 4 == 0 (rows and
// activation rows are then 16-byte aligned: the buffers are 256-aligned).
// Float32 throughout, with fmaf; only the order of the additions differs
// from dense_matmul_f32. The MoE router's product at prefill batch sizes
// (runtime/gpu: moeStep) uses it. Grid: x over groups of the block's warps
// (one row each), y over token tiles.
#define DENSE_TT 8
extern "C" __global__ void dense_matmul_f32_t8(float *out, const float *W, const float *x,
                                               int rows, int cols, int nTok, int ldOut)
{
    PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const long long r = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    const int t0 = blockIdx.y * DENSE_TT;
    if (r >= rows)
        return;
    const int nt = min(DENSE_TT, nTok - t0);
    const float *w = W + r * cols;
    const float *xt = x + (long long)t0 * cols;
    float acc[DENSE_TT];
#pragma unroll
    for (int i = 0; i < DENSE_TT; i++)
        acc[i] = 0.0f;
    if ((cols & 3) == 0) {
        for (int c = 4 * lane; c < cols; c += 128) {
            const float4 wv = *(const float4 *)(w + c);
#pragma unroll
            for (int i = 0; i < DENSE_TT; i++) {
                if (i < nt) {
                    const float4 xv = *(const float4 *)(xt + (long long)i * cols + c);
                    acc[i] = fmaf(wv.x, xv.x, acc[i]);
                    acc[i] = fmaf(wv.y, xv.y, acc[i]);
                    acc[i] = fmaf(wv.z, xv.z, acc[i]);
                    acc[i] = fmaf(wv.w, xv.w, acc[i]);
                }
            }
        }
    } else {
        for (int c = lane; c < cols; c += 32) {
            const float wv = w[c];
#pragma unroll
            for (int i = 0; i < DENSE_TT; i++)
                if (i < nt)
                    acc[i] = fmaf(wv, xt[(long long)i * cols + c], acc[i]);
        }
    }
#pragma unroll
    for (int i = 0; i < DENSE_TT; i++) {
        const float v = warp_sum(acc[i]);
        if (lane == 0 && i < nt)
            out[(long long)(t0 + i) * ldOut + r] = v;
    }
}

// dense_get_rows_f32: out[t] = W[ids[t]] for t < nTok; rows of cols floats.
extern "C" __global__ void dense_get_rows_f32(float *out, const float *W, const int *ids,
                                              int cols, int nTok)
{
    PDL_ENTRY();
    const long long n = (long long)nTok * cols;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long t = i / cols, c = i % cols;
        out[i] = W[(long long)ids[t] * cols + c];
    }
}

// dense_moe_matmul_f32: for each token t and slot j < k, with e = ids[t*k+j]:
//     out[(t*k + j)*rows + r] = W[e][r] · x[t]          (perSlot = 0)
//     out[(t*k + j)*rows + r] = W[e][r] · x[t*k + j]    (perSlot = 1)
// W is [experts][rows][cols]. One warp per (slot, row).
extern "C" __global__ void dense_moe_matmul_f32(float *out, const float *W, const float *x,
                                                int perSlot, const int *ids,
                                                int rows, int cols, int nTok, int k)
{
    PDL_ENTRY();
    const int lane = threadIdx.x & 31;
    const long long nw = (long long)gridDim.x * (blockDim.x >> 5);
    const long long total = (long long)nTok * k * rows;
    for (long long i = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; i < total; i += nw) {
        const long long slot = i / rows, r = i % rows;
        const long long e = ids[slot];
        const float *w = W + (e * rows + r) * cols;
        const float *xt = x + (perSlot ? slot : slot / k) * cols;
        float s = 0.0f;
        for (int c = lane; c < cols; c += 32)
            s += w[c] * xt[c];
        s = warp_sum(s);
        if (lane == 0)
            out[i] = s;
    }
}
