package cudadrv_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"testing"
	"time"

	"github.com/atsinfer/ats/cudadrv"
	"github.com/atsinfer/ats/cudadrv/kernels"
)

// Tests of the embedded kernels on the GPU; external because
// cudadrv/kernels imports cudadrv.

func randF32(seed uint64, n int) []float32 {
	b := cudadrv.RandBytes(seed, 4*n)
	v := make([]float32, n)
	for i := range v {
		// Uniform in [-8, 8): finite, varied exponents.
		v[i] = (float32(binary.LittleEndian.Uint32(b[4*i:])>>8)/(1<<24) - 0.5) * 16
	}
	return v
}

func f32Bytes(v []float32) []byte {
	b := make([]byte, 4*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(x))
	}
	return b
}

func bytesF32(b []byte) []float32 {
	v := make([]float32, len(b)/4)
	for i := range v {
		v[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return v
}

func upload(t *testing.T, ctx *cudadrv.Context, v []float32) cudadrv.DevicePtr {
	t.Helper()
	p, err := ctx.Alloc(4 * len(v))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Free(p) })
	if err := ctx.CopyHtoD(p, f32Bytes(v)); err != nil {
		t.Fatal(err)
	}
	return p
}

func download(t *testing.T, ctx *cudadrv.Context, p cudadrv.DevicePtr, n int) []float32 {
	t.Helper()
	b := make([]byte, 4*n)
	if err := ctx.CopyDtoH(b, p); err != nil {
		t.Fatal(err)
	}
	return bytesF32(b)
}

// poisoned allocates n float32s filled with NaN, so unwritten outputs show.
func poisoned(t *testing.T, ctx *cudadrv.Context, n int) cudadrv.DevicePtr {
	t.Helper()
	p, err := ctx.Alloc(4 * n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ctx.Free(p) })
	if err := ctx.MemsetD32(p, 0x7fc00bad, n); err != nil {
		t.Fatal(err)
	}
	return p
}

func equalF32(t *testing.T, what string, got, want []float32) {
	t.Helper()
	for i := range want {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Fatalf("%s: element %d = %v, want %v", what, i, got[i], want[i])
		}
	}
}

