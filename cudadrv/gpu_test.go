package cudadrv

import (
	"encoding/binary"
	"errors"
	"math"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"
)

// GPU tests: they skip where Available() is false.

// emptyPTX is one kernel that does nothing, for launch overhead, written by
// hand in the ISA version tools/ptx produces.
const emptyPTX = `
.version 7.8
.target sm_75
.address_size 64

.visible .entry empty()
{
	ret;
}

.visible .entry empty4(.param .u64 a, .param .u64 b, .param .u32 c, .param .f32 d)
{
	ret;
}
`

// brokenPTX fails to compile on line 9 (an unknown instruction).
const brokenPTX = `.version 7.8
.target sm_75
.address_size 64

.visible .entry broken(.param .u64 p)
{
	.reg .b32 %r<2>;
	mov.u32 %r1, 7;
	frobnicate.u32 %r1, %r1;
	ret;
}
`

func TestDeviceAttributes(t *testing.T) {
	ctx, info := needGPU(t)
	n, err := DeviceCount()
	if err != nil || n < 1 {
		t.Fatalf("DeviceCount = %d, %v", n, err)
	}
	v, _ := DriverVersion()
	t.Logf("driver API %d.%d, %s, %d device(s)", v/1000, v%1000/10, LibraryPath(), n)
	t.Logf("%+v", info)
	if info.Name == "" || info.Major < 5 || info.TotalMem == 0 || info.Multiprocessors == 0 ||
		info.L2CacheBytes == 0 || info.MaxSharedPerBlockOptin < 48<<10 || info.WarpSize != 32 || info.PCIBusID == "" {
		t.Errorf("implausible device info %+v", info)
	}
	if info.UUID == ([16]byte{}) {
		t.Error("zero UUID")
	}
	free, total, err := ctx.MemInfo()
	if err != nil || total != info.TotalMem || free == 0 || free > total {
		t.Errorf("MemInfo = %d, %d, %v (TotalMem %d)", free, total, err, info.TotalMem)
	}
	least, greatest, err := ctx.StreamPriorityRange()
	if err != nil || greatest > least {
		t.Errorf("StreamPriorityRange = %d, %d, %v", least, greatest, err)
	}
	t.Logf("stream priorities %d (least) .. %d (greatest)", least, greatest)
	flags, active, err := ctx.Device().PrimaryContextState()
	if err != nil || !active {
		t.Errorf("PrimaryContextState = %v, %v, %v", flags, active, err)
	}
}

func TestErrorNamesFromDriver(t *testing.T) {
	ctx, info := needGPU(t)
	// The built-in table must agree with the driver wherever the driver
	// knows a code.
	for r, name := range resultNames {
		if got := driverString(cuGetErrorName, r); got != "" && got != name {
			t.Errorf("code %d: driver says %s, table says %s", r, got, name)
		}
	}
	// A real failure names the call and the error.
	_, err := ctx.Alloc(int(info.TotalMem) * 4)
	if !isResult(err, ErrorOutOfMemory) {
		t.Fatalf("oversized Alloc: %v, want CUDA_ERROR_OUT_OF_MEMORY", err)
	}
	if s := err.Error(); !strings.Contains(s, "cuMemAlloc_v2") || !strings.Contains(s, "CUDA_ERROR_OUT_OF_MEMORY") || !strings.Contains(s, "out of memory") {
		t.Errorf("error text %q", s)
	}
	t.Logf("oversized Alloc: %v", err)
	m, err := ctx.LoadModule("empty", []byte(emptyPTX), false)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	_, err = m.Function("no_such_kernel")
	if !isResult(err, ErrorNotFound) {
		t.Errorf("missing kernel: %v, want CUDA_ERROR_NOT_FOUND", err)
	}
	t.Logf("missing kernel: %v", err)
}

