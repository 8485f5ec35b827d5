package cudadrv

import (
	"errors"
	"fmt"
	"runtime"
	"sync/atomic"
	"unsafe"
)

// Symbols of memory management.
var (
	// CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize);
	cuMemAlloc = cuSym("cuMemAlloc_v2")
	// CUresult cuMemFree_v2(CUdeviceptr dptr);
	cuMemFree = cuSym("cuMemFree_v2")
	// CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N);
	cuMemsetD8 = cuSym("cuMemsetD8_v2")
	// CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N);
	cuMemsetD32 = cuSym("cuMemsetD32_v2")
	// CUresult cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream);
	cuMemsetD8Async = cuSym("cuMemsetD8Async")
	// CUresult cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream);
	cuMemsetD32Async = cuSym("cuMemsetD32Async")
	// CUresult cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags);
	cuMemHostAlloc = cuSym("cuMemHostAlloc")
	// CUresult cuMemFreeHost(void *p);
	cuMemFreeHost = cuSym("cuMemFreeHost")
	// CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *pdptr, void *p, unsigned int Flags);
	cuMemHostGetDevicePointer = cuSym("cuMemHostGetDevicePointer_v2")
	// CUresult cuMemHostRegister_v2(void *p, size_t bytesize, unsigned int Flags);
	cuMemHostRegister = cuSym("cuMemHostRegister_v2")
	// CUresult cuMemHostUnregister(void *p);
	cuMemHostUnregister = cuSym("cuMemHostUnregister")
	// CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount);
	cuMemcpyHtoD = cuSym("cuMemcpyHtoD_v2")
	// CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount);
	cuMemcpyDtoH = cuSym("cuMemcpyDtoH_v2")
	// CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount);
	cuMemcpyDtoD = cuSym("cuMemcpyDtoD_v2")
	// CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream);
	cuMemcpyHtoDAsync = cuSym("cuMemcpyHtoDAsync_v2")
	// CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
	cuMemcpyDtoHAsync = cuSym("cuMemcpyDtoHAsync_v2")
	// CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream);
	cuMemcpyDtoDAsync = cuSym("cuMemcpyDtoDAsync_v2")
)

// DevicePtr is a CUdeviceptr: an address in the device's (unified) address
// space, never a Go pointer.
type DevicePtr uint64

// Add returns p advanced by off bytes.
func (p DevicePtr) Add(off int) DevicePtr { return p + DevicePtr(off) }

// Alloc allocates n bytes of device memory (cuMemAlloc: 256-byte aligned,
// not initialised).
func (c *Context) Alloc(n int) (DevicePtr, error) {
	if n <= 0 {
		return 0, fmt.Errorf("cudadrv: Alloc(%d): size must be positive", n)
	}
	if err := c.enter(); err != nil {
		return 0, err
	}
	defer c.exit()
	var p DevicePtr
	if err := cuMemAlloc.call(uintptr(unsafe.Pointer(&p)), uintptr(n)); err != nil {
		return 0, fmt.Errorf("allocating %d bytes: %w", n, err)
	}
	return p, nil
}

// Free frees device memory from Alloc. Free(0) does nothing.
func (c *Context) Free(p DevicePtr) error {
	if p == 0 {
		return nil
	}
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	return cuMemFree.call(uintptr(p))
}

// MemsetD8 sets n bytes at p to v, synchronously.
func (c *Context) MemsetD8(p DevicePtr, v byte, n int) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	return cuMemsetD8.call(uintptr(p), uintptr(v), uintptr(n))
}

// MemsetD32 sets n 32-bit words at p (4-byte aligned) to v, synchronously:
// v = math.Float32bits(x) fills a float32 array with x.
func (c *Context) MemsetD32(p DevicePtr, v uint32, n int) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	return cuMemsetD32.call(uintptr(p), uintptr(v), uintptr(n))
}

// CopyHtoD copies src to dst and returns when src may be reused. src may be
// any Go memory; pinned memory copies at the link's full speed.
func (c *Context) CopyHtoD(dst DevicePtr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	return cuMemcpyHtoD.call(uintptr(dst), uintptr(unsafe.Pointer(&src[0])), uintptr(len(src)))
}

// CopyDtoH copies len(dst) bytes from src to dst and returns when done.
func (c *Context) CopyDtoH(dst []byte, src DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	return cuMemcpyDtoH.call(uintptr(unsafe.Pointer(&dst[0])), uintptr(src), uintptr(len(dst)))
}

// CopyDtoD copies n bytes between device buffers (ordered on the legacy
// default stream).
func (c *Context) CopyDtoD(dst, src DevicePtr, n int) error {
	if err := c.enter(); err != nil {
		return err
	}
	defer c.exit()
	return cuMemcpyDtoD.call(uintptr(dst), uintptr(src), uintptr(n))
}

// HostAllocFlags are the CU_MEMHOSTALLOC_* flags.
type HostAllocFlags uint32

const (
	// HostAllocPortable makes the memory pinned for every context, not only
	// the one that allocated it.
	HostAllocPortable HostAllocFlags = 1
	// HostAllocDeviceMap maps the memory into the device's address space, so
	// kernels can read and write it over the link (zero-copy).
	HostAllocDeviceMap HostAllocFlags = 2
	// HostAllocWriteCombined is fast for the host to write and the device to
	// read, but very slow for the host to read.
	HostAllocWriteCombined HostAllocFlags = 4
)

