package cudadrv

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"strings"
	"sync/atomic"
	"time"
	"unsafe"
)

// Symbols of modules, functions and launches.
var (
	// CUresult cuModuleLoadDataEx(CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options, void **optionValues);
	cuModuleLoadDataEx = cuSym("cuModuleLoadDataEx")
	// CUresult cuModuleUnload(CUmodule hmod);
	cuModuleUnload = cuSym("cuModuleUnload")
	// CUresult cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name);
	cuModuleGetFunction = cuSym("cuModuleGetFunction")
	// CUresult cuModuleGetGlobal_v2(CUdeviceptr *dptr, size_t *bytes, CUmodule hmod, const char *name);
	cuModuleGetGlobal = cuSym("cuModuleGetGlobal_v2")
	// CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc);
	cuFuncGetAttribute = cuSym("cuFuncGetAttribute")
	// CUresult cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute attrib, int value);
	cuFuncSetAttribute = cuSym("cuFuncSetAttribute")
	// CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,
	//     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,
	//     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra);
	cuLaunchKernel = cuSym("cuLaunchKernel")
	// CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra);
	// (CUDA 12.0 and later drivers)
	cuLaunchKernelEx = cuSym("cuLaunchKernelEx")
)

// launchConfig is a CUlaunchConfig: grid and block, shared memory, stream,
// and its attributes (a pointer and a count).
type launchConfig struct {
	gridX, gridY, gridZ    uint32
	blockX, blockY, blockZ uint32
	sharedMem              uint32
	_                      uint32
	stream                 uintptr
	attrs                  uintptr // *launchAttr
	numAttrs               uint32
	_                      uint32
}

// launchAttr is a CUlaunchAttribute: an id padded to 8 bytes, then the
// 64-byte union CUlaunchAttributeValue.
type launchAttr struct {
	id    uint32
	_     uint32
	value [64]byte
}

// attrProgrammaticStreamSerialization is
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION; its value is the
// int programmaticStreamSerializationAllowed.
const attrProgrammaticStreamSerialization = 6

// CUjit_option values used by LoadModule.
const (
	jitWallTime              = 2
	jitInfoLogBuffer         = 3
	jitInfoLogBufferSize     = 4
	jitErrorLogBuffer        = 5
	jitErrorLogBufferSize    = 6
	jitLogVerbose            = 12
	jitLogBufferSize         = 16 << 10
	maxModuleNameInErrorText = 64
)

// Module is a loaded CUmodule.
type Module struct {
	h        uintptr
	ctx      *Context
	name     string
	InfoLog  string        // the JIT's informational output (register use with verbose logs)
	JITTime  time.Duration // wall time the JIT compiler took
	unloaded atomic.Bool
}

// JITError is a module that failed to load; it carries the JIT's logs.
type JITError struct {
	Module   string // the name given to LoadModule
	Err      error  // the *Error of cuModuleLoadDataEx
	ErrorLog string // what the PTX compiler said, e.g. "ptxas application ptx input, line 7; error : ..."
	InfoLog  string
}

func (e *JITError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cudadrv: loading module %s: %v", e.Module, e.Err)
	if e.ErrorLog != "" {
		b.WriteString("\nJIT error log:\n")
		b.WriteString(strings.TrimSpace(e.ErrorLog))
	}
	if e.InfoLog != "" {
		b.WriteString("\nJIT info log:\n")
		b.WriteString(strings.TrimSpace(e.InfoLog))
	}
	return b.String()
}

func (e *JITError) Unwrap() error { return e.Err }