func TestAllocCopyRoundTrip(t *testing.T) {
	ctx, _ := needGPU(t)
	for _, n := range []int{1, 4097, 3<<20 + 13} {
		src := randBytes(uint64(n), n)
		a, err := ctx.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		b, err := ctx.Alloc(n)
		if err != nil {
			t.Fatal(err)
		}
		// Poison both device buffers and the host output.
		if err := ctx.MemsetD8(a, 0xAB, n); err != nil {
			t.Fatal(err)
		}
		if err := ctx.MemsetD8(b, 0xCD, n); err != nil {
			t.Fatal(err)
		}
		out := make([]byte, n)
		fill(out, 0xEF)
		if err := ctx.CopyHtoD(a, src); err != nil {
			t.Fatal(err)
		}
		if err := ctx.CopyDtoD(b, a, n); err != nil {
			t.Fatal(err)
		}
		if err := ctx.CopyDtoH(out, b); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(src, out); i >= 0 {
			t.Fatalf("n=%d: sync round trip differs at byte %d", n, i)
		}

		// The same through pinned memory and a stream.
		s, err := ctx.NewStream(StreamNonBlocking, 0)
		if err != nil {
			t.Fatal(err)
		}
		hin, err := ctx.HostAlloc(n, HostAllocPortable)
		if err != nil {
			t.Fatal(err)
		}
		hout, err := ctx.HostAlloc(n, HostAllocPortable)
		if err != nil {
			t.Fatal(err)
		}
		src2 := randBytes(uint64(n)+1, n)
		copy(hin.Bytes(), src2)
		fill(hout.Bytes(), 0xEF)
		steps := []error{
			s.MemsetD8(a, 0x11, n),
			s.MemsetD8(b, 0x22, n),
			s.CopyHtoD(a, hin.Bytes()),
			s.CopyDtoD(b, a, n),
			s.CopyDtoH(hout.Bytes(), b),
			s.Synchronize(),
		}
		if err := errors.Join(steps...); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(src2, hout.Bytes()); i >= 0 {
			t.Fatalf("n=%d: async round trip differs at byte %d", n, i)
		}
		if err := errors.Join(hin.Free(), hout.Free(), s.Destroy(), ctx.Free(a), ctx.Free(b)); err != nil {
			t.Fatal(err)
		}
	}
	// MemsetD32 writes whole words.
	const words = 1000
	p, err := ctx.Alloc(4 * words)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(p)
	if err := ctx.MemsetD32(p, math.Float32bits(-2.5), words); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 4*words)
	if err := ctx.CopyDtoH(out, p); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < words; i++ {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(out[4*i:])); v != -2.5 {
			t.Fatalf("word %d = %v after MemsetD32", i, v)
		}
	}
}

func TestMappedHostMemory(t *testing.T) {
	ctx, info := needGPU(t)
	if !info.CanMapHostMemory {
		t.Skip("device cannot map host memory")
	}
	const n = 1 << 20
	h, err := ctx.HostAlloc(n, HostAllocPortable|HostAllocDeviceMap)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	if h.DevicePtr() == 0 {
		t.Fatal("mapped HostMem has no device pointer")
	}
	fill(h.Bytes(), 0x5A)
	// The device writes the host memory through its mapping...
	if err := ctx.MemsetD32(h.DevicePtr().Add(4096), 0xA1B2C3D4, 1000); err != nil {
		t.Fatal(err)
	}
	b := h.Bytes()
	for i := 4096; i < 4096+4000; i += 4 {
		if v := binary.LittleEndian.Uint32(b[i:]); v != 0xA1B2C3D4 {
			t.Fatalf("host sees %#x at %d after a device write through the mapping", v, i)
		}
	}
	if b[4095] != 0x5A || b[4096+4000] != 0x5A {
		t.Fatal("device write through the mapping spilled outside its range")
	}
	// ...and reads it: copy device-side from the mapped pointer to device
	// memory, then back.
	src := randBytes(7, n)
	copy(b, src)
	d, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(d)
	if err := ctx.CopyDtoD(d, h.DevicePtr(), n); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, n)
	if err := ctx.CopyDtoH(out, d); err != nil {
		t.Fatal(err)
	}
	if i := firstDiff(src, out); i >= 0 {
		t.Fatalf("device read of mapped memory differs at %d", i)
	}
}

