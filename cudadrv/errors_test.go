package cudadrv

import (
	"errors"
	"strings"
	"testing"
)

// These run everywhere: they need no driver.

func TestAvailableReason(t *testing.T) {
	ok, reason := Available()
	err := Init()
	if ok {
		if err != nil || reason != "" {
			t.Fatalf("Available() = true, %q but Init() = %v", reason, err)
		}
		n, _ := DeviceCount()
		t.Logf("CUDA available: driver %d, %d device(s), %s", drv.version, n, LibraryPath())
		return
	}
	if reason == "" {
		t.Fatal("Available() = false with an empty reason")
	}
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Init() = %v, does not wrap ErrUnavailable", err)
	}
	// The reason must say what is missing: the library (and where we looked),
	// cuInit's failure, or the device count.
	if !strings.Contains(reason, "tried") && !strings.Contains(reason, "cuInit") &&
		!strings.Contains(reason, "0 devices") && !strings.Contains(reason, "no CUDA driver") {
		t.Errorf("reason %q does not say what is missing", reason)
	}
	t.Logf("CUDA unavailable (expected on a machine without a GPU): %s", reason)

	// Entry points fail with the same reason instead of panicking.
	if _, err := GetDevice(0); !errors.Is(err, ErrUnavailable) {
		t.Errorf("GetDevice without a driver: %v", err)
	}
	if n, err := DeviceCount(); n != 0 || !errors.Is(err, ErrUnavailable) {
		t.Errorf("DeviceCount without a driver: %d, %v", n, err)
	}
	if _, err := DriverVersion(); !errors.Is(err, ErrUnavailable) {
		t.Errorf("DriverVersion without a driver: %v", err)
	}
}

func TestResultNames(t *testing.T) {
	cases := map[Result]string{
		ErrorOutOfMemory:           "CUDA_ERROR_OUT_OF_MEMORY",
		ErrorInvalidPTX:            "CUDA_ERROR_INVALID_PTX",
		ErrorUnsupportedPTXVersion: "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
		ErrorNotReady:              "CUDA_ERROR_NOT_READY",
		ErrorNoDevice:              "CUDA_ERROR_NO_DEVICE",
		ErrorStubLibrary:           "CUDA_ERROR_STUB_LIBRARY",
	}
	for r, want := range cases {
		if got := r.Name(); got != want {
			t.Errorf("Result(%d).Name() = %q, want %q", r, got, want)
		}
	}
	if got := Result(12345).Name(); got != "CUDA_ERROR_12345" {
		t.Errorf("unknown code named %q", got)
	}
	err := error(&Error{Call: "cuMemAlloc_v2", Code: ErrorOutOfMemory})
	wrapped := errors.Join(errors.New("context"), err)
	if !errors.Is(wrapped, ErrorOutOfMemory) {
		t.Error("errors.Is does not reach the Result through *Error")
	}
	var e *Error
	if !errors.As(wrapped, &e) || e.Call != "cuMemAlloc_v2" {
		t.Error("errors.As does not find the *Error")
	}
	if s := err.Error(); !strings.Contains(s, "cuMemAlloc_v2") || !strings.Contains(s, "CUDA_ERROR_OUT_OF_MEMORY") {
		t.Errorf("error text %q names neither the call nor the CUDA error", s)
	}
}

func TestArgsPacking(t *testing.T) {
	var a Args
	a.Ptr(0x1122334455667788).I32(-2).F32(1.5).I64(-3).Bytes([]byte{1, 2, 3, 4, 5, 6, 7, 8, 9})
	if a.err != nil || a.Len() != 5 || a.used != 6 {
		t.Fatalf("n=%d used=%d err=%v", a.n, a.used, a.err)
	}
	if a.slots[0] != 0x1122334455667788 || uint32(a.slots[1]) != 0xfffffffe || uint32(a.slots[2]) != 0x3fc00000 || int64(a.slots[3]) != -3 {
		t.Errorf("slots %x", a.slots[:4])
	}
	if a.start[4] != 4 || a.slots[4] != 0x0807060504030201 || a.slots[5] != 9 {
		t.Errorf("struct parameter at slot %d: %x", a.start[4], a.slots[4:6])
	}
	a.Reset()
	for range maxArgSlots + 1 {
		a.U64(1)
	}
	if a.err == nil {
		t.Error("overflowing Args gives no error")
	}
}

func TestOpenLibraryMissing(t *testing.T) {
	_, _, err := openLibrary("ATS_TEST_NO_SUCH_VARIABLE", []string{"libats-no-such-library.so.1"})
	if err == nil {
		t.Fatal("a library that does not exist was opened")
	}
	t.Logf("missing library: %v", err)
	t.Setenv("ATS_TEST_LIB", "/no/such/libcuda.so.1")
	if _, _, err := openLibrary("ATS_TEST_LIB", cudaLibNames); err == nil {
		t.Fatal("override to a missing file was opened")
	}
}
