//go:build linux

package cudadrv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ebitengine/purego"
)

// Library file names and the directories searched for them besides the
// dynamic loader's own search (LD_LIBRARY_PATH, the ld.so cache). The NVIDIA
// container toolkit mounts the driver under /usr/local/nvidia/lib64; WSL2
// puts it under /usr/lib/wsl/lib. CUDA's stubs directory is deliberately not
// searched: its libcuda.so only answers CUDA_ERROR_STUB_LIBRARY.
var (
	cudaLibNames = []string{"libcuda.so.1", "libcuda.so"}
	nvmlLibNames = []string{"libnvidia-ml.so.1", "libnvidia-ml.so"}
	libDirs      = []string{
		"/usr/local/nvidia/lib64",
		"/usr/local/nvidia/lib",
		"/usr/lib/x86_64-linux-gnu",
		"/usr/lib/aarch64-linux-gnu",
		"/usr/lib64",
		"/usr/lib",
		"/usr/lib/wsl/lib",
	}
)

// openLibrary dlopens the first of names that loads, trying each bare name
// (the dynamic loader's search), then each name in every directory of
// LD_LIBRARY_PATH and of libDirs. The environment variable env, when set,
// names the one file to load instead. The error's Detail lists every
// attempt so a user can see where ats looked.
func openLibrary(env string, names []string) (uintptr, string, error) {
	var cands []string
	if p := os.Getenv(env); p != "" {
		h, err := purego.Dlopen(p, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			return 0, "", fmt.Errorf("%s=%s: %v", env, p, err)
		}
		return h, p, nil
	}
	cands = append(cands, names...)
	dirs := filepath.SplitList(os.Getenv("LD_LIBRARY_PATH"))
	dirs = append(dirs, libDirs...)
	for _, d := range dirs {
		if d == "" {
			continue
		}
		for _, n := range names {
			cands = append(cands, filepath.Join(d, n))
		}
	}
	var tried []string
	seen := map[string]bool{}
	for _, c := range cands {
		if seen[c] {
			continue
		}
		seen[c] = true
		if strings.ContainsRune(c, '/') {
			if _, err := os.Stat(c); err != nil {
				tried = append(tried, c+" (absent)")
				continue
			}
		}
		h, err := purego.Dlopen(c, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err == nil {
			return h, c, nil
		}
		tried = append(tried, fmt.Sprintf("%s (%v)", c, err))
	}
	return 0, "", &libraryNotFoundError{name: names[0], tried: tried}
}

// lookup returns the address of symbol name in the library, 0 if absent.
func lookup(h uintptr, name string) uintptr {
	p, err := purego.Dlsym(h, name)
	if err != nil {
		return 0
	}
	return p
}
