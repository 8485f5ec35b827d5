package cuda

import (
	"os"
	"sync"

	"github.com/atsinfer/ats/cudadrv"
)

// Stat is one GPU's live figures from NVML.
type Stat struct {
	Index             int
	Name              string
	MemUsed, MemTotal uint64  // bytes, all processes
	Util              float64 // busy fraction of the last sample period, 0..1
	PCIeRX, PCIeTX    float64 // bytes/s, host to device and device to host
}

var nvml struct {
	once sync.Once
	mon  *cudadrv.Monitor
}

// Stats samples every GPU NVML sees; nil where NVML is absent. Each call
// blocks for NVML's PCIe sampling window (tens of milliseconds), so call it
// from a metrics scrape or a background poller, never from the decode loop.
func Stats() []Stat {
	nvml.once.Do(func() { nvml.mon, _ = cudadrv.OpenMonitor() })
	if nvml.mon == nil {
		return nil
	}
	n, err := nvml.mon.DeviceCount()
	if err != nil {
		return nil
	}
	var out []Stat
	for i := 0; i < n; i++ {
		g, err := nvml.mon.Device(i)
		if err != nil {
			continue
		}
		name, _ := g.Name()
		s, _ := g.Sample() // fields NVML could not read stay zero
		out = append(out, Stat{Index: i, Name: name, MemUsed: s.MemUsed, MemTotal: s.MemTotal,
			Util: float64(s.GPUUtil) / 100, PCIeRX: float64(s.PCIeRX), PCIeTX: float64(s.PCIeTX)})
	}
	return out
}

// ProcessMemory is the device memory NVML charges to this process on d
// (the CUDA context, the kernel modules and every allocation), or, where
// NVML does not list the process (a PID namespace), the device's whole
// use; how says which. ok is false without NVML.
func (d *Device) ProcessMemory() (n int64, how string, ok bool) {
	nvml.once.Do(func() { nvml.mon, _ = cudadrv.OpenMonitor() })
	if nvml.mon == nil {
		return 0, "", false
	}
	g, err := nvml.mon.DeviceByPCIBusID(d.info.PCIBusID)
	if err != nil {
		return 0, "", false
	}
	if n, found, err := g.ProcessMemory(os.Getpid()); err == nil && found {
		return n, "NVML, this process", true
	}
	s, err := g.Sample()
	if err != nil || s.MemUsed == 0 {
		return 0, "", false
	}
	return int64(s.MemUsed), "NVML, whole device", true
}