// TestStreamWriteValue: a word the stream writes into mapped host memory
// after a copy appears only once the copy's bytes are there (the write's
// fence), so polling it can stand in for Synchronize.
func TestStreamWriteValue(t *testing.T) {
	ctx, info := needGPU(t)
	if !info.CanMapHostMemory {
		t.Skip("device cannot map host memory")
	}
	s, err := ctx.NewStream(StreamNonBlocking, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Destroy()
	const n = 64 << 20 // long enough that the host polls while it runs
	h, err := ctx.HostAlloc(n+64, HostAllocPortable|HostAllocDeviceMap)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Free()
	d, err := ctx.Alloc(n)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(d)
	word := (*uint32)(unsafe.Add(h.Pointer(), n))
	for seq := uint32(1); seq <= 3; seq++ {
		if err := s.MemsetD32(d, 0x01010101*seq, n/4); err != nil {
			t.Fatal(err)
		}
		if err := s.CopyDtoD(h.DevicePtr(), d, n); err != nil {
			t.Fatal(err)
		}
		if err := s.WriteValue32(h.DevicePtr().Add(n), seq); err != nil {
			t.Fatalf("cuStreamWriteValue32_v2: %v", err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for atomic.LoadUint32(word) != seq {
			if time.Now().After(deadline) {
				t.Fatalf("round %d: the word never came (it reads %d)", seq, atomic.LoadUint32(word))
			}
		}
		b := h.Bytes()
		for _, i := range []int{0, n / 2, n - 1} {
			if b[i] != byte(seq) {
				t.Fatalf("round %d: byte %d is %d when the word is seen", seq, i, b[i])
			}
		}
	}
	if err := s.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestStreamsEventsOrdering(t *testing.T) {
	ctx, _ := needGPU(t)
	least, greatest, err := ctx.StreamPriorityRange()
	if err != nil {
		t.Fatal(err)
	}
	// A low-priority "copy" stream fills X; a high-priority "compute" stream
	// must see the fill only because it waits for the event.
	fillS, err := ctx.NewStream(StreamNonBlocking, least)
	if err != nil {
		t.Fatal(err)
	}
	defer fillS.Destroy()
	useS, err := ctx.NewStream(StreamNonBlocking, greatest)
	if err != nil {
		t.Fatal(err)
	}
	defer useS.Destroy()
	const words = 16 << 20 // 64 MiB: the fill takes long enough to race
	x, err := ctx.Alloc(4 * words)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(x)
	y, err := ctx.Alloc(4 * words)
	if err != nil {
		t.Fatal(err)
	}
	defer ctx.Free(y)
	host, err := ctx.HostAlloc(4*words, HostAllocPortable)
	if err != nil {
		t.Fatal(err)
	}
	defer host.Free()
	filled, err := ctx.NewEvent(EventDisableTiming)
	if err != nil {
		t.Fatal(err)
	}
	defer filled.Destroy()
	start, _ := ctx.NewEvent(EventDefault)
	end, _ := ctx.NewEvent(EventBlockingSync)
	defer start.Destroy()
	defer end.Destroy()

	for iter := uint32(1); iter <= 6; iter++ {
		steps := []error{
			fillS.Record(start),
			fillS.MemsetD32(x, 0, words),
			fillS.MemsetD32(x, iter*0x01010101, words),
			filled.Record(fillS),
			fillS.Record(end),
			useS.WaitEvent(filled),
			useS.CopyDtoD(y, x, 4*words),
			useS.CopyDtoH(host.Bytes(), y),
			useS.Synchronize(),
		}
		if err := errors.Join(steps...); err != nil {
			t.Fatal(err)
		}
		b := host.Bytes()
		for i := 0; i < len(b); i += 4 {
			if v := binary.LittleEndian.Uint32(b[i:]); v != iter*0x01010101 {
				t.Fatalf("iteration %d: word %d = %#x: the waiting stream ran before the event", iter, i/4, v)
			}
		}
		if err := end.Synchronize(); err != nil {
			t.Fatal(err)
		}
		done, err := end.Done()
		if err != nil || !done {
			t.Fatalf("event not done after Synchronize: %v %v", done, err)
		}
		sd, err := useS.Done()
		if err != nil || !sd {
			t.Fatalf("stream not done after Synchronize: %v %v", sd, err)
		}
		el, err := Elapsed(start, end)
		if err != nil || el <= 0 || el > 10*time.Second {
			t.Fatalf("Elapsed = %v, %v", el, err)
		}
		if iter == 1 {
			t.Logf("two 64 MiB memsets: %v (%.0f GB/s)", el, 2*4*words/el.Seconds()/1e9)
		}
	}
	// A query on unfinished work says "not ready" rather than failing.
	if err := fillS.MemsetD32(x, 1, words); err != nil {
		t.Fatal(err)
	}
	if err := filled.Record(fillS); err != nil {
		t.Fatal(err)
	}
	done, err := filled.Done()
	t.Logf("event queried right after a 64 MiB memset: done=%v err=%v", done, err)
	if err != nil {
		t.Fatal(err)
	}
	if err := fillS.Synchronize(); err != nil {
		t.Fatal(err)
	}
}

func TestModuleLoadErrorLog(t *testing.T) {
	ctx, _ := needGPU(t)
	_, err := ctx.LoadModule("broken", []byte(brokenPTX), false)
	if err == nil {
		t.Fatal("broken PTX loaded")
	}
	var je *JITError
	if !errors.As(err, &je) {
		t.Fatalf("error %T %v is not a *JITError", err, err)
	}
	if !isResult(err, ErrorInvalidPTX) {
		t.Errorf("broken PTX: %v, want CUDA_ERROR_INVALID_PTX", err)
	}
	if je.ErrorLog == "" || !strings.Contains(err.Error(), je.ErrorLog[:min(20, len(je.ErrorLog))]) {
		t.Errorf("JIT error log missing from the error: %q", err.Error())
	}
	if !strings.Contains(je.ErrorLog, "line 9") {
		t.Errorf("JIT log does not point at line 9: %q", je.ErrorLog)
	}
	t.Logf("broken PTX error:\n%v", err)

	// PTX of an ISA newer than the driver's is its own error.
	_, err = ctx.LoadModule("future", []byte(strings.Replace(emptyPTX, ".version 7.8", ".version 99.9", 1)), false)
	t.Logf("PTX .version 99.9: %v", err)
	if err == nil {
		t.Error("PTX .version 99.9 loaded")
	}

	m, err := ctx.LoadModule("empty", []byte(emptyPTX), true)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Unload()
	t.Logf("empty module: JIT %v, info log %q", m.JITTime, m.InfoLog)
	f, err := m.Function("empty4")
	if err != nil {
		t.Fatal(err)
	}
	regs, err := f.Attribute(FuncNumRegs)
	if err != nil {
		t.Fatal(err)
	}
	ptxv, _ := f.Attribute(FuncPTXVersion)
	binv, _ := f.Attribute(FuncBinaryVersion)
	t.Logf("empty4: %d registers, PTX %d, binary sm_%d", regs, ptxv, binv)
	if err := f.Launch(nil, D1(1), D1(32), 0, new(Args).Ptr(0).Ptr(0).U32(1).F32(2)); err != nil {
		t.Fatal(err)
	}
	if err := ctx.Synchronize(); err != nil {
		t.Fatal(err)
	}
	// A launch with an impossible block is refused with a named error.
	err = f.Launch(nil, D1(1), D1(4096), 0, nil)
	t.Logf("block of 4096 threads: %v", err)
	if !isResult(err, ErrorInvalidValue) {
		t.Errorf("block of 4096 threads: %v, want CUDA_ERROR_INVALID_VALUE", err)
	}
}

func TestNVML(t *testing.T) {
	_, _ = needGPU(t)
	m, reason := OpenMonitor()
	if m == nil {
		t.Skip("NVML unavailable: " + reason)
	}
	defer m.Close()
	ver, err := m.DriverVersion()
	if err != nil {
		t.Fatal(err)
	}
	d, _ := GetDevice(0)
	bus, _ := d.PCIBusID()
	g, err := m.DeviceByPCIBusID(bus)
	if err != nil {
		t.Fatal(err)
	}
	name, err := g.Name()
	if err != nil {
		t.Fatal(err)
	}
	s, err := g.Sample()
	t.Logf("NVML: driver %s, %s at %s: %+v", ver, name, bus, s)
	if err != nil {
		t.Logf("some figures missing: %v", err)
	}
	if s.MemTotal == 0 {
		t.Error("NVML reports no memory")
	}
	var nilMon *Monitor
	if _, err := nilMon.DeviceCount(); !errors.Is(err, ErrNoNVML) {
		t.Errorf("nil monitor: %v", err)
	}
}
