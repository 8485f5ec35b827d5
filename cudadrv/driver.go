package cudadrv

import (
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// ErrUnavailable is wrapped by every error that comes from the absence of a
// usable CUDA driver or device, so callers can tell "no GPU here" from a
// failure of a GPU that exists.
var ErrUnavailable = errors.New("cudadrv: CUDA unavailable")

// symbol is one driver (or NVML) entry point. Its address is filled in by
// load; it stays 0 when the installed library lacks the symbol.
type symbol struct {
	name string
	addr uintptr
	lib  string // the library searched, set by load
}

var (
	cudaSyms []*symbol // bound from libcuda by loadDriver
	nvmlSyms []*symbol // bound from libnvidia-ml by loadNVML
)

// cuSym declares a libcuda symbol; the files of each API area declare theirs
// at package level, each beside its C prototype.
func cuSym(name string) *symbol {
	s := &symbol{name: name}
	cudaSyms = append(cudaSyms, s)
	return s
}

// raw calls the symbol and returns the C function's 32-bit result.
//
// The uintptrescapes directive makes the conversions
// uintptr(unsafe.Pointer(&x)) written in a call of raw keep x alive and on
// the heap until raw returns, as it does for purego.SyscallN itself.
//
//go:uintptrescapes
func (s *symbol) raw(args ...uintptr) (uint32, error) {
	if s.addr == 0 {
		return 0, s.missing()
	}
	r, _, _ := purego.SyscallN(s.addr, args...)
	return uint32(r), nil
}

// call calls a CUresult-returning driver function and turns a failure into
// an *Error naming the call.
//
//go:uintptrescapes
func (s *symbol) call(args ...uintptr) error {
	if s.addr == 0 {
		return s.missing()
	}
	r, _, _ := purego.SyscallN(s.addr, args...)
	if Result(uint32(r)) != Success {
		return &Error{Call: s.name, Code: Result(uint32(r))}
	}
	return nil
}

func (s *symbol) missing() error {
	if s.lib == "" {
		// Only reachable through a zero Device or Context made without Init.
		return fmt.Errorf("cudadrv: %s: %w: library not loaded", s.name, ErrUnavailable)
	}
	return fmt.Errorf("cudadrv: %s: symbol not found in %s (driver too old?)", s.name, s.lib)
}

// drv holds the state of the driver library, loaded once.
var drv struct {
	once    sync.Once
	loaded  bool   // the library is open and symbols are bound
	path    string // the library file that was opened
	err     error  // why CUDA is unusable, nil if usable
	version int    // cuDriverGetVersion, e.g. 12080
	devices int
}

// Symbols of initialisation.
var (
	// CUresult cuInit(unsigned int Flags);
	cuInit = cuSym("cuInit")
	// CUresult cuDriverGetVersion(int *driverVersion);
	cuDriverGetVersion = cuSym("cuDriverGetVersion")
	// CUresult cuGetErrorName(CUresult error, const char **pStr);
	cuGetErrorName = cuSym("cuGetErrorName")
	// CUresult cuGetErrorString(CUresult error, const char **pStr);
	cuGetErrorString = cuSym("cuGetErrorString")
)

// Init loads the driver library, calls cuInit and counts the devices. It is
// idempotent and safe for concurrent use; every later call returns the first
// result. The error wraps ErrUnavailable and says what is missing.
func Init() error {
	drv.once.Do(func() { drv.err = load() })
	return drv.err
}

func load() error {
	h, path, err := openLibrary("ATS_LIBCUDA", cudaLibNames)
	if err != nil {
		return &unavailableError{msg: err.Error(), cause: err}
	}
	drv.path = path
	for _, s := range cudaSyms {
		s.addr, s.lib = lookup(h, s.name), path
	}
	drv.loaded = true
	if cuInit.addr == 0 {
		return &unavailableError{msg: path + " has no cuInit"}
	}
	fail := func(err error) error {
		var e *Error
		if errors.As(err, &e) {
			return &unavailableError{msg: fmt.Sprintf("%s failed with %v; library %s", e.Call, e.Code, path), cause: err}
		}
		return &unavailableError{msg: err.Error(), cause: err}
	}
	if err := cuInit.call(0); err != nil {
		return fail(err)
	}
	var v int32
	if err := cuDriverGetVersion.call(uintptr(unsafe.Pointer(&v))); err != nil {
		return fail(err)
	}
	drv.version = int(v)
	var n int32
	if err := cuDeviceGetCount.call(uintptr(unsafe.Pointer(&n))); err != nil {
		return fail(err)
	}
	drv.devices = int(n)
	if n == 0 {
		return &unavailableError{msg: "the driver reports 0 devices; library " + path}
	}
	return nil
}

// unavailableError says why CUDA cannot be used. It matches ErrUnavailable
// and, where a driver call failed, that call's *Error.
type unavailableError struct {
	msg   string
	cause error
}

func (e *unavailableError) Error() string { return "cudadrv: CUDA unavailable: " + e.msg }

func (e *unavailableError) Unwrap() []error {
	if e.cause == nil {
		return []error{ErrUnavailable}
	}
	return []error{ErrUnavailable, e.cause}
}

// Available reports whether CUDA can be used: a driver library was found,
// cuInit succeeded and at least one device exists. When it cannot, reason
// says why in one line suitable for the user, with every place searched
// for the library where it was not found (Init's error only counts them).
func Available() (ok bool, reason string) {
	if err := Init(); err != nil {
		return false, errorDetail(err)
	}
	return true, ""
}

// DriverVersion returns the version of the CUDA driver API the installed
// driver supports, as major*1000 + minor*10 (12080 for 12.8).
func DriverVersion() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	return drv.version, nil
}

// LibraryPath returns the driver library file that was loaded, or "".
func LibraryPath() string {
	_ = Init()
	return drv.path
}