// LoadModule loads a module image for the context's device: PTX text,
// which the driver JIT-compiles, a cubin, or a fatbin, from which the driver
// takes the SASS that runs on the device or else JIT-compiles its PTX.
// name identifies the module in errors. A compile failure returns a
// *JITError holding the JIT's error log. With verbose, the info log (register
// and spill counts per kernel) is kept in Module.InfoLog.
func (c *Context) LoadModule(name string, image []byte, verbose bool) (*Module, error) {
	// The JIT reads PTX as a C string: give it a NUL-terminated copy (a
	// binary image ignores the extra byte). The copy and the log buffers are
	// Go memory the driver reads or writes during the call, so they are
	// pinned for its duration.
	img := make([]byte, len(image)+1)
	copy(img, image)
	infoLog := make([]byte, jitLogBufferSize)
	errLog := make([]byte, jitLogBufferSize)
	verb := uintptr(0)
	if verbose {
		verb = 1
	}
	opts := []int32{jitInfoLogBuffer, jitInfoLogBufferSize, jitErrorLogBuffer, jitErrorLogBufferSize, jitLogVerbose, jitWallTime}
	vals := []uintptr{
		uintptr(unsafe.Pointer(&infoLog[0])), uintptr(len(infoLog)),
		uintptr(unsafe.Pointer(&errLog[0])), uintptr(len(errLog)),
		verb, 0,
	}
	var pin runtime.Pinner
	defer pin.Unpin()
	for _, p := range []*byte{&img[0], &infoLog[0], &errLog[0]} {
		pin.Pin(p)
	}
	pin.Pin(&opts[0])
	pin.Pin(&vals[0])

	if err := c.enter(); err != nil {
		return nil, err
	}
	defer c.exit()
	var h uintptr
	err := cuModuleLoadDataEx.call(uintptr(unsafe.Pointer(&h)), uintptr(unsafe.Pointer(&img[0])),
		uintptr(len(opts)), uintptr(unsafe.Pointer(&opts[0])), uintptr(unsafe.Pointer(&vals[0])))
	// On return the size slots hold the bytes written and the wall-time slot
	// a float32 in milliseconds.
	info := cBytesString(infoLog[:min(int(vals[1]), len(infoLog))])
	elog := cBytesString(errLog[:min(int(vals[3]), len(errLog))])
	if err != nil {
		return nil, &JITError{Module: name, Err: err, ErrorLog: elog, InfoLog: info}
	}
	ms := math.Float32frombits(uint32(vals[5]))
	return &Module{h: h, ctx: c, name: name, InfoLog: info, JITTime: time.Duration(float64(ms) * float64(time.Millisecond))}, nil
}

// Name returns the name given to LoadModule.
func (m *Module) Name() string { return m.name }

// Unload unloads the module; its functions must not be launched after.
// Calling it again does nothing.
func (m *Module) Unload() error {
	if m == nil || m.unloaded.Swap(true) {
		return nil
	}
	if err := m.ctx.enter(); err != nil {
		return err
	}
	defer m.ctx.exit()
	return cuModuleUnload.call(m.h)
}

// cString returns s as a NUL-terminated byte slice.
func cString(s string) []byte { return append([]byte(s), 0) }

// Function looks up a kernel by its (extern "C", unmangled) name.
func (m *Module) Function(name string) (*Function, error) {
	if err := m.ctx.enter(); err != nil {
		return nil, err
	}
	defer m.ctx.exit()
	var h uintptr
	cname := cString(name)
	if err := cuModuleGetFunction.call(uintptr(unsafe.Pointer(&h)), m.h, uintptr(unsafe.Pointer(&cname[0]))); err != nil {
		return nil, fmt.Errorf("kernel %s in module %s: %w", name, m.name, err)
	}
	return &Function{h: h, ctx: m.ctx, name: name}, nil
}

// Global returns the device address and size of a __device__ or
// __constant__ variable of the module (lookup tables of quantisation
// formats, say).
func (m *Module) Global(name string) (DevicePtr, int, error) {
	if err := m.ctx.enter(); err != nil {
		return 0, 0, err
	}
	defer m.ctx.exit()
	var p DevicePtr
	var n uint64
	cname := cString(name)
	if err := cuModuleGetGlobal.call(uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&n)), m.h, uintptr(unsafe.Pointer(&cname[0]))); err != nil {
		return 0, 0, fmt.Errorf("global %s in module %s: %w", name, m.name, err)
	}
	return p, int(n), nil
}

// Function is a CUfunction: a kernel of a loaded module.
type Function struct {
	h    uintptr
	ctx  *Context
	name string
}

// Name returns the kernel's name.
func (f *Function) Name() string { return f.name }

// Handle returns the CUfunction.
func (f *Function) Handle() uintptr { return f.h }

// FuncAttribute is a CUfunction_attribute.
type FuncAttribute int32

