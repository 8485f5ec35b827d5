// Elementwise kernels of the feed-forward blocks: SwiGLU (separate gate and
// up, or both halves of one row) and the broadcast bias add of the matrix
// products that have one. Go launchers: glu.go; CPU twins: ops.SwiGLU,
// ops.AddTo.
//
// Thread mapping: grid-stride over rows*width output elements; consecutive
// threads take consecutive columns of a row (coalesced).

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

// silu is x * sigmoid(x) as ops.SiLU computes it: x / (1 + exp(-x)). expf
// (not the fast __expf) keeps it within an ulp or two of the CPU's double
// exponential.
__device__ __forceinline__ float silu(float x)
{
    return __fdiv_rn(x, __fadd_rn(1.0f, expf(-x)));
}

// swiglu_f32: out[r][c] = silu(gate[r*ld + c]) * up[r*ld + c] for c < width,
// r < rows. Separate buffers: ld = width. Fused halves of one row of 2*width:
// gate = in, up = in + width, ld = 2*width. out may alias gate (not up, when
// fused: the halves are different columns).
extern "C" __global__ void swiglu_f32(float *out, const float *gate, const float *up,
                                      int width, int ld, long long rows)
{
    PDL_ENTRY();
    const long long n = rows * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        const long long r = i / width, c = i % width;
        const long long j = r * ld + c;
        out[i] = __fmul_rn(silu(gate[j]), up[j]);
    }
}

// add_bias_f32: x[r][c] += b[c] for c < width, r < rows.
extern "C" __global__ void add_bias_f32(float *x, const float *b, int width, long long rows)
{
    PDL_ENTRY();
    const long long n = rows * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] += b[i % width];
}

// q8k_scale and q8k_value: matvec.cu's (Q8_K's rounding in ats's GPU Q8_1
// layout), repeated here: each .cu file is its own module.
__device__ __forceinline__ float q8k_scale(float amax, float &d)
{
    const float iscale = amax != 0.0f ? 127.0f / amax : 0.0f;
    d = amax != 0.0f ? 1.0f / iscale : 0.0f;
    return iscale;
}

__device__ __forceinline__ int q8k_value(float v, float amax, float iscale)
{
    return amax != 0.0f ? max(-127, min(127, __float2int_rn(iscale * v))) : 0;
}

// swiglu_q8_1 is swiglu_f32 that also writes its output in ats's GPU Q8_1
// layout (matvec.cu: int8 q [rows][width], float2 {d, d*sum(q)} per block
// of 32), the input the next matrix-vector product reads, with the same
// expressions as quantize_q8_1 there and its scale block qb:
//   qb = 32: width % 32 == 0, a warp's 32 consecutive outputs are one block
//            of one row (the grid stride and the block size are multiples
//            of 32);
//   qb = 256: width % 256 == 0, a warp takes a block of 256 outputs (eight
//            values a lane), grid-stride over the blocks.
extern "C" __global__ void swiglu_q8_1(float *out, const float *gate, const float *up,
                                       int width, int ld, long long rows, int qb,
                                       signed char *q, float2 *ds)
{
    PDL_ENTRY();
    const long long n = rows * width;
    if (qb == 256) {
        const int lane = threadIdx.x & 31;
        const long long warps = (long long)gridDim.x * (blockDim.x >> 5);
        for (long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); b < n / 256; b += warps) {
            const long long i0 = 256 * b, r = i0 / width, c0 = i0 % width;
            float v[8];
            float amax = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) {
                const long long j = r * ld + c0 + 32 * k + lane;
                v[k] = __fmul_rn(silu(gate[j]), up[j]);
                amax = fmaxf(amax, fabsf(v[k]));
            }
            // out may alias gate: every lane has read its values above.
#pragma unroll
            for (int k = 0; k < 8; k++)
                out[i0 + 32 * k + lane] = v[k];
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            float d;
            const float iscale = q8k_scale(amax, d);
#pragma unroll
            for (int k = 0; k < 8; k++) {
                int qv = q8k_value(v[k], amax, iscale);
                q[i0 + 32 * k + lane] = (signed char)qv;
#pragma unroll
                for (int o = 16; o > 0; o >>= 1)
                    qv += __shfl_xor_sync(0xffffffffu, qv, o);
                if (lane == 0)
                    ds[b * 8 + k] = make_float2(d, (float)qv * d);
            }
        }
        return;
    }
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i0 = (long long)blockIdx.x * blockDim.x; i0 < n; i0 += stride) {
        const long long i = i0 + threadIdx.x;
        if (i0 + (threadIdx.x & ~31) >= n)
            break; // the whole warp is past the end
        const long long r = i / width, c = i % width;
        const long long j = r * ld + c;
        const float v = __fmul_rn(silu(gate[j]), up[j]);
        out[i] = v;
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
        q[i] = (signed char)qv;
        if ((threadIdx.x & 31) == 0)
            ds[i / 32] = make_float2(d, (float)sum * d);
    }
}
