// Package kernels holds ats's CUDA kernels: the CUDA C sources (*.cu, with
// the headers they share, *.cuh), what tools/ptx/build.sh builds from them
// (ptx/: PTX per target architecture; fatbin/: per source one fatbin
// holding SASS for each architecture and that PTX, embedded in the binary),
// and the Go launcher of each kernel. A kernel set (Norm, WeightOps, ...)
// loads its module at its first launch, so a process loads only the
// modules its model uses. See README.md for adding a kernel.
package kernels

import (
	"bufio"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/atsinfer/ats/cudadrv"
)

// contents is what one module's fatbin holds, from its manifest.
type contents struct {
	sass, ptx []int // architectures, ascending (75 for sm_75 / compute_75)
}

// catalog maps a module name (the .cu file's base name) to its fatbin's
// contents. A malformed manifest is a build error, caught by the package's
// tests; here it leaves the module out.
var catalog = sync.OnceValue(func() map[string]contents {
	m := map[string]contents{}
	files, _ := fs.Glob(imageFS(), "fatbin/*.manifest")
	for _, f := range files {
		b, err := fs.ReadFile(imageFS(), f)
		if err != nil {
			continue
		}
		c, err := parseManifest(b)
		if err != nil {
			continue
		}
		m[strings.TrimSuffix(path.Base(f), ".manifest")] = c.contents
	}
	return m
})

// manifest is a parsed fatbin/<name>.manifest, written by tools/ptx/build.sh:
//
//	source cudadrv/kernels/<name>.cu sha256:<hex>
//	fatbin sha256:<hex>
//	sass 75 80 86 89 90
//	ptx 75 80 86 89 90
type manifest struct {
	contents
	sourceSum, fatbinSum string
}

func parseManifest(b []byte) (manifest, error) {
	var m manifest
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		key, val, _ := strings.Cut(sc.Text(), " ")
		var err error
		switch key {
		case "source":
			_, sum, _ := strings.Cut(val, " sha256:")
			m.sourceSum = sum
		case "fatbin":
			m.fatbinSum = strings.TrimPrefix(val, "sha256:")
		case "sass":
			m.sass, err = parseArchs(val)
		case "ptx":
			m.ptx, err = parseArchs(val)
		}
		if err != nil {
			return m, fmt.Errorf("%s line: %w", key, err)
		}
	}
	if len(m.sass) == 0 && len(m.ptx) == 0 {
		return m, fmt.Errorf("no sass or ptx line")
	}
	return m, nil
}

func parseArchs(s string) ([]int, error) {
	var archs []int
	for _, f := range strings.Fields(s) {
		a, err := strconv.Atoi(f)
		if err != nil || a < 10 {
			return nil, fmt.Errorf("architecture %q", f)
		}
		archs = append(archs, a)
	}
	slices.Sort(archs)
	return archs, nil
}

