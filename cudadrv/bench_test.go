package cudadrv

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"
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

// copyTarget is the device buffer of copyBytes and the non-blocking
// stream a copy benchmark copies into and on, released when b ends.
func copyTarget(b *testing.B, ctx *Context) (DevicePtr, *Stream) {
	b.Helper()
	d, err := ctx.Alloc(copyBytes)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { ctx.Free(d) })
	s, err := ctx.NewStream(StreamNonBlocking, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Destroy() })
	return d, s
}

func copyBench(b *testing.B, flags HostAllocFlags, dir string) {
	ctx, _ := needGPU(b)
	h, err := ctx.HostAlloc(copyBytes, flags)
	if err != nil {
		b.Fatal(err)
	}
	defer h.Free()
	copy(h.Bytes(), randBytes(1, copyBytes))
	d, s := copyTarget(b, ctx)
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

// BenchmarkHostShared measures how host memory divides between the CPU's
// reads and the link's copies, the two sources a hybrid decode step draws
// its host-resident weights from: every CPU thread summing a 2 GiB buffer
// (well past any L3), 256 MiB pinned copies to the GPU, and both at once.
// read-GB/s and link-GB/s are each side's rate, sum-GB/s the two
// together: what bounds a step that must bring so many bytes from host
// memory, whichever side takes them.
func BenchmarkHostShared(b *testing.B) {
	const readBytes, srcBytes = 2 << 30, 4 * copyBytes
	for _, mode := range []string{"read", "link", "both"} {
		b.Run(mode, func(b *testing.B) {
			ctx, _ := needGPU(b)
			h, err := ctx.HostAlloc(srcBytes, HostAllocPortable)
			if err != nil {
				b.Fatal(err)
			}
			defer h.Free()
			for i := range h.Bytes() {
				h.Bytes()[i] = byte(i)
			}
			d, s := copyTarget(b, ctx)
			buf := make([]uint64, readBytes/8)
			for i := range buf {
				buf[i] = uint64(i) // every page touched before timing
			}
			var read atomic.Int64
			var stop atomic.Bool
			var wg sync.WaitGroup
			readers := func() {
				n := runtime.GOMAXPROCS(0)
				per := len(buf) / n
				for w := range n {
					wg.Add(1)
					go func(x []uint64) {
						defer wg.Done()
						var sum uint64
						for !stop.Load() {
							for lo := 0; lo < len(x) && !stop.Load(); lo += 1 << 17 {
								var a, b2, c, e uint64
								y := x[lo:min(lo+1<<17, len(x))]
								for len(y) >= 4 {
									a += y[0]
									b2 += y[1]
									c += y[2]
									e += y[3]
									y = y[4:]
								}
								sum += a + b2 + c + e
								read.Add(8 << 17)
							}
						}
						runtime.KeepAlive(sum)
					}(buf[w*per : (w+1)*per])
				}
			}
			var copied int64
			copies := func(k int) {
				for i := range k {
					src := h.Bytes()[(i%4)*copyBytes : (i%4+1)*copyBytes]
					if err := s.CopyHtoD(d, src); err != nil {
						b.Fatal(err)
					}
					copied += copyBytes
				}
				if err := s.Synchronize(); err != nil {
					b.Fatal(err)
				}
			}
			copies(1) // warm
			if mode != "link" {
				readers()
			}
			b.ResetTimer()
			read.Store(0)
			copied = 0
			for range b.N {
				if mode == "read" {
					time.Sleep(20 * time.Millisecond)
					continue
				}
				copies(4)
			}
			b.StopTimer()
			stop.Store(true)
			wg.Wait()
			sec := b.Elapsed().Seconds()
			r, l := float64(read.Load())/sec/1e9, float64(copied)/sec/1e9
			b.ReportMetric(r, "read-GB/s")
			b.ReportMetric(l, "link-GB/s")
			b.ReportMetric(r+l, "sum-GB/s")
		})
	}
}
