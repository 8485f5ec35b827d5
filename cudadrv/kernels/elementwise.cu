// Elementwise float32 kernels. They are the first kernels of ats and prove
// the path from CUDA C through committed PTX to a launch from Go; their Go
// launchers are in elementwise.go.
//
// Conventions for every kernel file here:
//   - extern "C" so the PTX entry names are the C names Go looks up;
//   - element counts are long long (tensors can exceed 2^31 elements);
//   - grid-stride loops, so any grid size is correct and the launcher can
//     cap the grid.

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

extern "C" __global__ void add_f32(float *dst, const float *a, const float *b, long long n)
{
    PDL_ENTRY();
    // No __restrict__: dst may alias a or b (in-place accumulation).
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = a[i] + b[i];
}

extern "C" __global__ void scale_f32(float *dst, const float *src, float s, long long n)
{
    PDL_ENTRY();
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i] * s;
}

// copy_f32 moves activations between device memory and mapped pinned host
// memory (either side may be a host pointer seen through unified
// addressing): the hybrid executor's zero-copy transfers. Run by the SMs,
// it never queues behind weight copies on the copy engine. Both pointers
// 16-byte aligned: float4 loads and stores, the scalar tail after.
extern "C" __global__ void copy_f32(float *__restrict__ dst, const float *__restrict__ src, long long n)
{
    PDL_ENTRY();
    long long stride = (long long)gridDim.x * blockDim.x;
    long long i0 = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    long long head = 0;
    if ((((unsigned long long)dst | (unsigned long long)src) & 15) == 0) {
        long long n4 = n / 4;
        float4 *d4 = (float4 *)dst;
        const float4 *s4 = (const float4 *)src;
        for (long long i = i0; i < n4; i += stride)
            d4[i] = s4[i];
        head = n4 * 4;
    }
    for (long long i = head + i0; i < n; i += stride)
        dst[i] = src[i];
}

// gather_rows_f32 copies rows of width floats: dst[i] = src[idx[i]] for i <
// n, idx an int32 device array: the output head takes only the rows whose
// logits are wanted.
extern "C" __global__ void gather_rows_f32(float *dst, const float *src, const int *idx, int width, int n)
{
    PDL_ENTRY();
    const long long total = (long long)n * width;
    const long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += stride) {
        const int r = (int)(i / width);
        dst[i] = src[(long long)idx[r] * width + (i - (long long)r * width)];
    }
}

// fwht_f32 replaces each of nChunks chunks of n floats of x (n a power of
// two, 4..1024) by its orthonormal Walsh-Hadamard transform, as ggml's CPU
// fwht computes it and ops.FWHT does: the values scaled by scale
// (1/sqrt(n)), then butterflies (u+v, u-v) of growing span, in float, no
// fused multiply-add. A quantized KV cache holds keys and values rotated
// so (llama.cpp spreads a head's outliers before quantizing); queries are
// rotated alike and attention's outputs rotated back. A block of n/2
// threads takes one chunk at a time, a butterfly a thread.
extern "C" __global__ void fwht_f32(float *x, long long nChunks, int n, float scale)
{
    PDL_ENTRY();
    __shared__ float s[1024];
    const int h = threadIdx.x, half = n / 2;
    for (long long c = blockIdx.x; c < nChunks; c += gridDim.x) {
        float *p = x + c * n;
        s[h] = __fmul_rn(p[h], scale);
        s[h + half] = __fmul_rn(p[h + half], scale);
        __syncthreads();
        for (int span = 1; span < n; span <<= 1) {
            const int i = (h / span) * 2 * span + (h % span);
            const float u = s[i], v = s[i + span];
            s[i] = __fadd_rn(u, v);
            s[i + span] = __fsub_rn(u, v);
            __syncthreads();
        }
        p[h] = s[h];
        p[h + half] = s[h + half];
        __syncthreads();
    }
}
