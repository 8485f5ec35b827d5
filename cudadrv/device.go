package cudadrv

import (
	"fmt"
	"unsafe"
)

// Symbols of device management.
var (
	// CUresult cuDeviceGetCount(int *count);
	cuDeviceGetCount = cuSym("cuDeviceGetCount")
	// CUresult cuDeviceGet(CUdevice *device, int ordinal);
	cuDeviceGet = cuSym("cuDeviceGet")
	// CUresult cuDeviceGetName(char *name, int len, CUdevice dev);
	cuDeviceGetName = cuSym("cuDeviceGetName")
	// CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev);
	cuDeviceGetUuid = cuSym("cuDeviceGetUuid")
	// CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev);
	cuDeviceTotalMem = cuSym("cuDeviceTotalMem_v2")
	// CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev);
	cuDeviceGetAttribute = cuSym("cuDeviceGetAttribute")
	// CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);
	cuDeviceGetPCIBusId = cuSym("cuDeviceGetPCIBusId")
)

// Attribute is a CUdevice_attribute.
type Attribute int32

// Device attributes ats reads (values from cuda.h).
const (
	AttrMaxThreadsPerBlock            Attribute = 1
	AttrMaxSharedMemoryPerBlock       Attribute = 8
	AttrWarpSize                      Attribute = 10
	AttrMaxRegistersPerBlock          Attribute = 12
	AttrClockRate                     Attribute = 13 // kHz; deprecated since CUDA 12
	AttrMultiprocessorCount           Attribute = 16
	AttrIntegrated                    Attribute = 18
	AttrCanMapHostMemory              Attribute = 19
	AttrComputeMode                   Attribute = 20
	AttrConcurrentKernels             Attribute = 31
	AttrECCEnabled                    Attribute = 32
	AttrPCIBusID                      Attribute = 33
	AttrPCIDeviceID                   Attribute = 34
	AttrTCCDriver                     Attribute = 35
	AttrMemoryClockRate               Attribute = 36 // kHz; deprecated since CUDA 12
	AttrGlobalMemoryBusWidth          Attribute = 37 // bits
	AttrL2CacheSize                   Attribute = 38 // bytes
	AttrMaxThreadsPerMultiprocessor   Attribute = 39
	AttrAsyncEngineCount              Attribute = 40
	AttrUnifiedAddressing             Attribute = 41
	AttrPCIDomainID                   Attribute = 50
	AttrComputeCapabilityMajor        Attribute = 75
	AttrComputeCapabilityMinor        Attribute = 76
	AttrMaxSharedMemoryPerSM          Attribute = 81
	AttrMaxRegistersPerSM             Attribute = 82
	AttrManagedMemory                 Attribute = 83
	AttrPageableMemoryAccess          Attribute = 88
	AttrConcurrentManagedAccess       Attribute = 89
	AttrCooperativeLaunch             Attribute = 95
	AttrMaxSharedMemoryPerBlockOptin  Attribute = 97
	AttrHostRegisterSupported         Attribute = 99
	AttrMaxBlocksPerSM                Attribute = 106
	AttrMaxPersistingL2CacheSize      Attribute = 108
	AttrReadOnlyHostRegisterSupported Attribute = 113
	AttrMemoryPoolsSupported          Attribute = 115
)

// Device is a CUdevice: an ordinal the driver hands out.
type Device struct{ h int32 }

// DeviceCount returns the number of CUDA devices; 0 with an error wrapping
// ErrUnavailable when there is no usable driver.
func DeviceCount() (int, error) {
	if err := Init(); err != nil {
		return 0, err
	}
	return drv.devices, nil
}

// GetDevice returns the device of the given ordinal.
func GetDevice(ordinal int) (Device, error) {
	if err := Init(); err != nil {
		return Device{}, err
	}
	var d int32
	if err := cuDeviceGet.call(uintptr(unsafe.Pointer(&d)), uintptr(ordinal)); err != nil {
		return Device{}, err
	}
	return Device{d}, nil
}

// Ordinal returns the CUdevice value.
func (d Device) Ordinal() int { return int(d.h) }

// Name returns the marketing name, e.g. "NVIDIA H200".
func (d Device) Name() (string, error) {
	var buf [256]byte
	if err := cuDeviceGetName.call(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d.h)); err != nil {
		return "", err
	}
	return cBytesString(buf[:]), nil
}

// UUID returns the device's 16-byte UUID, stable across reboots and
// orderings: the key for caching per-device profiles.
func (d Device) UUID() ([16]byte, error) {
	var u [16]byte
	err := cuDeviceGetUuid.call(uintptr(unsafe.Pointer(&u[0])), uintptr(d.h))
	return u, err
}

// PCIBusID returns the PCI address, "0000:3b:00.0", by which NVML finds the
// same device (CUDA and NVML may number devices differently).
func (d Device) PCIBusID() (string, error) {
	var buf [64]byte
	if err := cuDeviceGetPCIBusId.call(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(d.h)); err != nil {
		return "", err
	}
	return cBytesString(buf[:]), nil
}

