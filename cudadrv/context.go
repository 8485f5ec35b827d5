package cudadrv

import (
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Symbols of context management.
var (
	// CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev);
	cuDevicePrimaryCtxRetain = cuSym("cuDevicePrimaryCtxRetain")
	// CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev);
	cuDevicePrimaryCtxRelease = cuSym("cuDevicePrimaryCtxRelease_v2")
	// CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags);
	cuDevicePrimaryCtxSetFlags = cuSym("cuDevicePrimaryCtxSetFlags_v2")
	// CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active);
	cuDevicePrimaryCtxGetState = cuSym("cuDevicePrimaryCtxGetState")
	// CUresult cuCtxSetCurrent(CUcontext ctx);
	cuCtxSetCurrent = cuSym("cuCtxSetCurrent")
	// CUresult cuCtxSynchronize(void);
	cuCtxSynchronize = cuSym("cuCtxSynchronize")
	// CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority);
	cuCtxGetStreamPriorityRange = cuSym("cuCtxGetStreamPriorityRange")
	// CUresult cuMemGetInfo_v2(size_t *free, size_t *total);
	cuMemGetInfo = cuSym("cuMemGetInfo_v2")
)

// ContextFlags are the CU_CTX_* flags of a primary context. The scheduling
// flags decide how a host thread waits for the GPU (cuCtxSynchronize,
// cuStreamSynchronize, cuEventSynchronize without BLOCKING_SYNC): spinning
// answers fastest but burns a core that ats's CPU workers want.
type ContextFlags uint32

const (
	CtxSchedAuto         ContextFlags = 0 // spin if cores are idle, else yield
	CtxSchedSpin         ContextFlags = 1
	CtxSchedYield        ContextFlags = 2
	CtxSchedBlockingSync ContextFlags = 4
	CtxLmemResizeToMax   ContextFlags = 16 // keep local memory grown for later launches
)

// SetPrimaryContextFlags sets the flags the device's primary context is (or
// will be) created with. Call it before RetainPrimaryContext.
func (d Device) SetPrimaryContextFlags(f ContextFlags) error {
	return cuDevicePrimaryCtxSetFlags.call(uintptr(d.h), uintptr(f))
}

// PrimaryContextState returns the primary context's flags and whether it is
// active (retained by someone in this process).
func (d Device) PrimaryContextState() (ContextFlags, bool, error) {
	var flags uint32
	var active int32
	err := cuDevicePrimaryCtxGetState.call(uintptr(d.h), uintptr(unsafe.Pointer(&flags)), uintptr(unsafe.Pointer(&active)))
	return ContextFlags(flags), active != 0, err
}

// Context is a retained primary context. Every method that needs the
// context current makes it so on the calling goroutine's OS thread for the
// duration of the driver call (see the package documentation), so a Context
// and everything made in it may be used from any goroutine.
type Context struct {
	h        uintptr // CUcontext
	dev      Device
	released atomic.Bool
}

// RetainPrimaryContext retains the device's primary context, creating it on
// first use. Release it with Context.Release.
func (d Device) RetainPrimaryContext() (*Context, error) {
	var h uintptr
	if err := cuDevicePrimaryCtxRetain.call(uintptr(unsafe.Pointer(&h)), uintptr(d.h)); err != nil {
		return nil, err
	}
	return &Context{h: h, dev: d}, nil
}

// Device returns the context's device.
func (c *Context) Device() Device { return c.dev }

// Handle returns the CUcontext, for code that calls the driver itself.
func (c *Context) Handle() uintptr { return c.h }

// Release releases the primary context. The driver destroys it (and every
// allocation, stream, event and module made in it) when the last retain in
// the process is released. Calling Release again does nothing.
func (c *Context) Release() error {
	if c.released.Swap(true) {
		return nil
	}
	return cuDevicePrimaryCtxRelease.call(uintptr(c.dev.h))
}

// enter locks the goroutine to its OS thread and makes c current there; exit
// undoes the lock. cuCtxSetCurrent on a thread where c is already current is
// a thread-local compare in the driver, cheap next to any real call.
func (c *Context) enter() error {
	runtime.LockOSThread()
	if err := cuCtxSetCurrent.call(c.h); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	return nil
}

func (c *Context) exit() { runtime.UnlockOSThread() }

// Do runs fn with the calling goroutine locked to its OS thread and c
// current on it, for code that calls driver functions not bound here.
func (c *Context) Do(fn func() error) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	return fn()
}

// Synchronize waits until every stream of the context is idle and returns
// the first asynchronous error (a faulting kernel surfaces here).
func (c *Context) Synchronize() error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	return cuCtxSynchronize.call()
}

// StreamPriorityRange returns the stream priorities the device supports.
// Lower numbers are higher priorities: greatest is the most urgent (e.g. -5)
// and least the default (0).
func (c *Context) StreamPriorityRange() (least, greatest int, err error) {
	if err := c.enter(); err != nil {
		return 0, 0, err
	}
	defer c.exit()
	var l, g int32
	err = cuCtxGetStreamPriorityRange.call(uintptr(unsafe.Pointer(&l)), uintptr(unsafe.Pointer(&g)))
	return int(l), int(g), err
}

// MemInfo returns the free and total device memory in bytes as the driver
// sees them now (other processes' allocations included).
func (c *Context) MemInfo() (free, total uint64, err error) {
	if err := c.enter(); err != nil {
		return 0, 0, err
	}
	defer c.exit()
	err = cuMemGetInfo.call(uintptr(unsafe.Pointer(&free)), uintptr(unsafe.Pointer(&total)))
	return free, total, err
}
