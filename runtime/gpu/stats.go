package gpu

import (
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