// HostMem is page-locked host memory from cuMemHostAlloc. Its bytes live
// outside the Go heap and stay valid until Free.
type HostMem struct {
	p     unsafe.Pointer
	n     int
	dptr  DevicePtr
	ctx   *Context
	freed atomic.Bool
}

// HostAlloc allocates n bytes of pinned host memory. With HostAllocDeviceMap
// the memory is also mapped into the device's address space
// (HostMem.DevicePtr). ats uses HostAllocPortable|HostAllocDeviceMap.
func (c *Context) HostAlloc(n int, flags HostAllocFlags) (*HostMem, error) {
	if n <= 0 {
		return nil, fmt.Errorf("cudadrv: HostAlloc(%d): size must be positive", n)
	}
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.exit()
	var p unsafe.Pointer
	if err := cuMemHostAlloc.call(uintptr(unsafe.Pointer(&p)), uintptr(n), uintptr(flags)); err != nil {
		return nil, fmt.Errorf("allocating %d pinned bytes: %w", n, err)
	}
	h := &HostMem{p: p, n: n, ctx: c}
	if flags&HostAllocDeviceMap != 0 {
		if err := cuMemHostGetDevicePointer.call(uintptr(unsafe.Pointer(&h.dptr)), uintptr(p), 0); err != nil {
			_ = cuMemFreeHost.call(uintptr(p))
			return nil, err
		}
	}
	return h, nil
}

// Bytes returns the memory as a slice. It must not be used after Free.
func (h *HostMem) Bytes() []byte { return unsafe.Slice((*byte)(h.p), h.n) }

// Pointer returns the host address.
func (h *HostMem) Pointer() unsafe.Pointer { return h.p }

// Len returns the size in bytes.
func (h *HostMem) Len() int { return h.n }

// DevicePtr returns the device address of mapped memory (0 if the memory
// was allocated without HostAllocDeviceMap). Kernels reach the host memory
// through it over the link.
func (h *HostMem) DevicePtr() DevicePtr { return h.dptr }

// Free releases the memory. Calling Free again does nothing.
func (h *HostMem) Free() error {
	if h == nil || h.freed.Swap(true) {
		return nil
	}
	if err := h.ctx.enter(); err != nil {
		return err
	}
	defer h.ctx.exit()
	return cuMemFreeHost.call(uintptr(h.p))
}

// HostRegisterFlags are the CU_MEMHOSTREGISTER_* flags.
type HostRegisterFlags uint32

const (
	HostRegisterPortable  HostRegisterFlags = 1
	HostRegisterDeviceMap HostRegisterFlags = 2
	HostRegisterIOMemory  HostRegisterFlags = 4
	// HostRegisterReadOnly promises that the device only reads the range. It
	// is what lets a read-only mapping (the model's mmap, PROT_READ) be
	// registered at all: without it the driver asks for write access and
	// fails. Needs AttrReadOnlyHostRegisterSupported.
	HostRegisterReadOnly HostRegisterFlags = 8
)

// Registration is a host range page-locked by cuMemHostRegister.
type Registration struct {
	p     unsafe.Pointer
	n     int
	dptr  DevicePtr
	ctx   *Context
	done  atomic.Bool
	owner []byte // keeps a Go-heap range alive while registered
}

// HostRegister page-locks the existing host range b so that copies from it
// run at the link's full speed and, with HostRegisterDeviceMap, kernels can
// read it. b is typically an mmap'd file (not Go heap memory); if it is Go
// memory, the Registration keeps it alive until Unregister.
func (c *Context) HostRegister(b []byte, flags HostRegisterFlags) (*Registration, error) {
	if len(b) == 0 {
		return nil, errors.New("cudadrv: HostRegister: empty range")
	}
	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.exit()
	p := unsafe.Pointer(&b[0])
	if err := cuMemHostRegister.call(uintptr(p), uintptr(len(b)), uintptr(flags)); err != nil {
		return nil, fmt.Errorf("registering %d bytes at %p: %w", len(b), p, err)
	}
	r := &Registration{p: p, n: len(b), ctx: c, owner: b}
	if flags&HostRegisterDeviceMap != 0 {
		if err := cuMemHostGetDevicePointer.call(uintptr(unsafe.Pointer(&r.dptr)), uintptr(p), 0); err != nil {
			_ = cuMemHostUnregister.call(uintptr(p))
			return nil, err
		}
	}
	return r, nil
}

// DevicePtr returns the device address of a range registered with
// HostRegisterDeviceMap, else 0.
func (r *Registration) DevicePtr() DevicePtr { return r.dptr }

// Len returns the size of the registered range.
func (r *Registration) Len() int { return r.n }

// Unregister unpins the range. Calling it again does nothing.
func (r *Registration) Unregister() error {
	if r == nil || r.done.Swap(true) {
		return nil
	}
	if err := r.ctx.enter(); err != nil {
		return err
	}
	defer r.ctx.exit()
	err := cuMemHostUnregister.call(uintptr(r.p))
	runtime.KeepAlive(r.owner)
	r.owner = nil
	return err
}