// TotalMem returns the device memory in bytes.
func (d Device) TotalMem() (uint64, error) {
	var n uint64 // size_t: 64 bits on every platform CUDA supports
	err := cuDeviceTotalMem.call(uintptr(unsafe.Pointer(&n)), uintptr(d.h))
	return n, err
}

// Attribute returns one device attribute.
func (d Device) Attribute(a Attribute) (int, error) {
	var v int32
	if err := cuDeviceGetAttribute.call(uintptr(unsafe.Pointer(&v)), uintptr(a), uintptr(d.h)); err != nil {
		return 0, fmt.Errorf("attribute %d: %w", a, err)
	}
	return int(v), nil
}

// ComputeCapability returns the device's compute capability, e.g. 9, 0.
func (d Device) ComputeCapability() (major, minor int, err error) {
	if major, err = d.Attribute(AttrComputeCapabilityMajor); err != nil {
		return 0, 0, err
	}
	minor, err = d.Attribute(AttrComputeCapabilityMinor)
	return major, minor, err
}

// DeviceInfo gathers what ats needs to know about a device.
type DeviceInfo struct {
	Ordinal                     int
	Name                        string
	UUID                        [16]byte
	PCIBusID                    string
	Major, Minor                int    // compute capability
	TotalMem                    uint64 // bytes
	Multiprocessors             int
	L2CacheBytes                int
	MaxPersistingL2Bytes        int
	MaxSharedPerBlock           int // bytes, without opting in
	MaxSharedPerBlockOptin      int // bytes, with cuFuncSetAttribute
	MaxSharedPerSM              int
	MaxThreadsPerBlock          int
	MaxThreadsPerSM             int
	RegistersPerBlock           int
	WarpSize                    int
	ClockKHz                    int // 0 where the driver no longer reports it
	MemoryClockKHz              int // 0 where the driver no longer reports it
	MemoryBusWidth              int // bits
	AsyncEngines                int // copy engines: 2 lets HtoD and DtoH overlap
	Integrated                  bool
	CanMapHostMemory            bool
	UnifiedAddressing           bool
	HostRegisterSupported       bool
	ReadOnlyHostRegisterSupport bool
	ConcurrentManagedAccess     bool
	TCCDriver                   bool // Windows TCC mode (no WDDM)
}

// CC returns the compute capability as major*10+minor (90 for 9.0).
func (i DeviceInfo) CC() int { return i.Major*10 + i.Minor }

// Info queries the device's name, capability, memory and attributes.
// Attributes a driver has retired read as 0 instead of failing the whole query.
func (d Device) Info() (DeviceInfo, error) {
	info := DeviceInfo{Ordinal: int(d.h)}
	var err error
	if info.Name, err = d.Name(); err != nil {
		return info, err
	}
	if info.TotalMem, err = d.TotalMem(); err != nil {
		return info, err
	}
	if info.Major, info.Minor, err = d.ComputeCapability(); err != nil {
		return info, err
	}
	info.UUID, _ = d.UUID()
	info.PCIBusID, _ = d.PCIBusID()
	ints := []struct {
		dst *int
		a   Attribute
	}{
		{&info.Multiprocessors, AttrMultiprocessorCount},
		{&info.L2CacheBytes, AttrL2CacheSize},
		{&info.MaxPersistingL2Bytes, AttrMaxPersistingL2CacheSize},
		{&info.MaxSharedPerBlock, AttrMaxSharedMemoryPerBlock},
		{&info.MaxSharedPerBlockOptin, AttrMaxSharedMemoryPerBlockOptin},
		{&info.MaxSharedPerSM, AttrMaxSharedMemoryPerSM},
		{&info.MaxThreadsPerBlock, AttrMaxThreadsPerBlock},
		{&info.MaxThreadsPerSM, AttrMaxThreadsPerMultiprocessor},
		{&info.RegistersPerBlock, AttrMaxRegistersPerBlock},
		{&info.WarpSize, AttrWarpSize},
		{&info.ClockKHz, AttrClockRate},
		{&info.MemoryClockKHz, AttrMemoryClockRate},
		{&info.MemoryBusWidth, AttrGlobalMemoryBusWidth},
		{&info.AsyncEngines, AttrAsyncEngineCount},
	}
	for _, q := range ints {
		*q.dst, _ = d.Attribute(q.a)
	}
	bools := []struct {
		dst *bool
		a   Attribute
	}{
		{&info.Integrated, AttrIntegrated},
		{&info.CanMapHostMemory, AttrCanMapHostMemory},
		{&info.UnifiedAddressing, AttrUnifiedAddressing},
		{&info.HostRegisterSupported, AttrHostRegisterSupported},
		{&info.ReadOnlyHostRegisterSupport, AttrReadOnlyHostRegisterSupported},
		{&info.ConcurrentManagedAccess, AttrConcurrentManagedAccess},
		{&info.TCCDriver, AttrTCCDriver},
	}
	for _, q := range bools {
		v, _ := d.Attribute(q.a)
		*q.dst = v != 0
	}
	return info, nil
}
