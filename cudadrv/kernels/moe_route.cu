// Mixture-of-experts routing and the weighted sum of the chosen experts'
// outputs. Go launchers: moe_route.go; CPU twin: the routing in
// runtime's moeFFN (softmax over the router's logits, the top k by
// probability with ties to the lower expert id, optionally renormalised to
// sum to 1; the outputs summed in slot order).
//
// moe_route: one warp per token (4 tokens per block of 128 threads). Lane l
// holds the logits of experts l, l+32, ... in registers (ne <= 256). The
// softmax takes the exponentials in double and sums them in double, as the
// CPU does, so the probabilities (and therefore the ranking) match it. The
// top k are found in k rounds of a warp arg-max; after each round every
// lane knows the winner, and lane j keeps the j-th.
//
// The ids and weights go to device memory, where the expert-product
// kernels read them; nothing returns to the host.

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

#define MOE_MAX_EXPERTS 256
#define MOE_PER_LANE (MOE_MAX_EXPERTS / 32)

extern "C" __global__ void moe_route(const float *logits, int ne, int k, int norm,
                                     int *ids, float *weights, int nTok)
{
    PDL_ENTRY();
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= nTok)
        return;
    const float *x = logits + (long long)warp * ne;

    float p[MOE_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < MOE_PER_LANE; i++) {
        const int e = lane + 32 * i;
        p[i] = e < ne ? x[e] : -INFINITY;
        mx = fmaxf(mx, p[i]);
    }
    for (int o = 16; o > 0; o >>= 1)
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    double sum = 0.0;
#pragma unroll
    for (int i = 0; i < MOE_PER_LANE; i++) {
        const int e = lane + 32 * i;
        if (e < ne) {
            p[i] = (float)exp((double)(p[i] - mx));
            sum += (double)p[i];
        }
    }
    for (int o = 16; o > 0; o >>= 1)
        sum += __shfl_xor_sync(0xffffffffu, sum, o);
    const float inv = (float)(1.0 / sum);
#pragma unroll
    for (int i = 0; i < MOE_PER_LANE; i++)
        p[i] = lane + 32 * i < ne ? p[i] * inv : -1.0f; // -1: not an expert, never chosen

    // k rounds of arg-max. Probabilities are >= 0; a chosen one becomes -1.
    float mine = 0.0f;
    int mineId = 0;
    float wsum = 0.0f;
    for (int j = 0; j < k; j++) {
        float bv = -2.0f;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < MOE_PER_LANE; i++) {
            // Within a lane, ids ascend with i: '>' keeps the lower id on ties.
            if (p[i] > bv) {
                bv = p[i];
                bi = lane + 32 * i;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) {
                bv = ov;
                bi = oi;
            }
        }
        // Every lane now holds the winner (bv, bi).
#pragma unroll
        for (int i = 0; i < MOE_PER_LANE; i++) // static indices keep p in registers
            if (bi == lane + 32 * i)
                p[i] = -1.0f;
        wsum += bv;             // float, in slot order, as the CPU sums
        if (lane == j) {
            mine = bv;
            mineId = bi;
        }
    }
    if (lane < k) {
        ids[(long long)warp * k + lane] = mineId;
        weights[(long long)warp * k + lane] = norm ? mine / wsum : mine;
    }
}

// moe_weighted_sum: out[t][d] = host[t][d] + Σ_j y[t][j][d] * w[t][j] over
// the slots j = 0..k-1, in order, whose id is not -1, each product rounded
// before its add as the CPU computes it. y is [nTok][k][width]. ids
// ([nTok][k]) and host ([nTok][width], mapped host memory: the host's
// partial sum of the experts it computed after moe_split) may be null:
// without ids every slot counts, without host the sum starts from the
// first slot's product, not from +0 (so a lone -0 product stays -0).
// Grid-stride over nTok*width.
extern "C" __global__ void moe_weighted_sum(float *out, const float *y, const float *w,
                                            const int *ids, const float *host,
                                            int width, int k, int nTok)
{
    PDL_ENTRY();
    const long long n = (long long)nTok * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long t = i / width, d = i % width;
        const float *yt = y + t * k * width + d;
        const float *wt = w + t * k;
        bool empty = host == nullptr;
        float acc = empty ? 0.0f : host[i];
        for (int j = 0; j < k; j++) {
            if (ids != nullptr && ids[t * k + j] < 0)
                continue;
            const float p = __fmul_rn(yt[(long long)j * width], wt[j]);
            acc = empty ? p : __fadd_rn(acc, p);
            empty = false;
        }
        out[i] = acc;
    }
}

// moe_split: the slots whose expert is below ks go to the host, which
// computes those experts while the device computes the rest (an MoE layer
// split between the CPU and the GPU). Every slot's id and weight are
// copied to hids and hw (mapped host memory) for the host; on the device
// the ids of the host's slots become -1, which the expert products drop
// (moe_group, the matvec path) and moe_weighted_sum skips.
// One thread per slot.
extern "C" __global__ void moe_split(int *ids, const float *w, int ks, int nslots,
                                     int *hids, float *hw)
{
    PDL_ENTRY();
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= nslots)
        return;
    const int e = ids[i];
    hids[i] = e;
    hw[i] = w[i];
    if (e < ks)
        ids[i] = -1;
}
