//go:build windows

package cudadrv

import (
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/windows"
)

// nvcuda.dll and nvml.dll are installed into System32 by the display driver;
// older drivers put nvml.dll under "NVIDIA Corporation\NVSMI" in Program Files.
// Loading with LOAD_LIBRARY_SEARCH_SYSTEM32 for bare names keeps a DLL
// planted in the working directory from being picked up.
var (
	cudaLibNames = []string{"nvcuda.dll"}
	nvmlLibNames = []string{"nvml.dll"}
)

func openLibrary(env string, names []string) (uintptr, string, error) {
	type cand struct {
		path  string
		flags uintptr
	}
	var cands []cand
	if p := os.Getenv(env); p != "" {
		h, err := windows.LoadLibraryEx(p, 0, 0)
		if err != nil {
			return 0, "", fmt.Errorf("%s=%s: %v", env, p, err)
		}
		return uintptr(h), p, nil
	}
	for _, n := range names {
		cands = append(cands, cand{n, windows.LOAD_LIBRARY_SEARCH_SYSTEM32})
	}
	if pf := os.Getenv("ProgramFiles"); pf != "" {
		for _, n := range names {
			cands = append(cands, cand{filepath.Join(pf, "NVIDIA Corporation", "NVSMI", n), 0})
		}
	}
	var tried []string
	for _, c := range cands {
		h, err := windows.LoadLibraryEx(c.path, 0, c.flags)
		if err == nil {
			return uintptr(h), c.path, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%v)", c.path, err))
	}
	return 0, "", &libraryNotFoundError{name: names[0], tried: tried}
}

func lookup(h uintptr, name string) uintptr {
	p, err := windows.GetProcAddress(windows.Handle(h), name)
	if err != nil {
		return 0
	}
	return p
}