const (
	FuncMaxThreadsPerBlock         FuncAttribute = 0
	FuncSharedSizeBytes            FuncAttribute = 1 // static shared memory
	FuncConstSizeBytes             FuncAttribute = 2
	FuncLocalSizeBytes             FuncAttribute = 3 // per thread: non-zero means spills or stack arrays
	FuncNumRegs                    FuncAttribute = 4
	FuncPTXVersion                 FuncAttribute = 5
	FuncBinaryVersion              FuncAttribute = 6
	FuncMaxDynamicSharedSizeBytes  FuncAttribute = 8
	FuncPreferredSharedMemCarveout FuncAttribute = 9
)

// Attribute returns one attribute of the kernel as compiled for the device.
func (f *Function) Attribute(a FuncAttribute) (int, error) {
	if err := f.ctx.enter(); err != nil {
		return 0, err
	}
	defer f.ctx.exit()
	var v int32
	if err := cuFuncGetAttribute.call(uintptr(unsafe.Pointer(&v)), uintptr(a), f.h); err != nil {
		return 0, fmt.Errorf("kernel %s: %w", f.name, err)
	}
	return int(v), nil
}

// SetAttribute sets a kernel attribute; FuncMaxDynamicSharedSizeBytes
// above 48 KiB is how a kernel opts into the device's larger shared memory
// (DeviceInfo.MaxSharedPerBlockOptin).
func (f *Function) SetAttribute(a FuncAttribute, v int) error {
	if err := f.ctx.enter(); err != nil {
		return err
	}
	defer f.ctx.exit()
	if err := cuFuncSetAttribute.call(f.h, uintptr(a), uintptr(int32(v))); err != nil {
		return fmt.Errorf("kernel %s: %w", f.name, err)
	}
	return nil
}

// Dim3 is a grid or block shape. Zero components count as 1.
type Dim3 struct{ X, Y, Z uint32 }

// D1 returns the one-dimensional shape n.
func D1(n int) Dim3 { return Dim3{X: uint32(n), Y: 1, Z: 1} }

// Blocks returns the number of blocks of size block that cover n items.
func Blocks(n, block int) int { return (n + block - 1) / block }

func (d Dim3) norm() (x, y, z uintptr) {
	one := func(v uint32) uintptr {
		if v == 0 {
			return 1
		}
		return uintptr(v)
	}
	return one(d.X), one(d.Y), one(d.Z)
}

// maxArgSlots bounds the bytes of kernel parameters an Args holds (8 bytes
// a slot): 256 bytes, far more than a kernel of ats takes.
const maxArgSlots = 32

// Args holds a kernel's parameters in order, each copied into 8-byte slots,
// plus the array of pointers to them that cuLaunchKernel reads. Reuse one
// Args per call site (Reset) to launch without allocating. An Args must not
// be used by two launches at once.
type Args struct {
	slots [maxArgSlots]uint64
	ptrs  [maxArgSlots]unsafe.Pointer // filled at launch, when a is pinned
	cfg   launchConfig                // a programmatic launch's (Stream.SetProgrammatic)
	attr  launchAttr
	start [maxArgSlots]uint8 // first slot of each parameter
	n     int                // parameters
	used  int                // slots
	err   error
	pin   runtime.Pinner
}

// Reset empties a for reuse and returns it.
func (a *Args) Reset() *Args {
	a.n, a.used, a.err = 0, 0, nil
	return a
}

func (a *Args) add(v uint64) *Args {
	if a.used >= maxArgSlots {
		a.err = fmt.Errorf("cudadrv: more than %d bytes of kernel parameters", 8*maxArgSlots)
		return a
	}
	a.start[a.n] = uint8(a.used)
	a.slots[a.used] = v
	a.n++
	a.used++
	return a
}

// Ptr appends a device pointer parameter (T* in the kernel).
func (a *Args) Ptr(p DevicePtr) *Args { return a.add(uint64(p)) }

// I32 appends an int parameter.
func (a *Args) I32(v int32) *Args { return a.add(uint64(uint32(v))) }

// U32 appends an unsigned int parameter.
func (a *Args) U32(v uint32) *Args { return a.add(uint64(v)) }

