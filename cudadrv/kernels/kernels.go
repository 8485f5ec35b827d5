// Package kernels holds ats's CUDA kernels: the CUDA C sources (*.cu), the
// PTX that tools/ptx/build.sh generates from them for several target
// architectures (ptx/, committed, embedded in the binary), and the Go
// launcher of each kernel. See README.md for adding a kernel.
package kernels

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/atsinfer/ats/cudadrv"
)

//go:embed ptx/*.ptx
var ptxFS embed.FS

// catalog maps a module name (the .cu file's base name) to the
// architectures its PTX was built for, ascending (e.g. 75 for compute_75).
var catalog = sync.OnceValue(func() map[string][]int {
	m := map[string][]int{}
	files, _ := fs.Glob(ptxFS, "ptx/*.ptx")
	for _, f := range files {
		// name.compute_XX.ptx
		base := strings.TrimSuffix(path.Base(f), ".ptx")
		name, arch, ok := strings.Cut(base, ".compute_")
		if !ok {
			continue
		}
		a, err := strconv.Atoi(arch)
		if err != nil {
			continue
		}
		m[name] = append(m[name], a)
	}
	for _, v := range m {
		slices.Sort(v)
	}
	return m
})

// Modules returns the names of the embedded modules, sorted.
func Modules() []string {
	var names []string
	for n := range catalog() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Archs returns the architectures module name was built for, ascending.
func Archs(name string) []int { return slices.Clone(catalog()[name]) }

// SelectArch returns the architecture whose PTX module name loads on a
// device of compute capability cc (major*10+minor): the highest built one
// not above cc. PTX for compute_XX is JIT-compiled for any device of
// capability XX or later, and the highest such variant may use the most of
// the device's features.
func SelectArch(name string, cc int) (int, error) {
	archs, ok := catalog()[name]
	if !ok {
		return 0, fmt.Errorf("kernels: no PTX embedded for module %q", name)
	}
	best := 0
	for _, a := range archs {
		if a <= cc {
			best = a
		}
	}
	if best == 0 {
		return 0, fmt.Errorf("kernels: module %s needs compute capability %d.%d or later; the device has %d.%d",
			name, archs[0]/10, archs[0]%10, cc/10, cc%10)
	}
	return best, nil
}

// PTX returns the PTX text of module name built for arch.
func PTX(name string, arch int) ([]byte, error) {
	b, err := ptxFS.ReadFile(fmt.Sprintf("ptx/%s.compute_%d.ptx", name, arch))
	if err != nil {
		return nil, fmt.Errorf("kernels: %w", err)
	}
	return b, nil
}

// Load JIT-compiles and loads module name in ctx, picking the PTX variant
// for the context's device. The module is named "name (compute_XX)" in
// errors.
func Load(ctx *cudadrv.Context, name string) (*cudadrv.Module, error) {
	major, minor, err := ctx.Device().ComputeCapability()
	if err != nil {
		return nil, err
	}
	arch, err := SelectArch(name, major*10+minor)
	if err != nil {
		return nil, err
	}
	src, err := PTX(name, arch)
	if err != nil {
		return nil, err
	}
	return ctx.LoadModule(fmt.Sprintf("%s (compute_%d)", name, arch), src, false)
}

// lookup fills each *Function with the kernel of the same name in m.
func lookup(m *cudadrv.Module, fns map[string]**cudadrv.Function) error {
	for name, dst := range fns {
		f, err := m.Function(name)
		if err != nil {
			return err
		}
		*dst = f
	}
	return nil
}

// argsPool recycles launch parameter blocks, so launchers do not allocate.
var argsPool = sync.Pool{New: func() any { return new(cudadrv.Args) }}

// launch queues f with the parameters set by fill.
func launch(f *cudadrv.Function, s *cudadrv.Stream, grid, block cudadrv.Dim3, shared int, fill func(*cudadrv.Args)) error {
	a := argsPool.Get().(*cudadrv.Args)
	fill(a.Reset())
	err := f.Launch(s, grid, block, shared, a)
	argsPool.Put(a)
	return err
}

// grid1 returns the grid for a grid-stride kernel over n items in blocks
// of block threads, capped: 8192 blocks of 256 threads fill any current GPU
// many times over, and the loop covers the rest.
func grid1(n, block int) cudadrv.Dim3 {
	return cudadrv.D1(max(1, min(cudadrv.Blocks(n, block), 8192)))
}
