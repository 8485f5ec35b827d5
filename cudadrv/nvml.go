package cudadrv

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// NVML reports what the GPU is doing (utilisation, memory, PCIe traffic,
// clocks) for ats's re-planning; it is optional: without it ats plans from
// its own measurements. go-nvml needs cgo, so NVML is bound here the same way
// as the driver.

func nvSym(name string) *symbol {
	s := &symbol{name: name}
	nvmlSyms = append(nvmlSyms, s)
	return s
}

// Symbols of NVML.
var (
	// nvmlReturn_t nvmlInit_v2(void);
	nvmlInit = nvSym("nvmlInit_v2")
	// nvmlReturn_t nvmlShutdown(void);
	nvmlShutdown = nvSym("nvmlShutdown")
	// const char *nvmlErrorString(nvmlReturn_t result);
	nvmlErrorString = nvSym("nvmlErrorString")
	// nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length);
	nvmlSystemGetDriverVersion = nvSym("nvmlSystemGetDriverVersion")
	// nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount);
	nvmlDeviceGetCount = nvSym("nvmlDeviceGetCount_v2")
	// nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device);
	nvmlDeviceGetHandleByIndex = nvSym("nvmlDeviceGetHandleByIndex_v2")
	// nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device);
	nvmlDeviceGetHandleByPciBusId = nvSym("nvmlDeviceGetHandleByPciBusId_v2")
	// nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length);
	nvmlDeviceGetName = nvSym("nvmlDeviceGetName")
	// nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization);
	nvmlDeviceGetUtilizationRates = nvSym("nvmlDeviceGetUtilizationRates")
	// nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory);
	nvmlDeviceGetMemoryInfo = nvSym("nvmlDeviceGetMemoryInfo")
	// nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t device, nvmlPcieUtilCounter_t counter, unsigned int *value);
	nvmlDeviceGetPcieThroughput = nvSym("nvmlDeviceGetPcieThroughput")
	// nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock);
	nvmlDeviceGetClockInfo = nvSym("nvmlDeviceGetClockInfo")
	// nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, nvmlClockType_t type, unsigned int *clock);
	nvmlDeviceGetMaxClockInfo = nvSym("nvmlDeviceGetMaxClockInfo")
	// nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp);
	nvmlDeviceGetTemperature = nvSym("nvmlDeviceGetTemperature")
	// nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power);
	nvmlDeviceGetPowerUsage = nvSym("nvmlDeviceGetPowerUsage")
	// nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *currLinkGen);
	nvmlDeviceGetCurrPcieLinkGeneration = nvSym("nvmlDeviceGetCurrPcieLinkGeneration")
	// nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *currLinkWidth);
	nvmlDeviceGetCurrPcieLinkWidth = nvSym("nvmlDeviceGetCurrPcieLinkWidth")
	// nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos);
	// nvmlProcessInfo_t: {unsigned int pid; unsigned long long usedGpuMemory; unsigned int gpuInstanceId, computeInstanceId;}
	nvmlDeviceGetComputeRunningProcesses = nvSym("nvmlDeviceGetComputeRunningProcesses_v3")
)

// NVMLError is a failed NVML call.
type NVMLError struct {
	Call string
	Code uint32 // nvmlReturn_t
}

var nvmlNames = map[uint32]string{
	1: "NVML_ERROR_UNINITIALIZED", 2: "NVML_ERROR_INVALID_ARGUMENT", 3: "NVML_ERROR_NOT_SUPPORTED",
	4: "NVML_ERROR_NO_PERMISSION", 5: "NVML_ERROR_ALREADY_INITIALIZED", 6: "NVML_ERROR_NOT_FOUND",
	7: "NVML_ERROR_INSUFFICIENT_SIZE", 8: "NVML_ERROR_INSUFFICIENT_POWER", 9: "NVML_ERROR_DRIVER_NOT_LOADED",
	10: "NVML_ERROR_TIMEOUT", 11: "NVML_ERROR_IRQ_ISSUE", 12: "NVML_ERROR_LIBRARY_NOT_FOUND",
	13: "NVML_ERROR_FUNCTION_NOT_FOUND", 14: "NVML_ERROR_CORRUPTED_INFOROM", 15: "NVML_ERROR_GPU_IS_LOST",
	16: "NVML_ERROR_RESET_REQUIRED", 17: "NVML_ERROR_OPERATING_SYSTEM", 18: "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
	19: "NVML_ERROR_IN_USE", 20: "NVML_ERROR_MEMORY", 21: "NVML_ERROR_NO_DATA",
	22: "NVML_ERROR_VGPU_ECC_NOT_ENABLED", 23: "NVML_ERROR_INSUFFICIENT_RESOURCES",
	24: "NVML_ERROR_FREQ_NOT_SUPPORTED", 25: "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
	26: "NVML_ERROR_DEPRECATED", 27: "NVML_ERROR_NOT_READY", 28: "NVML_ERROR_GPU_NOT_FOUND",
	29: "NVML_ERROR_INVALID_STATE", 999: "NVML_ERROR_UNKNOWN",
}