// Modules returns the names of the embedded modules, sorted.
func Modules() []string {
	var names []string
	for n := range catalog() {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Image is the code of a module that a device runs: SASS compiled ahead of
// time for sm_Arch, or PTX for compute_Arch that the driver JIT-compiles at
// load (and caches in ~/.nv/ComputeCache unless CUDA_CACHE_DISABLE=1).
type Image struct {
	Arch int // major*10 + minor
	SASS bool
}

func (i Image) String() string {
	if i.SASS {
		return fmt.Sprintf("sm_%d SASS", i.Arch)
	}
	return fmt.Sprintf("compute_%d PTX (JIT)", i.Arch)
}

// Images returns what module name's fatbin holds: its SASS, then its PTX,
// each by ascending architecture.
func Images(name string) []Image {
	c := catalog()[name]
	var out []Image
	for _, a := range c.sass {
		out = append(out, Image{Arch: a, SASS: true})
	}
	for _, a := range c.ptx {
		out = append(out, Image{Arch: a})
	}
	return out
}

// EnvForcePTXJIT is the driver's own switch (CUDA_FORCE_PTX_JIT=1) that
// makes it ignore SASS in a fatbin and JIT-compile the PTX: the way to
// compare the driver's compiler with the shipped SASS, or to step around a
// bad cubin. Select honours it so that reports say what loads.
const EnvForcePTXJIT = "CUDA_FORCE_PTX_JIT"

// Select returns the image of module name that the driver loads on a device
// of compute capability cc (major*10+minor), following the driver's rule
// for fatbins: SASS runs only on its own major architecture at the same or
// a later minor, so the SASS of the device's major with the highest minor
// not above the device's; when there is none (GPUs newer than the newest
// SASS, or CUDA_FORCE_PTX_JIT=1), the PTX of the highest architecture not
// above cc, which the driver JIT-compiles.
func Select(name string, cc int) (Image, error) {
	c, ok := catalog()[name]
	if !ok {
		return Image{}, fmt.Errorf("kernels: no module %q embedded", name)
	}
	return c.choose(name, cc, os.Getenv(EnvForcePTXJIT) == "1")
}

// choose is Select of a fatbin holding c; forcePTX skips the SASS.
func (c contents) choose(name string, cc int, forcePTX bool) (Image, error) {
	if !forcePTX {
		best := 0
		for _, a := range c.sass {
			if a/10 == cc/10 && a <= cc {
				best = a
			}
		}
		if best != 0 {
			return Image{Arch: best, SASS: true}, nil
		}
	}
	best := 0
	for _, a := range c.ptx {
		if a <= cc {
			best = a
		}
	}
	if best != 0 {
		return Image{Arch: best}, nil
	}
	all := append(slices.Clone(c.sass), c.ptx...)
	if len(all) > 0 && slices.Min(all) > cc {
		low := slices.Min(all)
		return Image{}, fmt.Errorf("kernels: module %s needs compute capability %d.%d or later; the device has %d.%d",
			name, low/10, low%10, cc/10, cc%10)
	}
	return Image{}, fmt.Errorf("kernels: module %s (SASS for %v, PTX for %v) has no image for compute capability %d.%d",
		name, c.sass, c.ptx, cc/10, cc%10)
}

// Fatbin returns the embedded fatbin of module name.
func Fatbin(name string) ([]byte, error) {
	b, err := fs.ReadFile(imageFS(), "fatbin/"+name+".fatbin")
	if err != nil {
		return nil, fmt.Errorf("kernels: %w", err)
	}
	return b, nil
}

// selectFor is Select for the context's device.
func selectFor(ctx *cudadrv.Context, name string) (Image, error) {
	major, minor, err := ctx.Device().ComputeCapability()
	if err != nil {
		return Image{}, err
	}
	return Select(name, major*10+minor)
}

// Load loads module name's fatbin in ctx now; the driver picks the image
// (Select says which). The module is named "name (image)" in errors.
func Load(ctx *cudadrv.Context, name string) (*cudadrv.Module, error) {
	img, err := selectFor(ctx, name)
	if err != nil {
		return nil, err
	}
	fb, err := Fatbin(name)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	m, err := ctx.LoadModule(fmt.Sprintf("%s (%s)", name, img), fb, false)
	if err != nil {
		return nil, err
	}
	if logLoads {
		fmt.Fprintf(os.Stderr, "ats: kernels: loaded %s in %v\n", m.Name(), time.Since(start).Round(10*time.Microsecond))
	}
	return m, nil
}

// EnvLogLoads, set to 1, has every module load logged on stderr with its
// wall time: what a cold start spends where.
const EnvLogLoads = "ATS_GPU_LOG_LOADS"

var logLoads = os.Getenv(EnvLogLoads) == "1"

// lazyModule is one module in one context, loaded by the first launch that
// needs it (ready), or by Load. Kernel sets embed it.
type lazyModule struct {
	name string
	open func() (*cudadrv.Module, error) // Load of the module in its context
	bind func(*cudadrv.Module) error     // looks the set's kernels up

	once     sync.Once
	mod      *cudadrv.Module
	err      error
	loaded   atomic.Bool
	unloaded atomic.Bool
}

// prepare prepares module name of ctx, loaded later by ready; it fails now if
// no image of the module runs on the device.
func (l *lazyModule) prepare(ctx *cudadrv.Context, name string, bind func(*cudadrv.Module) error) error {
	if _, err := selectFor(ctx, name); err != nil {
		return err
	}
	l.name, l.bind = name, bind
	l.open = func() (*cudadrv.Module, error) { return Load(ctx, name) }
	return nil
}

// prepareLookup is prepare for a set whose kernels are fns, by name.
func (l *lazyModule) prepareLookup(ctx *cudadrv.Context, name string, fns map[string]**cudadrv.Function) error {
	return l.prepare(ctx, name, func(m *cudadrv.Module) error { return lookup(m, fns) })
}

// loadNow returns the set k of a New* constructor after loading its
// module: the Load* constructors.
func loadNow[T interface{ Load() error }](k T, err error) (T, error) {
	if err == nil {
		err = k.Load()
	}
	if err != nil {
		var none T
		return none, err
	}
	return k, nil
}

// ready loads the module unless done; every later call returns the first
// load's error, which names the module.
func (l *lazyModule) ready() error {
	l.once.Do(l.load)
	if l.err == nil && l.unloaded.Load() {
		return fmt.Errorf("kernels: module %s used after Unload", l.name)
	}
	return l.err
}

func (l *lazyModule) load() {
	m, err := l.open()
	if err != nil {
		l.err = err
		return
	}
	if err := l.bind(m); err != nil {
		_ = m.Unload()
		l.err = fmt.Errorf("kernels: module %s: %w", l.name, err)
		return
	}
	l.mod = m
	l.loaded.Store(true)
}

// Load loads the module now if no launch has yet: for callers that want a
// load failure at start, or the load out of a timed or captured region.
func (l *lazyModule) Load() error { return l.ready() }

// Loaded reports whether the module is loaded.
func (l *lazyModule) Loaded() bool { return l.loaded.Load() && !l.unloaded.Load() }

// Unload unloads the module if it was loaded; the set's launchers fail
// after it. Calling it again does nothing.
func (l *lazyModule) Unload() error {
	l.once.Do(func() {}) // a set never loaded stays unloaded
	if l.unloaded.Swap(true) || l.mod == nil {
		return nil
	}
	return l.mod.Unload()
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
