// Elementwise float32 kernels. They are the first kernels of ats and prove
// the path from CUDA C through committed PTX to a launch from Go; their Go
// launchers are in elementwise.go.
//
// Conventions for every kernel file here:
//   - extern "C" so the PTX entry names are the C names Go looks up;
//   - element counts are long long (tensors can exceed 2^31 elements);
//   - grid-stride loops, so any grid size is correct and the launcher can
//     cap the grid.

extern "C" __global__ void add_f32(float *dst, const float *a, const float *b, long long n)
{
    // No __restrict__: dst may alias a or b (in-place accumulation).
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = a[i] + b[i];
}

extern "C" __global__ void scale_f32(float *dst, const float *src, float s, long long n)
{
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
        dst[i] = src[i] * s;
}
