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

// q8_1_quant and q8_1_block are matvec.cu's (the same expressions as
// quantize_q8_1 there): a warp's block of 32 values in ats's GPU Q8_1
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

// swiglu_q8_1 is swiglu_f32 that also writes its output in ats's GPU Q8_1
// layout (matvec.cu: int8 q [rows][width], float2 {d, d*sum(q)} per block
// of 32), the input the next matrix-vector product reads, and with
// plane > 0 (rows*width) the second planes as rows rows.. of that layout.
// width % 32 == 0: a warp's 32 consecutive outputs are one block of one
// row (the grid stride and the block size are multiples of 32).
extern "C" __global__ void swiglu_q8_1(float *out, const float *gate, const float *up,
                                       int width, int ld, long long rows,
                                       signed char *q, float2 *ds, long long plane)
{
    PDL_ENTRY();
    const long long n = rows * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i0 = (long long)blockIdx.x * blockDim.x; i0 < n; i0 += stride) {
        const long long i = i0 + threadIdx.x;
        if (i0 + (threadIdx.x & ~31) >= n)
            break; // the whole warp is past the end
        const long long r = i / width, c = i % width;
        const long long j = r * ld + c;
        const float v = __fmul_rn(silu(gate[j]), up[j]);
        out[i] = v;
        q8_1_block(v, q + i, ds + i / 32, plane);
    }
}
