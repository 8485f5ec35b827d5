// Package cudadrv binds the CUDA driver API (libcuda.so.1, nvcuda.dll) and
// NVML (libnvidia-ml.so.1, nvml.dll) without cgo, through
// github.com/ebitengine/purego. The libraries are opened at run time: a
// binary built with CGO_ENABLED=0 runs everywhere and uses the GPU where a
// driver is installed.
//
// # Availability
//
// [Available] reports whether a driver and at least one device are present,
// and why not otherwise (no library in the searched paths, cuInit failed with
// a named error, or zero devices). Nothing in this package panics for a
// missing driver; every entry point returns an error that wraps
// [ErrUnavailable] instead.
//
// # Calling convention
//
// Every driver function is called through purego.SyscallN with uintptr
// arguments (all CUDA driver entry points take integers and pointers only).
// purego.RegisterLibFunc would give typed Go functions, but it goes through
// reflect on every call. Measured on an H200 (bench_test.go, two machines,
// 100 launches then a sync per op): an empty launch costs 3.2-4.5 µs through
// bare SyscallN, 4.2-5.9 µs (and 11 allocations) through RegisterFunc, and
// 3.5-4.3 µs through Function.Launch, which adds the thread lock and
// cuCtxSetCurrent (0.12-0.35 µs alone). A CUDA graph replays the same
// launches at 0.74-0.77 µs each. purego.SyscallN heap-allocates its
// variadic argument array, so every driver call allocates about 100 bytes.
// Each bound symbol is declared in the file of its API area beside its C
// prototype; a symbol that the installed driver lacks turns into an error at
// the call that needs it, never at load.
//
// # Threads and contexts
//
// The driver keeps a current context per OS thread, while goroutines move
// between threads. Rather than funnel every call through one dedicated
// thread (a channel round trip, several µs, per call), every method that
// needs a context locks the goroutine to its thread with
// runtime.LockOSThread, makes the context current with cuCtxSetCurrent (a
// thread-local store in the driver, measured above) and unlocks after the
// call. Callers therefore need no thread discipline: any goroutine may use any
// [Context], [Stream] or [Function]. [Context.Do] runs a closure with the
// thread locked and the context current for code that calls the driver
// directly.
//
// # Contexts
//
// ats uses the device's primary context (the one the CUDA runtime would
// share), retained by [Device.RetainPrimaryContext] and released with
// [Context.Release].
//
// # Memory ownership
//
// Device memory is a [DevicePtr] (a CUdeviceptr); page-locked host memory is
// a [HostMem] whose bytes live outside the Go heap. Asynchronous copies read
// or write host memory after the call returns: give them pinned ([HostMem])
// or registered ([Registration]) memory and keep it alive until the stream
// has passed the copy. Synchronous copies accept any Go slice.
package cudadrv
