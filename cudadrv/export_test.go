package cudadrv

import "testing"

// NeedGPU exposes needGPU to the external tests (package cudadrv_test),
// which exist because they import cudadrv/kernels, which imports cudadrv.
func NeedGPU(tb testing.TB) (*Context, DeviceInfo) { return needGPU(tb) }

// RandBytes exposes randBytes to the external tests.
func RandBytes(seed uint64, n int) []byte { return randBytes(seed, n) }
