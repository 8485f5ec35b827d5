package cudadrv

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// TestHostRegisterReadOnlyMmap registers a read-only file mapping, the way
// ats pins the model's mmap, and copies from it to the device.
func TestHostRegisterReadOnlyMmap(t *testing.T) {
	ctx, info := needGPU(t)
	if !info.HostRegisterSupported || !info.ReadOnlyHostRegisterSupport {
		t.Skipf("device lacks (read-only) host registration: %v %v", info.HostRegisterSupported, info.ReadOnlyHostRegisterSupport)
	}
	const n = 8<<20 + 123 // not a page multiple, like a tensor's extent
	src := randBytes(42, n)
	path := filepath.Join(t.TempDir(), "weights.bin")
	if err := os.WriteFile(path, src, 0o444); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mem, err := unix.Mmap(int(f.Fd()), 0, n, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)

	// Without the read-only flag the driver wants write access to the pages:
	// on a PROT_READ mapping that is expected to fail. Logged, not asserted.
	if r, err := ctx.HostRegister(mem, HostRegisterPortable); err == nil {
		t.Log("registering the read-only mapping without READ_ONLY succeeded on this driver")
		_ = r.Unregister()
	} else {
		t.Logf("without READ_ONLY: %v", err)
	}

	reg, err := ctx.HostRegister(mem, HostRegisterPortable|HostRegisterReadOnly|HostRegisterDeviceMap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ctx.HostRegister(mem, HostRegisterReadOnly); !isResult(err, ErrorHostMemoryAlreadyRegister) {
		t.Errorf("registering twice: %v, want CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED", err)
	}
	d, err := ctx.Alloc(2 * n)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(d)
	if err := ctx.MemsetD8(d, 0xAB, 2*n); err != nil {
		t.Fatal(err)
	}
	s, err := ctx.NewStream(StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	// Copy-engine copy from the registered pages, and a device-side read
	// through the mapping's device pointer.
	if err := s.CopyHtoD(d, mem); err != nil {
		t.Fatal(err)
	}
	if reg.DevicePtr() != 0 {
		if err := s.CopyDtoD(d.Add(n), reg.DevicePtr(), n); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 2*n)
	if err := ctx.CopyDtoH(out, d); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(src, out[:n]); i >= 0 {
		t.Fatalf("copy from the registered mapping differs at %d", i)
	}
	if reg.DevicePtr() != 0 {
		if i := firstDiff(src, out[n:]); i >= 0 {
			t.Fatalf("device read through the mapping differs at %d", i)
		}
	}
	if err := reg.Unregister(); err != nil {
		t.Fatal(err)
	}
}

// BenchmarkCopyHtoDRegisteredMmap256MiB copies from a read-only file
// mapping registered with HostRegisterReadOnly (the model-weights path),
// and reports how long registering 256 MiB took.
func BenchmarkCopyHtoDRegisteredMmap256MiB(b *testing.B) {
	ctx, _ := needGPU(b)
	dir := b.TempDir()
	if st, err := os.Stat("/dev/shm"); err == nil && st.IsDir() {
		dir = "/dev/shm" // page-cache resident without touching a disk
	}
	f, err := os.CreateTemp(dir, "ats-bench-*.bin")
	if err != nil {
		b.Fatal(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	if _, err := f.Write(randBytes(3, copyBytes)); err != nil {
		b.Fatal(err)
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, copyBytes, unix.PROT_READ, unix.MAP_SHARED)
	if err != nil {
		b.Fatal(err)
	}
	defer unix.Munmap(mem)
	t0 := time.Now()
	reg, err := ctx.HostRegister(mem, HostRegisterPortable|HostRegisterReadOnly)
	if err != nil {
		b.Fatal(err)
	}
	regTime := time.Since(t0)
	defer reg.Unregister()
	d, s := copyTarget(b, ctx)
	b.SetBytes(copyBytes)
	for b.Loop() {
		if err := s.CopyHtoD(d, mem); err != nil {
			b.Fatal(err)
		}
		if err := s.Synchronize(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(regTime.Microseconds())/1000, "ms/register")
}