func (e *NVMLError) Error() string {
	name, ok := nvmlNames[e.Code]
	if !ok {
		name = "NVML_ERROR_" + strconv.Itoa(int(e.Code))
	}
	if nvml.errorString == nil {
		return "nvml: " + e.Call + ": " + name
	}
	if d := nvml.errorString(e.Code); d != "" {
		name += " (" + d + ")"
	}
	return "nvml: " + e.Call + ": " + name
}

// IsNotSupported reports whether err says the GPU or driver does not offer
// the figure asked for (common on virtual GPUs).
func (e *NVMLError) IsNotSupported() bool { return e.Code == 3 }

// nvcall calls an nvmlReturn_t function.
//
//go:uintptrescapes
func (s *symbol) nvcall(args ...uintptr) error {
	r, err := s.raw(args...)
	if err != nil {
		return err
	}
	if r != 0 {
		return &NVMLError{Call: s.name, Code: r}
	}
	return nil
}

var nvml struct {
	once        sync.Once
	err         error
	path        string
	errorString func(uint32) string // nvmlErrorString through purego: it returns a char*
	mu          sync.Mutex
	refs        int
}

func loadNVML() error {
	h, path, err := openLibrary("ATS_LIBNVML", nvmlLibNames)
	if err != nil {
		return err
	}
	nvml.path = path
	for _, s := range nvmlSyms {
		s.addr, s.lib = lookup(h, s.name), path
	}
	if nvmlErrorString.addr != 0 {
		// RegisterFunc converts the returned char* to a Go string; this path
		// is only taken when formatting an error, so its cost does not matter.
		purego.RegisterFunc(&nvml.errorString, nvmlErrorString.addr)
	} else {
		nvml.errorString = func(uint32) string { return "" }
	}
	if nvmlInit.addr == 0 {
		return fmt.Errorf("%s has no nvmlInit_v2", path)
	}
	return nil
}

// Monitor is an NVML session. A nil *Monitor is valid: it stands for "no
// NVML here" and its methods return ErrNoNVML.
type Monitor struct {
	closed bool
}

// ErrNoNVML is returned by the methods of a nil *Monitor.
var ErrNoNVML = errors.New("nvml: not available")

// OpenMonitor initialises NVML. Where NVML is absent or fails to start it
// returns nil and the reason: NVML is optional, so that is not an error.
func OpenMonitor() (*Monitor, string) {
	nvml.once.Do(func() { nvml.err = loadNVML() })
	if nvml.err != nil {
		return nil, errorDetail(nvml.err)
	}
	nvml.mu.Lock()
	defer nvml.mu.Unlock()
	if err := nvmlInit.nvcall(); err != nil {
		return nil, err.Error()
	}
	nvml.refs++
	return &Monitor{}, ""
}

// Close ends the session (NVML counts nvmlInit calls; the last
// nvmlShutdown releases it).
func (m *Monitor) Close() error {
	if m == nil || m.closed {
		return nil
	}
	m.closed = true
	nvml.mu.Lock()
	defer nvml.mu.Unlock()
	nvml.refs--
	return nvmlShutdown.nvcall()
}

// DriverVersion returns the display driver version, e.g. "570.124.06".
func (m *Monitor) DriverVersion() (string, error) {
	if m == nil {
		return "", ErrNoNVML
	}
	var buf [96]byte
	if err := nvmlSystemGetDriverVersion.nvcall(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf))); err != nil {
		return "", err
	}
	return cBytesString(buf[:]), nil
}

// DeviceCount returns the number of GPUs NVML sees (all of them, whatever
// CUDA_VISIBLE_DEVICES says).
func (m *Monitor) DeviceCount() (int, error) {
	if m == nil {
		return 0, ErrNoNVML
	}
	var n uint32
	err := nvmlDeviceGetCount.nvcall(uintptr(unsafe.Pointer(&n)))
	return int(n), err
}

// GPU is an NVML device handle.
type GPU struct{ h uintptr }

// Device returns the GPU of NVML index i (PCI order, which need not be
// CUDA's order: use DeviceByPCIBusID to match a CUDA device).
func (m *Monitor) Device(i int) (*GPU, error) {
	if m == nil {
		return nil, ErrNoNVML
	}
	var h uintptr
	if err := nvmlDeviceGetHandleByIndex.nvcall(uintptr(i), uintptr(unsafe.Pointer(&h))); err != nil {
		return nil, err
	}
	return &GPU{h}, nil
}

// DeviceByPCIBusID returns the GPU at a PCI address as Device.PCIBusID
// gives it.
func (m *Monitor) DeviceByPCIBusID(id string) (*GPU, error) {
	if m == nil {
		return nil, ErrNoNVML
	}
	var h uintptr
	cid := cString(id)
	if err := nvmlDeviceGetHandleByPciBusId.nvcall(uintptr(unsafe.Pointer(&cid[0])), uintptr(unsafe.Pointer(&h))); err != nil {
		return nil, err
	}
	return &GPU{h}, nil
}