// I64 appends a long long parameter.
func (a *Args) I64(v int64) *Args { return a.add(uint64(v)) }

// U64 appends an unsigned long long (or size_t) parameter.
func (a *Args) U64(v uint64) *Args { return a.add(v) }

// F32 appends a float parameter.
func (a *Args) F32(v float32) *Args { return a.add(uint64(math.Float32bits(v))) }

// F64 appends a double parameter.
func (a *Args) F64(v float64) *Args { return a.add(math.Float64bits(v)) }

// Bytes appends a parameter passed by value whose bytes are b: a struct laid
// out as the kernel declares it (alignment up to 8).
func (a *Args) Bytes(b []byte) *Args {
	k := (len(b) + 7) / 8
	if k == 0 || a.used+k > maxArgSlots {
		a.err = fmt.Errorf("cudadrv: kernel parameter of %d bytes does not fit", len(b))
		return a
	}
	a.start[a.n] = uint8(a.used)
	dst := unsafe.Slice((*byte)(unsafe.Pointer(&a.slots[a.used])), 8*k)
	clear(dst)
	copy(dst, b)
	a.n++
	a.used += k
	return a
}

// Len returns the number of parameters.
func (a *Args) Len() int { return a.n }

var errNilFunction = errors.New("cudadrv: launch of a nil *Function")

// Launch queues the kernel on s (nil: the legacy default stream) with the
// given grid and block shapes, dynamic shared memory bytes and parameters
// (nil for none). Faults inside the kernel surface at the next synchronising
// call, not here.
func (f *Function) Launch(s *Stream, grid, block Dim3, sharedMem int, a *Args) error {
	if f == nil {
		return errNilFunction
	}
	gx, gy, gz := grid.norm()
	bx, by, bz := block.norm()
	if a == nil {
		if err := f.ctx.enter(); err != nil {
			return err
		}
		defer f.ctx.exit()
		// Launched as usual, also on a programmatic stream: the next
		// kernel may still overlap it.
		err := cuLaunchKernel.call(f.h, gx, gy, gz, bx, by, bz, uintptr(sharedMem), s.handle(), 0, 0)
		s.queued(err == nil)
		return f.launchErr(err)
	}
	if a.err != nil {
		return fmt.Errorf("kernel %s: %w", f.name, a.err)
	}
	// cuLaunchKernel reads kernelParams[i] and the values they point to:
	// Go memory holding Go pointers, so a is pinned while the driver reads
	// it (the values are copied into the launch before the call returns).
	a.pin.Pin(a)
	defer a.pin.Unpin()
	for i := 0; i < a.n; i++ {
		a.ptrs[i] = unsafe.Pointer(&a.slots[a.start[i]])
	}
	if err := f.ctx.enter(); err != nil {
		return err
	}
	defer f.ctx.exit()
	if s != nil && s.pdl.Load() && s.afterKernel.Load() {
		// Programmatic dependent launch (Stream.SetProgrammatic): the
		// config and its attribute live in a, pinned like the parameters.
		a.attr = launchAttr{id: attrProgrammaticStreamSerialization}
		a.attr.value[0] = 1 // programmaticStreamSerializationAllowed
		a.cfg = launchConfig{gridX: uint32(gx), gridY: uint32(gy), gridZ: uint32(gz),
			blockX: uint32(bx), blockY: uint32(by), blockZ: uint32(bz), sharedMem: uint32(sharedMem),
			stream: s.h, attrs: uintptr(unsafe.Pointer(&a.attr)), numAttrs: 1}
		err := cuLaunchKernelEx.call(uintptr(unsafe.Pointer(&a.cfg)), f.h, uintptr(unsafe.Pointer(&a.ptrs[0])), 0)
		s.queued(err == nil)
		return f.launchErr(err)
	}
	err := cuLaunchKernel.call(f.h, gx, gy, gz, bx, by, bz, uintptr(sharedMem), s.handle(),
		uintptr(unsafe.Pointer(&a.ptrs[0])), 0)
	s.queued(err == nil)
	return f.launchErr(err)
}

func (f *Function) launchErr(err error) error {
	if err != nil {
		return fmt.Errorf("launching %s: %w", f.name, err)
	}
	return nil
}
