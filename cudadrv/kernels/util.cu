// Utility kernels. Go launchers: util.go.

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

// spin keeps one thread busy for about `cycles` SM clock cycles. The GPU
// profile (runtime, ATS_GPU_PROFILE) queues it before a run's launches so
// that the host has queued them all before the device starts: the events
// between them then time the kernels, not the host's launch rate.
extern "C" __global__ void spin(long long cycles)
{
    PDL_ENTRY();
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
