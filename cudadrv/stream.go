package cudadrv

import (
	"sync/atomic"
	"time"
	"unsafe"
)

// Symbols of streams and events.
var (
	// CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags, int priority);
	cuStreamCreateWithPriority = cuSym("cuStreamCreateWithPriority")
	// CUresult cuStreamDestroy_v2(CUstream hStream);
	cuStreamDestroy = cuSym("cuStreamDestroy_v2")
	// CUresult cuStreamSynchronize(CUstream hStream);
	cuStreamSynchronize = cuSym("cuStreamSynchronize")
	// CUresult cuStreamQuery(CUstream hStream);
	cuStreamQuery = cuSym("cuStreamQuery")
	// CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags);
	cuStreamWaitEvent = cuSym("cuStreamWaitEvent")
	// CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags);
	cuEventCreate = cuSym("cuEventCreate")
	// CUresult cuEventDestroy_v2(CUevent hEvent);
	cuEventDestroy = cuSym("cuEventDestroy_v2")
	// CUresult cuEventRecord(CUevent hEvent, CUstream hStream);
	cuEventRecord = cuSym("cuEventRecord")
	// CUresult cuEventSynchronize(CUevent hEvent);
	cuEventSynchronize = cuSym("cuEventSynchronize")
	// CUresult cuEventQuery(CUevent hEvent);
	cuEventQuery = cuSym("cuEventQuery")
	// CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd);
	cuEventElapsedTime = cuSym("cuEventElapsedTime")
	// CUresult cuStreamWriteValue32_v2(CUstream stream, CUdeviceptr addr, cuuint32_t value, unsigned int flags);
	cuStreamWriteValue32 = cuSym("cuStreamWriteValue32_v2")
)

// StreamFlags are the CU_STREAM_* creation flags.
type StreamFlags uint32

const (
	// StreamDefault streams synchronise with the legacy default stream (the
	// one synchronous copies and a nil *Stream use).
	StreamDefault StreamFlags = 0
	// StreamNonBlocking streams run concurrently with the legacy default
	// stream. ats's compute and copy streams are non-blocking.
	StreamNonBlocking StreamFlags = 1
)

// Stream is a CUstream. A nil *Stream stands for the legacy default stream
// wherever a stream is taken.
type Stream struct {
	h         uintptr
	ctx       *Context
	destroyed atomic.Bool
	// pdl: SetProgrammatic; afterKernel: the last work queued on the
	// stream was a kernel launch (Function.Launch), which a programmatic
	// launch may overlap.
	pdl, afterKernel atomic.Bool
}

// SetProgrammatic turns programmatic dependent launch on or off for the
// kernels queued on s (devices of compute capability 9.0 and later; the
// driver's cuLaunchKernelEx). A kernel launched right after another kernel
// on s is then launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION:
// its blocks may be scheduled once every block of the kernel before has
// executed griddepcontrol.launch_dependents (or exited), while that kernel
// still runs, and the stream's order holds only through the kernel's own
// griddepcontrol.wait, which returns when the kernels before it have
// completed and their writes are visible. So every kernel launched on such
// a stream must execute griddepcontrol.wait before it reads or writes
// memory that earlier work touches (ats's kernels do so first thing:
// PDL_ENTRY in cudadrv/kernels). A kernel after a copy, memset, event or
// graph launch is launched as usual. Inside a stream capture the overlap
// becomes a programmatic edge of the graph. On a device before 9.0, or
// without cuLaunchKernelEx (a driver before CUDA 12), it does nothing. It
// returns whether it is in effect.
func (s *Stream) SetProgrammatic(on bool) bool {
	if s == nil {
		return false
	}
	if on {
		major, _, err := s.ctx.Device().ComputeCapability()
		on = err == nil && major >= 9 && cuLaunchKernelEx.addr != 0
	}
	s.pdl.Store(on)
	return on
}

// Programmatic reports whether SetProgrammatic is in effect on s.
func (s *Stream) Programmatic() bool { return s != nil && s.pdl.Load() }

// queued notes what was last queued on s: a kernel launch or other work.
func (s *Stream) queued(kernel bool) {
	if s != nil {
		s.afterKernel.Store(kernel)
	}
}

// NewStream creates a stream. priority follows StreamPriorityRange: 0 is the
// default, lower is more urgent; values outside the range are clamped by the
// driver.
func (c *Context) NewStream(flags StreamFlags, priority int) (*Stream, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.exit()
	var h uintptr
	if err := cuStreamCreateWithPriority.call(uintptr(unsafe.Pointer(&h)), uintptr(flags), uintptr(int32(priority))); err != nil {
		return nil, err
	}
	return &Stream{h: h, ctx: c}, nil
}

// handle returns the CUstream, 0 (the legacy default stream) for nil.
func (s *Stream) handle() uintptr {
	if s == nil {
		return 0
	}
	return s.h
}

// Handle returns the CUstream, 0 for the nil (legacy default) stream.
func (s *Stream) Handle() uintptr { return s.handle() }

// Destroy destroys the stream once its queued work finishes; the call does
// not wait. Calling it again does nothing.
func (s *Stream) Destroy() error {
	if s == nil || s.destroyed.Swap(true) {
		return nil
	}
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	return cuStreamDestroy.call(s.h)
}

// Synchronize waits until all work queued on the stream has finished.
func (s *Stream) Synchronize() error {
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	return cuStreamSynchronize.call(s.h)
}

// Done reports whether all work queued on the stream has finished, without
// waiting.
func (s *Stream) Done() (bool, error) {
	if err := s.ctx.enter(); err != nil {
		return false, err
	}
	defer s.ctx.exit()
	return notReady(cuStreamQuery.call(s.h))
}

