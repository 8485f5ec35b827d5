//go:build !linux && !windows

package cudadrv

import (
	"errors"
	"runtime"
)

// NVIDIA ships the CUDA driver for Linux and Windows only: macOS has had no
// CUDA driver since 10.13, so on every other system ats runs on the CPU.
var (
	cudaLibNames = []string{"libcuda"}
	nvmlLibNames = []string{"libnvidia-ml"}
)

func openLibrary(string, []string) (uintptr, string, error) {
	return 0, "", errors.New("there is no CUDA driver for " + runtime.GOOS)
}

func lookup(uintptr, string) uintptr { return 0 }