// TestEmbeddedImagesLoad loads every embedded fatbin (the driver runs the
// image kernels.Select names) and JIT-compiles every committed PTX variant
// the device can run: the check that nvcc 11.8's output, SASS and PTX,
// loads on this driver.
func TestEmbeddedImagesLoad(t *testing.T) {
	ctx, info := cudadrv.NeedGPU(t)
	for _, name := range kernels.Modules() {
		start := time.Now()
		m, err := kernels.Load(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: loaded in %v (JIT %v)", m.Name(), time.Since(start), m.JITTime)
		if err := m.Unload(); err != nil {
			t.Fatal(err)
		}
		for _, img := range kernels.Images(name) {
			if img.SASS || img.Arch > info.CC() {
				continue
			}
			src, err := os.ReadFile(fmt.Sprintf("kernels/ptx/%s.compute_%d.ptx", name, img.Arch))
			if _, dirErr := os.Stat("kernels/ptx"); errors.Is(err, fs.ErrNotExist) && dirErr == nil {
				// Only compute_75's and compute_90's PTX are committed
				// (tools/ptx/build.sh, PTX_KEEP); the others are in the
				// fatbin alone.
				continue
			}
			if errors.Is(err, fs.ErrNotExist) {
				// The PTX files are read from the source tree, relative
				// to the package directory: a test binary run elsewhere
				// checks the embedded images only.
				t.Logf("kernels/ptx not found from %s: the PTX JIT of each architecture is not checked", cwd())
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			m, err := ctx.LoadModule(name, src, true)
			if err != nil {
				t.Fatalf("%s %v: %v", name, img, err)
			}
			t.Logf("%s %v: JIT %v", name, img, m.JITTime)
			if err := m.Unload(); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestLazyLoading checks that kernel sets load their modules at the first
// launch that needs them, and WeightOps each of its two on its own.
func TestLazyLoading(t *testing.T) {
	ctx, _ := cudadrv.NeedGPU(t)
	s, err := ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()

	e, err := kernels.NewElementwise(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer e.Unload()
	if e.Loaded() {
		t.Fatal("NewElementwise loaded its module")
	}
	const n = 64
	x := upload(t, ctx, randF32(1, n))
	if err := errors.Join(e.ScaleF32(s, x, x, 1, n), s.Synchronize()); err != nil {
		t.Fatal(err)
	}
	if !e.Loaded() {
		t.Fatal("elementwise not loaded after a launch")
	}

	w, err := kernels.NewWeightOps(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Unload()
	if mv, mm := w.Loaded(); mv || mm {
		t.Fatalf("NewWeightOps loaded matvec %v, matmul %v", mv, mm)
	}
	q8, err := ctx.Alloc(kernels.Q8_1Bytes(1, n))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(q8)
	if err := errors.Join(w.QuantizeQ8_1(s, x, n, 1, n, q8), s.Synchronize()); err != nil {
		t.Fatal(err)
	}
	if mv, mm := w.Loaded(); !mv || mm {
		t.Fatalf("after a quantization: matvec loaded %v (want true), matmul %v (want false)", mv, mm)
	}
	xh, err := ctx.Alloc(kernels.F16Bytes(1, n))
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(xh)
	if err := errors.Join(w.ConvertF16(s, x, n, 1, n, xh), s.Synchronize()); err != nil {
		t.Fatal(err)
	}
	if mv, mm := w.Loaded(); !mv || !mm {
		t.Fatalf("after a conversion to f16: matvec loaded %v, matmul %v (want both)", mv, mm)
	}
}

// TestFirstLaunchInCapture loads a module inside a (relaxed) stream
// capture, as the GPU executor does when the first decode step is the
// first use of a kernel set, and replays the graph.
func TestFirstLaunchInCapture(t *testing.T) {
	ctx, _ := cudadrv.NeedGPU(t)
	k, err := kernels.NewElementwise(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Unload()
	s, err := ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	const n = 4099
	a, b := randF32(7, n), randF32(8, n)
	da, db, sum := upload(t, ctx, a), upload(t, ctx, b), poisoned(t, ctx, n)
	g, err := s.Capture(cudadrv.CaptureRelaxed, func() error { return k.AddF32(s, sum, da, db, n) })
	if err != nil {
		t.Fatalf("first launch (the module load) inside a capture: %v", err)
	}
	defer g.Destroy()
	ge, err := g.Instantiate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ge.Destroy()
	if err := errors.Join(ge.Launch(s), s.Synchronize()); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, n)
	for i := range a {
		want[i] = a[i] + b[i]
	}
	equalF32(t, "sum from the graph", download(t, ctx, sum, n), want)
}

// BenchmarkModuleLoad loads each embedded module (the image Select names)
// and unloads it: the start-up cost of a module. With CUDA_CACHE_DISABLE=1
// every PTX load pays the JIT; CUDA_FORCE_PTX_JIT=1 measures the JIT of the
// PTX instead of the SASS load. tools/ptx/coldstart.sh runs it.
func BenchmarkModuleLoad(b *testing.B) {
	ctx, info := cudadrv.NeedGPU(b)
	for _, name := range kernels.Modules() {
		img, err := kernels.Select(name, info.CC())
		if err != nil {
			b.Fatal(err)
		}
		kind := fmt.Sprintf("compute_%d_PTX_JIT", img.Arch)
		if img.SASS {
			kind = fmt.Sprintf("sm_%d_SASS", img.Arch)
		}
		b.Run(name+"/"+kind, func(b *testing.B) {
			for range b.N {
				m, err := kernels.Load(ctx, name)
				if err != nil {
					b.Fatal(err)
				}
				if err := m.Unload(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func TestElementwiseKernels(t *testing.T) {
	ctx, _ := cudadrv.NeedGPU(t)
	k, err := kernels.LoadElementwise(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Unload()
	s, err := ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	// 8192 blocks * 256 threads = 2^21: the largest size exercises the
	// grid-stride loop.
	for _, n := range []int{1, 255, 257, 1<<20 + 17, 5<<20 + 3} {
		a, b := randF32(uint64(n), n), randF32(uint64(n)+1, n)
		da, db := upload(t, ctx, a), upload(t, ctx, b)
		sum, scaled := poisoned(t, ctx, n), poisoned(t, ctx, n)
		const factor = float32(-1.75)
		if err := errors.Join(k.AddF32(s, sum, da, db, n), k.ScaleF32(s, scaled, da, factor, n), s.Synchronize()); err != nil {
			t.Fatal(err)
		}
		wantSum, wantScaled := make([]float32, n), make([]float32, n)
		for i := range a {
			wantSum[i] = a[i] + b[i]
			wantScaled[i] = a[i] * factor
		}
		equalF32(t, "add_f32", download(t, ctx, sum, n), wantSum)
		equalF32(t, "scale_f32", download(t, ctx, scaled, n), wantScaled)
	}
}

// TestMappedMemoryKernel has a kernel read and write host memory directly
// through its device mapping (zero-copy), as activations will travel.
func TestMappedMemoryKernel(t *testing.T) {
	ctx, info := cudadrv.NeedGPU(t)
	if !info.CanMapHostMemory {
		t.Skip("device cannot map host memory")
	}
	k, err := kernels.LoadElementwise(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Unload()
	const n = 4096 + 5
	in, err := ctx.HostAlloc(4*n, cudadrv.HostAllocPortable|cudadrv.HostAllocDeviceMap)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Free()
	out, err := ctx.HostAlloc(4*n, cudadrv.HostAllocPortable|cudadrv.HostAllocDeviceMap)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Free()
	x := randF32(99, n)
	copy(in.Bytes(), f32Bytes(x))
	for i := range out.Bytes() {
		out.Bytes()[i] = 0xFF // NaN
	}
	if err := k.ScaleF32(nil, out.DevicePtr(), in.DevicePtr(), 3, n); err != nil {
		t.Fatal(err)
	}
	if err := ctx.Synchronize(); err != nil {
		t.Fatal(err)
	}
	want := make([]float32, n)
	for i := range x {
		want[i] = x[i] * 3
	}
	equalF32(t, "scale_f32 on mapped memory", bytesF32(out.Bytes()), want)
}

// TestCopyF32 moves floats device to mapped host and back with the
// zero-copy kernel, at aligned and misaligned offsets and odd lengths.
func TestCopyF32(t *testing.T) {
	ctx, info := cudadrv.NeedGPU(t)
	if !info.CanMapHostMemory {
		t.Skip("device cannot map host memory")
	}
	k, err := kernels.LoadElementwise(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Unload()
	for _, n := range []int{1, 3, 4, 1023, 5<<20 + 3} {
		for _, off := range []int{0, 1} { // floats: 0 keeps 16-byte alignment, 1 breaks it
			host, err := ctx.HostAlloc(4*(n+off), cudadrv.HostAllocPortable|cudadrv.HostAllocDeviceMap)
			if err != nil {
				t.Fatal(err)
			}
			x := randF32(uint64(n+off), n)
			dx := upload(t, ctx, x)
			hp := host.DevicePtr().Add(4 * off)
			for i := range host.Bytes() {
				host.Bytes()[i] = 0xFF
			}
			if err := errors.Join(k.CopyF32(nil, hp, dx, n), ctx.Synchronize()); err != nil {
				t.Fatal(err)
			}
			equalF32(t, "copy_f32 to host", bytesF32(host.Bytes()[4*off:]), x)
			back := poisoned(t, ctx, n+off)
			if err := errors.Join(k.CopyF32(nil, back.Add(4*off), hp, n), ctx.Synchronize()); err != nil {
				t.Fatal(err)
			}
			equalF32(t, "copy_f32 to device", download(t, ctx, back, n+off)[off:], x)
			host.Free()
		}
	}
}

// TestGraphCaptureReplay captures N launches, checks capture ran nothing,
// then replays the graph R times against the same sums in Go; then runs
// the same chain eagerly. With programmatic dependent launch (on devices
// of CC 9.0 and later) each kernel overlaps the one before and its
// griddepcontrol.wait alone keeps the chain's order: a kernel that read
// x before the previous one wrote it would lose a term.
func TestGraphCaptureReplay(t *testing.T) {
	for _, pdl := range []bool{false, true} {
		t.Run(fmt.Sprintf("programmatic=%v", pdl), func(t *testing.T) { testGraphCaptureReplay(t, pdl) })
	}
}

func testGraphCaptureReplay(t *testing.T, pdl bool) {
	ctx, _ := cudadrv.NeedGPU(t)
	k, err := kernels.LoadElementwise(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer k.Unload()
	s, err := ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	if pdl && !s.SetProgrammatic(true) {
		t.Skip("no programmatic dependent launch on this device or driver")
	}
	const n, launches, replays = 100003, 64, 3
	x0, y := randF32(5, n), randF32(6, n)
	dx, dy := upload(t, ctx, x0), upload(t, ctx, y)

	g, err := s.Capture(cudadrv.CaptureRelaxed, func() error {
		if st, err := s.CaptureStatus(); err != nil || st != cudadrv.CaptureActive {
			return errors.Join(err, errors.New("stream not capturing inside Capture"))
		}
		for range launches {
			// x = x + y, then x = x * 1 (exact): two kernels per step.
			if err := k.AddF32(s, dx, dx, dy, n); err != nil {
				return err
			}
			if err := k.ScaleF32(s, dx, dx, 1, n); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	defer g.Destroy()
	nodes, err := g.Nodes()
	if err != nil || nodes != 2*launches {
		t.Fatalf("graph has %d nodes (%v), want %d", nodes, err, 2*launches)
	}
	equalF32(t, "x after capture (nothing may run)", download(t, ctx, dx, n), x0)

	ge, err := g.Instantiate(0)
	if err != nil {
		t.Fatal(err)
	}
	defer ge.Destroy()
	for range replays {
		if err := ge.Launch(s); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	want := append([]float32(nil), x0...)
	for range replays * launches {
		for i := range want {
			want[i] += y[i]
		}
	}
	equalF32(t, "x after replays", download(t, ctx, dx, n), want)

	// The same chain, launched eagerly.
	for range launches {
		if err := errors.Join(k.AddF32(s, dx, dx, dy, n), k.ScaleF32(s, dx, dx, 1, n)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	for range launches {
		for i := range want {
			want[i] += y[i]
		}
	}
	equalF32(t, "x after eager launches", download(t, ctx, dx, n), want)
}

// BenchmarkAddF32Launch is a real kernel launched through its Go launcher
// (pooled parameters): the per-launch host cost an op pays.
func BenchmarkAddF32Launch(b *testing.B) {
	ctx, _ := cudadrv.NeedGPU(b)
	k, err := kernels.LoadElementwise(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer k.Unload()
	s, err := ctx.NewStream(cudadrv.StreamNonBlocking, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	const n = 4096
	p, err := ctx.Alloc(4 * n)
	if err != nil {
		b.Fatal(err)
	}
	defer ctx.Free(p)
	b.ReportAllocs()
	for b.Loop() {
		for range 100 {
			if err := k.AddF32(s, p, p, p, n); err != nil {
				b.Fatal(err)
			}
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*100), "ns/launch")
}

func cwd() string {
	d, err := os.Getwd()
	if err != nil {
		return "?"
	}
	return d
}
