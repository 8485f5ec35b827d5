// Utility kernels. Go launchers: util.go.

// spin keeps one thread busy for about `cycles` SM clock cycles. The GPU
// profile (runtime, ATS_GPU_PROFILE) queues it before a run's launches so
// that the host has queued them all before the device starts: the events
// between them then time the kernels, not the host's launch rate.
extern "C" __global__ void spin(long long cycles)
{
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
}
