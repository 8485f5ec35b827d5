package cudadrv

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Launch benchmarks: one op is 100 launches of an empty kernel followed by a
// stream synchronisation; ns/launch is the figure to read. They compare the
// public path (LockOSThread + cuCtxSetCurrent + SyscallN, with or without a
// pinned parameter block), the bare SyscallN call on a thread where the
// context is already current, purego.RegisterFunc's reflect-based call, and
// a CUDA graph replaying the same 100 launches.

const launchesPerOp = 100

type launchBench struct {
	ctx *Context
	s   *Stream
	m   *Module
	f   *Function // empty()
	f4  *Function // empty4(u64, u64, u32, f32)
}

func newLaunchBench(b *testing.B) *launchBench {
	ctx, _ := needGPU(b)
	m, err := ctx.LoadModule("empty", []byte(emptyPTX), false)
	if err != nil {
		b.Fatal(err)
	}
	f, err := m.Function("empty")
	if err != nil {
		b.Fatal(err)
	}
	f4, err := m.Function("empty4")
	if err != nil {
		b.Fatal(err)
	}
	s, err := ctx.NewStream(StreamNonBlocking, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Destroy(); m.Unload() })
	return &launchBench{ctx, s, m, f, f4}
}

func (lb *launchBench) finish(b *testing.B) {
	b.StopTimer()
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*launchesPerOp), "ns/launch")
}

func BenchmarkLaunchEmpty(b *testing.B) {
	lb := newLaunchBench(b)
	b.ReportAllocs()
	for b.Loop() {
		for range launchesPerOp {
			if err := lb.f.Launch(lb.s, D1(1), D1(32), 0, nil); err != nil {
				b.Fatal(err)
			}
		}
		if err := lb.s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	lb.finish(b)
}

func BenchmarkLaunchEmpty4Args(b *testing.B) {
	lb := newLaunchBench(b)
	b.ReportAllocs()
	var a Args
	for b.Loop() {
		for i := range launchesPerOp {
			a.Reset().Ptr(1 << 20).Ptr(2 << 20).U32(uint32(i)).F32(1.5)
			if err := lb.f4.Launch(lb.s, D1(1), D1(32), 0, &a); err != nil {
				b.Fatal(err)
			}
		}
		if err := lb.s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	lb.finish(b)
}

// BenchmarkLaunchEmptyNoSetCurrent calls cuLaunchKernel through SyscallN
// with the thread locked and the context made current once: the floor of
// the public path, which adds LockOSThread and cuCtxSetCurrent per call.
func BenchmarkLaunchEmptyNoSetCurrent(b *testing.B) {
	lb := newLaunchBench(b)
	b.ReportAllocs()
	if err := lb.ctx.enter(); err != nil {
		b.Fatal(err)
	}
	defer lb.ctx.exit()
	for b.Loop() {
		for range launchesPerOp {
			if err := cuLaunchKernel.call(lb.f.h, 1, 1, 1, 32, 1, 1, 0, lb.s.h, 0, 0); err != nil {
				b.Fatal(err)
			}
		}
		if err := cuStreamSynchronize.call(lb.s.h); err != nil {
			b.Fatal(err)
		}
	}
	lb.finish(b)
}

// BenchmarkLaunchEmptyRegisterFunc is the same bare call through
// purego.RegisterFunc's typed, reflect-based wrapper.
func BenchmarkLaunchEmptyRegisterFunc(b *testing.B) {
	lb := newLaunchBench(b)
	b.ReportAllocs()
	var launch func(f uintptr, gx, gy, gz, bx, by, bz, shm uint32, s uintptr, params, extra unsafe.Pointer) uint32
	purego.RegisterFunc(&launch, cuLaunchKernel.addr)
	if err := lb.ctx.enter(); err != nil {
		b.Fatal(err)
	}
	defer lb.ctx.exit()
	for b.Loop() {
		for range launchesPerOp {
			if r := launch(lb.f.h, 1, 1, 1, 32, 1, 1, 0, lb.s.h, nil, nil); r != 0 {
				b.Fatal(Result(r))
			}
		}
		if err := cuStreamSynchronize.call(lb.s.h); err != nil {
			b.Fatal(err)
		}
	}
	lb.finish(b)
}

// BenchmarkSetCurrent is the per-call overhead the public path adds.
func BenchmarkSetCurrent(b *testing.B) {
	ctx, _ := needGPU(b)
	for b.Loop() {
		if err := ctx.enter(); err != nil {
			b.Fatal(err)
		}
		ctx.exit()
	}
}

func BenchmarkLaunchEmptyGraph(b *testing.B) {
	lb := newLaunchBench(b)
	b.ReportAllocs()
	g, err := lb.s.Capture(CaptureRelaxed, func() error {
		for range launchesPerOp {
			if err := lb.f.Launch(lb.s, D1(1), D1(32), 0, nil); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	defer g.Destroy()
	ge, err := g.Instantiate(0)
	if err != nil {
		b.Fatal(err)
	}
	defer ge.Destroy()
	if err := ge.Upload(lb.s); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if err := ge.Launch(lb.s); err != nil {
			b.Fatal(err)
		}
		if err := lb.s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	lb.finish(b)
}

// Copy benchmarks: 256 MiB per op, async on a non-blocking stream, then
// synchronised. SetBytes makes the MB/s column the link speed.

const copyBytes = 256 << 20

func copyBench(b *testing.B, flags HostAllocFlags, dir string) {
	ctx, _ := needGPU(b)
	h, err := ctx.HostAlloc(copyBytes, flags)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Free()
	copy(h.Bytes(), randBytes(1, copyBytes))
	d, err := ctx.Alloc(copyBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer ctx.Free(d)
	s, err := ctx.NewStream(StreamNonBlocking, 0)
	if err != nil {
		b.Fatal(err)
	}
	defer s.Destroy()
	one := func() error {
		if dir == "HtoD" {
			return s.CopyHtoD(d, h.Bytes())
		}
		return s.CopyDtoH(h.Bytes(), d)
	}
	if err := one(); err != nil { // warm: first touch of the pages
		b.Fatal(err)
	}
	b.SetBytes(copyBytes)
	for b.Loop() {
		if err := one(); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCopyHtoDPinned256MiB(b *testing.B) { copyBench(b, HostAllocPortable, "HtoD") }
func BenchmarkCopyDtoHPinned256MiB(b *testing.B) { copyBench(b, HostAllocPortable, "DtoH") }

// BenchmarkCopyHtoDPageable256MiB copies from ordinary Go memory, for
// comparison: the driver stages it through its own pinned buffers.
func BenchmarkCopyHtoDPageable256MiB(b *testing.B) {
	ctx, _ := needGPU(b)
	src := randBytes(2, copyBytes)
	d, err := ctx.Alloc(copyBytes)
	if err != nil {
		b.Fatal(err)
	}
	defer ctx.Free(d)
	b.SetBytes(copyBytes)
	for b.Loop() {
		if err := ctx.CopyHtoD(d, src); err != nil {
			b.Fatal(err)
		}
	}
	runtime.KeepAlive(src)
}