// notReady turns CUDA_ERROR_NOT_READY from a query into (false, nil).
func notReady(err error) (bool, error) {
	if e, ok := err.(*Error); ok && e.Code == ErrorNotReady {
		return false, nil
	}
	return err == nil, err
}

// WaitEvent makes all work queued on s after this call wait until e has
// completed (its last Record). The host does not wait.
func (s *Stream) WaitEvent(e *Event) error {
	ctx := e.ctx
	if s != nil {
		ctx = s.ctx
	}
	if err := ctx.enter(); err != nil {
		return err
	}
	defer ctx.exit()
	s.queued(false)
	return cuStreamWaitEvent.call(s.handle(), e.h, 0)
}

// WriteValue32 queues a write of v to the 32-bit word at addr (device
// memory, or pinned host memory mapped into the device) once the work
// queued before it has finished; the driver fences first, so that work's
// writes are visible before the word is (CU_STREAM_WRITE_VALUE_DEFAULT).
// The host can then poll the word instead of calling Synchronize. A driver
// without it (before CUDA 11.7) returns an error.
func (s *Stream) WriteValue32(addr DevicePtr, v uint32) error {
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	s.queued(false)
	return cuStreamWriteValue32.call(s.handle(), uintptr(addr), uintptr(v), 0)
}

// Record is shorthand for e.Record(s).
func (s *Stream) Record(e *Event) error { return e.Record(s) }

// MemsetD8 queues setting n bytes at p to v.
func (s *Stream) MemsetD8(p DevicePtr, v byte, n int) error {
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	s.queued(false)
	return cuMemsetD8Async.call(uintptr(p), uintptr(v), uintptr(n), s.h)
}

// MemsetD32 queues setting n 32-bit words at p to v.
func (s *Stream) MemsetD32(p DevicePtr, v uint32, n int) error {
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	s.queued(false)
	return cuMemsetD32Async.call(uintptr(p), uintptr(v), uintptr(n), s.h)
}

// CopyHtoD queues a copy of src to dst. The copy reads src after the call
// returns: src must be pinned (HostMem, Registration) and stay valid until
// the stream has passed the copy. From pageable memory the driver copies
// synchronously through a staging buffer.
func (s *Stream) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	s.queued(false)
	return cuMemcpyHtoDAsync.call(uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)), s.h)
}

// CopyDtoH queues a copy of len(dst) bytes from src into dst, which must be
// pinned and stay valid until the stream has passed the copy.
func (s *Stream) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	s.queued(false)
	return cuMemcpyDtoHAsync.call(uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)), s.h)
}

// CopyDtoD queues a copy of n bytes between device buffers.
func (s *Stream) CopyDtoD(dst, src DevicePtr, n int) error {
	if err := s.ctx.enter(); err != nil {
		return err
	}
	defer s.ctx.exit()
	s.queued(false)
	return cuMemcpyDtoDAsync.call(uintptr(dst), uintptr(src), uintptr(n), s.h)
}

// EventFlags are the CU_EVENT_* creation flags.
type EventFlags uint32

const (
	EventDefault EventFlags = 0
	// EventBlockingSync makes Synchronize sleep instead of spinning: right
	// for long waits while CPU workers need the cores.
	EventBlockingSync EventFlags = 1
	// EventDisableTiming makes record and wait cheaper; such events cannot
	// be timed. Use it for events that only order work.
	EventDisableTiming EventFlags = 2
)

// Event is a CUevent: a marker in a stream that other streams and the host
// can wait for, and that can time the work between two markers.
type Event struct {
	h         uintptr
	ctx       *Context
	destroyed atomic.Bool
}

// NewEvent creates an event.
func (c *Context) NewEvent(flags EventFlags) (*Event, error) {
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.exit()
	var h uintptr
	if err := cuEventCreate.call(uintptr(unsafe.Pointer(&h)), uintptr(flags)); err != nil {
		return nil, err
	}
	return &Event{h: h, ctx: c}, nil
}

// Record captures in e the work queued on s so far (nil: the legacy default
// stream). Waits on e then wait for that work.
func (e *Event) Record(s *Stream) error {
	if err := e.ctx.enter(); err != nil {
		return err
	}
	defer e.ctx.exit()
	s.queued(false)
	return cuEventRecord.call(e.h, s.handle())
}

// Synchronize blocks the calling goroutine until the recorded work is done.
func (e *Event) Synchronize() error {
	if err := e.ctx.enter(); err != nil {
		return err
	}
	defer e.ctx.exit()
	return cuEventSynchronize.call(e.h)
}

// Done reports whether the recorded work is done, without waiting.
func (e *Event) Done() (bool, error) {
	if err := e.ctx.enter(); err != nil {
		return false, err
	}
	defer e.ctx.exit()
	return notReady(cuEventQuery.call(e.h))
}

// Elapsed returns the device time between start and end, both recorded and
// completed, created without EventDisableTiming. Resolution is about 0.5 µs.
func Elapsed(start, end *Event) (time.Duration, error) {
	if err := start.ctx.enter(); err != nil {
		return 0, err
	}
	defer start.ctx.exit()
	var ms float32
	if err := cuEventElapsedTime.call(uintptr(unsafe.Pointer(&ms)), start.h, end.h); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}

// Destroy destroys the event. Calling it again does nothing.
func (e *Event) Destroy() error {
	if e == nil || e.destroyed.Swap(true) {
		return nil
	}
	if err := e.ctx.enter(); err != nil {
		return err
	}
	defer e.ctx.exit()
	return cuEventDestroy.call(e.h)
}