// Name returns the GPU's name.
func (g *GPU) Name() (string, error) {
	var buf [96]byte
	if err := nvmlDeviceGetName.nvcall(g.h, uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf))); err != nil {
		return "", err
	}
	return cBytesString(buf[:]), nil
}

// Sample is one reading of a GPU's state. Fields NVML could not give are
// left zero and their errors returned by GPU.Sample.
type Sample struct {
	GPUUtil, MemUtil        int    // percent of the last sample period busy
	MemTotal, MemUsed       uint64 // bytes, all processes
	MemFree                 uint64
	PCIeTX, PCIeRX          uint64 // bytes/s over the last ~20 ms (TX: GPU to host)
	PCIeGen, PCIeWidth      int    // current link generation and lanes
	SMClockMHz, MemClockMHz int
	MaxSMClockMHz           int
	TempC                   int
	PowerW                  float64
}

// Sample reads the GPU's utilisation, memory, PCIe throughput, clocks,
// temperature and power. The PCIe counters block for their sampling window
// (about 20 ms each), so poll from a background goroutine, not from the
// decode loop.
func (g *GPU) Sample() (Sample, error) {
	var s Sample
	var errs []error
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err)
		}
	}
	var util [2]uint32 // nvmlUtilization_t {unsigned int gpu, memory;}
	if err := nvmlDeviceGetUtilizationRates.nvcall(g.h, uintptr(unsafe.Pointer(&util[0]))); err == nil {
		s.GPUUtil, s.MemUtil = int(util[0]), int(util[1])
	} else {
		keep(err)
	}
	var mem [3]uint64 // nvmlMemory_t {unsigned long long total, free, used;}
	if err := nvmlDeviceGetMemoryInfo.nvcall(g.h, uintptr(unsafe.Pointer(&mem[0]))); err == nil {
		s.MemTotal, s.MemFree, s.MemUsed = mem[0], mem[1], mem[2]
	} else {
		keep(err)
	}
	u32 := func(sym *symbol, arg uintptr) (int, error) {
		var v uint32
		err := sym.nvcall(g.h, arg, uintptr(unsafe.Pointer(&v)))
		return int(v), err
	}
	u32b := func(sym *symbol) (int, error) {
		var v uint32
		err := sym.nvcall(g.h, uintptr(unsafe.Pointer(&v)))
		return int(v), err
	}
	const pcieTX, pcieRX = 0, 1    // nvmlPcieUtilCounter_t
	const clockSM, clockMem = 1, 2 // nvmlClockType_t
	const tempGPU = 0              // nvmlTemperatureSensors_t
	if v, err := u32(nvmlDeviceGetPcieThroughput, pcieTX); err == nil {
		s.PCIeTX = uint64(v) * 1024 // NVML reports KB/s
	} else {
		keep(err)
	}
	if v, err := u32(nvmlDeviceGetPcieThroughput, pcieRX); err == nil {
		s.PCIeRX = uint64(v) * 1024
	} else {
		keep(err)
	}
	var err error
	s.SMClockMHz, err = u32(nvmlDeviceGetClockInfo, clockSM)
	keep(err)
	s.MemClockMHz, err = u32(nvmlDeviceGetClockInfo, clockMem)
	keep(err)
	s.MaxSMClockMHz, err = u32(nvmlDeviceGetMaxClockInfo, clockSM)
	keep(err)
	s.TempC, err = u32(nvmlDeviceGetTemperature, tempGPU)
	keep(err)
	s.PCIeGen, err = u32b(nvmlDeviceGetCurrPcieLinkGeneration)
	keep(err)
	s.PCIeWidth, err = u32b(nvmlDeviceGetCurrPcieLinkWidth)
	keep(err)
	mw, err := u32b(nvmlDeviceGetPowerUsage)
	keep(err)
	s.PowerW = float64(mw) / 1000
	return s, errors.Join(errs...)
}

// nvmlProcessInfo is nvmlProcessInfo_t (v2 and v3 layouts agree).
type nvmlProcessInfo struct {
	PID           uint32
	_             uint32
	UsedGPUMemory uint64
	GPUInstance   uint32
	ComputeInst   uint32
}

// ProcessMemory is the device memory NVML charges to process pid, and
// whether NVML lists the process at all (a PID namespace can hide it).
func (g *GPU) ProcessMemory(pid int) (int64, bool, error) {
	infos := make([]nvmlProcessInfo, 256)
	n := uint32(len(infos))
	if err := nvmlDeviceGetComputeRunningProcesses.nvcall(g.h, uintptr(unsafe.Pointer(&n)), uintptr(unsafe.Pointer(&infos[0]))); err != nil {
		return 0, false, err
	}
	for _, in := range infos[:min(int(n), len(infos))] {
		if int(in.PID) == pid {
			return int64(in.UsedGPUMemory), true, nil
		}
	}
	return 0, false, nil
}
